# === pytorch ===
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 24
IN_FEATURES = 40
OUT_FEATURES = 36


class LinearResidual(nn.Module):
    """Linear layer plus a residual input of the output's shape."""

    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x, residual):
        return self.linear(x) + residual


def get_inputs():
    return [torch.randn(BATCH, IN_FEATURES), torch.randn(BATCH, OUT_FEATURES)]


def get_init_inputs():
    return [[IN_FEATURES, OUT_FEATURES], {}]


# === triton ===
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def linear_residual_kernel(a_ptr, b_ptr, bias_ptr, residual_ptr, c_ptr, M, N, K,
        stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # C[M, N] = A[M, K] @ B[K, N] with a fused epilogue; one program per output tile
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
        b = tl.load(b_ptr + k[:, None] * stride_bk + offs_n[None, :] * stride_bn,
                    mask=(k[:, None] < K) & mask_n[None, :], other=0.0)
        acc += tl.dot(a, b, input_precision="ieee")
    acc += tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0)[None, :]
    acc += tl.load(residual_ptr + offs_m[:, None] * N + offs_n[None, :],
                   mask=mask_m[:, None] & mask_n[None, :], other=0.0)
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, acc,
             mask=mask_m[:, None] & mask_n[None, :])


class LinearResidualNew(nn.Module):
    """Linear layer plus a residual input of the output's shape. A tiled Triton GEMM with the epilogue fused."""

    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x, residual):
        weight = self.linear.weight  # (out_features, in_features): B = weight^T through strides
        x2 = x.contiguous().view(-1, x.shape[-1])
        residual2 = residual.contiguous().view(-1, residual.shape[-1])
        M, K = x2.shape
        N = weight.shape[0]
        out = torch.empty((M, N), device=x.device, dtype=x.dtype)
        grid = (triton.cdiv(M, 16), triton.cdiv(N, 16))
        linear_residual_kernel[grid](
            x2, weight, self.linear.bias, residual2, out, M, N, K,
            x2.stride(0), x2.stride(1), weight.stride(1), weight.stride(0), out.stride(0), out.stride(1),
            BLOCK_M=16, BLOCK_N=16, BLOCK_K=16,
        )
        return out.view(*x.shape[:-1], N)
