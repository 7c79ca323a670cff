# === pytorch ===
import torch
import torch.nn as nn
import torch.nn.functional as F

ROWS = 16
COLS = 200


class ResidualLayerNorm(nn.Module):
    """LayerNorm of x + residual (the transformer add & norm)."""

    def __init__(self, features):
        super().__init__()
        self.norm = nn.LayerNorm(features)

    def forward(self, x, residual):
        return self.norm(x + residual)


def get_inputs():
    return [torch.randn(ROWS, COLS), torch.randn(ROWS, COLS)]


def get_init_inputs():
    return [[COLS], {}]


# === triton ===
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def residual_layer_norm_kernel(x_ptr, residual_ptr, w_ptr, b_ptr, out_ptr, n_cols, eps, BLOCK_SIZE: tl.constexpr):
    # one program per row; the whole row fits in one block
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    residual = tl.load(residual_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    weight = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    bias = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    s = x + residual
    mean = tl.sum(s, axis=0) / n_cols
    centered = tl.where(mask, s - mean, 0.0)
    var = tl.sum(centered * centered, axis=0) / n_cols
    y = centered / tl.sqrt(var + eps) * weight + bias
    tl.store(out_ptr + row * n_cols + cols, y, mask=mask)


class ResidualLayerNormNew(nn.Module):
    """LayerNorm of x + residual (the transformer add & norm). One Triton program per row."""

    def __init__(self, features):
        super().__init__()
        self.norm = nn.LayerNorm(features)

    def forward(self, x, residual):
        n_cols = x.shape[-1]
        x2 = x.contiguous().view(-1, n_cols)
        residual2 = residual.contiguous().view(-1, n_cols)
        out = torch.empty_like(x2)
        n_rows = x2.shape[0]
        residual_layer_norm_kernel[(n_rows,)](x2, residual2, self.norm.weight, self.norm.bias, out, n_cols, self.norm.eps, BLOCK_SIZE=triton.next_power_of_2(n_cols))
        return out.view(x.shape)
