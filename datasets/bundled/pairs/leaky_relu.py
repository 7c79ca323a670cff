# === pytorch ===
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 8
FEATURES = 384


class LeakyRelu(nn.Module):
    """Leaky ReLU with a configurable negative slope."""

    def __init__(self, negative_slope=0.01):
        super().__init__()
        self.negative_slope = negative_slope

    def forward(self, x):
        return F.leaky_relu(x, self.negative_slope)


def get_inputs():
    return [torch.randn(BATCH, FEATURES)]


def get_init_inputs():
    return [[], {'negative_slope': 0.2}]


# === triton ===
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def leaky_relu_kernel(x_ptr, out_ptr, n_elements, negative_slope, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    y = tl.where(x >= 0, x, x * negative_slope)
    tl.store(out_ptr + offsets, y, mask=mask)


class LeakyReluNew(nn.Module):
    """Leaky ReLU with a configurable negative slope. Computed by one elementwise Triton kernel."""

    def __init__(self, negative_slope=0.01):
        super().__init__()
        self.negative_slope = negative_slope

    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        n_elements = x.numel()
        grid = (triton.cdiv(n_elements, 1024),)
        leaky_relu_kernel[grid](x, out, n_elements, self.negative_slope, BLOCK_SIZE=1024)
        return out
