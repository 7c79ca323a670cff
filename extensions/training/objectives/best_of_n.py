"""Best-of-N expert iteration: per task the top ``top_k`` distinct samples with reward >=
``reward_threshold`` are kept, and the adapter is fine-tuned on them with the SFT loss for
``epochs_per_round`` epochs (accumulation shrinks when few were kept; with none, the adapter is
unchanged that round)."""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Optional, Sequence

from ..batching import tokenize_examples
from ..rollouts import Candidate
from ..trainer import OptimSettings, StepPlan
from .base import Objective, RoundRollouts, UpdateContext, group_statistics


def select_top_k(candidates: Sequence[Candidate], top_k: int, threshold: float) -> list[Candidate]:
    """Per task, the ``top_k`` best distinct candidates with reward >= ``threshold``.

    Order: reward descending, then sample index ascending (deterministic ties). A response whose
    text repeats a better one of the same task is skipped so duplicates do not count twice.
    """
    by_task: dict[str, list[Candidate]] = {}
    for candidate in candidates:
        by_task.setdefault(candidate.task_id, []).append(candidate)
    kept = []
    for task_id in sorted(by_task):
        eligible = sorted((c for c in by_task[task_id] if c.result is not None and c.reward >= threshold),
                          key=lambda c: (-c.reward, c.sample_index))
        texts = set()
        for candidate in eligible:
            key = candidate.text.strip()
            if key in texts:
                continue
            texts.add(key)
            kept.append(candidate)
            if len(texts) == top_k:
                break
    return kept


def fit_plan(examples, settings: OptimSettings, seed: int, world_size: int) -> Optional[StepPlan]:
    """A plan for the kept candidates; accumulation shrinks when few were kept (None: too few)."""
    for accumulation in range(settings.gradient_accumulation_steps, 0, -1):
        for batch_size in sorted({settings.per_device_batch_size, 1}, reverse=True):
            trial = dataclasses.replace(settings, gradient_accumulation_steps=accumulation, per_device_batch_size=batch_size)
            plan = StepPlan(examples, trial, seed=seed, world_size=world_size)
            if plan.steps_per_epoch > 0:
                return plan
    return None


class BestOfN(Objective):
    name = "best_of_n"

    def __init__(self, rl_cfg, max_seq_len: int):
        self.rl = rl_cfg
        self.max_seq_len = max_seq_len

    def update(self, ctx: UpdateContext, rollouts: RoundRollouts) -> dict[str, Any]:
        from tqdm.auto import tqdm

        rl, dist, round_index = self.rl, ctx.dist, rollouts.round_index
        kept = select_top_k(rollouts.candidates, rl.top_k, rl.reward_threshold)
        examples, report = tokenize_examples(ctx.tokenizer, [(rollouts.messages[c.task_id], c.text) for c in kept],
                                             self.max_seq_len, "kept candidates")
        if report.dropped and dist.is_main:
            print(f"[rl] round {round_index}: {report.summary('kept candidates')}", flush=True)
        plan = fit_plan(examples, ctx.trainer.settings, seed=ctx.cfg.run.seed + round_index, world_size=dist.world_size) if examples else None
        losses, tokens = [], 0
        started = time.perf_counter()
        if plan is None:
            if dist.is_main:
                why = (f"no candidate reached reward {rl.reward_threshold}" if not kept
                       else f"{len(examples)} usable of {len(kept)} kept: too few for {dist.world_size} process(es)")
                print(f"[rl] round {round_index}: {why}; the adapter is unchanged this round", flush=True)
        else:
            steps = plan.steps_per_epoch * max(1, rl.epochs_per_round)
            for step in tqdm(range(steps), desc=f"rl round {round_index} training", disable=not (ctx.progress and dist.is_main)):
                ctx.check_signal()
                step_stats = ctx.trainer.train_step(plan, step)
                losses.append(step_stats["loss"])
                tokens += step_stats["tokens"]
                ctx.metrics.log(round_index * 100_000 + step, {"round": round_index, **step_stats})
        seconds = time.perf_counter() - started
        return {**group_statistics(rollouts.candidates), "kept": len(kept), "kept_tasks": len({c.task_id for c in kept}),
                "train_examples": len(examples), "train_steps": len(losses),
                "train_loss_mean": sum(losses) / len(losses) if losses else None, "train_tokens": tokens,
                "train_tokens_per_s": tokens / seconds if tokens and seconds > 0 else None}
