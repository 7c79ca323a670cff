"""REINFORCE with a running baseline, clipped token-level loss.

A_i = r_i - b. The baseline b starts at the first round's mean reward and then follows
b <- m b + (1 - m) mean(round rewards) after each round (m = ``rl.baseline_momentum``), so it
tracks the policy's improving reward; it is part of each round checkpoint. Samples of a group with
equal rewards still train (the baseline is not the group's), unless their reward equals b.
"""
from __future__ import annotations

import statistics
from typing import Any, Optional, Sequence

from .policy_gradient import TokenObjective


def reinforce_advantages(rewards: Sequence[float], baseline: float) -> list[float]:
    return [r - baseline for r in rewards]


class Reinforce(TokenObjective):
    name = "reinforce"

    def __init__(self, rl_cfg):
        if not 0.0 <= rl_cfg.baseline_momentum < 1.0:
            raise ValueError(f"rl.baseline_momentum must be in [0, 1), got {rl_cfg.baseline_momentum}")
        super().__init__(rl_cfg)
        self.baseline: Optional[float] = None
        self.baseline_used: Optional[float] = None

    def sample_weights(self, candidates):
        rewards = [c.reward for c in candidates]
        if not rewards:
            return []
        round_mean = statistics.fmean(rewards)
        baseline = round_mean if self.baseline is None else self.baseline
        self.baseline_used = baseline
        m = self.rl.baseline_momentum
        self.baseline = round_mean if self.baseline is None else m * self.baseline + (1 - m) * round_mean
        return reinforce_advantages(rewards, baseline)

    def update(self, ctx, rollouts) -> dict[str, Any]:
        stats = super().update(ctx, rollouts)
        return {**stats, "baseline_used": self.baseline_used, "baseline_next": self.baseline}

    def state_dict(self) -> dict[str, Any]:
        return {"baseline": self.baseline}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.baseline = state.get("baseline")
