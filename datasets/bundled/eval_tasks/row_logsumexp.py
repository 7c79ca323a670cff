# Evaluation task of the bundled set (not a training pair).
# level: 1
# === task ===
import torch
import torch.nn as nn
import torch.nn.functional as F

ROWS = 12
COLS = 150


class Model(nn.Module):
    """Log-sum-exp over the last dimension."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.logsumexp(x, dim=-1)


def get_inputs():
    return [torch.randn(ROWS, COLS)]


def get_init_inputs():
    return []


# === solution ===
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def row_logsumexp_kernel(x_ptr, out_ptr, n_cols, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=-float('inf')).to(tl.float32)
    peak = tl.max(x, axis=0)
    r = peak + tl.log(tl.sum(tl.exp(x - peak), axis=0))
    tl.store(out_ptr + row, r)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        n_cols = x.shape[-1]
        x2 = x.contiguous().view(-1, n_cols)
        out = torch.empty(x.shape[:-1], device=x.device, dtype=x.dtype)
        row_logsumexp_kernel[(x2.shape[0],)](x2, out, n_cols, BLOCK_SIZE=triton.next_power_of_2(n_cols))
        return out
