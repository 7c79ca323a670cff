"""GRPO: group-relative advantages with a clipped token-level loss.

Per task, the N samples' rewards r_i give A_i = (r_i - mean(r)) / (std(r) + eps), std the sample
standard deviation (n - 1); with ``rl.scale_advantages: false`` A_i = r_i - mean(r) (Dr. GRPO: the
division favours tasks whose rewards barely differ). A group whose rewards are all equal gets A = 0
and trains nothing.
"""
from __future__ import annotations

import statistics
from typing import Sequence

from .base import groups_by_task, zero_spread
from .policy_gradient import TokenObjective

STD_EPS = 1e-4


def grpo_advantages(rewards: Sequence[float], *, scale: bool) -> list[float]:
    if len(rewards) < 2 or zero_spread(rewards):
        return [0.0] * len(rewards)
    mean = statistics.fmean(rewards)
    if not scale:
        return [r - mean for r in rewards]
    std = statistics.stdev(rewards)
    return [(r - mean) / (std + STD_EPS) for r in rewards]


class GRPO(TokenObjective):
    name = "grpo"

    def sample_weights(self, candidates):
        advantage = {}
        for group in groups_by_task(candidates).values():
            for c, a in zip(group, grpo_advantages([c.reward for c in group], scale=self.rl.scale_advantages)):
                advantage[c.key] = a
        return [advantage[c.key] for c in candidates]
