"""Stage 2: LoRA supervised fine-tuning on KernelBook pairs, resumable to the exact step.

``run_sft`` trains on ``sft_train.jsonl`` (completion-only loss; batching per ``sft.batching``),
evaluates on ``sft_val.jsonl`` every ``eval_every_steps``, checkpoints every ``save_every_steps``
(keeping the newest ``keep_last_checkpoints``) and whenever a ``SaveSignal`` asks, and writes the
final adapter + tokenizer + model card to ``checkpoints/sft/final``. A rerun resumes from the newest complete
checkpoint and reproduces the uninterrupted run's adapter.
"""
from __future__ import annotations

import logging
import math
import time
from typing import Optional

from ..config.sections import PipelineConfig
from ..models.loading import load_tokenizer
from ..runtime import checkpoints
from ..runtime.paths import RunPaths
from . import state as train_state
from .batching import read_sft_jsonl, tokenize_examples
from .distributed import make_dist
from .metrics import MetricsLogger
from .saving import discard_replaced, file_fingerprint, model_card_writer, save_adapter_checkpoint, set_stage_aside
from .stage_common import StageOutcome, prepare_trainable_model, set_seed, skipped_if_finished
from .trainer import AdapterTrainer, OptimSettings, StepPlan

log = logging.getLogger(__name__)


def _total_steps(sft_cfg, steps_per_epoch: int) -> int:
    if sft_cfg.max_steps > 0:
        return sft_cfg.max_steps
    return max(1, math.ceil(sft_cfg.num_epochs * steps_per_epoch))


def run_sft(cfg: PipelineConfig, *, save_signal=None, force: bool = False, progress: bool = True) -> StageOutcome:
    paths = RunPaths.from_config(cfg)
    final_dir = paths.final("sft")
    dist = make_dist(cfg.model)
    skipped = skipped_if_finished("sft", final_dir, dist, force)
    if skipped is not None:
        return skipped
    sft = cfg.sft
    tokenizer = load_tokenizer(cfg.model)
    train_pairs, train_rows = read_sft_jsonl(paths.sft_train)
    train_examples, train_tok = tokenize_examples(tokenizer, train_pairs, sft.max_seq_len, "sft_train", progress and dist.is_main)
    val_examples = []
    if paths.sft_val.is_file():
        val_pairs, val_rows = read_sft_jsonl(paths.sft_val)
        val_examples, val_tok = tokenize_examples(tokenizer, val_pairs, sft.max_seq_len, "sft_val", progress and dist.is_main)
        reports = [val_rows.summary("sft_val rows"), val_tok.summary("sft_val tokenized")]
    else:
        reports = [f"sft_val: {paths.sft_val} not found; no validation loss"]
    if dist.is_main:
        for line in [train_rows.summary("sft_train rows"), train_tok.summary("sft_train tokenized"), *reports]:
            print(f"[sft] {line}", flush=True)
    if not train_examples:
        raise ValueError(f"no usable SFT examples in {paths.sft_train}")

    settings = OptimSettings.from_sft(sft)
    plan = StepPlan(train_examples, settings, seed=cfg.run.seed, world_size=dist.world_size)
    if plan.steps_per_epoch == 0:
        raise ValueError(
            f"{len(train_examples)} SFT examples make fewer micro-batches than one optimizer step needs "
            f"({plan.per_step} = gradient_accumulation_steps x processes); lower the batch settings"
        )
    if dist.is_main and plan.dropped_per_epoch:
        print(f"[sft] each epoch leaves out its last {plan.dropped_per_epoch} micro-batch(es), which do not fill "
              f"an optimizer step (a new shuffle each epoch)", flush=True)
    total_steps = _total_steps(sft, plan.steps_per_epoch)

    # --force: nothing is moved or deleted until the model, tokenizer and data have loaded.
    resume_dir = None if force else checkpoints.newest_complete(paths.stage_dir("sft"))
    model = prepare_trainable_model(cfg, dist, resume_from=resume_dir, gradient_checkpointing=sft.gradient_checkpointing)
    trainer = AdapterTrainer(model, dist, settings, pad_token_id=tokenizer.pad_token_id, total_steps=total_steps)
    if force:
        set_stage_aside("sft", paths.stage_dir("sft"), dist)
    state = train_state.TrainerState(total_steps=total_steps, steps_per_epoch=plan.steps_per_epoch)
    if resume_dir is not None:
        train_state.load_optimizer(resume_dir, trainer.optimizer, trainer.scheduler, map_location=str(dist.device))
        saved = train_state.load_trainer_state(resume_dir)
        if saved.steps_per_epoch != plan.steps_per_epoch or saved.total_steps != total_steps:
            raise ValueError(
                f"{resume_dir} was written with {saved.steps_per_epoch} steps/epoch and {saved.total_steps} total steps; "
                f"this run plans {plan.steps_per_epoch} and {total_steps}: the data or batch settings changed "
                "(use --force to restart the stage)"
            )
        state = saved
        if not train_state.load_rng_state(resume_dir, dist.rank):
            print(f"[sft] warning: {resume_dir} holds no RNG state for rank {dist.rank}; dropout streams will differ", flush=True)
        if dist.is_main:
            print(f"[sft] resuming from {resume_dir} at step {state.step}/{total_steps}", flush=True)
    else:
        set_seed(cfg.run.seed + dist.rank)

    data_meta = {"train": file_fingerprint(paths.sft_train), "val": file_fingerprint(paths.sft_val),
                 "train_examples": len(train_examples), "val_examples": len(val_examples)}
    metrics = MetricsLogger.for_stage(paths, "sft", enabled=dist.is_main, report_to=cfg.logging.report_to,
                                      project=cfg.run.run_id)

    def save(directory, **extra):
        saved = save_adapter_checkpoint(
            directory, dist=dist, model=trainer.model, cfg=cfg, stage="sft", data=data_meta,
            optimizer=trainer.optimizer, scheduler=trainer.scheduler, trainer_state=state, step=state.step, **extra,
        )
        discard_replaced("sft", paths.stage_dir("sft"), dist)
        return saved

    from tqdm.auto import tqdm

    bar = tqdm(total=total_steps, initial=state.step, desc="sft", unit="step", disable=not (progress and dist.is_main))
    run_started, first_step, first_tokens, last_loss = time.perf_counter(), state.step, state.tokens_seen, None
    try:
        while state.step < total_steps:
            if save_signal is not None and dist.any(save_signal.save_requested()):
                saved_dir = save(paths.sft_checkpoint(state.step))
                stop = dist.any(save_signal.stop_requested())
                save_signal.acknowledge(saved_dir)
                if stop:
                    if dist.is_main:
                        print(f"[sft] stop requested ({save_signal.reason}); saved {saved_dir}", flush=True)
                    return StageOutcome("stopped", str(saved_dir), f"stopped at step {state.step}")
            stats = trainer.train_step(plan, state.step)
            last_loss = stats["loss"]
            state.step += 1
            state.tokens_seen += stats["tokens"]
            bar.update(1)
            bar.set_postfix(loss=f"{stats['loss']:.4f}")
            if state.step % max(1, sft.log_every_steps) == 0 or state.step == total_steps:
                metrics.log(state.step, {**stats, "epoch": state.step / plan.steps_per_epoch})
            if sft.eval_every_steps > 0 and state.step % sft.eval_every_steps == 0 and state.step < total_steps:
                _evaluate(trainer, val_examples, state, metrics, progress=progress and dist.is_main)
            if sft.save_every_steps > 0 and state.step % sft.save_every_steps == 0 and state.step < total_steps:
                save(paths.sft_checkpoint(state.step))
                if dist.is_main:
                    checkpoints.prune(paths.stage_dir("sft"), sft.keep_last_checkpoints)
        _evaluate(trainer, val_examples, state, metrics, progress=progress and dist.is_main)
        save(final_dir, tokenizer=tokenizer, final_eval_loss=state.last_eval_loss,
             before_finalize=model_card_writer(paths, cfg.checkpoint))
    finally:
        bar.close()
        metrics.close()
    if dist.is_main:
        print("[sft] " + stage_summary(total_steps, state.step - first_step, state.tokens_seen,
                                       state.tokens_seen - first_tokens, last_loss, state.last_eval_loss,
                                       time.perf_counter() - run_started), flush=True)
    return StageOutcome("finished", str(final_dir), f"{total_steps} steps")


def stage_summary(steps: int, steps_here: int, tokens: int, tokens_here: int, train_loss: Optional[float],
                  eval_loss: Optional[float], seconds: float) -> str:
    """The end-of-stage line: what was trained, to what loss, how fast (this process's share when
    the stage resumed)."""
    minutes, rest = divmod(int(round(seconds)), 60)
    resumed = f" ({steps_here} in this run)" if steps_here != steps else ""
    losses = f"last train loss {train_loss:.4f}" if train_loss is not None else "no train step in this run"
    if eval_loss is not None:
        losses += f", eval loss {eval_loss:.4f}"
    rate = f", {tokens_here / seconds:.1f} tokens/s" if seconds > 0 and tokens_here else ""
    return f"done: {steps} steps{resumed}, {tokens:,} tokens, {losses}, {minutes}m{rest:02d}s{rate}"


def _evaluate(trainer: AdapterTrainer, val_examples, state: train_state.TrainerState, metrics: MetricsLogger, *,
              progress: bool = False) -> None:
    if not val_examples:
        return
    started = time.perf_counter()
    loss = trainer.evaluate(val_examples, progress=progress)
    state.last_eval_loss = loss
    state.history.append({"step": state.step, "eval_loss": loss})
    metrics.log(state.step, {"eval_loss": loss, "eval_seconds": time.perf_counter() - started}, kind="eval")
