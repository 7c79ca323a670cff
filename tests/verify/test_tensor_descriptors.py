"""Kernels that use tensor descriptors (``tl.make_tensor_descriptor``) give Triton an allocator for
their scratch memory with ``triton.set_allocator`` and call the descriptor's ``load``/``store``: such
a kernel is correct and must be judged so, not refused for naming the allocator hook or the
descriptor's methods. (A descriptor's strides must be 16-byte aligned on the GPU, so a general
kernel keeps a plain path for other widths, which the verifier's shapes reach.)"""
from __future__ import annotations

import textwrap

from extensions.config import VerifierConfig
from extensions.verify import VerifyRequest, verify_batch
from extensions.verify.static.static_check import static_check

PROBLEM = textwrap.dedent("""
    import torch
    import torch.nn as nn

    class Model(nn.Module):
        def __init__(self):
            super().__init__()

        def forward(self, x):
            return x * 2.0

    rows = 64
    cols = 48

    def get_inputs():
        return [torch.randn(rows, cols)]

    def get_init_inputs():
        return []
""")

DESCRIPTOR_KERNEL = textwrap.dedent("""
    import torch
    import torch.nn as nn
    import triton
    import triton.language as tl


    def scratch(size, alignment, stream):
        return torch.empty(size, dtype=torch.int8, device="cuda")


    triton.set_allocator(scratch)


    @triton.jit
    def double_kernel(x_ptr, y_ptr, M, N, BM: tl.constexpr, BN: tl.constexpr):
        xd = tl.make_tensor_descriptor(x_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
        yd = tl.make_tensor_descriptor(y_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
        row, col = tl.program_id(0) * BM, tl.program_id(1) * BN
        yd.store([row, col], xd.load([row, col]) * 2.0)


    @triton.jit
    def double_flat_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2.0, mask=mask)


    class ModelNew(nn.Module):
        def __init__(self):
            super().__init__()

        def forward(self, x):
            x = x.contiguous()
            y = torch.empty_like(x)
            m, n = x.shape
            if (n * x.element_size()) % 16 == 0:  # a descriptor's row stride must be 16-byte aligned
                double_kernel[(triton.cdiv(m, 16), triton.cdiv(n, 16))](x, y, m, n, BM=16, BN=16)
            else:
                double_flat_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
            return y
""")


def test_the_allocator_hook_passes_the_static_check():
    report = static_check(DESCRIPTOR_KERNEL)
    assert report.ok, report.errors


def test_a_tensor_descriptor_kernel_is_judged_correct_on_cpu():
    config = VerifierConfig(device="cpu", multi_input_num_tests=2, timeout_s=120)
    result = verify_batch([VerifyRequest(PROBLEM, DESCRIPTOR_KERNEL, "descriptors")], config, device="cpu",
                          progress=False)[0]
    assert result.correct, (result.stage, result.flags, result.error)
