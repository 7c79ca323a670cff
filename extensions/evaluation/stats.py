"""Statistics for evaluation reports: pass@k, geometric mean, paired bootstrap confidence intervals."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Optional, Sequence

# pass@k is reported for every k here that the smallest per-task sample count allows.
PASS_AT_K_CANDIDATES = (1, 5, 10, 20, 50, 100, 200, 500, 1000)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one task with ``n`` samples of which ``c`` are correct, in [0, 1].

    Equals 1 - C(n-c, k) / C(n, k), computed as a product so large n never overflows
    (Chen et al., 2021, "Evaluating Large Language Models Trained on Code").
    """
    if n < 1 or not 0 <= c <= n:
        raise ValueError(f"pass@k needs n >= 1 and 0 <= c <= n; got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass@{k} is undefined with only {n} samples per task")
    if n - c < k:
        return 1.0
    survive = 1.0
    for i in range(n - c + 1, n + 1):
        survive *= 1.0 - k / i
    return 1.0 - survive


def allowed_ks(min_samples_per_task: int) -> list[int]:
    return [k for k in PASS_AT_K_CANDIDATES if k <= min_samples_per_task]


def geometric_mean(values: Sequence[float]) -> Optional[float]:
    """Geometric mean of positive values; None for an empty sequence."""
    if not values:
        return None
    bad = [v for v in values if not (v > 0 and math.isfinite(v))]
    if bad:
        raise ValueError(f"geometric mean needs positive finite values; got {len(bad)} bad, e.g. {bad[0]!r}")
    return math.exp(math.fsum(math.log(v) for v in values) / len(values))


@dataclass
class BootstrapInterval:
    mean: float  # mean paired difference over tasks
    low: Optional[float]
    high: Optional[float]
    num_tasks: int
    significant: bool  # the interval excludes 0
    note: Optional[str] = None

    def to_dict(self) -> dict:
        return asdict(self)


def paired_bootstrap(differences: Sequence[float], num_resamples: int = 2000, seed: int = 0,
                     confidence: float = 0.95) -> BootstrapInterval:
    """Percentile bootstrap interval of the mean of per-task paired differences (tasks resampled)."""
    import numpy as np

    n = len(differences)
    if n == 0:
        return BootstrapInterval(0.0, None, None, 0, False, "no paired tasks")
    values = np.asarray(differences, dtype=np.float64)
    mean = float(values.mean())
    if n < 2:
        return BootstrapInterval(mean, None, None, n, False, "one paired task: no interval")
    rng = np.random.default_rng(seed)
    means = np.empty(num_resamples, dtype=np.float64)
    # Resampling in blocks keeps memory bounded for thousands of tasks.
    block = max(1, 1_000_000 // n)
    for start in range(0, num_resamples, block):
        stop = min(num_resamples, start + block)
        idx = rng.integers(0, n, size=(stop - start, n))
        means[start:stop] = values[idx].mean(axis=1)
    tail = (1.0 - confidence) / 2 * 100
    low, high = (float(x) for x in np.percentile(means, [tail, 100 - tail]))
    significant = not (low <= 0.0 <= high)
    return BootstrapInterval(mean, low, high, n, significant)
