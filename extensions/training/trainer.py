"""The optimisation loop shared by SFT and the RL fine-tuning phase: completion-only loss over
planned micro-batches, gradient accumulation, data parallelism, clipping, warm-up + cosine.

The loss of an optimizer step is the mean cross-entropy over every completion token of the step on
every rank (token-weighted, not a mean of micro-batch means), so packed, length-grouped and padded
batches of the same data give the same loss, and a step does not depend on how its tokens were cut
into micro-batches.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Optional, Sequence

from .batching import IGNORE_INDEX, TokenizedExample, batch_target_tokens, batch_tokens, collate, plan_epoch
from .packed_attention import use_packed_attention

log = logging.getLogger(__name__)


@dataclass
class OptimSettings:
    learning_rate: float
    per_device_batch_size: int
    gradient_accumulation_steps: int
    max_seq_len: int
    batching: str = "packed"
    max_grad_norm: float = 1.0
    weight_decay: float = 0.0
    warmup_ratio: float = 0.0
    schedule: str = "cosine"  # cosine (after warm-up) | constant
    # Padded batches are padded up to a multiple of this (None: to their longest example).
    pad_to_multiple_of: Optional[int] = None

    @classmethod
    def from_sft(cls, sft_cfg) -> "OptimSettings":
        return cls(
            learning_rate=sft_cfg.learning_rate, per_device_batch_size=sft_cfg.per_device_batch_size,
            gradient_accumulation_steps=sft_cfg.gradient_accumulation_steps, max_seq_len=sft_cfg.max_seq_len,
            batching=sft_cfg.batching, max_grad_norm=sft_cfg.max_grad_norm, weight_decay=sft_cfg.weight_decay,
            warmup_ratio=sft_cfg.warmup_ratio, schedule="cosine",
        )


def warmup_cosine(step: int, total_steps: int, warmup_steps: int) -> float:
    """LR multiplier: linear warm-up from 0, then cosine decay to 0 at ``total_steps``."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def completion_loss_sum(logits, labels):
    """Summed next-token cross-entropy over positions whose label is not -100 (fp32)."""
    import torch.nn.functional as F

    shifted_logits = logits[:, :-1, :].float()
    shifted_labels = labels[:, 1:].to(logits.device)
    return F.cross_entropy(
        shifted_logits.reshape(-1, shifted_logits.size(-1)), shifted_labels.reshape(-1),
        ignore_index=IGNORE_INDEX, reduction="sum",
    )


def forward_loss_sum(model, batch: dict, device=None):
    """Summed completion loss of one collated micro-batch.

    ``use_cache=False`` matters for packed batches: transformers derives the block-diagonal mask
    from position-id resets only when no KV cache is in play.
    """
    inputs = {k: (v.to(device) if device is not None and hasattr(v, "to") else v) for k, v in batch.items() if k != "labels"}
    logits = model(**inputs, use_cache=False).logits
    return completion_loss_sum(logits, batch["labels"])


class StepPlan:
    """The global micro-batch plan: step s, rank r -> its ``gradient_accumulation_steps`` micro-batches."""

    def __init__(self, examples: Sequence[TokenizedExample], settings: OptimSettings, *, seed: int, world_size: int):
        self.examples = examples
        self.settings = settings
        self.seed = seed
        self.world_size = world_size
        self.lengths = [len(e) for e in examples]
        self.per_step = settings.gradient_accumulation_steps * world_size
        first = self.epoch_batches(0)
        self.steps_per_epoch = len(first) // self.per_step
        self.dropped_per_epoch = len(first) - self.steps_per_epoch * self.per_step
        self._cache = {0: first}

    def epoch_batches(self, epoch: int) -> list[list[list[int]]]:
        s = self.settings
        return plan_epoch(self.lengths, mode=s.batching, batch_size=s.per_device_batch_size,
                          max_seq_len=s.max_seq_len, seed=self.seed, epoch=epoch)

    def step_batches(self, step: int) -> list[list[list[int]]]:
        """All micro-batches of optimizer step ``step`` (every rank's), rank-interleaved."""
        if self.steps_per_epoch == 0:
            raise ValueError("not enough data for one optimizer step")
        epoch, index = divmod(step, self.steps_per_epoch)
        if epoch not in self._cache:
            self._cache = {epoch: self.epoch_batches(epoch)}
        batches = self._cache[epoch]
        return batches[index * self.per_step:(index + 1) * self.per_step]

    def rank_batches(self, step: int, rank: int) -> list[list[list[int]]]:
        return self.step_batches(step)[rank::self.world_size]


class AdapterTrainer:
    """Trains the trainable (LoRA) parameters of ``model`` under ``dist``."""

    def __init__(self, model, dist, settings: OptimSettings, *, pad_token_id: int, total_steps: int):
        import torch

        self.dist = dist
        self.settings = settings
        self.pad_token_id = pad_token_id
        self.total_steps = total_steps
        if settings.batching == "packed":
            problem = use_packed_attention(model, next(model.parameters()).device)
            if problem:
                log.info("packed batches attend through a block-diagonal mask (%s)", problem)
        params = [p for p in model.parameters() if p.requires_grad]
        if not params:
            raise ValueError("the model has no trainable parameters (attach LoRA first)")
        self.optimizer = torch.optim.AdamW(params, lr=settings.learning_rate, weight_decay=settings.weight_decay)
        warmup = int(round(settings.warmup_ratio * total_steps))
        if settings.schedule == "cosine":
            schedule = lambda step: warmup_cosine(step, total_steps, warmup)  # noqa: E731
        else:
            schedule = lambda step: 1.0  # noqa: E731
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, schedule)
        self.params = params
        self.model = dist.accelerator.prepare_model(model) if dist.world_size > 1 else model
        self.autocast = dist.accelerator.autocast

    def _forward_loss_sum(self, batch: dict, *, synced: bool = True):
        """``synced=False`` runs the bare model: DDP's forward broadcasts buffers from rank 0, a
        collective that hangs when only some ranks run a forward (evaluation shards can be empty)."""
        unwrapped = self.dist.unwrap(self.model)
        # A device_map model takes its inputs on the device of its first parameters.
        device = next(unwrapped.parameters()).device if hasattr(unwrapped, "hf_device_map") else self.dist.device
        with self.autocast():
            return forward_loss_sum(self.model if synced else unwrapped, batch, device)

    def train_step(self, plan: StepPlan, step: int) -> dict:
        """One optimizer step; returns loss (global token mean), lr, grad norm, tokens, tokens/s."""
        import contextlib

        import torch

        started = time.perf_counter()
        self.model.train()
        examples = plan.examples
        step_batches = plan.step_batches(step)
        global_targets = sum(batch_target_tokens(b, examples) for b in step_batches)
        global_tokens = sum(batch_tokens(b, examples) for b in step_batches)
        mine = step_batches[self.dist.rank::self.dist.world_size]
        packed = self.settings.batching == "packed"
        # DDP averages gradients over ranks; scaling by world size turns that average into the sum,
        # so the gradient is that of (sum of token losses) / (tokens in the whole step).
        scale = self.dist.world_size / max(1, global_targets)
        local_loss_sum = 0.0
        for index, micro in enumerate(mine):
            batch = collate(micro, examples, pad_token_id=self.pad_token_id, packed=packed,
                            pad_to_multiple_of=None if packed else self.settings.pad_to_multiple_of)
            last = index == len(mine) - 1
            sync = contextlib.nullcontext() if last or self.dist.world_size == 1 else self.dist.accelerator.no_sync(self.model)
            with sync:
                loss_sum = self._forward_loss_sum(batch)
                self.dist.accelerator.backward(loss_sum * scale)
            local_loss_sum += float(loss_sum.detach())
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.settings.max_grad_norm)
        lr = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        total_loss_sum = self.dist.sum([local_loss_sum])[0]
        elapsed = time.perf_counter() - started
        return {
            "loss": total_loss_sum / max(1, global_targets), "lr": lr, "grad_norm": float(grad_norm),
            "tokens": global_tokens, "target_tokens": global_targets, "tokens_per_s": global_tokens / max(elapsed, 1e-9),
            "step_seconds": elapsed,
        }

    def evaluate(self, examples: Sequence[TokenizedExample], *, progress: bool = False) -> Optional[float]:
        """Token-weighted completion loss over ``examples`` (sharded across ranks)."""
        import torch
        from tqdm.auto import tqdm

        if not examples:
            return None
        s = self.settings
        lengths = [len(e) for e in examples]
        batches = plan_epoch(lengths, mode=s.batching, batch_size=s.per_device_batch_size,
                             max_seq_len=s.max_seq_len, seed=0, epoch=0)
        mine = batches[self.dist.rank::self.dist.world_size]
        packed = s.batching == "packed"
        was_training = self.model.training
        self.model.eval()
        loss_sum, targets = 0.0, 0
        with torch.no_grad():
            # leave=False: the validation bar appears under the training bar and goes when it ends.
            for micro in tqdm(mine, desc="validation", unit="batch", leave=False, disable=not progress):
                batch = collate(micro, examples, pad_token_id=self.pad_token_id, packed=packed,
                            pad_to_multiple_of=None if packed else self.settings.pad_to_multiple_of)
                loss_sum += float(self._forward_loss_sum(batch, synced=False))
                targets += batch_target_tokens(micro, examples)
        if was_training:
            self.model.train()
        total_loss, total_targets = self.dist.sum([loss_sum, float(targets)])
        return total_loss / total_targets if total_targets else None
