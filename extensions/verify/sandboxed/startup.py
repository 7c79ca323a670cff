"""A worker process's trusted start-up, before it is given a candidate: imports, CUDA, limits.

Shared by the fresh worker (``worker.main``) and the fork server's children (``forkserver``); none
of it runs candidate code. It imports neither of them: each caller imports the worker itself (the
fork server before its first fork, so that no child imports it again).
"""
from __future__ import annotations


def preload() -> None:
    """Everything a worker imports before it is given a candidate (no CUDA initialisation: a
    fork server forks its children after this)."""
    import torch  # noqa: F401
    # The profiler's first start asks `hasattr(torch, "_inductor")`, which imports inductor and
    # dynamo (2 s here, 5 s on an H100 machine): most of what was taken for CUPTI's start-up
    # (bench/profiler_startup.py). Imported once here, a fork server's children inherit it.
    import torch._inductor.config  # noqa: F401
    import triton  # noqa: F401
    import triton.language  # noqa: F401

    from ..common import tensor_io  # noqa: F401
    from . import audit, integrity, interpreter_compat  # noqa: F401


def limit_memory(limit_mb: int, device: str) -> None:
    """Cap the data segment (heap and private writable mappings) at what the worker holds now
    plus ``limit_mb``: an allocation above it fails at once, before pages are touched. Only on
    CPU: CUDA's runtime maps memory in ways a data limit can break; there the parent's resident
    memory watch is the cap."""
    import resource

    if limit_mb <= 0 or device != "cpu":
        return
    held = 0
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmData:"):
                held = int(line.split()[1]) * 1024
    limit = held + limit_mb * (1 << 20)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))


def warm_up_cuda(clock) -> None:
    """Create the CUDA context, start the profiler once with CUDA activity (its first start
    initialises CUPTI: seconds) and load Triton's driver utilities, all in trusted code before the
    candidate is imported: per-process start-up costs, not the candidate's work. A forked child
    does this while it waits for its candidate; a no-op the second time."""
    import torch
    import triton

    from .audit import warm_up_profiler

    if getattr(warm_up_cuda, "done", False):
        return
    with clock.phase("cuda_init"):
        torch.zeros(1, device="cuda")
        torch.cuda.synchronize()
    with clock.phase("profiler_warmup"):
        warm_up_profiler(cuda=True)
    with clock.phase("triton_driver"):
        triton.runtime.driver.active.utils  # noqa: B018 - loads (or builds) the driver utilities
    warm_up_cuda.done = True
