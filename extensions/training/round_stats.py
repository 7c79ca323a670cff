"""Statistics of one RL round's judged candidates, for its metrics and its checkpoint."""
from __future__ import annotations

import statistics
from typing import Any, Sequence

from ..verify.result import STAGES, stage_rank
from .rollouts import Candidate


def round_statistics(candidates: Sequence[Candidate]) -> dict[str, Any]:
    """Reward mean/std/min/max, share of candidates reaching each verifier stage, reward and correct
    rate per level."""
    judged = [c for c in candidates if c.result is not None]
    rewards = [c.reward for c in judged]
    reached = {stage: 0 for stage in STAGES[1:]}
    for c in judged:
        rank = stage_rank(c.result.get("stage", "none")) if c.result.get("stage") in STAGES else 0
        for stage in STAGES[1:]:
            if rank >= stage_rank(stage):
                reached[stage] += 1
    levels: dict[int, list[Candidate]] = {}
    for c in judged:
        levels.setdefault(c.level, []).append(c)
    return {
        "candidates": len(candidates),
        "judged": len(judged),
        "reward_mean": statistics.fmean(rewards) if rewards else 0.0,
        "reward_std": statistics.pstdev(rewards) if len(rewards) > 1 else 0.0,
        "reward_min": min(rewards) if rewards else 0.0,
        "reward_max": max(rewards) if rewards else 0.0,
        "correct": sum(c.correct for c in judged),
        "stage_pass_rate": {stage: (n / len(judged) if judged else 0.0) for stage, n in reached.items()},
        "correct_rate_by_level": {str(level): sum(c.correct for c in items) / len(items) for level, items in sorted(levels.items())},
        "reward_mean_by_level": {str(level): statistics.fmean(c.reward for c in items) for level, items in sorted(levels.items())},
        "completion_tokens_mean": statistics.fmean(len(c.token_ids) for c in candidates) if candidates else 0.0,
    }
