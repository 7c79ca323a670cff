"""Multi-turn evaluation (``evaluate.py --turns T``): each task's samples become trajectories that
refine their kernel on the verifier's feedback for up to T turns (``extensions.generation.multiturn``).

Metrics are given per turn t, over the verdicts standing after t turns (a trajectory solved at turn
2 counts as correct at turns 2..T; one still failing counts its latest answer): compile rate, correct
rate, fast_1, pass@k, the share of tasks solved by turn t, and the rates of the answers given in turn
t itself. The report's main ``metrics`` are those after the last turn, so single-turn consumers
(summaries, comparisons) read a multi-turn report unchanged. Every turn's response, verdict and
feedback is written to ``trajectories_NAME.jsonl`` after each turn. A later run of the same model
(by content), sampling and prompt settings picks the saved turns up (``restore_trajectories``):
an evaluation interrupted in turn t goes on from turn t, without sampling or judging turns 1..t-1
again; trajectories of tasks whose code changed start over.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from ..generation.multiturn import Trajectory, Turn, TurnStats, run_turns
from ..runtime.io import atomic_write_jsonl, read_jsonl
from ..verify.result import VerifyResult
from .metrics import compute_metrics
from .records import EvalTask, SampleRecord, SkippedTask, TaskRecord
from .runner import EvalSettings, VerificationError, VerificationOutcome, reference_failure

# Per-turn numbers shown in tables and curves: (key in a per-turn entry, column label)
TURN_COLUMNS = (("compiled_rate", "compiled %"), ("correct_rate", "correct %"), ("fast_1", "fast_1 %"),
                ("pass@1", "pass@1 %"), ("solved_share", "tasks solved %"))


@dataclass
class TurnsOutcome:
    trajectories: list[Trajectory]
    turn_stats: list[TurnStats]
    verification: VerificationOutcome
    per_turn_records: list[list[TaskRecord]] = field(default_factory=list)
    max_prompt_tokens: Optional[int] = None


def build_trajectories(tasks: Sequence[EvalTask], samples_per_task: int, prompts) -> list[Trajectory]:
    return [Trajectory(f"{task.task_id}#{sample}", task.code, prompts.messages(task.code, task.task_id))
            for task in tasks for sample in range(samples_per_task)]


# Header entries that decide what a trajectory's turns are; ``turns`` (how many) may differ.
RESUME_KEYS = ("model", "sampling", "prompt", "max_prompt_tokens")


def restore_trajectories(path: Path, trajectories: Sequence[Trajectory], header: dict, turns: int,
                         log=print) -> int:
    """Give ``trajectories`` the turns (up to ``turns``) a previous run saved in ``path`` under the same
    model, settings and task code; returns how many turns were restored. A file made by another model
    or with other settings is kept as ``<name>.old``."""
    path = Path(path)
    if not path.is_file():
        return 0
    saved_header, rows = _read_trajectories(path)
    if saved_header is None or any(saved_header.get(key) != header.get(key) for key in RESUME_KEYS):
        old = path.with_name(path.name + ".old")
        os.replace(path, old)
        log(f"{path} was made by another model or with other settings; moved to {old}, starting anew")
        return 0
    saved_codes, codes = saved_header.get("tasks") or {}, header.get("tasks") or {}
    by_key = {t.key: t for t in trajectories}
    restored = 0
    for row in rows:
        trajectory = by_key.get(f"{row.get('task_id')}#{row.get('sample')}")
        task_id = row.get("task_id")
        if trajectory is None or trajectory.turns or saved_codes.get(task_id) != codes.get(task_id):
            continue
        for saved in (row.get("turns") or [])[:turns]:
            result = VerifyResult.from_dict(saved["result"])
            trajectory.turns.append(Turn(saved["response"], result, saved["feedback"], saved.get("prompt_tokens"),
                                         int(saved.get("turns_dropped", 0))))
            restored += 1
            if result.correct:
                break
    if restored:
        log(f"reusing {restored} saved turn(s) of {sum(bool(t.turns) for t in trajectories)} trajectories from {path}")
    return restored


def _read_trajectories(path: Path) -> tuple[Optional[dict], list[dict]]:
    header, rows = None, []
    # Written whole by a rename, so only a hand-edited file has a line that is not an object: skipped.
    for number, record in read_jsonl(path, errors="strict"):
        if number == 1 and "header" in record:
            header = record["header"]
        elif isinstance(record.get("turns"), list):
            rows.append(record)
    return header, rows


def _write_trajectories(path: Path, trajectories: Sequence[Trajectory], header: dict) -> None:
    def rows():
        yield {"header": header}
        for trajectory in trajectories:
            task_id, sample = trajectory.key.rsplit("#", 1)
            yield {"task_id": task_id, "sample": int(sample), "turns": [turn.to_dict() for turn in trajectory.turns]}

    atomic_write_jsonl(path, rows(), ensure_ascii=True)


def model_callables(model_path: str, model_cfg, settings: EvalSettings, verifier_cfg, device: str,
                    progress: bool):
    """(generate, verify, count_tokens) over a loaded model and the verifier's batch API."""
    from ..models.loading import load_for_inference
    from ..generation.sampling import SamplingParams, render_prompt_ids, sample_completions
    from ..verify import VerifyRequest, verify_batch

    model, tokenizer, _info = load_for_inference(model_path, model_cfg)

    def generate(prompts: list[list[dict]], turn: int) -> list[str]:
        params = SamplingParams(max_new_tokens=settings.max_new_tokens, temperature=settings.temperature,
                                top_p=settings.top_p, seed=settings.seed + 1009 * turn,
                                batch_size=settings.generation_batch_size, compile_step=settings.compile_decode)
        return [texts[0] for texts in sample_completions(model, tokenizer, prompts, 1, params, progress=progress)]

    def verify(requests: list[VerifyRequest]) -> list[VerifyResult]:
        try:
            return verify_batch(requests, verifier_cfg, device=device, progress=progress)
        except Exception as exc:  # the verifier itself broke: nothing was judged
            raise VerificationError(f"the verifier could not run: {type(exc).__name__}: {exc}") from exc

    def count_tokens(messages: list[dict]) -> int:
        return len(render_prompt_ids(tokenizer, [messages])[0])

    return generate, verify, count_tokens


def run_turns_evaluation(tasks: Sequence[EvalTask], trajectories: list[Trajectory], *, generate, verify,
                         count_tokens, turns: int, max_prompt_tokens: Optional[int], trajectories_path: Path,
                         header: dict) -> TurnsOutcome:
    """Run the trajectories for ``turns`` turns (continuing the turns they hold) and group their
    verdicts per task and per turn."""
    stats = run_turns(trajectories, generate, verify, turns, max_prompt_tokens=max_prompt_tokens,
                      count_tokens=count_tokens,
                      on_turn=lambda _turn, _live: _write_trajectories(trajectories_path, trajectories, header))
    _write_trajectories(trajectories_path, trajectories, header)  # also when every turn was restored
    by_task: dict[str, list[Trajectory]] = {}
    for trajectory in trajectories:
        by_task.setdefault(trajectory.key.rsplit("#", 1)[0], []).append(trajectory)
    outcome = VerificationOutcome(records=[])
    kept_tasks = []
    for task in tasks:
        verdicts = [turn.result for t in by_task.get(task.task_id, []) for turn in t.turns]
        failure = next((reason for result in verdicts if (reason := reference_failure(result))), None)
        if failure is not None:
            outcome.skipped_tasks.append(SkippedTask(task.task_id, f"reference failed to run: {failure}"))
        else:
            kept_tasks.append(task)
    per_turn = [_records_by_turn(kept_tasks, by_task, turn) for turn in range(1, turns + 1)]
    outcome.records = per_turn[-1]
    return TurnsOutcome(trajectories, stats, outcome, per_turn, max_prompt_tokens)


def _records_by_turn(tasks: Sequence[EvalTask], by_task: dict[str, list[Trajectory]], turn: int) -> list[TaskRecord]:
    records = []
    for task in tasks:
        record = TaskRecord(task.task_id, task.level, task.name)
        for sample, trajectory in enumerate(by_task.get(task.task_id, [])):
            result = trajectory.result_by_turn(turn)
            record.samples.append(SampleRecord.from_verify_result(sample, result) if result is not None
                                  else SampleRecord.failed(sample, "no answer"))
        records.append(record)
    return records


def turns_block(outcome: TurnsOutcome, timing: bool, no_timing_reason: str) -> dict[str, Any]:
    """The report's ``turns`` section: per-turn metrics and trajectory-level summaries."""
    kept = {r.task_id for r in outcome.verification.records}
    trajectories = [t for t in outcome.trajectories if t.key.rsplit("#", 1)[0] in kept]
    per_turn = []
    for index, records in enumerate(outcome.per_turn_records):
        turn = index + 1
        metrics = compute_metrics(records, timing, no_timing_reason)
        answered = [t.turns[index] for t in trajectories if len(t.turns) > index]
        solved_tasks = sum(any(s.correct for s in r.samples) for r in records)
        per_turn.append({
            "turn": turn,
            **{key: metrics.get(key) for key in ("compiled_rate", "correct_rate", "fast_1", "valid_rate",
                                                 "mean_reward", "num_samples")},
            **{key: value for key, value in metrics.items() if key.startswith("pass@")},
            "solved_share": 100.0 * solved_tasks / len(records) if records else None,
            "answered": len(answered),
            "answered_compiled_rate": _share(answered, lambda a: a.result.passed("compile")),
            "answered_correct_rate": _share(answered, lambda a: a.result.correct),
            "prompt_rounds_dropped": sum(a.turns_dropped for a in answered),
        })
    used = [len(t.turns) for t in trajectories]
    budget = outcome.max_prompt_tokens
    best_reward = [max((turn.result.reward for turn in t.turns), default=0.0) for t in trajectories]
    return {
        "max_turns": len(outcome.per_turn_records),
        "per_turn": per_turn,
        "trajectories": len(trajectories),
        "success_rate": _share(trajectories, lambda t: t.solved),
        "average_turns_used": sum(used) / len(used) if used else None,
        "mean_best_reward": sum(best_reward) / len(best_reward) if best_reward else None,
        # from the trajectories, not this run's turn statistics: a resumed run restored some turns
        "prompt_rounds_dropped": sum(turn.turns_dropped for t in outcome.trajectories for turn in t.turns),
        "prompts_over_budget": sum(1 for t in outcome.trajectories for turn in t.turns
                                   if budget is not None and turn.prompt_tokens is not None
                                   and turn.prompt_tokens > budget),
    }


def _share(items: Sequence, test) -> Optional[float]:
    return 100.0 * sum(bool(test(item)) for item in items) / len(items) if items else None


def format_turn_table(block: dict[str, Any]) -> str:
    """The per-turn table printed after a multi-turn evaluation."""
    header = f"{'turn':>4} {'answered':>8} " + " ".join(f"{label:>14}" for _, label in TURN_COLUMNS)
    lines = [header]
    for entry in block["per_turn"]:
        cells = " ".join(f"{'n/a' if entry.get(key) is None else format(entry[key], '.1f'):>14}"
                         for key, _ in TURN_COLUMNS)
        lines.append(f"{entry['turn']:>4} {entry['answered']:>8} {cells}")
    average = block["average_turns_used"]
    lines.append(f"trajectories solved: {_fmt(block['success_rate'])}%, average turns used: "
                 f"{'n/a' if average is None else format(average, '.2f')}, older rounds dropped from prompts: "
                 f"{block['prompt_rounds_dropped']}")
    return "\n".join(lines)


def _fmt(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def plot_turn_curves(blocks: dict[str, dict[str, Any]], path: Path) -> None:
    """Per-turn curves (tasks solved, correct and compiled rates) for one or more models."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for ax, (key, label) in zip(axes, (("solved_share", "tasks solved by turn t (%)"),
                                       ("correct_rate", "correct samples by turn t (%)"),
                                       ("compiled_rate", "compiled samples by turn t (%)"))):
        for name, block in blocks.items():
            turns = [e["turn"] for e in block["per_turn"]]
            ax.plot(turns, [e.get(key) or 0.0 for e in block["per_turn"]], marker="o", label=name)
        ax.set_title(label)
        ax.set_xlabel("turn")
        ax.set_ylim(-2, 102)
        ax.set_xticks(sorted({e["turn"] for b in blocks.values() for e in b["per_turn"]}))
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
