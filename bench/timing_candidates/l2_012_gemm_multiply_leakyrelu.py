"""Triton candidate for KernelBench level 2 problem 12 (Linear, multiply, LeakyReLU), with the
bias, scale and activation fused into the GEMM's epilogue (IEEE fp32 tl.dot, to meet the fp32 tolerance)."""
import torch
import torch.nn as nn
import triton
import triton.language as tl

PROBLEM = (2, 12)


@triton.jit
def _linear_scale_leaky_kernel(x_ptr, w_ptr, bias_ptr, y_ptr, M, N, K, stride_xm, stride_xk, stride_wn, stride_wk,
                               stride_ym, stride_yn, multiplier, negative_slope,
                               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                               GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    group = pid // (GROUP_M * grid_n)
    first_m = group * GROUP_M
    group_rows = min(grid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group_rows)
    pid_n = (pid % (GROUP_M * grid_n)) // group_rows
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        x = tl.load(x_ptr + rm[:, None] * stride_xm + (k + rk)[None, :] * stride_xk,
                    mask=(rm[:, None] < M) & ((k + rk)[None, :] < K), other=0.0)
        # W is (N, K): read it as the (K, N) right operand.
        w = tl.load(w_ptr + (k + rk)[:, None] * stride_wk + rn[None, :] * stride_wn,
                    mask=((k + rk)[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(x, w, input_precision="ieee")
    bias = tl.load(bias_ptr + rn, mask=rn < N, other=0.0)
    out = (acc + bias[None, :]) * multiplier
    out = tl.where(out >= 0, out, out * negative_slope)
    tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :] * stride_yn, out,
             mask=(rm[:, None] < M) & (rn[None, :] < N))


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, multiplier, negative_slope):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.multiplier = multiplier
        self.negative_slope = negative_slope

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.gemm.weight
        M, K = x.shape
        N = w.shape[0]
        y = torch.empty((M, N), device=x.device, dtype=torch.float32)
        bm, bn, bk = 128, 128, 32
        grid = (triton.cdiv(M, bm) * triton.cdiv(N, bn),)
        _linear_scale_leaky_kernel[grid](
            x, w, self.gemm.bias, y, M, N, K, x.stride(0), x.stride(1), w.stride(0), w.stride(1),
            y.stride(0), y.stride(1), float(self.multiplier), float(self.negative_slope),
            BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, num_warps=8, num_stages=3)
        return y.to(x.dtype)
