"""What the sandbox tests share: a small problem, a correct Triton candidate with hooks for
hostile code at import and in forward, and a prepared problem to judge candidates against."""
from __future__ import annotations

import contextlib
import dataclasses
import os
import textwrap
import time

import pytest

from extensions.config import VerifierConfig
from extensions.verify.api import _DevicePool
from extensions.verify.common.proctree import become_subreaper, live_descendants, stop_being_subreaper
from extensions.verify.parent.judge import ProblemPreparer, judge_candidate
from extensions.verify.parent.sandbox import bwrap_works, choose_isolation

PROBLEM = textwrap.dedent("""
    import torch
    import torch.nn as nn

    class Model(nn.Module):
        def __init__(self, alpha):
            super().__init__()
            self.alpha = alpha

        def forward(self, x):
            return x * self.alpha + 1.0

    batch_size = 4
    dim = 40

    def get_inputs():
        return [torch.randn(batch_size, dim)]

    def get_init_inputs():
        return [2.5]
""")

KERNEL = textwrap.dedent("""
    import torch
    import torch.nn as nn
    import triton
    import triton.language as tl

    @triton.jit
    def affine_kernel(x_ptr, y_ptr, n, alpha, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask)
        tl.store(y_ptr + offs, x * alpha + 1.0, mask=mask)
""")

MODEL_NEW = textwrap.dedent("""
    class ModelNew(nn.Module):
        def __init__(self, alpha):
            super().__init__()
            self.alpha = alpha

        def forward(self, x):
            {forward_prelude}
            y = torch.empty_like(x)
            n = x.numel()
            affine_kernel[(triton.cdiv(n, 64),)](x, y, n, self.alpha, BLOCK=64)
            return y
""")

def affine_candidate(store: str = "x * alpha + 1.0", ret: str = "y", extra_import: str = "",
                     prelude: str = "") -> str:
    return textwrap.dedent(f"""
        import torch
        import torch.nn as nn
        import triton
        import triton.language as tl
        {extra_import}

        @triton.jit
        def affine_kernel(x_ptr, y_ptr, n, alpha, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            x = tl.load(x_ptr + offs, mask=mask)
            {prelude}
            tl.store(y_ptr + offs, {store}, mask=mask)


        class ModelNew(nn.Module):
            def __init__(self, alpha):
                super().__init__()
                self.alpha = alpha

            def forward(self, x):
                y = torch.empty_like(x)
                n = x.numel()
                affine_kernel[(triton.cdiv(n, 64),)](x, y, n, self.alpha, BLOCK=64)
                return {ret}
    """)


needs_bwrap = pytest.mark.skipif(not bwrap_works(), reason="bubblewrap cannot start a sandbox here")
# Every isolation mode; bwrap is skipped where it cannot start (process is always available).
BOTH_MODES = pytest.mark.parametrize("isolation", [
    pytest.param("bwrap", marks=needs_bwrap), "process"])


def candidate(at_import: str = "", forward_prelude: str = "pass") -> str:
    prelude = textwrap.indent(textwrap.dedent(forward_prelude).strip(), " " * 8).strip()
    return KERNEL + textwrap.dedent(at_import) + MODEL_NEW.format(forward_prelude=prelude)


@dataclasses.dataclass
class Ctx:
    config: VerifierConfig
    prepared: object
    pool: _DevicePool
    root: str

    def judge(self, code: str, isolation: str = "bwrap", **overrides):
        config = dataclasses.replace(self.config, **overrides)
        return judge_candidate(code, self.prepared, config, "cpu", self.pool, choose_isolation(isolation),
                               self.root, "c")


def make_ctx(tmp_path_factory) -> Ctx:
    root = str(tmp_path_factory.mktemp("sandbox"))
    config = VerifierConfig(device="cpu", timeout_s=60, multi_input_num_tests=1,
                            multi_input_shape_variations=False)
    pool = _DevicePool("cpu", 1)
    prepared = ProblemPreparer(config, "cpu", root, pool).prepare(PROBLEM)
    assert prepared.ok, prepared.error
    return Ctx(config, prepared, pool, root)


def processes_with(marker: str) -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if marker.encode() in fh.read():
                    found.append(pid)
        except OSError:
            continue
    return found


def wait_gone(marker: str, seconds: float = 5.0) -> list[str]:
    deadline = time.monotonic() + seconds
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    return processes_with(marker)



def descendants() -> list[int]:
    """Live processes below this one: what this test started and left, never another run's
    processes on the same machine."""
    return live_descendants(os.getpid())


def wait_no_descendants(seconds: float = 5.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while descendants() and time.monotonic() < deadline:
        time.sleep(0.1)
    return descendants()


@contextlib.contextmanager
def adopting_orphans():
    """Within the block this process is a child subreaper (Linux): a process whose parent dies
    becomes this process's child instead of init's, so ``descendants`` still sees it."""
    if not become_subreaper():
        pytest.skip("prctl(PR_SET_CHILD_SUBREAPER) is not available")
    try:
        yield
    finally:
        stop_being_subreaper()


def judge_cases(cases: dict, device: str, isolation: str, **settings) -> dict:
    """Each ``name: (problem, candidate)`` of ``cases`` judged by the real verifier in one batch,
    by name (``settings``: further VerifierConfig fields)."""
    from extensions.verify import VerifyRequest, verify_batch

    config = VerifierConfig(device=device, isolation=isolation, timeout_s=120, workers=2, **settings)
    results = verify_batch([VerifyRequest(problem, code, label=name) for name, (problem, code) in cases.items()],
                           config, device=device, progress=False)
    return dict(zip(cases, results))
