"""Statistics of paired timing trials: robust centres, spread, and a bootstrap CI of the speedup.

Pure Python + NumPy so every number the timer reports can be checked on a CPU.

The speedup of one measurement is a median of per-pair ratios ``ref_i / cand_i``: each pair was
timed back to back, so clock and thermal drift that move both times cancel in the ratio, and the
median ignores the odd trial hit by an outside disturbance. Pairs alternate which model runs first;
when the order is known, each pair is joined with the next one of the other order into a block
whose ratio is the geometric mean of the two, and the median is taken over blocks. A first-call
(or second-call) effect then cancels inside every block instead of splitting the ratios into two
clusters, between which a plain median jumps from run to run. Its precision is the bootstrap over
blocks: ``cv`` is the standard deviation of the bootstrap medians over the estimate (the relative
standard error of the reported speedup), ``trial_cv`` is the spread of single ratios.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

# Event timers resolve about half a microsecond; a time below this is a measurement artefact and
# would make a ratio explode.
MIN_TIME_MS = 1e-4


def median(values: Sequence[float]) -> float:
    if len(values) == 0:
        raise ValueError("median of an empty sequence")
    return float(np.median(np.asarray(values, dtype=np.float64)))


def trimmed_mean(values: Sequence[float], proportion: float = 0.1) -> float:
    """Mean after dropping ``proportion`` of the values at each end (10% by default)."""
    if len(values) == 0:
        raise ValueError("trimmed mean of an empty sequence")
    if not 0.0 <= proportion < 0.5:
        raise ValueError(f"trim proportion must be in [0, 0.5), got {proportion}")
    ordered = np.sort(np.asarray(values, dtype=np.float64))
    cut = int(math.floor(proportion * len(ordered)))
    kept = ordered[cut: len(ordered) - cut] if cut else ordered
    return float(kept.mean())


def coefficient_of_variation(values: Sequence[float]) -> float:
    """Sample standard deviation over the mean; NaN with fewer than two values or a zero mean."""
    data = np.asarray(values, dtype=np.float64)
    if len(data) < 2:
        return float("nan")
    mean = data.mean()
    if mean == 0:
        return float("nan")
    return float(data.std(ddof=1) / abs(mean))


def paired_ratios(ref_ms: Sequence[float], cand_ms: Sequence[float]) -> np.ndarray:
    if len(ref_ms) != len(cand_ms):
        raise ValueError(f"paired trials differ in length: {len(ref_ms)} reference vs {len(cand_ms)} candidate")
    if len(ref_ms) == 0:
        raise ValueError("no paired trials")
    ref = np.maximum(np.asarray(ref_ms, dtype=np.float64), MIN_TIME_MS)
    cand = np.maximum(np.asarray(cand_ms, dtype=np.float64), MIN_TIME_MS)
    return ref / cand


def order_balanced_ratios(ratios: np.ndarray, reference_first: Optional[Sequence[bool]]) -> np.ndarray:
    """Geometric means of consecutive pairs run in opposite orders (one block each); a pair left
    without a partner is dropped, unless no block forms at all. Without orders: the ratios."""
    if reference_first is None:
        return ratios
    if len(reference_first) != len(ratios):
        raise ValueError(f"{len(reference_first)} orders for {len(ratios)} paired trials")
    blocks, index = [], 0
    while index + 1 < len(ratios):
        if bool(reference_first[index]) != bool(reference_first[index + 1]):
            blocks.append(math.sqrt(ratios[index] * ratios[index + 1]))
            index += 2
        else:
            index += 1
    return np.asarray(blocks, dtype=np.float64) if blocks else ratios


def bootstrap_median_ratio(ratios: np.ndarray, samples: int, seed: int) -> np.ndarray:
    """Medians of ``samples`` resamples (with replacement) of the paired ratios."""
    if samples < 1:
        raise ValueError(f"bootstrap needs at least one resample, got {samples}")
    rng = np.random.default_rng(seed)
    n = len(ratios)
    # Chunked so a large trial count never builds a huge index matrix.
    chunk = max(1, 2_000_000 // max(n, 1))
    medians = []
    for start in range(0, samples, chunk):
        rows = min(chunk, samples - start)
        index = rng.integers(0, n, size=(rows, n))
        medians.append(np.median(ratios[index], axis=1))
    return np.concatenate(medians)


@dataclass
class PairedSummary:
    """What one measurement (n paired trials) says about the speedup."""

    trials: int
    speedup: float  # median of ref_i / cand_i
    ci95: tuple[float, float]  # bootstrap percentile interval of that median
    cv: float  # relative standard error of the speedup (bootstrap std / speedup)
    trial_cv: float  # spread of single paired ratios
    ref_median_ms: float
    cand_median_ms: float
    ref_trimmed_ms: float
    cand_trimmed_ms: float
    ref_cv: float
    cand_cv: float


def summarize_pairs(
    ref_ms: Sequence[float],
    cand_ms: Sequence[float],
    *,
    bootstrap_samples: int = 1000,
    seed: int = 0,
    reference_first: Optional[Sequence[bool]] = None,
) -> PairedSummary:
    """``reference_first[i]``: whether pair i ran the reference first (enables order balancing)."""
    ratios = paired_ratios(ref_ms, cand_ms)
    blocks = order_balanced_ratios(ratios, reference_first)
    speedup = float(np.median(blocks))
    if len(blocks) >= 2:
        boot = bootstrap_median_ratio(blocks, bootstrap_samples, seed)
        low, high = np.percentile(boot, [2.5, 97.5])
        ci = (float(low), float(high))
        cv = float(boot.std(ddof=1) / speedup) if bootstrap_samples > 1 else float("nan")
    else:
        ci = (speedup, speedup)
        cv = float("nan")
    return PairedSummary(
        trials=len(ratios),
        speedup=speedup,
        ci95=ci,
        cv=cv,
        trial_cv=coefficient_of_variation(ratios),
        ref_median_ms=median(ref_ms),
        cand_median_ms=median(cand_ms),
        ref_trimmed_ms=trimmed_mean(ref_ms),
        cand_trimmed_ms=trimmed_mean(cand_ms),
        ref_cv=coefficient_of_variation(ref_ms),
        cand_cv=coefficient_of_variation(cand_ms),
    )


def is_stable(summary: PairedSummary, max_cv: float) -> bool:
    """A measurement is stable when the speedup's relative standard error is within ``max_cv``."""
    return math.isfinite(summary.cv) and summary.cv <= max_cv
