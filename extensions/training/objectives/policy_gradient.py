"""What the token-level objectives share: per-sample weights (advantages or reward weights) in, the
update of ``policy_update`` out, with the round's advantage statistics.

A subclass says how a round's rewards become one weight per sample (``sample_weights``); a sample
whose weight is exactly 0 adds nothing to the gradient and is not trained on (for GRPO and RLOO,
every sample of a group with equal rewards), and the count of such samples is reported.

In a multi-turn round (``rl.max_turns`` > 1) every turn is a sample: its reward is its discounted
return over the rest of its trajectory, its prompt the one that turn was sampled from
(``RoundRollouts.prompt_ids_for``), and a task's group holds every turn of its trajectories.
"""
from __future__ import annotations

import time
from typing import Any, Sequence

from ..rollouts import Candidate
from .base import Objective, RoundRollouts, UpdateContext, group_statistics
from .policy_update import PolicyUpdate, TrainSequence, UpdateSettings, summarise_steps
from .token_loss import ClipSettings

HISTOGRAM_BINS = 20


def histogram(values: Sequence[float], bins: int = HISTOGRAM_BINS) -> dict[str, list]:
    """Equal-width bin edges and counts (JSONL form of TensorBoard's histogram)."""
    if not values:
        return {"edges": [], "counts": []}
    low, high = min(values), max(values)
    if high - low <= 0:
        return {"edges": [low, high], "counts": [len(values)]}
    width = (high - low) / bins
    counts = [0] * bins
    for v in values:
        counts[min(bins - 1, int((v - low) / width))] += 1
    return {"edges": [low + i * width for i in range(bins + 1)], "counts": counts}


class TokenObjective(Objective):
    loss = "clipped"

    def __init__(self, rl_cfg):
        self.rl = rl_cfg

    def sample_weights(self, candidates: Sequence[Candidate]) -> list[float]:
        """One weight per candidate (same order)."""
        raise NotImplementedError

    def update_settings(self) -> UpdateSettings:
        rl = self.rl
        return UpdateSettings(loss=self.loss, temperature=rl.temperature if rl.temperature > 0 else 1.0,
                              epochs=rl.ppo_epochs, normalization=rl.loss_normalization,
                              clip=ClipSettings(rl.clip_eps_low, rl.clip_eps_high, rl.beta))

    def update(self, ctx: UpdateContext, rollouts: RoundRollouts) -> dict[str, Any]:
        candidates = rollouts.candidates
        weights = self.sample_weights(candidates)
        sequences = [TrainSequence(rollouts.prompt_ids_for(c), c.token_ids, c.logprobs, w)
                     for c, w in zip(candidates, weights) if w != 0.0 and c.token_ids]
        stats: dict[str, Any] = {**group_statistics(candidates), "zero_weight_samples": len(candidates) - len(sequences),
                                 "trained_samples": len(sequences)}
        stats.update(_distribution("advantage", weights))
        stats["advantage_histogram"] = histogram(weights)
        ctx.distributions["advantage"] = list(weights)
        started = time.perf_counter()
        history = []
        if len(sequences) < ctx.dist.world_size:
            if ctx.dist.is_main:
                print(f"[rl] round {rollouts.round_index}: {len(sequences)} sample(s) with a non-zero "
                      f"{'weight' if self.loss == 'weighted_nll' else 'advantage'} ({stats['zero_spread_groups']} of "
                      f"{stats['groups']} groups without reward spread); the adapter is unchanged this round", flush=True)
        else:
            history = PolicyUpdate(ctx, self.update_settings()).run(
                sequences, seed=ctx.cfg.run.seed + rollouts.round_index, round_index=rollouts.round_index)
        stats.update(summarise_steps(history, time.perf_counter() - started))
        return stats


def _distribution(name: str, values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {}
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / len(values)
    return {f"{name}_mean": mean, f"{name}_std": var ** 0.5, f"{name}_min": min(values), f"{name}_max": max(values)}
