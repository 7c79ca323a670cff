"""Triton candidate for KernelBench level 1 problem 40 (LayerNorm over (features, dim1, dim2)).

Each normalised row holds millions of elements and there are few rows, so one program per row
would leave most of the GPU idle: every row is split into CHUNKS pieces, a first kernel writes each
piece's sum and sum of squares, a second one combines them and normalises its piece.
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl

PROBLEM = (1, 40)
CHUNKS = 64


@triton.jit
def _partial_moments_kernel(x_ptr, sums_ptr, squares_ptr, n, chunk, CHUNKS: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    piece = tl.program_id(1)
    base = x_ptr + row * n
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    acc_sq = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, chunk, BLOCK):
        offsets = piece * chunk + start + tl.arange(0, BLOCK)
        x = tl.load(base + offsets, mask=offsets < n, other=0.0).to(tl.float32)
        acc += x
        acc_sq += x * x
    tl.store(sums_ptr + row * CHUNKS + piece, tl.sum(acc, axis=0))
    tl.store(squares_ptr + row * CHUNKS + piece, tl.sum(acc_sq, axis=0))


@triton.jit
def _normalize_kernel(x_ptr, w_ptr, b_ptr, y_ptr, sums_ptr, squares_ptr, n, chunk, eps,
                      CHUNKS: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    piece = tl.program_id(1)
    pieces = tl.arange(0, CHUNKS)
    mean = tl.sum(tl.load(sums_ptr + row * CHUNKS + pieces), axis=0) / n
    mean_sq = tl.sum(tl.load(squares_ptr + row * CHUNKS + pieces), axis=0) / n
    rstd = 1.0 / tl.sqrt(tl.maximum(mean_sq - mean * mean, 0.0) + eps)
    for start in range(0, chunk, BLOCK):
        offsets = piece * chunk + start + tl.arange(0, BLOCK)
        mask = offsets < n
        x = tl.load(x_ptr + row * n + offsets, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + offsets, mask=mask, other=0.0)
        b = tl.load(b_ptr + offsets, mask=mask, other=0.0)
        tl.store(y_ptr + row * n + offsets, (x - mean) * rstd * w + b, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, normalized_shape: tuple):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape=normalized_shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        n = self.ln.weight.numel()
        rows = x.numel() // n
        block = 2048
        chunk = triton.cdiv(triton.cdiv(n, CHUNKS), block) * block
        sums = torch.empty(rows * CHUNKS, device=x.device, dtype=torch.float32)
        squares = torch.empty_like(sums)
        y = torch.empty_like(x)
        grid = (rows, CHUNKS)
        _partial_moments_kernel[grid](x, sums, squares, n, chunk, CHUNKS=CHUNKS, BLOCK=block, num_warps=8)
        _normalize_kernel[grid](x, self.ln.weight, self.ln.bias, y, sums, squares, n, chunk, self.ln.eps,
                                CHUNKS=CHUNKS, BLOCK=block, num_warps=8)
        return y
