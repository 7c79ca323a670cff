"""Where a candidate's time goes: seconds per named phase, in the worker and in the parent.

The verifier's throughput is bounded by per-candidate start-up costs (CUDA context, the C compiler
runs Triton makes for its driver utilities and launchers, the profiler's first start) as much as by
the candidate's own work. Both sides record their phases; the parent merges them into
``details["phase_s"]`` (``{"parent": {...}, "worker": {...}}``) and ``bench/verifier_throughput.py``
sums them per phase.

The worker's numbers come from the candidate's process, so the parent keeps them only as plain
numbers under identifier-like names (``sanitize_phases``): they are diagnostics, never part of a
verdict.
"""
from __future__ import annotations

import contextlib
import re
import sys
import time
from typing import Any, Iterator

_PHASE_NAME = re.compile(r"^[a-z][a-z0-9_.]{0,40}$")
_MAX_PHASES = 40
# Triton's helpers that run the host C compiler (driver utilities and, in some Triton versions, a
# launcher per kernel signature): module -> function name.
_C_BUILD_FUNCTIONS = (("triton.runtime.build", "_build"), ("triton.backends.nvidia.driver", "_build"))


class PhaseClock:
    """Accumulates wall seconds per phase name (a phase entered twice adds up)."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self.counts: dict[str, int] = {}

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        started = time.monotonic()
        try:
            yield
        finally:
            self.add(name, time.monotonic() - started)

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds
        self.counts[name] = self.counts.get(name, 0) + 1

    def as_dict(self) -> dict[str, float]:
        return {name: round(value, 4) for name, value in self.seconds.items()}

    def count_c_builds(self) -> None:
        """Time every host C compiler run Triton makes (phase ``triton_c_build``). Installed by the
        worker before the candidate is imported, like the audit's hooks; the wrapper only adds
        to this clock and calls the original."""
        for module_name, attribute in _C_BUILD_FUNCTIONS:
            module = sys.modules.get(module_name)
            original = getattr(module, attribute, None) if module is not None else None
            if original is None or getattr(original, "_phase_clock_wrapped", False):
                continue
            setattr(module, attribute, self._timed(original))

    def _timed(self, original):
        clock = self

        def timed_build(*args, **kwargs):
            with clock.phase("triton_c_build"):
                return original(*args, **kwargs)

        timed_build._phase_clock_wrapped = True
        return timed_build


def sanitize_phases(value: Any) -> dict[str, float]:
    """Phase seconds from a worker's status: identifier-like names, finite non-negative numbers."""
    if not isinstance(value, dict):
        return {}
    kept: dict[str, float] = {}
    for name, seconds in list(value.items())[:_MAX_PHASES]:
        if isinstance(name, str) and _PHASE_NAME.match(name) and isinstance(seconds, (int, float)) \
                and not isinstance(seconds, bool) and 0 <= seconds < 1e6:
            kept[name] = float(seconds)
    return kept
