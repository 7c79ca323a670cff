"""Stage 3: RL on verified rewards, with an adaptive curriculum; the algorithm is ``rl.algorithm``.

One round loop serves every algorithm. Each round: the curriculum picks ``tasks_per_round`` tasks;
the policy samples ``samples_per_task`` completions per task, keeping each token's log-probability
(``rollouts``); the verifier judges every candidate; the reward preset scores the verdicts
(``rewards``); the objective updates the adapter (``objectives``: best_of_n, grpo, rloo, reinforce,
reward_weighted). With ``rl.max_turns`` > 1 each sample is a trajectory that refines its kernel on
the verifier's feedback (``turn_rollouts``); each turn trains on its discounted return
R_t = s_t + ``rl.gamma`` * R_{t+1}. The round ends in a complete ``round-NNN`` checkpoint (adapter, optimizer,
objective state, curriculum state, round metrics); the last one is copied to ``rl/final`` with the model card.

Under data parallelism each rank samples and verifies its share of the round's tasks (on its own
GPU), results are gathered, and the update is data-parallel. Sampled responses (with their token
ids and log-probs) and verdicts go to the round's candidate log as soon as they exist; a resumed
round reuses them. Verification overlaps sampling: each sampled chunk goes to the rank's verifier
session at once (``rl.overlap_verification``), so the round waits only for the verdicts of what was
sampled last. A save request during sampling or verification is served by that log; during
the update a stop request ends the process and the resumed run redoes the update from the round's
start, on the same rollouts, to the same result.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ..config.sections import PipelineConfig
from ..data.retrieval import ExampleRetriever
from ..generation.sampling import render_prompt_ids
from ..models.loading import load_tokenizer
from ..prompting.builder import PromptBuilder
from ..runtime import checkpoints
from ..runtime.io import atomic_write_json
from ..runtime.paths import RunPaths
from . import state as train_state
from .batching import DropReport, read_json_rows
from .candidates import CandidateLog
from .curriculum import Curriculum
from .distributed import make_dist
from .metrics import MetricsLogger
from .objectives import Objective, RoundRollouts, UpdateContext, make_objective
from .rewards import RewardFn, ScoreFn, gated_user_rewards, load_reward_fn, make_score_fn
from .rollouts import (Candidate, RoundContext, StopRequested, VerifyFn, check_signal, collect_candidates,
                       make_verify_fn, task_prompt_ids)
from .round_stats import multiturn_statistics, round_distributions, round_statistics
from .saving import discard_replaced, file_fingerprint, model_card_writer, save_adapter_checkpoint, set_stage_aside
from .stage_common import StageOutcome, prepare_trainable_model, set_seed, skipped_if_finished
from .trainer import AdapterTrainer, OptimSettings
from .turn_rollouts import collect_trajectories, with_discounted_returns

CURRICULUM_FILE = "curriculum.json"
ROUND_METRICS_FILE = "round_metrics.json"
OBJECTIVE_STATE_FILE = "objective_state.json"

__all__ = ["Candidate", "RoundContext", "StopRequested", "VerifyFn", "make_verify_fn", "read_rl_tasks", "run_rl"]


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


# -- the stage -------------------------------------------------------------------------------------------
def _rl_settings(cfg: PipelineConfig) -> OptimSettings:
    return OptimSettings(
        learning_rate=cfg.rl.learning_rate, per_device_batch_size=cfg.rl.per_device_batch_size,
        gradient_accumulation_steps=cfg.rl.gradient_accumulation_steps, max_seq_len=cfg.sft.max_seq_len,
        batching=cfg.sft.batching, max_grad_norm=cfg.sft.max_grad_norm, weight_decay=cfg.sft.weight_decay,
        warmup_ratio=0.0, schedule="constant",
    )


def _policy_fingerprint(directory: Optional[Path], seed: int) -> str:
    if directory is None:
        return f"fresh-lora-seed-{seed}"
    manifest = checkpoints.read_manifest(directory) or {}
    files = manifest.get("files", {})
    weights = [entry.get("sha256") for name, entry in sorted(files.items()) if name.startswith("adapter_model")]
    return f"{directory.name}:{','.join(w for w in weights if w)}"


def run_rl(cfg: PipelineConfig, *, save_signal=None, force: bool = False, progress: bool = True,
           verify_fn: Optional[VerifyFn] = None, score_fn: Optional[ScoreFn] = None) -> StageOutcome:
    """Run (or resume) the RL stage.

    ``verify_fn`` judges candidates (default: the project verifier); ``score_fn`` turns a judged
    candidate into its training reward (default: ``rl.reward_preset``). Both are pluggable so a
    synthetic reward can drive the same loop.
    """
    paths = RunPaths.from_config(cfg)
    rl = cfg.rl
    final_dir = paths.final("rl")
    dist = make_dist(cfg.model)
    skipped = skipped_if_finished("rl", final_dir, dist, force)
    if skipped is not None:
        return skipped
    objective = make_objective(cfg)
    tasks, task_report = read_rl_tasks(paths.rl_tasks)
    if dist.is_main:
        print(f"[rl] {task_report.summary('rl_tasks', 'tasks')}", flush=True)
    if not tasks:
        raise ValueError(f"no usable RL tasks in {paths.rl_tasks}")
    user_reward = load_reward_fn(rl.reward_fn) if rl.reward_fn else None  # fails before any model loads
    tokenizer = load_tokenizer(cfg.model)
    curriculum = Curriculum(rl.curriculum, seed=cfg.run.seed)

    # --force: nothing is moved until the tasks, tokenizer and model have loaded.
    resume_dir = None if force else checkpoints.newest_complete(paths.stage_dir("rl"))
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
    if force:
        set_stage_aside("rl", paths.stage_dir("rl"), dist)
        if dist.is_main:
            for r in range(1, rl.num_rounds + 1):
                log_path = paths.rl_candidates_log(r)
                if log_path.exists():
                    CandidateLog(log_path).set_aside()
        dist.barrier()
    first_round = 1
    if resume_dir is not None:
        meta = checkpoints.read_meta(resume_dir)
        first_round = int(meta["round"]) + 1
        train_state.load_optimizer(resume_dir, trainer.optimizer, map_location=str(dist.device))
        curriculum.load_state_dict(json.loads((resume_dir / CURRICULUM_FILE).read_text()))
        _load_objective_state(objective, resume_dir, meta)
        train_state.load_rng_state(resume_dir, dist.rank)
        if dist.is_main:
            print(f"[rl] resuming after round {first_round - 1} from {resume_dir}", flush=True)
    else:
        set_seed(cfg.run.seed + dist.rank)
    policy_dir = start_from

    if verify_fn is None:
        verify_fn = make_verify_fn(cfg.verifier, dist.verifier_device(cfg.verifier.device), progress=progress)
    ctx = RoundContext(cfg, paths, dist, tokenizer, verify_fn, save_signal, progress, prompts=_prompt_builder(cfg, paths))
    metrics = MetricsLogger.for_stage(paths, "rl", enabled=dist.is_main, report_to=cfg.logging.report_to,
                                      project=cfg.run.run_id)
    data_meta = {"rl_tasks": file_fingerprint(paths.rl_tasks), "tasks": len(tasks),
                 "start": str(start_from) if start_from else "base+fresh-lora"}
    round_parts = RoundParts(trainer, curriculum, objective, score_fn or make_score_fn(rl), metrics, data_meta,
                             reward_fn=user_reward)
    last_round_dir = resume_dir
    stage_started = time.perf_counter()
    if dist.is_main:
        print(f"[rl] algorithm {rl.algorithm}, reward preset {rl.reward_preset}", flush=True)
    try:
        for round_index in range(first_round, rl.num_rounds + 1):
            round_dir = _run_round(ctx, round_parts, tasks, round_index, policy_dir)
            policy_dir = last_round_dir = round_dir
            discard_replaced("rl", paths.stage_dir("rl"), dist)
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
        checkpoints.copy_checkpoint(last_round_dir, final_dir, before_finalize=model_card_writer(paths, cfg.checkpoint))
        print(f"[rl] final adapter: {final_dir} (from {last_round_dir.name})", flush=True)
        print("[rl] " + rounds_summary(round_parts.history, time.perf_counter() - stage_started), flush=True)
    dist.barrier()
    return StageOutcome("finished", str(final_dir), f"{rl.num_rounds} rounds")


def rounds_summary(history: list, seconds: float) -> str:
    """The end-of-stage line: each round this run trained, its reward, correct share and updates."""
    minutes, rest = divmod(int(round(seconds)), 60)
    if not history:
        return f"done: no round ran in this run ({minutes}m{rest:02d}s)"
    rounds = "; ".join(f"round {r}: reward {reward:.3f}, {correct}/{judged} correct, {steps} update step(s)"
                       for r, reward, correct, judged, steps in history)
    return f"done: {len(history)} round(s) in this run, {minutes}m{rest:02d}s. {rounds}"


def _load_objective_state(objective: Objective, resume_dir: Path, meta: dict) -> None:
    saved_algorithm = meta.get("algorithm", "best_of_n")
    state_file = resume_dir / OBJECTIVE_STATE_FILE
    if saved_algorithm != objective.name:
        print(f"[rl] warning: {resume_dir.name} was trained with {saved_algorithm}; continuing with {objective.name} "
              "(its optimizer state carries over, its objective state does not)", flush=True)
    elif state_file.is_file():
        objective.load_state_dict(json.loads(state_file.read_text()))


@dataclass
class RoundParts:
    """What persists from round to round inside one process."""

    trainer: AdapterTrainer
    curriculum: Curriculum
    objective: Objective
    score_fn: ScoreFn
    metrics: MetricsLogger
    data_meta: dict
    reward_fn: Optional[RewardFn] = None  # rl.reward_fn, gated by the verdicts
    history: list = field(default_factory=list)  # (round, reward mean, correct, judged, update steps) this run


def _prompt_builder(cfg: PipelineConfig, paths: RunPaths) -> PromptBuilder:
    """prompt.mode's builder; raicl reads the retrieval index prepare_data.py built for the run."""
    return PromptBuilder.from_config(
        cfg.prompt, lambda: ExampleRetriever.open(paths.retrieval_index, cfg.data.retrieval_dense_model))


def _round_rollouts(ctx: RoundContext, round_index: int, chosen: list[dict], candidates: list) -> RoundRollouts:
    """What the objective trains on. In a multi-turn round each turn is a sample continuing its own
    prompt, and its reward is its discounted return over the rest of its trajectory."""
    messages = {t["task_id"]: ctx.messages(t) for t in chosen}
    if ctx.cfg.rl.max_turns == 1:
        return RoundRollouts(round_index, chosen, candidates, task_prompt_ids(ctx, chosen), messages)
    turn_prompts = render_prompt_ids(ctx.tokenizer, [c.prompt for c in candidates])
    return RoundRollouts(round_index, chosen, with_discounted_returns(candidates, ctx.cfg.rl.gamma),
                         task_prompt_ids(ctx, chosen), messages,
                         turn_prompt_ids={c.key: ids for c, ids in zip(candidates, turn_prompts)})


def _run_round(ctx: RoundContext, parts: RoundParts, tasks, round_index: int, policy_dir: Optional[Path]) -> Path:
    """sample -> verify -> score -> objective.update -> checkpoint."""
    cfg, dist, rl = ctx.cfg, ctx.dist, ctx.cfg.rl
    trainer, curriculum = parts.trainer, parts.curriculum
    round_started = time.perf_counter()
    shares = dict(curriculum.shares)
    chosen = curriculum.select(tasks, rl.tasks_per_round)
    if dist.is_main:
        by_level = {lvl: sum(1 for t in chosen if t["level"] == lvl) for lvl in (1, 2, 3)}
        print(f"[rl] round {round_index}/{rl.num_rounds}: {len(chosen)} tasks (by level {by_level}), "
              f"{rl.samples_per_task} samples each", flush=True)
    model = dist.unwrap(trainer.model)
    multi_turn = rl.max_turns > 1
    collect = collect_trajectories if multi_turn else collect_candidates
    candidates, phase = collect(ctx, model, round_index, chosen, _policy_fingerprint(policy_dir, cfg.run.seed))
    for candidate in candidates:
        candidate.score = float(parts.score_fn(candidate))
    if parts.reward_fn is not None:
        problems = {t["task_id"]: t["code"] for t in chosen}
        for candidate, value in zip(candidates, gated_user_rewards(parts.reward_fn, candidates, problems, parts.score_fn)):
            candidate.score = value
    stats = round_statistics(candidates)
    if multi_turn:
        stats["multiturn"] = multiturn_statistics(candidates, rl.max_turns, cfg.prompt.max_prompt_tokens)

    update_ctx = UpdateContext(cfg, dist, trainer, ctx.tokenizer, parts.metrics, ctx.progress,
                               check_signal=lambda: check_signal(ctx, policy_dir))
    started = time.perf_counter()
    update_stats = parts.objective.update(update_ctx, _round_rollouts(ctx, round_index, chosen, candidates))
    training_s = time.perf_counter() - started

    # A multi-turn round judges the level by its trajectories: a kernel fixed in turn 2 is a success.
    by_level = stats["multiturn"]["success_rate_by_level"] if multi_turn else stats["correct_rate_by_level"]
    level_rates = {int(level): rate for level, rate in by_level.items()}
    movement = curriculum.update(round_index, {lvl: level_rates.get(lvl) for lvl in (1, 2, 3)})
    sampling_s = phase["sampling_s"]
    round_metrics = {
        "round": round_index, "algorithm": parts.objective.name, "reward_preset": rl.reward_preset, **stats,
        **update_stats, "curriculum_share": {str(k): v for k, v in shares.items()}, "curriculum": movement,
        "rollout_tokens": phase["sampled_tokens"],
        "reused_from_candidate_log": {"samples": phase.get("samples_reused", 0), "verdicts": phase.get("verdicts_reused", 0)},
        "rollout_tokens_per_s": phase["sampled_tokens"] / sampling_s if phase["sampled_tokens"] and sampling_s > 0 else None,
        "seconds": {"sampling_s": sampling_s, "verifying_s": phase["verifying_s"], "waiting_s": phase["waiting_s"],
                    "training_s": training_s},
    }
    parts.history.append((round_index, stats["reward_mean"], stats["correct"], stats["judged"],
                          int(update_stats.get("train_steps", 0) or 0)))
    if dist.is_main:
        print(f"[rl] round {round_index}: reward mean {stats['reward_mean']:.3f} (std {stats['reward_std']:.3f}), "
              f"{stats['correct']}/{stats['judged']} correct, {update_stats.get('train_steps', 0)} update step(s), "
              f"level-2 share next {curriculum.share_l2:.2f}; sampling {sampling_s:.0f}s, "
              f"verifying {phase['verifying_s']:.0f}s, waiting {phase['waiting_s']:.0f}s, training {training_s:.0f}s",
              flush=True)
        if multi_turn:
            turns = stats["multiturn"]
            print(f"[rl] round {round_index}: {100 * turns['success_rate']:.1f}% of {turns['trajectories']} trajectories "
                  f"solved within {rl.max_turns} turns, {turns['average_turns_used']:.2f} turns used on average, "
                  f"correct answers in turns 1..{rl.max_turns}: " + ", ".join(f"{100 * e['correct_rate']:.0f}%" for e in turns["per_turn"].values())
                  + f"; {turns['prompt_turns_dropped']} earlier turn(s) dropped from prompts", flush=True)

    def write_round_files(directory: Path) -> None:
        atomic_write_json(directory / CURRICULUM_FILE, curriculum.state_dict())
        atomic_write_json(directory / OBJECTIVE_STATE_FILE, parts.objective.state_dict())
        atomic_write_json(directory / ROUND_METRICS_FILE, round_metrics)

    saving_started = time.perf_counter()
    round_metrics["seconds"]["round_s"] = saving_started - round_started  # until the save; completed below
    directory = save_adapter_checkpoint(
        ctx.paths.rl_round(round_index), dist=dist, model=trainer.model, cfg=cfg, stage="rl",
        data={**parts.data_meta, "round_tasks": [t["task_id"] for t in chosen]}, optimizer=trainer.optimizer,
        tokenizer=ctx.tokenizer, round_index=round_index, write_extra=write_round_files,
        algorithm=parts.objective.name, reward_preset=rl.reward_preset,
        optimizer_state=train_state.OPTIMIZER_FILE, objective_state=OBJECTIVE_STATE_FILE,
        round_summary={k: round_metrics.get(k) for k in ("reward_mean", "correct", "judged", "train_steps")},
    )
    round_metrics["seconds"]["checkpoint_s"] = time.perf_counter() - saving_started
    round_metrics["seconds"]["round_s"] = time.perf_counter() - round_started
    parts.metrics.log(round_index, round_metrics, kind="round")
    if histograms_due(cfg.logging.histogram_every, round_index):
        # After the save: a round redone after a stop mid-update logs its histograms once.
        for name, values in {**round_distributions(candidates), **update_ctx.distributions}.items():
            parts.metrics.log_histogram(f"round/{name}", values, round_index)
    return directory


def histograms_due(every: int, round_index: int) -> bool:
    """Whether round ``round_index`` logs histograms under ``logging.histogram_every`` (0: never)."""
    return every > 0 and round_index % every == 0
