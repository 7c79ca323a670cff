# === pytorch ===
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 8
FEATURES = 384


class MultiplyAdd(nn.Module):
    """Fused multiply-add, x * y + z."""

    def __init__(self):
        super().__init__()

    def forward(self, x, y, z):
        return x * y + z


def get_inputs():
    return [torch.randn(BATCH, FEATURES), torch.randn(BATCH, FEATURES), torch.randn(BATCH, FEATURES)]


def get_init_inputs():
    return [[], {}]


# === triton ===
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def mul_add_kernel(x_ptr, y_ptr, z_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    y = tl.load(y_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    z = tl.load(z_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    y = x * y + z
    tl.store(out_ptr + offsets, y, mask=mask)


class MultiplyAddNew(nn.Module):
    """Fused multiply-add, x * y + z. Computed by one elementwise Triton kernel."""

    def __init__(self):
        super().__init__()

    def forward(self, x, y, z):
        x = x.contiguous()
        y = y.contiguous()
        z = z.contiguous()
        out = torch.empty_like(x)
        n_elements = x.numel()
        grid = (triton.cdiv(n_elements, 1024),)
        mul_add_kernel[grid](x, y, z, out, n_elements, BLOCK_SIZE=1024)
        return out
