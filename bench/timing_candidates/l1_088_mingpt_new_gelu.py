"""Triton candidate for KernelBench level 1 problem 88 (MinGPT's tanh GELU), fused into one pass."""
import torch
import torch.nn as nn
import triton
import triton.language as tl

PROBLEM = (1, 88)


@triton.jit
def _new_gelu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    tanh_inner = 2.0 * tl.sigmoid(2.0 * inner) - 1.0  # tanh without a libdevice call
    tl.store(y_ptr + offsets, 0.5 * x * (1.0 + tanh_inner), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = torch.empty_like(x)
        n = x.numel()
        block = 4096
        _new_gelu_kernel[(triton.cdiv(n, block),)](x, y, n, BLOCK=block, num_warps=8)
        return y
