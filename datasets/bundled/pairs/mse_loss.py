# === pytorch ===
import torch
import torch.nn as nn

BATCH = 12
FEATURES = 300


class MeanSquaredError(nn.Module):
    """Mean squared error between predictions and targets (a scalar)."""

    def __init__(self):
        super().__init__()

    def forward(self, predictions, targets):
        return torch.mean((predictions - targets) ** 2)


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
def mse_kernel(p_ptr, t_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    # a single program walks the whole input, so the result needs no second reduction pass
    acc = tl.zeros((BLOCK_SIZE,), dtype=tl.float32)
    for start in range(0, n_elements, BLOCK_SIZE):
        offsets = start + tl.arange(0, BLOCK_SIZE)
        mask = offsets < n_elements
        p = tl.load(p_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        t = tl.load(t_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        diff = p - t
        acc += diff * diff
    tl.store(out_ptr, tl.sum(acc, axis=0) / n_elements)


class MeanSquaredErrorNew(nn.Module):
    """Mean squared error between predictions and targets, reduced by one Triton program."""

    def __init__(self):
        super().__init__()

    def forward(self, predictions, targets):
        predictions = predictions.contiguous()
        targets = targets.contiguous()
        out = torch.empty((), device=predictions.device, dtype=predictions.dtype)
        mse_kernel[(1,)](predictions, targets, out, predictions.numel(), BLOCK_SIZE=1024)
        return out
