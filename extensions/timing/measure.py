"""The timing seam the verifier calls: ``measure_speedup``.

Runs inside the sandboxed worker that already holds the candidate, after correctness passed, while
the worker holds the GPU's lease::

    from extensions.timing import gpu_lease, measure_speedup
    with gpu_lease(device_index):
        report = measure_speedup(reference_model, candidate_model, input_sets, config,
                                 compare_outputs=compare_outputs)

``compare_outputs`` is the caller's output comparison (the verifier's), handed in so that this
package imports nothing of the verifier.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Optional, Sequence

from extensions.timing.report import SpeedupReport
from extensions.timing.schedule import SpeedupScheduler, TimingSettings, TrialRunner


def make_runner(reference, candidate, input_sets: Sequence[Sequence[Any]], config: Any,
                compare_outputs: Callable[[Any, Any, Any], Any],
                localise_outputs: Optional[Callable[[Any, Any, Any], Any]] = None) -> TrialRunner:
    """The CUDA runner when the inputs live on a GPU, else the host-clock runner."""
    import torch

    from extensions.timing.runners import CudaTrialRunner, HostTrialRunner

    on_gpu = any(isinstance(x, torch.Tensor) and x.is_cuda for s in input_sets for x in s)
    if on_gpu:
        return CudaTrialRunner(reference, candidate, input_sets, config, compare_outputs, localise=localise_outputs)
    return HostTrialRunner(reference, candidate, input_sets, config, compare_outputs, localise_outputs)


def measure_speedup(
    reference,
    candidate,
    input_sets: Sequence[Sequence[Any]],
    config: Any,
    *,
    compare_outputs: Callable[[Any, Any, Any], Any],
    localise_outputs: Optional[Callable[[Any, Any, Any], Any]] = None,
    runner: Optional[TrialRunner] = None,
    clock: Callable[[], float] = time.perf_counter,
) -> SpeedupReport:
    """Time ``candidate`` against ``reference`` on rotating ``input_sets``; see ``docs/timing.md``.

    ``config`` is a ``VerifierConfig`` (its timing_* fields). ``input_sets`` is a list of argument
    lists, tensors already on the device; use at least two sets (the last one is held back for the
    memoisation probe). ``compare_outputs(candidate, reference, config)`` is None when outputs agree
    (the verifier's comparison: the timer is never more lenient than correctness was).
    ``localise_outputs(candidate, reference, config)`` (optional): per output tensor the flat
    indices of a small element-wise disagreement, or None; a checked call that disagrees only
    there is not counted as a mismatch but kept in ``report.localised_mismatches`` (input index
    and the candidate's values there), for the caller to judge against what it knows of the
    reference's ambiguous elements. ``runner`` and ``clock`` are injectable for tests.
    """
    settings = TimingSettings.from_config(config)
    if not input_sets:
        raise ValueError("measure_speedup needs at least one input set, got none")
    if runner is None:
        runner = make_runner(reference, candidate, input_sets, config, compare_outputs, localise_outputs)
    return SpeedupScheduler(runner, settings, clock).run()
