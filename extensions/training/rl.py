"""Stage 3: Best-of-N expert iteration on verified rewards, with an adaptive curriculum.

Each round: the curriculum picks ``tasks_per_round`` tasks; the policy samples ``samples_per_task``
completions per task (all samples of many tasks per ``generate`` call); the verifier judges every
candidate; per task the top ``top_k`` distinct candidates with reward >= ``reward_threshold`` are kept
(ties: lower sample index first) and the adapter is fine-tuned on them with the SFT loss at
``rl.learning_rate``. The round ends in a complete ``round-NNN`` checkpoint (adapter, optimizer,
curriculum state, round metrics); the last one is copied to ``rl/final``.

Under data parallelism each rank samples and verifies its share of the round's tasks (on its own
GPU), results are gathered, and the fine-tuning is data-parallel over the kept candidates.
Sampled responses and verdicts go to the round's candidate log as soon as they exist; a resumed
round reuses them. A save request during sampling or verification is served by that log; during
the fine-tuning phase a stop request ends the process and the resumed run redoes that phase only.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from .. import checkpoints
from ..modeling import load_tokenizer
from ..paths import RunPaths
from ..prompts import build_messages
from ..sampling import SamplingParams, sample_completions
from ..verify.result import STAGES, VerifyResult, stage_rank
from . import state as train_state
from .batching import DropReport, read_json_rows, tokenize_examples
from .candidates import CandidateLog, sample_record, verdict_record
from .curriculum import Curriculum
from .distributed import Dist, make_dist
from .metrics import MetricsLogger
from .saving import file_fingerprint, save_adapter_checkpoint
from .sft import StageOutcome, prepare_trainable_model, set_seed, skipped_if_finished
from .trainer import AdapterTrainer, OptimSettings, StepPlan

log = logging.getLogger(__name__)

CURRICULUM_FILE = "curriculum.json"
ROUND_METRICS_FILE = "round_metrics.json"

# (problem_code, candidate_text, label) triples in, one VerifyResult (or its dict) per triple out.
VerifyFn = Callable[[list[tuple[str, str, str]]], list[Any]]


@dataclass
class Candidate:
    task_id: str
    level: int
    sample_index: int
    text: str
    result: Optional[dict] = None  # VerifyResult.to_dict()

    @property
    def reward(self) -> float:
        return float(self.result.get("reward", 0.0)) if self.result else 0.0

    @property
    def correct(self) -> bool:
        return bool(self.result.get("correct")) if self.result else False


# -- tasks ---------------------------------------------------------------------------------------------
def read_rl_tasks(path: Path) -> tuple[list[dict], DropReport]:
    report = DropReport()
    tasks, seen = [], set()
    for row in read_json_rows(path, report, "RL tasks"):
        if not isinstance(row.get("code"), str) or not row["code"].strip() or row.get("task_id") is None:
            report.add("without task_id or code")
            continue
        task_id = str(row["task_id"])
        if task_id in seen:
            report.add("with a repeated task_id")
            continue
        try:
            level = int(row.get("level", 1))
        except (TypeError, ValueError):
            report.add("with a non-integer level")
            continue
        seen.add(task_id)
        tasks.append({**row, "task_id": task_id, "level": level})
        report.kept += 1
    return tasks, report


# -- selection -----------------------------------------------------------------------------------------
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


def round_statistics(candidates: Sequence[Candidate]) -> dict[str, Any]:
    """Reward mean/std, share of candidates reaching each verifier stage, correct rate per level."""
    rewards = [c.reward for c in candidates if c.result is not None]
    judged = [c for c in candidates if c.result is not None]
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
        "correct": sum(c.correct for c in judged),
        "stage_pass_rate": {stage: (n / len(judged) if judged else 0.0) for stage, n in reached.items()},
        "correct_rate_by_level": {str(level): sum(c.correct for c in items) / len(items) for level, items in sorted(levels.items())},
    }


# -- verifier ------------------------------------------------------------------------------------------
def make_verify_fn(verifier_cfg, device: Optional[str], *, progress: bool = True) -> VerifyFn:
    """The project verifier as a ``VerifyFn`` (imported on first use)."""

    def verify(items: list[tuple[str, str, str]]) -> list[Any]:
        from ..verify import VerifyRequest, verify_batch

        requests = [VerifyRequest(problem_code=code, candidate_text=text, label=label) for code, text, label in items]
        return verify_batch(requests, verifier_cfg, device=device, progress=progress)

    return verify


def _result_dict(result: Any) -> dict:
    if isinstance(result, VerifyResult):
        return result.to_dict()
    if isinstance(result, dict):
        return VerifyResult.from_dict(result).to_dict()
    if hasattr(result, "to_dict"):
        return result.to_dict()
    raise TypeError(f"verifier returned {type(result).__name__}, expected VerifyResult")


# -- one round's rollouts --------------------------------------------------------------------------------
@dataclass
class RoundContext:
    cfg: Any
    paths: RunPaths
    dist: Dist
    tokenizer: Any
    verify_fn: VerifyFn
    save_signal: Any = None
    progress: bool = True


class StopRequested(Exception):
    """A SaveSignal asked the run to stop; everything known is already on disk."""


def _check_signal(ctx: RoundContext, served_by: Optional[Path]) -> None:
    if ctx.save_signal is None or not ctx.dist.any(ctx.save_signal.save_requested()):
        return
    stop = ctx.dist.any(ctx.save_signal.stop_requested())
    ctx.save_signal.acknowledge(served_by)
    if stop:
        raise StopRequested(ctx.save_signal.reason or "stop requested")


def collect_candidates(ctx: RoundContext, model, round_index: int, tasks: Sequence[dict], policy: str) -> tuple[list[Candidate], dict]:
    """Sample and verify every candidate of the round (reusing the log), gathered on all ranks."""
    rl = ctx.cfg.rl
    n = rl.samples_per_task
    candidate_log = CandidateLog(ctx.paths.rl_candidates_log(round_index))
    header = {"type": "round", "round": round_index, "task_ids": [t["task_id"] for t in tasks], "policy": policy,
              "samples_per_task": n}
    if ctx.dist.is_main:
        existing = candidate_log.read()
        if existing.header is not None and any(existing.header.get(k) != header[k] for k in ("task_ids", "policy", "samples_per_task")):
            stale = candidate_log.set_aside()
            print(f"[rl] round {round_index}: candidate log belongs to another policy or task list; moved to {stale}", flush=True)
            existing = candidate_log.read()
        if existing.header is None:
            candidate_log.append([header])
    ctx.dist.barrier()
    contents = candidate_log.read()
    if ctx.dist.is_main and (contents.samples or contents.damaged_lines):
        print(f"[rl] round {round_index}: reusing {len(contents.samples)} sampled and {len(contents.verdicts)} judged "
              f"candidates from {candidate_log.path}" + (f"; skipped {contents.damaged_lines} damaged line(s)" if contents.damaged_lines else ""),
              flush=True)
    samples, verdicts = dict(contents.samples), dict(contents.verdicts)
    mine = ctx.dist.shard(tasks)
    timings = {"sampling_s": 0.0, "verifying_s": 0.0}

    # Sampling: tasks missing any of their n samples are sampled again in full, a generate batch at a time.
    todo = [t for t in mine if any((t["task_id"], i) not in samples for i in range(n))]
    tasks_per_chunk = max(1, rl.generation_batch_size // n)
    started = time.perf_counter()
    for chunk_index, start in enumerate(range(0, len(todo), tasks_per_chunk)):
        chunk = todo[start:start + tasks_per_chunk]
        params = SamplingParams(
            max_new_tokens=rl.max_new_tokens, temperature=rl.temperature, top_p=rl.top_p,
            seed=ctx.cfg.run.seed + 100_003 * round_index + 1009 * ctx.dist.rank + chunk_index,
            batch_size=rl.generation_batch_size, cuda_graphs=rl.cuda_graphs, compile_step=rl.compile_decode,
        )
        texts = sample_completions(model, ctx.tokenizer, [build_messages(t["code"]) for t in chunk], n, params,
                                   progress=ctx.progress)
        records = []
        for task, task_texts in zip(chunk, texts):
            for i, text in enumerate(task_texts):
                samples[(task["task_id"], i)] = text
                records.append(sample_record(task["task_id"], i, text))
        candidate_log.append(records)
        _check_signal(ctx, candidate_log.path)
    timings["sampling_s"] = time.perf_counter() - started

    # Verification, a chunk at a time, each verdict logged as soon as its chunk is judged.
    code_of = {t["task_id"]: t["code"] for t in tasks}
    pending = [(t["task_id"], i) for t in mine for i in range(n) if (t["task_id"], i) not in verdicts]
    started = time.perf_counter()
    for start in range(0, len(pending), max(1, rl.verify_chunk_size)):
        chunk = pending[start:start + max(1, rl.verify_chunk_size)]
        items = [(code_of[tid], samples[(tid, i)], f"r{round_index}/{tid}/{i}") for tid, i in chunk]
        results = ctx.verify_fn(items)
        if len(results) != len(items):
            raise RuntimeError(f"verifier returned {len(results)} results for {len(items)} candidates")
        records = []
        for (tid, i), result in zip(chunk, results):
            verdicts[(tid, i)] = _result_dict(result)
            records.append(verdict_record(tid, i, samples[(tid, i)], verdicts[(tid, i)]))
        candidate_log.append(records)
        _check_signal(ctx, candidate_log.path)
    timings["verifying_s"] = time.perf_counter() - started

    level_of = {t["task_id"]: int(t["level"]) for t in tasks}
    local = [dataclasses.asdict(Candidate(tid, level_of[tid], i, samples[(tid, i)], verdicts[(tid, i)]))
             for t in mine for tid in [t["task_id"]] for i in range(n)]
    gathered = [Candidate(**c) for c in ctx.dist.gather_objects(local)]
    gathered.sort(key=lambda c: (c.task_id, c.sample_index))
    return gathered, timings


# -- the stage -------------------------------------------------------------------------------------------
def _rl_settings(cfg) -> OptimSettings:
    return OptimSettings(
        learning_rate=cfg.rl.learning_rate, per_device_batch_size=cfg.rl.per_device_batch_size,
        gradient_accumulation_steps=cfg.rl.gradient_accumulation_steps, max_seq_len=cfg.sft.max_seq_len,
        batching=cfg.sft.batching, max_grad_norm=cfg.sft.max_grad_norm, weight_decay=cfg.sft.weight_decay,
        warmup_ratio=0.0, schedule="constant",
    )


def _fit_plan(examples, settings: OptimSettings, seed: int, world_size: int) -> Optional[StepPlan]:
    """A plan for the kept candidates; accumulation shrinks when few were kept (None: too few)."""
    for accumulation in range(settings.gradient_accumulation_steps, 0, -1):
        for batch_size in sorted({settings.per_device_batch_size, 1}, reverse=True):
            trial = dataclasses.replace(settings, gradient_accumulation_steps=accumulation, per_device_batch_size=batch_size)
            plan = StepPlan(examples, trial, seed=seed, world_size=world_size)
            if plan.steps_per_epoch > 0:
                return plan
    return None


def _policy_fingerprint(directory: Optional[Path], seed: int) -> str:
    if directory is None:
        return f"fresh-lora-seed-{seed}"
    manifest = checkpoints.read_manifest(directory) or {}
    files = manifest.get("files", {})
    weights = [entry.get("sha256") for name, entry in sorted(files.items()) if name.startswith("adapter_model")]
    return f"{directory.name}:{','.join(w for w in weights if w)}"


def run_rl(cfg, *, save_signal=None, force: bool = False, progress: bool = True,
           verify_fn: Optional[VerifyFn] = None) -> StageOutcome:
    paths = RunPaths.from_config(cfg)
    rl = cfg.rl
    final_dir = paths.final("rl")
    dist = make_dist(cfg.model)
    skipped = skipped_if_finished("rl", final_dir, dist, force)
    if skipped is not None:
        return skipped
    if force:
        if dist.is_main:
            shutil.rmtree(paths.stage_dir("rl"), ignore_errors=True)
            for r in range(1, rl.num_rounds + 1):
                log_path = paths.rl_candidates_log(r)
                if log_path.exists():
                    CandidateLog(log_path).set_aside()
            print("[rl] --force: restarting RL from its start; old rounds removed, candidate logs set aside", flush=True)
        dist.barrier()

    tasks, task_report = read_rl_tasks(paths.rl_tasks)
    if dist.is_main:
        print(f"[rl] {task_report.summary('rl_tasks', 'tasks')}", flush=True)
    if not tasks:
        raise ValueError(f"no usable RL tasks in {paths.rl_tasks}")
    tokenizer = load_tokenizer(cfg.model)
    curriculum = Curriculum(rl.curriculum, seed=cfg.run.seed)

    resume_dir = checkpoints.newest_complete(paths.stage_dir("rl"))
    sft_final = paths.final("sft")
    start_from: Optional[Path] = resume_dir
    if resume_dir is None and rl.init == "sft":
        if not checkpoints.is_complete(sft_final):
            raise ValueError(f"no complete SFT adapter at {sft_final}; run the SFT stage first or set rl.init: base")
        start_from = sft_final
    elif resume_dir is None and dist.is_main:
        print("[rl] rl.init is base: RL starts from the base model with a fresh LoRA", flush=True)
    model = prepare_trainable_model(cfg, dist, resume_from=start_from, gradient_checkpointing=cfg.sft.gradient_checkpointing)
    settings = _rl_settings(cfg)
    trainer = AdapterTrainer(model, dist, settings, pad_token_id=tokenizer.pad_token_id, total_steps=0)
    first_round = 1
    if resume_dir is not None:
        meta = checkpoints.read_meta(resume_dir)
        first_round = int(meta["round"]) + 1
        train_state.load_optimizer(resume_dir, trainer.optimizer, map_location=str(dist.device))
        curriculum.load_state_dict(json.loads((resume_dir / CURRICULUM_FILE).read_text()))
        train_state.load_rng_state(resume_dir, dist.rank)
        if dist.is_main:
            print(f"[rl] resuming after round {first_round - 1} from {resume_dir}", flush=True)
    else:
        set_seed(cfg.run.seed + dist.rank)
    policy_dir = start_from

    if verify_fn is None:
        verify_fn = make_verify_fn(cfg.verifier, dist.verifier_device(cfg.verifier.device), progress=progress)
    ctx = RoundContext(cfg, paths, dist, tokenizer, verify_fn, save_signal, progress)
    metrics = MetricsLogger.for_stage(paths, "rl", enabled=dist.is_main, report_to=cfg.logging.report_to,
                                      project=cfg.run.run_id)
    data_meta = {"rl_tasks": file_fingerprint(paths.rl_tasks), "tasks": len(tasks),
                 "start": str(start_from) if start_from else "base+fresh-lora"}
    last_round_dir = resume_dir
    try:
        for round_index in range(first_round, rl.num_rounds + 1):
            round_dir = _run_round(ctx, trainer, curriculum, tasks, round_index, policy_dir, metrics, data_meta)
            policy_dir = last_round_dir = round_dir
            if dist.is_main:
                checkpoints.prune(paths.stage_dir("rl"), rl.keep_last_rounds)
            dist.barrier()
    except StopRequested as stop:
        if dist.is_main:
            print(f"[rl] stopping on request ({stop}); candidate logs and round checkpoints are on disk", flush=True)
        return StageOutcome("stopped", str(last_round_dir) if last_round_dir else None, str(stop))
    finally:
        metrics.close()
    if last_round_dir is None:
        raise ValueError("rl.num_rounds is 0: nothing to train")
    if dist.is_main:
        checkpoints.copy_checkpoint(last_round_dir, final_dir)
        print(f"[rl] final adapter: {final_dir} (from {last_round_dir.name})", flush=True)
    dist.barrier()
    return StageOutcome("finished", str(final_dir), f"{rl.num_rounds} rounds")


def _run_round(ctx: RoundContext, trainer: AdapterTrainer, curriculum: Curriculum, tasks, round_index: int,
               policy_dir: Optional[Path], metrics: MetricsLogger, data_meta: dict) -> Path:
    cfg, dist, rl = ctx.cfg, ctx.dist, ctx.cfg.rl
    round_started = time.perf_counter()
    shares = dict(curriculum.shares)
    chosen = curriculum.select(tasks, rl.tasks_per_round)
    if dist.is_main:
        by_level = {lvl: sum(1 for t in chosen if t["level"] == lvl) for lvl in (1, 2, 3)}
        print(f"[rl] round {round_index}/{rl.num_rounds}: {len(chosen)} tasks (by level {by_level}), "
              f"{rl.samples_per_task} samples each", flush=True)
    model = dist.unwrap(trainer.model)
    candidates, timings = collect_candidates(ctx, model, round_index, chosen, _policy_fingerprint(policy_dir, cfg.run.seed))
    stats = round_statistics(candidates)
    kept = select_top_k(candidates, rl.top_k, rl.reward_threshold)

    started = time.perf_counter()
    code_of = {t["task_id"]: t["code"] for t in chosen}
    examples, report = tokenize_examples(ctx.tokenizer, [(build_messages(code_of[c.task_id]), c.text) for c in kept],
                                         cfg.sft.max_seq_len, "kept candidates")
    if report.dropped and dist.is_main:
        print(f"[rl] round {round_index}: {report.summary('kept candidates')}", flush=True)
    plan = _fit_plan(examples, trainer.settings, seed=cfg.run.seed + round_index, world_size=dist.world_size) if examples else None
    train_losses: list[float] = []
    if plan is None:
        if dist.is_main:
            why = (f"no candidate reached reward {rl.reward_threshold}" if not kept
                   else f"{len(examples)} usable of {len(kept)} kept: too few for {dist.world_size} process(es)")
            print(f"[rl] round {round_index}: {why}; the adapter is unchanged this round", flush=True)
    else:
        from tqdm.auto import tqdm

        steps = plan.steps_per_epoch * max(1, rl.epochs_per_round)
        for step in tqdm(range(steps), desc=f"rl round {round_index} training", disable=not (ctx.progress and dist.is_main)):
            _check_signal(ctx, policy_dir)
            step_stats = trainer.train_step(plan, step)
            train_losses.append(step_stats["loss"])
            metrics.log(round_index * 100_000 + step, {"round": round_index, **step_stats})
    training_s = time.perf_counter() - started

    level_rates = {int(level): rate for level, rate in stats["correct_rate_by_level"].items()}
    movement = curriculum.update(round_index, {lvl: level_rates.get(lvl) for lvl in (1, 2, 3)})
    round_metrics = {
        "round": round_index, **stats, "kept": len(kept), "kept_tasks": len({c.task_id for c in kept}),
        "train_examples": len(examples), "train_steps": len(train_losses),
        "train_loss_mean": statistics.fmean(train_losses) if train_losses else None,
        "curriculum_share": {str(k): v for k, v in shares.items()}, "curriculum": movement,
        "seconds": {**timings, "training_s": training_s, "round_s": time.perf_counter() - round_started},
    }
    metrics.log(round_index, round_metrics, kind="round")
    if dist.is_main:
        print(f"[rl] round {round_index}: reward mean {stats['reward_mean']:.3f} (std {stats['reward_std']:.3f}), "
              f"{stats['correct']}/{stats['judged']} correct, kept {len(kept)}, "
              f"level-2 share next {curriculum.share_l2:.2f}", flush=True)

    def write_round_files(directory: Path) -> None:
        checkpoints.atomic_write_json(directory / CURRICULUM_FILE, curriculum.state_dict())
        checkpoints.atomic_write_json(directory / ROUND_METRICS_FILE, round_metrics)

    return save_adapter_checkpoint(
        ctx.paths.rl_round(round_index), dist=dist, model=trainer.model, cfg=cfg, stage="rl",
        data={**data_meta, "round_tasks": [t["task_id"] for t in chosen]}, optimizer=trainer.optimizer,
        tokenizer=ctx.tokenizer, round_index=round_index, write_extra=write_round_files,
        round_summary={k: round_metrics[k] for k in ("reward_mean", "correct", "judged", "kept")},
    )
