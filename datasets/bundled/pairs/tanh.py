# === pytorch ===
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 8
FEATURES = 384


class TanhActivation(nn.Module):
    """Hyperbolic tangent."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.tanh(x)


def get_inputs():
    return [torch.randn(BATCH, FEATURES)]


def get_init_inputs():
    return [[], {}]


# === triton ===
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def tanh_kernel(x_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    # tanh(|x|) from exp(-2|x|) stays accurate near 0 and never overflows
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    y = tl.where(x >= 0, t, -t)
    tl.store(out_ptr + offsets, y, mask=mask)


class TanhActivationNew(nn.Module):
    """Hyperbolic tangent. Computed by one elementwise Triton kernel."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        n_elements = x.numel()
        grid = (triton.cdiv(n_elements, 1024),)
        tanh_kernel[grid](x, out, n_elements, BLOCK_SIZE=1024)
        return out
