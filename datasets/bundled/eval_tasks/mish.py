# Evaluation task of the bundled set (not a training pair).
# level: 1
# === task ===
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 8
FEATURES = 320


class Model(nn.Module):
    """Mish activation, x * tanh(softplus(x))."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return F.mish(x)


def get_inputs():
    return [torch.randn(BATCH, FEATURES)]


def get_init_inputs():
    return []


# === solution ===
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def mish_kernel(x_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    softplus = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))
    e = tl.exp(-2.0 * softplus)  # softplus >= 0, so tanh(softplus) = (1 - e) / (1 + e)
    y = x * (1.0 - e) / (1.0 + e)
    tl.store(out_ptr + offsets, y, mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        n_elements = x.numel()
        mish_kernel[(triton.cdiv(n_elements, 1024),)](x, out, n_elements, BLOCK_SIZE=1024)
        return out
