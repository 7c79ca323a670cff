"""Trusted Triton warm-up: fill a fresh Triton cache with the C modules every CUDA worker needs.

    python -m extensions.verify.reference.triton_warmup       (started by ``TritonCacheSeed.build``)

Runs no candidate code. Loads Triton's driver utilities and launches a few kernels with the
argument signatures candidates use most (one to three tensors, 32-bit sizes and strides,
compile-time block sizes), so that Triton versions that build a launcher per signature leave those
launchers in the cache as well. A launcher passes every tensor as a plain device pointer, so one
element type covers the others: fp16 and bf16 launches built no module that fp32 had not (5 C
modules from 12 kernels or from 4), and each kernel compiled here delays the batch's first
candidates. The cache directory is ``TRITON_CACHE_DIR`` from the
environment (the sandbox points it into this process's own directory). Prints one JSON line: the
kernels launched and the ones that failed (a failure only means that launcher is not seeded).
"""
from __future__ import annotations

import json

import torch
import triton
import triton.language as tl


@triton.jit
def _unary(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2, mask=mask)


@triton.jit
def _binary(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(a_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, a + tl.load(b_ptr + offs, mask=mask), mask=mask)


@triton.jit
def _rows(x_ptr, y_ptr, stride_x, stride_y, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    tl.store(y_ptr + row * stride_y + cols, x - tl.max(x, axis=0), mask=mask)


@triton.jit
def _matmul(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        a = tl.load(a_ptr + rm[:, None] * stride_am + (k + rk)[None, :] * stride_ak,
                    mask=(rm[:, None] < M) & ((k + rk)[None, :] < K), other=0.0)
        b = tl.load(b_ptr + (k + rk)[:, None] * stride_bk + rn[None, :] * stride_bn,
                    mask=((k + rk)[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(a, b)
    tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc.to(c_ptr.dtype.element_ty),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


def _launches(dtype: torch.dtype):
    n = 3000  # neither 1 nor a multiple of 16: the common unspecialised case
    x, y, z = (torch.randn(n, device="cuda", dtype=dtype) for _ in range(3))
    rows = torch.randn(5, 100, device="cuda", dtype=dtype)
    yield "unary", lambda: _unary[(triton.cdiv(n, 1024),)](x, y, n, BLOCK=1024)
    yield "binary", lambda: _binary[(triton.cdiv(n, 1024),)](x, y, z, n, BLOCK=1024)
    yield "rows", lambda: _rows[(rows.shape[0],)](rows, torch.empty_like(rows), rows.stride(0), rows.stride(0),
                                                    rows.shape[1], BLOCK=128)
    a, b = torch.randn(70, 50, device="cuda", dtype=dtype), torch.randn(50, 90, device="cuda", dtype=dtype)
    c = torch.empty(70, 90, device="cuda", dtype=dtype)
    yield "matmul", lambda: _matmul[(triton.cdiv(70, 32), triton.cdiv(90, 32))](
        a, b, c, 70, 90, 50, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
        BLOCK_M=32, BLOCK_N=32, BLOCK_K=32)


def main() -> None:
    triton.runtime.driver.active.utils  # noqa: B018 - loads (or builds) the driver utilities
    launched, failed = [], []
    for name, launch in _launches(torch.float32):
        try:
            launch()
            launched.append(name)
        except Exception as exc:  # noqa: BLE001 - a kernel that fails here only goes unseeded
            failed.append(f"{name}: {type(exc).__name__}")
    torch.cuda.synchronize()
    print(json.dumps({"kernels": len(launched), "failed": failed}))


if __name__ == "__main__":
    main()
