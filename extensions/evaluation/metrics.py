"""KernelBench metrics from per-sample records.

Rates are percentages (0-100) over all samples of the evaluated tasks (skipped tasks excluded):

    valid_rate     passed the static stage (code extracted, policy check passed)
    compiled_rate  passed the compile stage
    correct_rate   correct with Triton doing the work (KernelBench fast_0)
    fast_1, fast_1.5   correct AND speedup > p, over all samples (KernelBench fast_p); null with a
                   reason when there was no timing (CPU: the Triton interpreter is not timed)
    geomean_speedup    geometric mean speedup over correct samples that were timed
    pass@k         unbiased estimator averaged over tasks, for every k the sample count allows

``recompute_metrics(report)`` rebuilds the stored metrics from the report's own records.
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Optional, Sequence

from .records import TaskRecord
from .stats import allowed_ks, geometric_mean, pass_at_k

FAST_P_THRESHOLDS = {"fast_1": 1.0, "fast_1.5": 1.5}
# Kept in step with extensions.verify.result.STAGES (asserted in the tests) without importing the
# verifier package here.
FUNNEL_STAGES = ("none", "extract", "static", "compile", "tiny", "full", "timing")


def _percent(count: int, total: int) -> Optional[float]:
    return None if total == 0 else 100.0 * count / total


def _reached(stage: str, threshold: str) -> bool:
    return FUNNEL_STAGES.index(stage) >= FUNNEL_STAGES.index(threshold)


def metrics_block(tasks: Sequence[TaskRecord], timing_available: bool,
                  no_timing_reason: str = "no timing was measured") -> dict[str, Any]:
    """Metrics for one group of tasks (the whole report, or one level)."""
    samples = [s for t in tasks for s in t.samples]
    total = len(samples)
    correct = [s for s in samples if s.correct]
    block: dict[str, Any] = {
        "num_tasks": len(tasks),
        "num_samples": total,
        "num_correct": len(correct),
        "valid_rate": _percent(sum(_reached(s.stage, "static") for s in samples), total),
        "compiled_rate": _percent(sum(_reached(s.stage, "compile") for s in samples), total),
        "correct_rate": _percent(len(correct), total),
        "mean_reward": None if total == 0 else sum(s.reward for s in samples) / total,
    }

    timed = [s.speedup for s in correct if s.speedup is not None]
    if timing_available:
        for key, p in FAST_P_THRESHOLDS.items():
            block[key] = _percent(sum(1 for s in correct if s.speedup is not None and s.speedup > p), total)
        block["fast_p_note"] = None
        block["correct_without_timing"] = len(correct) - len(timed)
    else:
        for key in FAST_P_THRESHOLDS:
            block[key] = None
        block["fast_p_note"] = no_timing_reason
    block["geomean_speedup"] = geometric_mean(timed) if timed else None
    block["geomean_speedup_note"] = (
        None if timed else (no_timing_reason if not timing_available else "no correct sample was timed")
    )

    counts = [len(t.samples) for t in tasks if t.samples]
    for k in allowed_ks(min(counts)) if counts else []:
        per_task = [pass_at_k(len(t.samples), sum(s.correct for s in t.samples), k) for t in tasks]
        block[f"pass@{k}"] = 100.0 * sum(per_task) / len(per_task)

    block["stage_counts"] = {stage: sum(1 for s in samples if s.stage == stage) for stage in FUNNEL_STAGES}
    block["reached_counts"] = {stage: sum(1 for s in samples if _reached(s.stage, stage)) for stage in FUNNEL_STAGES}
    block["flag_counts"] = dict(sorted(Counter(flag for s in samples for flag in set(s.flags)).items()))
    return block


def compute_metrics(tasks: Sequence[TaskRecord], timing_available: bool,
                    no_timing_reason: str = "no timing was measured") -> dict[str, Any]:
    """Overall metrics plus the same metrics per KernelBench level (``per_level``, keyed "1", "2"...)."""
    metrics = metrics_block(tasks, timing_available, no_timing_reason)
    levels = sorted({t.level for t in tasks}, key=lambda lv: (lv is None, lv if lv is not None else 0))
    metrics["per_level"] = {
        str(level): metrics_block([t for t in tasks if t.level == level], timing_available, no_timing_reason)
        for level in levels
    }
    return metrics


def recompute_metrics(report: dict[str, Any]) -> dict[str, Any]:
    """The metrics of an evaluation report, rebuilt from its per-task records alone."""
    verification = report.get("verification") or {}
    tasks = [TaskRecord.from_dict(t) for t in report.get("tasks", [])]
    return compute_metrics(
        tasks, bool(verification.get("timing")),
        verification.get("no_timing_reason") or "no timing was measured",
    )
