# === pytorch ===
import torch
import torch.nn as nn
import torch.nn.functional as F

ROWS = 16
COLS = 200


class RMSNorm(nn.Module):
    """RMSNorm: x / sqrt(mean(x^2) + eps) * weight."""

    def __init__(self, features, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.rand(features) + 0.5)

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps) * self.weight


def get_inputs():
    return [torch.randn(ROWS, COLS)]


def get_init_inputs():
    return [[], {'features': COLS}]


# === triton ===
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def rms_norm_kernel(x_ptr, w_ptr, out_ptr, n_cols, eps, BLOCK_SIZE: tl.constexpr):
    # one program per row; the whole row fits in one block
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    weight = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = x / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps) * weight
    tl.store(out_ptr + row * n_cols + cols, y, mask=mask)


class RMSNormNew(nn.Module):
    """RMSNorm: x / sqrt(mean(x^2) + eps) * weight. One Triton program per row."""

    def __init__(self, features, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.rand(features) + 0.5)

    def forward(self, x):
        n_cols = x.shape[-1]
        x2 = x.contiguous().view(-1, n_cols)
        out = torch.empty_like(x2)
        n_rows = x2.shape[0]
        rms_norm_kernel[(n_rows,)](x2, self.weight, out, n_cols, self.eps, BLOCK_SIZE=triton.next_power_of_2(n_cols))
        return out.view(x.shape)
