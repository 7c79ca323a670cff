"""Reward-weighted SFT: the SFT loss of every sample, weighted by its normalised reward.

w_i = r_i / mean(r) over the round's samples (so the round's mean weight is 1 and the learning rate
means what it means for SFT); samples with reward 0 weigh nothing and are not trained on. The loss
is the cross-entropy of the sampled tokens (temperature 1), normalised like the policy-gradient
losses (``rl.loss_normalization``); no ratio, no clipping. Passes per round: ``rl.ppo_epochs``.
"""
from __future__ import annotations

from typing import Sequence

from .policy_gradient import TokenObjective
from .policy_update import UpdateSettings


def reward_weights(rewards: Sequence[float]) -> list[float]:
    mean = sum(rewards) / len(rewards) if rewards else 0.0
    if mean <= 0:
        return [0.0] * len(rewards)
    return [max(0.0, r) / mean for r in rewards]


class RewardWeighted(TokenObjective):
    name = "reward_weighted"
    loss = "weighted_nll"

    def sample_weights(self, candidates):
        return reward_weights([c.reward for c in candidates])

    def update_settings(self) -> UpdateSettings:
        settings = super().update_settings()
        settings.temperature = 1.0  # the SFT loss, not the sampling distribution
        return settings
