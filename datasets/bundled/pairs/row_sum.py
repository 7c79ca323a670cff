# === pytorch ===
import torch
import torch.nn as nn
import torch.nn.functional as F

ROWS = 16
COLS = 200


class RowSum(nn.Module):
    """Sum over the last dimension."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.sum(x, dim=-1)


def get_inputs():
    return [torch.randn(ROWS, COLS)]


def get_init_inputs():
    return [[], {}]


# === triton ===
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def row_sum_kernel(x_ptr, out_ptr, n_cols, BLOCK_SIZE: tl.constexpr):
    # one program per row; the whole row fits in one block
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    r = tl.sum(x, axis=0)
    tl.store(out_ptr + row, r)


class RowSumNew(nn.Module):
    """Sum over the last dimension. One Triton program per row."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        n_cols = x.shape[-1]
        x2 = x.contiguous().view(-1, n_cols)
        out = torch.empty(x.shape[:-1], device=x.device, dtype=x.dtype)
        n_rows = x2.shape[0]
        row_sum_kernel[(n_rows,)](x2, out, n_cols, BLOCK_SIZE=triton.next_power_of_2(n_cols))
        return out
