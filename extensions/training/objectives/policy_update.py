"""The token-level update shared by the policy-gradient objectives and reward-weighted SFT.

It trains on the exact sampled sequences (prompt ids + sampled ids) with the sampling policy's
log-probabilities from the rollouts, so no forward pass of an "old" policy is needed. A round's
trained sequences are shuffled (seeded by round and pass) and cut into optimizer steps of
``per_device_batch_size x gradient_accumulation_steps x processes`` sequences; each rank runs its
round-robin share of a step in micro-batches of ``per_device_batch_size``, and the gradient is that
of the step's normalised loss (``token_loss``) over every rank. A last step too small to give every
rank a sequence joins the step before it.

Dropout is off during the update (the model stays in training mode, so gradient checkpointing still
applies): the first pass's importance ratio is then 1 up to numerics instead of dropout noise.
The KL reference (``beta > 0``) is the same model with its adapters disabled (peft's
``disable_adapter()``), so no second model is held in memory.
"""
from __future__ import annotations

import contextlib
import random
import time
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from .base import UpdateContext
from .token_loss import ClipSettings, clipped_token_loss, normalisation_coefficients, weighted_nll_token_loss


@dataclass
class TrainSequence:
    prompt_ids: list[int]
    completion_ids: list[int]
    old_logprobs: list[float]  # sampling policy, one per completion token
    weight: float  # the advantage (policy gradient) or the reward weight (reward-weighted SFT)


def plan_steps(count: int, per_step: int, world_size: int, seed: int) -> list[list[int]]:
    """Shuffled sequence indices cut into optimizer steps; every step gives each rank >= 1 sequence."""
    if count < world_size:
        return []
    order = list(range(count))
    random.Random(seed).shuffle(order)
    per_step = max(per_step, world_size)
    steps = [order[i:i + per_step] for i in range(0, count, per_step)]
    if len(steps) > 1 and len(steps[-1]) < world_size:
        steps[-2].extend(steps.pop())
    return steps


def collate_sequences(sequences: Sequence[TrainSequence], pad_token_id: int) -> dict[str, Any]:
    """Right-padded prompt+completion rows with next-token targets and the sampled log-probs.

    Position j of ``targets``/``mask``/``old_logprobs`` is the prediction of token j + 1; ``mask``
    marks the completion's tokens.
    """
    import torch

    width = max(len(s.prompt_ids) + len(s.completion_ids) for s in sequences)
    batch = len(sequences)
    input_ids = torch.full((batch, width), pad_token_id, dtype=torch.long)
    attention = torch.zeros((batch, width), dtype=torch.long)
    targets = torch.zeros((batch, width - 1), dtype=torch.long)
    mask = torch.zeros((batch, width - 1), dtype=torch.bool)
    old = torch.zeros((batch, width - 1), dtype=torch.float32)
    for row, s in enumerate(sequences):
        if len(s.old_logprobs) != len(s.completion_ids):
            raise ValueError(f"{len(s.completion_ids)} completion tokens but {len(s.old_logprobs)} log-probs")
        ids = list(s.prompt_ids) + list(s.completion_ids)
        input_ids[row, :len(ids)] = torch.tensor(ids)
        attention[row, :len(ids)] = 1
        first, last = len(s.prompt_ids) - 1, len(ids) - 1  # predictions of the completion's tokens
        targets[row, :last] = torch.tensor(ids[1:])
        mask[row, first:last] = True
        old[row, first:last] = torch.tensor(s.old_logprobs, dtype=torch.float32)
    weights = torch.tensor([s.weight for s in sequences], dtype=torch.float32)
    return {"input_ids": input_ids, "attention_mask": attention, "targets": targets, "mask": mask,
            "old_logprobs": old, "weights": weights}


def token_logprobs(model, batch: dict, temperature: float, *, with_entropy: bool = False):
    """log_softmax(logits / temperature) of each target token, (batch, width - 1) fp32; and the
    entropy of the tempered distribution per position (no gradient) when asked."""
    import torch

    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False).logits
    scaled = logits[:, :-1, :].float() / temperature
    normaliser = torch.logsumexp(scaled, dim=-1)
    chosen = scaled.gather(-1, batch["targets"][..., None]).squeeze(-1) - normaliser
    entropy = None
    if with_entropy:
        with torch.no_grad():
            probs = torch.softmax(scaled, dim=-1)
            entropy = normaliser - (probs * scaled).sum(dim=-1)
    return chosen, entropy


@contextlib.contextmanager
def dropout_disabled(model):
    import torch

    layers = [m for m in model.modules() if isinstance(m, torch.nn.Dropout)]
    saved = [m.p for m in layers]
    try:
        for m in layers:
            m.p = 0.0
        yield
    finally:
        for m, p in zip(layers, saved):
            m.p = p


@dataclass
class UpdateSettings:
    loss: str  # "clipped" (policy gradient) | "weighted_nll" (reward-weighted SFT)
    temperature: float  # the distribution the log-probs are taken under
    epochs: int
    normalization: str = "token"
    clip: ClipSettings = field(default_factory=ClipSettings)


class PolicyUpdate:
    def __init__(self, ctx: UpdateContext, settings: UpdateSettings):
        self.ctx = ctx
        self.settings = settings
        self.trainer = ctx.trainer
        self.dist = ctx.dist

    def _device(self):
        unwrapped = self.dist.unwrap(self.trainer.model)
        return next(unwrapped.parameters()).device if hasattr(unwrapped, "hf_device_map") else self.dist.device

    def run(self, sequences: Sequence[TrainSequence], *, seed: int, round_index: int) -> list[dict]:
        """Every pass over ``sequences``; returns each optimizer step's statistics (logged as steps
        ``round_index x 100000 + n``, like Best-of-N's)."""
        from tqdm.auto import tqdm

        t = self.trainer.settings
        per_step = t.per_device_batch_size * t.gradient_accumulation_steps * self.dist.world_size
        plans = [plan_steps(len(sequences), per_step, self.dist.world_size, seed * 1000 + epoch)
                 for epoch in range(max(1, self.settings.epochs))]
        total = sum(len(p) for p in plans)
        history = []
        bar = tqdm(total=total, desc="rl update", unit="step", disable=not (self.ctx.progress and self.dist.is_main))
        try:
            with dropout_disabled(self.dist.unwrap(self.trainer.model)):
                for epoch, steps in enumerate(plans):
                    for step in steps:
                        self.ctx.check_signal()
                        stats = self.train_step([sequences[i] for i in step])
                        stats["epoch"] = epoch
                        history.append(stats)
                        self.ctx.metrics.log(round_index * 100_000 + len(history), {"round": round_index, **stats})
                        bar.update(1)
        finally:
            bar.close()
        return history

    def micro_batch_loss(self, model, batch: dict, step_tokens: int, step_sequences: int):
        """(loss share of this micro-batch, summed statistics) for one collated micro-batch."""
        import torch

        s = self.settings
        new, entropy = token_logprobs(model, batch, s.temperature, with_entropy=True)
        mask = batch["mask"]
        coefficients = normalisation_coefficients(mask, s.normalization, step_tokens, step_sequences)
        stats = {"tokens": float(mask.sum()), "entropy_sum": float((entropy * mask).sum())}
        if s.loss == "clipped":
            ref = None
            if s.clip.beta > 0:
                unwrapped = self.dist.unwrap(model)
                with torch.no_grad(), unwrapped.disable_adapter():
                    ref, _ = token_logprobs(unwrapped, batch, s.temperature)
            token_loss, clipped, ratio = clipped_token_loss(new, batch["old_logprobs"], batch["weights"], s.clip, ref)
            with torch.no_grad():
                log_ratio = (new - batch["old_logprobs"]).detach()
                stats["clipped_sum"] = float((clipped & mask).sum())
                stats["approx_kl_sum"] = float(((torch.exp(log_ratio) - 1 - log_ratio) * mask).sum())
                if ref is not None:
                    delta = ref - new.detach()
                    stats["ref_kl_sum"] = float(((torch.exp(delta) - delta - 1) * mask).sum())
        elif s.loss == "weighted_nll":
            token_loss = weighted_nll_token_loss(new, batch["weights"])
        else:
            raise ValueError(f"unknown update loss {s.loss!r}")
        # Padding positions can hold extreme values; a 0 coefficient must not meet an inf there.
        loss = (torch.where(mask, token_loss, torch.zeros_like(token_loss)) * coefficients).sum()
        return loss, stats

    def train_step(self, step: Sequence[TrainSequence]) -> dict:
        import torch

        started = time.perf_counter()
        dist, trainer = self.dist, self.trainer
        trainer.model.train()
        step_tokens = sum(len(s.completion_ids) for s in step)
        mine = list(step[dist.rank::dist.world_size])
        size = max(1, trainer.settings.per_device_batch_size)
        micro_batches = [mine[i:i + size] for i in range(0, len(mine), size)]
        device = self._device()
        totals: dict[str, float] = {"loss": 0.0, "tokens": 0.0, "entropy_sum": 0.0, "clipped_sum": 0.0,
                                    "approx_kl_sum": 0.0, "ref_kl_sum": 0.0, "all_tokens": 0.0}
        for index, micro in enumerate(micro_batches):
            batch = {k: v.to(device) for k, v in collate_sequences(micro, trainer.pad_token_id).items()}
            last = index == len(micro_batches) - 1
            sync = contextlib.nullcontext() if last or dist.world_size == 1 else dist.accelerator.no_sync(trainer.model)
            with sync:
                with trainer.autocast():
                    loss, stats = self.micro_batch_loss(trainer.model, batch, step_tokens, len(step))
                # DDP averages gradients over ranks; the world-size factor turns that into the sum.
                dist.accelerator.backward(loss * dist.world_size)
            totals["loss"] += float(loss.detach())
            totals["all_tokens"] += float(batch["attention_mask"].sum())
            for key, value in stats.items():
                totals[key] += value
        grad_norm = torch.nn.utils.clip_grad_norm_(trainer.params, trainer.settings.max_grad_norm)
        lr = trainer.scheduler.get_last_lr()[0]
        trainer.optimizer.step()
        trainer.scheduler.step()
        trainer.optimizer.zero_grad(set_to_none=True)
        keys = sorted(totals)
        summed = dict(zip(keys, dist.sum([totals[k] for k in keys])))
        tokens = max(1.0, summed["tokens"])
        elapsed = time.perf_counter() - started
        result = {
            "loss": summed["loss"], "lr": lr, "grad_norm": float(grad_norm), "sequences": len(step),
            "completion_tokens": int(summed["tokens"]), "tokens": int(summed["all_tokens"]),
            "entropy": summed["entropy_sum"] / tokens, "tokens_per_s": summed["all_tokens"] / max(elapsed, 1e-9),
            "step_seconds": elapsed,
        }
        if self.settings.loss == "clipped":
            result["clip_fraction"] = summed["clipped_sum"] / tokens
            result["approx_kl"] = summed["approx_kl_sum"] / tokens
            if self.settings.clip.beta > 0:
                result["ref_kl"] = summed["ref_kl_sum"] / tokens
        return result


def summarise_steps(history: Sequence[dict], seconds: float) -> dict[str, Optional[float]]:
    """A round's update statistics from its steps: means, and training tokens per second."""
    def mean(key):
        values = [h[key] for h in history if key in h]
        return sum(values) / len(values) if values else None

    tokens = sum(h["tokens"] for h in history)
    return {"train_steps": len(history), "train_loss_mean": mean("loss"), "clip_fraction": mean("clip_fraction"),
            "approx_kl": mean("approx_kl"), "ref_kl": mean("ref_kl"), "entropy": mean("entropy"),
            "grad_norm_mean": mean("grad_norm"), "train_tokens": tokens,
            "train_tokens_per_s": tokens / seconds if seconds > 0 and tokens else None}
