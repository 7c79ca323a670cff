"""What one speedup measurement returns to the verifier."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

# Flags a report may carry. The verifier's reward code reads them; keep the names stable.
FLAG_SPEEDUP_REVIEW = "speedup_review"  # above speedup_review_bound: real, or a timer exploit
FLAG_UNSTABLE = "timing_unstable"  # speedup's CV above timing_max_cv after every re-measurement
FLAG_BUDGET_CUT = "timing_budget_cut"  # fewer than timing_num_trials pairs fitted in the budget
FLAG_SIDE_STREAM = "side_stream_suspected"  # work finished after the timed stream: charged in full
FLAG_EVENT_WALL = "event_wall_mismatch"  # event time far below host wall time: wall time charged
FLAG_MEMOIZATION = "memoization_suspected"  # much slower on never-seen inputs: charged that time
FLAG_OUTPUT_REUSED = "output_reused"  # returned the storage of an earlier output: no speedup
FLAG_OUTPUT_MISMATCH = "output_mismatch_during_timing"  # disagreed with the reference: no speedup
FLAG_SINGLE_INPUT_SET = "single_input_set"  # one input set: memoisation cannot be probed

FLAG_TIMER_PATCHED = "timer_patched"  # the clocks or CUDA events the timer reads were replaced
FLAGS_VOIDING_SPEEDUP = (FLAG_OUTPUT_REUSED, FLAG_OUTPUT_MISMATCH, FLAG_TIMER_PATCHED)

# Whether host launch time is inside the timed region (``timing_launch_cost``), as reported.
LAUNCH_EXCLUDED = "excluded"  # the device runs the whole call back to back; host launch time is not timed
LAUNCH_INCLUDED = "included"  # the region opens before forward is called: eager launch time counts
LAUNCH_COSTS = (LAUNCH_EXCLUDED, LAUNCH_INCLUDED)
LAUNCH_MIXED = "mixed"  # excluded was asked for, but some timed calls opened before they were queued


def _finite_or_none(value: Optional[float]) -> Optional[float]:
    if value is None or not math.isfinite(value):
        return None
    return float(value)


@dataclass
class SpeedupReport:
    speedup: Optional[float]  # reference time / candidate time; None when voided by a flag
    flags: list[str] = field(default_factory=list)
    ref_ms: float = float("nan")  # median per-call time of the reference
    cand_ms: float = float("nan")
    ref_trimmed_ms: float = float("nan")  # 10%-trimmed means, for reports that want a mean
    cand_trimmed_ms: float = float("nan")
    ci95: tuple[float, float] = (float("nan"), float("nan"))
    cv: float = float("nan")  # relative standard error of the speedup
    trial_cv: float = float("nan")  # spread of single paired ratios
    stable: bool = False
    trials: int = 0  # paired trials behind the reported numbers
    warmup: int = 0
    remeasures: int = 0
    mode: str = "counts"
    launch_cost: str = LAUNCH_INCLUDED  # whether host launch time is in the reported times
    cut_to_budget: bool = False
    method: str = ""
    elapsed_s: float = 0.0
    measured_speedup: Optional[float] = None  # before any flag lowered or voided it
    details: dict[str, Any] = field(default_factory=dict)
    # The candidate's output of the last timed call and the input set it was computed from: the
    # parent compares it with its own reference output (the worker is not trusted with verdicts).
    last_input_index: Optional[int] = None
    last_output: Any = None
    # Checked calls whose output disagreed with the reference's at a few elements only:
    # ``(input index, per output tensor None or (flat indices, candidate values))``. The caller
    # judges them (``measure_speedup``'s ``localise_outputs``); they void nothing here.
    localised_mismatches: list = field(default_factory=list)
    # Checked calls whose output disagreed more widely: ``(input index, the whole output on the
    # host)``, at most ``schedule.WHOLE_PER_SET`` distinct ones per set; the caller judges them too.
    whole_mismatches: list = field(default_factory=list)

    def add_flag(self, flag: str) -> None:
        if flag not in self.flags:
            self.flags.append(flag)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe summary (no tensors; NaN and infinity become None)."""
        return {
            "speedup": _finite_or_none(self.speedup),
            "flags": list(self.flags),
            "ref_ms": _finite_or_none(self.ref_ms),
            "cand_ms": _finite_or_none(self.cand_ms),
            "ref_trimmed_ms": _finite_or_none(self.ref_trimmed_ms),
            "cand_trimmed_ms": _finite_or_none(self.cand_trimmed_ms),
            "ci95": [_finite_or_none(self.ci95[0]), _finite_or_none(self.ci95[1])],
            "cv": _finite_or_none(self.cv),
            "trial_cv": _finite_or_none(self.trial_cv),
            "stable": bool(self.stable),
            "trials": int(self.trials),
            "warmup": int(self.warmup),
            "remeasures": int(self.remeasures),
            "mode": self.mode,
            "launch_cost": self.launch_cost,
            "cut_to_budget": bool(self.cut_to_budget),
            "method": self.method,
            "elapsed_s": round(float(self.elapsed_s), 4),
            "measured_speedup": _finite_or_none(self.measured_speedup),
            "last_input_index": self.last_input_index,
            "details": self.details,
        }
