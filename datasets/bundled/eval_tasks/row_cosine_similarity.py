# Evaluation task of the bundled set (not a training pair).
# level: 1
# === task ===
import torch
import torch.nn as nn
import torch.nn.functional as F

ROWS = 12
COLS = 150


class Model(nn.Module):
    """Cosine similarity of matching rows of x and y."""

    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        return F.cosine_similarity(x, y, dim=-1)


def get_inputs():
    return [torch.randn(ROWS, COLS), torch.randn(ROWS, COLS)]


def get_init_inputs():
    return []


# === solution ===
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def row_cosine_similarity_kernel(x_ptr, y_ptr, out_ptr, n_cols, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    y = tl.load(y_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    dot = tl.sum(x * y, axis=0)
    squared_norms = tl.sum(x * x, axis=0) * tl.sum(y * y, axis=0)
    r = dot / tl.sqrt(tl.maximum(squared_norms, 1e-16))
    tl.store(out_ptr + row, r)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        n_cols = x.shape[-1]
        x2 = x.contiguous().view(-1, n_cols)
        y2 = y.contiguous().view(-1, n_cols)
        out = torch.empty(x.shape[:-1], device=x.device, dtype=x.dtype)
        row_cosine_similarity_kernel[(x2.shape[0],)](x2, y2, out, n_cols, BLOCK_SIZE=triton.next_power_of_2(n_cols))
        return out
