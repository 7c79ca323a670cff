"""RL objectives, one module each; ``make_objective`` picks the one ``rl.algorithm`` names.

``best_of_n`` (expert iteration), ``grpo``, ``rloo``, ``reinforce`` (clipped token-level policy
gradient with group-relative, leave-one-out or running-baseline advantages) and ``reward_weighted``
(reward-weighted SFT). They share the round loop of ``extensions.training.rl``.
"""
from __future__ import annotations

from ...config.sections import PipelineConfig
from .base import Objective, RoundRollouts, UpdateContext

ALGORITHMS = ("best_of_n", "grpo", "rloo", "reinforce", "reward_weighted")


def check_rl_settings(rl) -> None:
    """Refuse settings an objective cannot train with, naming the key."""
    problems = []
    if rl.algorithm != "best_of_n" and rl.temperature <= 0:
        problems.append(f"rl.temperature must be > 0 for {rl.algorithm} (greedy samples carry no policy gradient)")
    if rl.ppo_epochs < 1:
        problems.append(f"rl.ppo_epochs must be >= 1, got {rl.ppo_epochs}")
    if not 0 <= rl.clip_eps_low < 1:
        problems.append(f"rl.clip_eps_low must be in [0, 1), got {rl.clip_eps_low}")
    if rl.clip_eps_high < 0:
        problems.append(f"rl.clip_eps_high must be >= 0, got {rl.clip_eps_high}")
    if rl.beta < 0:
        problems.append(f"rl.beta must be >= 0, got {rl.beta}")
    if rl.max_turns < 1:
        problems.append(f"rl.max_turns must be >= 1, got {rl.max_turns}")
    if not 0.0 <= rl.gamma <= 1.0:
        problems.append(f"rl.gamma must be in [0, 1], got {rl.gamma}")
    if problems:
        raise ValueError("; ".join(problems))


def make_objective(cfg: PipelineConfig) -> Objective:
    check_rl_settings(cfg.rl)
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
