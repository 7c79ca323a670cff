"""Statistics of one RL round's judged candidates, for its metrics and its checkpoint."""
from __future__ import annotations

import math
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


def round_distributions(candidates: Sequence[Candidate]) -> dict[str, list[float]]:
    """Per-candidate values the round logs as histograms: ``reward`` of every judged candidate,
    ``speedup`` of every correct one whose speedup was measured (finite values only)."""
    judged = [c for c in candidates if c.result is not None]
    speedups = [float(c.result["speedup"]) for c in judged
                if c.correct and isinstance(c.result.get("speedup"), (int, float))]
    return {"reward": [c.reward for c in judged], "speedup": [s for s in speedups if math.isfinite(s)]}


def _stage_index(candidate: Candidate) -> int:
    stage = candidate.result.get("stage") if candidate.result else None
    return stage_rank(stage) if stage in STAGES else 0


def _reached(candidate: Candidate, stage: str) -> bool:
    return _stage_index(candidate) >= stage_rank(stage)


def _rate(items: Sequence, test) -> float:
    return sum(bool(test(item)) for item in items) / len(items) if items else 0.0


def multiturn_statistics(candidates: Sequence[Candidate], max_turns: int, max_prompt_tokens: int) -> dict[str, Any]:
    """Trajectory-level statistics of a multi-turn round (every candidate is one turn).

    ``success_rate``: share of trajectories with a correct answer (they stop there);
    ``average_turns_used``; per turn t, of the answers given in turn t, ``compile_rate`` and
    ``correct_rate``, and ``solved_share``, the share of all trajectories solved by turn t; the best
    answer of each trajectory: ``best_stage_share`` (share whose best answer reached each verifier
    stage) and ``best_reward_mean``; ``prompt_turns_dropped`` (earlier turns left out of prompts to
    fit ``prompt.max_prompt_tokens``) and ``prompts_over_budget`` (prompts still above it).
    """
    trajectories: dict[tuple[str, int], list[Candidate]] = {}
    for candidate in candidates:
        trajectories.setdefault((candidate.task_id, candidate.sample_index), []).append(candidate)
    turns_of = list(trajectories.values())
    per_turn = {}
    for turn in range(1, max_turns + 1):
        answered = [c for c in candidates if c.turn == turn]
        per_turn[str(turn)] = {
            "answered": len(answered),
            "compile_rate": _rate(answered, lambda c: _reached(c, "compile")),
            "correct_rate": _rate(answered, lambda c: c.correct),
            "solved_share": _rate(turns_of, lambda turns: any(c.correct and c.turn <= turn for c in turns)),
        }
    best = [max(turns, key=lambda c: (c.correct, _stage_index(c), c.reward)) for turns in turns_of]
    levels: dict[int, list[list[Candidate]]] = {}
    for turns in turns_of:
        levels.setdefault(turns[0].level, []).append(turns)
    return {
        "max_turns": max_turns,
        "trajectories": len(turns_of),
        "success_rate": _rate(turns_of, lambda turns: any(c.correct for c in turns)),
        "average_turns_used": statistics.fmean(len(turns) for turns in turns_of) if turns_of else 0.0,
        "per_turn": per_turn,
        "best_stage_share": {stage: _rate(best, lambda c, s=stage: _reached(c, s)) for stage in STAGES[1:]},
        "best_reward_mean": statistics.fmean(c.reward for c in best) if best else 0.0,
        "success_rate_by_level": {str(level): _rate(items, lambda turns: any(c.correct for c in turns))
                                  for level, items in sorted(levels.items())},
        "prompt_turns_dropped": sum(c.turns_dropped for c in candidates),
        "prompts_over_budget": sum(1 for c in candidates if c.prompt_tokens is not None and c.prompt_tokens > max_prompt_tokens),
    }
