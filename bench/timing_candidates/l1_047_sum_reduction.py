"""Triton candidate for KernelBench level 1 problem 47 (sum over one dimension, keepdim)."""
import torch
import torch.nn as nn
import triton
import triton.language as tl

PROBLEM = (1, 47)


@triton.jit
def _sum_middle_kernel(x_ptr, y_ptr, rows, cols, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    # x is viewed as (outer, rows, cols); each program sums BLOCK_C columns of one outer slice.
    outer = tl.program_id(0).to(tl.int64)
    col = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_mask = col < cols
    base = x_ptr + outer * rows * cols
    acc = tl.zeros([BLOCK_C], dtype=tl.float32)
    for start in range(0, rows, BLOCK_R):
        row = start + tl.arange(0, BLOCK_R)
        mask = (row[:, None] < rows) & col_mask[None, :]
        tile = tl.load(base + row[:, None].to(tl.int64) * cols + col[None, :], mask=mask, other=0.0)
        acc += tl.sum(tile.to(tl.float32), axis=0)
    tl.store(y_ptr + outer * cols + col, acc, mask=col_mask)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        dim = self.dim % x.dim()
        outer = 1
        for size in x.shape[:dim]:
            outer *= size
        rows = x.shape[dim]
        cols = 1
        for size in x.shape[dim + 1:]:
            cols *= size
        out_shape = list(x.shape)
        out_shape[dim] = 1
        y = torch.empty(out_shape, device=x.device, dtype=x.dtype)
        block_c = 128
        grid = (outer, triton.cdiv(cols, block_c))
        _sum_middle_kernel[grid](x, y, rows, cols, BLOCK_R=32, BLOCK_C=block_c, num_warps=4)
        return y
