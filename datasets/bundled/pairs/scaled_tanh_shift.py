# === pytorch ===
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 8
FEATURES = 384


class ScaledTanhShift(nn.Module):
    """tanh(x) * scale + shift with fixed constants."""

    def __init__(self, scale, shift):
        super().__init__()
        self.scale = scale
        self.shift = shift

    def forward(self, x):
        return torch.tanh(x) * self.scale + self.shift


def get_inputs():
    return [torch.randn(BATCH, FEATURES)]


def get_init_inputs():
    return [[], {'scale': 2.0, 'shift': -0.5}]


# === triton ===
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def scaled_tanh_shift_kernel(x_ptr, out_ptr, n_elements, scale, shift, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    y = tl.where(x >= 0, t, -t) * scale + shift
    tl.store(out_ptr + offsets, y, mask=mask)


class ScaledTanhShiftNew(nn.Module):
    """tanh(x) * scale + shift with fixed constants. Computed by one elementwise Triton kernel."""

    def __init__(self, scale, shift):
        super().__init__()
        self.scale = scale
        self.shift = shift

    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        n_elements = x.numel()
        grid = (triton.cdiv(n_elements, 1024),)
        scaled_tanh_shift_kernel[grid](x, out, n_elements, self.scale, self.shift, BLOCK_SIZE=1024)
        return out
