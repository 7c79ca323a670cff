# Evaluation task of the bundled set (not a training pair).
# level: 3
# === task ===
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 20
IN_FEATURES = 48
HIDDEN = 40
OUT_FEATURES = 24


class Model(nn.Module):
    """A two-layer perceptron: linear, ReLU, linear."""

    def __init__(self, in_features, hidden, out_features):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.fc2 = nn.Linear(hidden, out_features)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def get_inputs():
    return [torch.randn(BATCH, IN_FEATURES)]


def get_init_inputs():
    return [IN_FEATURES, HIDDEN, OUT_FEATURES]


# === solution ===
import torch
import torch.nn as nn
import triton
import triton.language as tl

NONE = 0
RELU = 1

@triton.jit
def linear_kernel(a_ptr, w_ptr, bias_ptr, c_ptr, M, N, K, scale,
        stride_am, stride_ak, stride_wn, stride_wk, stride_cm, stride_cn,
        EPILOGUE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # C = A @ W^T + bias with a fused epilogue chosen at compile time
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    mask_n = offs_n < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + offs_k
        a = tl.load(a_ptr + offs_m[:, None] * stride_am + k[None, :] * stride_ak,
                    mask=mask_m[:, None] & (k[None, :] < K), other=0.0)
        w = tl.load(w_ptr + k[:, None] * stride_wk + offs_n[None, :] * stride_wn,
                    mask=(k[:, None] < K) & mask_n[None, :], other=0.0)
        acc += tl.dot(a, w, input_precision="ieee")
    acc += tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0)[None, :]
    if EPILOGUE == 1:
        acc = tl.maximum(acc, 0.0)
    if EPILOGUE == 2:
        e = tl.exp(-2.0 * tl.abs(acc))
        t = (1.0 - e) / (1.0 + e)
        acc = tl.where(acc >= 0, t, -t) * scale
    if EPILOGUE == 3:
        # the tile spans whole rows (BLOCK_N >= N): softmax across the columns in registers
        acc = tl.where(mask_n[None, :], acc, -float("inf"))
        acc = tl.exp(acc - tl.max(acc, axis=1)[:, None])
        acc = acc / tl.sum(acc, axis=1)[:, None]
    if EPILOGUE == 4:
        acc = tl.minimum(tl.maximum(acc / scale, -1.0), 1.0)
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, acc,
             mask=mask_m[:, None] & mask_n[None, :])


def launch_linear(x2, linear, epilogue, scale=1.0, whole_rows=False):
    weight = linear.weight
    M, K = x2.shape
    N = weight.shape[0]
    out = torch.empty((M, N), device=x2.device, dtype=x2.dtype)
    block_n = triton.next_power_of_2(N) if whole_rows else 16
    block_n = max(block_n, 16)
    grid = (triton.cdiv(M, 16), triton.cdiv(N, block_n))
    linear_kernel[grid](
        x2, weight, linear.bias, out, M, N, K, scale,
        x2.stride(0), x2.stride(1), weight.stride(0), weight.stride(1), out.stride(0), out.stride(1),
        EPILOGUE=epilogue, BLOCK_M=16, BLOCK_N=block_n, BLOCK_K=16,
    )
    return out


class ModelNew(nn.Module):
    def __init__(self, in_features, hidden, out_features):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.fc2 = nn.Linear(hidden, out_features)

    def forward(self, x):
        x2 = x.contiguous().view(-1, x.shape[-1])
        hidden = launch_linear(x2, self.fc1, RELU)
        out = launch_linear(hidden, self.fc2, NONE)
        return out.view(*x.shape[:-1], out.shape[-1])
