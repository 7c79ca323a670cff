# === pytorch ===
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 8
FEATURES = 384


class SwishResidual(nn.Module):
    """Swish of x plus a residual y: x * sigmoid(x) + y."""

    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        return x * torch.sigmoid(x) + y


def get_inputs():
    return [torch.randn(BATCH, FEATURES), torch.randn(BATCH, FEATURES)]


def get_init_inputs():
    return [[], {}]


# === triton ===
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def swish_residual_kernel(x_ptr, y_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    y = tl.load(y_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    y = x / (1.0 + tl.exp(-x)) + y
    tl.store(out_ptr + offsets, y, mask=mask)


class SwishResidualNew(nn.Module):
    """Swish of x plus a residual y: x * sigmoid(x) + y. Computed by one elementwise Triton kernel."""

    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        x = x.contiguous()
        y = y.contiguous()
        out = torch.empty_like(x)
        n_elements = x.numel()
        grid = (triton.cdiv(n_elements, 1024),)
        swish_residual_kernel[grid](x, y, out, n_elements, BLOCK_SIZE=1024)
        return out
