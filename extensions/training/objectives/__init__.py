"""RL objectives, one module each; ``make_objective`` picks the one ``rl.algorithm`` names.

``best_of_n`` (expert iteration), ``grpo``, ``rloo``, ``reinforce`` (clipped token-level policy
gradient with group-relative, leave-one-out or running-baseline advantages) and ``reward_weighted``
(reward-weighted SFT). They share the round loop of ``extensions.training.rl``.
"""
from __future__ import annotations

from .base import Objective, RoundRollouts, UpdateContext

ALGORITHMS = ("best_of_n", "grpo", "rloo", "reinforce", "reward_weighted")


def make_objective(cfg) -> Objective:
    algorithm = cfg.rl.algorithm
    if algorithm == "best_of_n":
        from .best_of_n import BestOfN

        return BestOfN(cfg.rl, cfg.sft.max_seq_len)
    if algorithm == "grpo":
        from .grpo import GRPO

        return GRPO(cfg.rl)
    if algorithm == "rloo":
        from .rloo import RLOO

        return RLOO(cfg.rl)
    if algorithm == "reinforce":
        from .reinforce import Reinforce

        return Reinforce(cfg.rl)
    if algorithm == "reward_weighted":
        from .reward_weighted import RewardWeighted

        return RewardWeighted(cfg.rl)
    raise ValueError(f"rl.algorithm {algorithm!r} is not one of {', '.join(ALGORITHMS)}")


__all__ = ["ALGORITHMS", "Objective", "RoundRollouts", "UpdateContext", "make_objective"]
