# === pytorch ===
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 8
FEATURES = 384


class ClampRange(nn.Module):
    """Clamp every element to [min_value, max_value]."""

    def __init__(self, min_value, max_value):
        super().__init__()
        self.min_value = min_value
        self.max_value = max_value

    def forward(self, x):
        return torch.clamp(x, self.min_value, self.max_value)


def get_inputs():
    return [torch.randn(BATCH, FEATURES)]


def get_init_inputs():
    return [[-0.5], {'max_value': 0.75}]


# === triton ===
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def clamp_kernel(x_ptr, out_ptr, n_elements, min_value, max_value, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    y = tl.minimum(tl.maximum(x, min_value), max_value)
    tl.store(out_ptr + offsets, y, mask=mask)


class ClampRangeNew(nn.Module):
    """Clamp every element to [min_value, max_value]. Computed by one elementwise Triton kernel."""

    def __init__(self, min_value, max_value):
        super().__init__()
        self.min_value = min_value
        self.max_value = max_value

    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        n_elements = x.numel()
        grid = (triton.cdiv(n_elements, 1024),)
        clamp_kernel[grid](x, out, n_elements, self.min_value, self.max_value, BLOCK_SIZE=1024)
        return out
