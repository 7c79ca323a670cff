"""RLOO: REINFORCE with a leave-one-out baseline, clipped token-level loss.

Per task with N >= 2 samples, A_i = r_i - mean_{j != i} r_j = N / (N - 1) * (r_i - mean(r)): each
sample is judged against the others of its group only, an unbiased baseline that needs no extra
model. A group whose rewards are all equal gets A = 0 and trains nothing.
"""
from __future__ import annotations

from typing import Sequence

from .base import groups_by_task, zero_spread
from .policy_gradient import TokenObjective


def rloo_advantages(rewards: Sequence[float]) -> list[float]:
    n = len(rewards)
    if n < 2 or zero_spread(rewards):
        return [0.0] * n
    total = sum(rewards)
    return [r - (total - r) / (n - 1) for r in rewards]


class RLOO(TokenObjective):
    name = "rloo"

    def __init__(self, rl_cfg):
        if rl_cfg.samples_per_task < 2:
            raise ValueError("rl.algorithm: rloo needs rl.samples_per_task >= 2 (a leave-one-out baseline)")
        super().__init__(rl_cfg)

    def sample_weights(self, candidates):
        advantage = {}
        for group in groups_by_task(candidates).values():
            for c, a in zip(group, rloo_advantages([c.reward for c in group])):
                advantage[c.key] = a
        return [advantage[c.key] for c in candidates]
