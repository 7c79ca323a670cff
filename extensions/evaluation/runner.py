"""Evaluate one model: generate responses (saved before anything is verified), verify them, and
turn the verdicts into an evaluation report.

Generations are appended to ``generations_NAME.jsonl`` one chunk of tasks at a time, so a crash
during generation keeps every finished chunk and a crash during verification keeps them all; a
re-run with the same model and sampling settings reuses the saved rows and generates only the
missing tasks.
"""
from __future__ import annotations

import gc
import json
import os
import time
import zlib
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from .generation_cache import pending_tasks, write_rows
from .inputs import Generation, GenerationsFile, generation_row, read_generations
from .metrics import compute_metrics
from .records import EvalTask, SampleRecord, SkippedTask, TaskRecord

REPORT_VERSION = 1


@dataclass
class EvalSettings:
    """How responses are sampled; saved in the generations header and the report."""

    samples_per_task: int = 1
    temperature: float = 0.0
    top_p: float = 0.95
    max_new_tokens: int = 2048
    seed: int = 1234
    generation_batch_size: int = 64
    compile_decode: bool = True

    @classmethod
    def from_config(cls, eval_cfg, samples_per_task: Optional[int] = None) -> "EvalSettings":
        return cls(
            samples_per_task=samples_per_task or eval_cfg.samples_per_task,
            temperature=eval_cfg.temperature, top_p=eval_cfg.top_p,
            max_new_tokens=eval_cfg.max_new_tokens, seed=eval_cfg.seed,
            generation_batch_size=eval_cfg.generation_batch_size, compile_decode=eval_cfg.compile_decode,
        )

    def sampling_key(self) -> dict[str, Any]:
        """The settings that change what is generated (batch size and kernel choices do not)."""
        key = asdict(self)
        key.pop("generation_batch_size")
        key.pop("compile_decode")
        return key


class VerificationError(RuntimeError):
    """The verifier itself could not run (not a verdict on a candidate)."""


# --------------------------------------------------------------------------------------------------
# generation


def _chunk_seed(base_seed: int, chunk: Sequence[EvalTask]) -> int:
    # Tied to the chunk's first task, not to its position, so every model sees the same seeds for
    # the same tasks and a resumed run seeds its remaining chunks as a fresh run would.
    return (base_seed + zlib.crc32(chunk[0].task_id.encode())) % (2**31 - 1)


def generate_responses(model_path: str, tasks: Sequence[EvalTask], settings: EvalSettings, model_cfg,
                       generations_path: Path, *, progress: bool = True, log=print,
                       workers: int = 0, prompts=None) -> GenerationsFile:
    """Generate ``samples_per_task`` responses per task (reusing saved ones) and return the saved file.

    ``workers``: generation processes, one per GPU (0: one per visible GPU unless ``model_cfg``
    shards one model over all of them with ``device_map``). ``prompts``: the ``PromptBuilder``
    (default: plain prompts).
    """
    from ..prompting.builder import PromptBuilder

    prompts = prompts or PromptBuilder()
    todo = pending_tasks(generations_path, tasks, model_path, settings, log=log, model_cfg=model_cfg,
                         prompt=prompts.describe())
    if todo:
        # Built here, once: worker processes receive the messages and need no retrieval index.
        messages = {t.task_id: prompts.messages(t.code, t.task_id) for t in todo}
        if settings.samples_per_task > 1 and settings.temperature == 0:
            log("warning: several samples per task with temperature 0 (greedy) are identical; pass@k>1 "
                "then says nothing more than pass@1")
        per_chunk = max(1, settings.generation_batch_size // settings.samples_per_task)
        chunks = [todo[start:start + per_chunk] for start in range(0, len(todo), per_chunk)]
        count = min(generation_workers(workers, model_cfg), len(chunks))
        if count <= 1:
            generate_chunks(generations_path, model_path, chunks, settings, model_cfg, progress=progress,
                            messages=messages)
        else:
            log(f"generating {len(todo)} tasks in {count} processes, one per GPU")
            _generate_in_workers(generations_path, model_path, chunks, settings, model_cfg, count, progress,
                                 messages)
    return read_generations(generations_path)


def generation_workers(requested: int, model_cfg) -> int:
    if requested > 0:
        return requested
    if model_cfg.device_map:
        return 1  # one model spread over every GPU
    try:
        import torch
    except ImportError:
        return 1
    return max(1, torch.cuda.device_count())


def _visible_gpus(count: int) -> list[str]:
    visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return visible[:count] if len(visible) >= count else [str(i) for i in range(count)]


def _generate_in_workers(path: Path, model_path: str, chunks: list[list[EvalTask]], settings: EvalSettings,
                         model_cfg, count: int, progress: bool, messages: dict) -> None:
    import subprocess
    import sys
    import tempfile

    import torch

    gpus = _visible_gpus(count) if torch.cuda.is_available() else [None] * count
    project_root = Path(__file__).resolve().parents[2]
    with tempfile.TemporaryDirectory(prefix="eval-generation-") as workdir:
        processes = []
        for worker, gpu in enumerate(gpus):
            spec = {
                "generations": str(Path(path).resolve()), "model_path": model_path,
                "model_cfg": asdict(model_cfg), "settings": asdict(settings),
                "chunks": [[asdict(task) for task in chunk] for chunk in chunks[worker::count]],
                "progress": progress, "worker": worker,
                "messages": {t.task_id: messages[t.task_id] for chunk in chunks[worker::count] for t in chunk},
            }
            spec_path = Path(workdir) / f"worker-{worker}.json"
            spec_path.write_text(json.dumps(spec))
            env = dict(os.environ)
            if gpu is not None:
                env["CUDA_VISIBLE_DEVICES"] = gpu
            processes.append(subprocess.Popen(
                [sys.executable, "-m", "extensions.evaluation.generation_worker", str(spec_path)],
                cwd=project_root, env=env))
        failed = [worker for worker, process in enumerate(processes) if process.wait() != 0]
    if failed:
        raise RuntimeError(f"generation worker(s) {failed} failed (their errors are above); the chunks they "
                           f"finished are saved in {path} and a re-run generates only the rest")


def generate_chunks(path: Path, model_path: str, chunks: Sequence[Sequence[EvalTask]], settings: EvalSettings,
                    model_cfg, *, progress: bool, position: int = 0,
                    messages: Optional[dict[str, list[dict]]] = None) -> None:
    """Generate ``chunks`` in this process, appending each finished chunk to ``path``.

    ``messages``: each task's prompt by task id (default: the plain prompt of its code)."""
    from tqdm.auto import tqdm

    from ..models.loading import load_for_inference
    from ..prompting.templates import build_messages
    from ..generation.sampling import SamplingParams, sample_answers

    model, tokenizer, _info = load_for_inference(model_path, model_cfg)
    try:
        bar = tqdm(total=sum(len(c) for c in chunks), desc=f"generate {Path(path).stem}", unit="task",
                   disable=not progress, position=position)
        for chunk in chunks:
            params = SamplingParams(
                max_new_tokens=settings.max_new_tokens, temperature=settings.temperature,
                top_p=settings.top_p, seed=_chunk_seed(settings.seed, chunk),
                batch_size=settings.generation_batch_size, compile_step=settings.compile_decode,
            )
            answers = sample_answers(
                model, tokenizer, [messages[t.task_id] if messages else build_messages(t.code) for t in chunk],
                settings.samples_per_task,
                params, progress=False,
            )
            rows = [generation_row(task, i, answer.text, new_tokens=answer.new_tokens, cut_off=answer.cut_off)
                    for task, per_task in zip(chunk, answers) for i, answer in enumerate(per_task)]
            write_rows(path, None, rows, "a")
            bar.update(len(chunk))
        bar.close()
    finally:
        del model
        gc.collect()
        try:
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        except ImportError:
            pass


# --------------------------------------------------------------------------------------------------
# verification


@dataclass
class VerificationOutcome:
    records: list[TaskRecord]
    skipped_tasks: list[SkippedTask] = field(default_factory=list)
    skipped_rows: list[str] = field(default_factory=list)
    failed_samples: int = 0  # rows with no usable response, counted as failed samples


def resolve_device(device: Optional[str], verifier_cfg) -> str:
    choice = device or verifier_cfg.device
    if choice == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return choice


def reference_failure(result) -> Optional[str]:
    """The reason a verdict says the task's own reference could not run, else None.

    The verifier marks such verdicts with ``details["problem_error"]`` and an error "problem: ...".
    It only prepares the reference for candidates that pass the static check, so a broken task whose
    candidates all fail earlier is not detected and is scored as failed samples.
    """
    if not (result.details or {}).get("problem_error"):
        return None
    error = result.error or "the task's reference failed to run"
    return error[len("problem: "):] if error.startswith("problem: ") else error


def verify_generations(tasks: Sequence[EvalTask], generations: GenerationsFile, verifier_cfg, device: str,
                       *, every_task_expected: bool, progress: bool = True) -> VerificationOutcome:
    """Judge every saved response with the verifier's batch API and group the verdicts per task.

    Rows naming an unknown task are skipped and reported. A task whose reference fails to run is
    moved to ``skipped_tasks`` and left out of every rate. With ``every_task_expected`` a task that has
    no generation at all is skipped too (model mode); otherwise the task set is the one the
    generations cover (``--from_generations`` with a larger tasks file).
    """
    from ..verify import VerifyRequest, verify_batch

    by_id = {t.task_id: t for t in tasks}
    outcome = VerificationOutcome(records=[])
    unknown = Counter(row.task_id for row in generations.rows if row.task_id not in by_id)
    for task_id, n in sorted(unknown.items()):
        outcome.skipped_rows.append(f"unknown task id {task_id!r}: {n} generation row(s) skipped")
    rows_by_task: dict[str, list[Generation]] = {}
    for row in generations.rows:
        if row.task_id in by_id:
            rows_by_task.setdefault(row.task_id, []).append(row)

    to_verify = [row for rows in rows_by_task.values() for row in rows if row.response is not None]
    requests = [
        VerifyRequest(problem_code=by_id[row.task_id].code, candidate_text=row.response,
                      label=f"{row.task_id}#{row.sample}")
        for row in to_verify
    ]
    try:
        results = verify_batch(requests, verifier_cfg, device=device, progress=progress) if requests else []
    except Exception as exc:  # the verifier itself broke: nothing was judged
        raise VerificationError(f"the verifier could not run: {type(exc).__name__}: {exc}") from exc
    if len(results) != len(requests):
        raise VerificationError(f"the verifier returned {len(results)} verdicts for {len(requests)} requests")
    verdicts = {(row.task_id, row.sample): result for row, result in zip(to_verify, results)}

    for task in tasks:
        rows = sorted(rows_by_task.get(task.task_id, []), key=lambda r: r.sample)
        if not rows:
            if every_task_expected:
                outcome.skipped_tasks.append(SkippedTask(task.task_id, "no generation was saved for this task"))
            continue
        judged = [verdicts[(row.task_id, row.sample)] for row in rows if (row.task_id, row.sample) in verdicts]
        failure = next((reason for result in judged if (reason := reference_failure(result))), None)
        if failure is not None:
            outcome.skipped_tasks.append(SkippedTask(task.task_id, f"reference failed to run: {failure}"))
            continue
        record = TaskRecord(task_id=task.task_id, level=task.level, name=task.name)
        for row in rows:
            if row.response is None:
                record.samples.append(SampleRecord.failed(row.sample, row.problem or "no response"))
                outcome.failed_samples += 1
            else:
                record.samples.append(SampleRecord.from_verify_result(row.sample, verdicts[(row.task_id, row.sample)]))
        outcome.records.append(record)
    return outcome


# --------------------------------------------------------------------------------------------------
# report


def timing_status(device: str, verifier_cfg, records: Sequence[TaskRecord]) -> tuple[bool, Optional[str]]:
    """Whether speedups were measured, and if not, why (so fast_p is null, never a fake 0)."""
    measured = any(s.speedup is not None for t in records for s in t.samples)
    if measured or (device == "cuda" and verifier_cfg.enable_calibrated_timing):
        return True, None
    if device != "cuda":
        return False, f"no timing on {device}: Triton ran in the interpreter, which is not timed"
    return False, "timing disabled (verifier.enable_calibrated_timing is false)"


def answer_lengths(rows: Sequence[Any]) -> Optional[dict[str, Any]]:
    """How long the generated answers were and how many ``max_new_tokens`` cut off, over the rows
    that carry their length (rows from another tool's generations do not): None without such rows.
    A cut-off answer usually fails extraction, so this tells a budget problem from a model one."""
    lengths = sorted(row.new_tokens for row in rows if getattr(row, "new_tokens", None) is not None)
    if not lengths:
        return None
    cut = sum(1 for row in rows if getattr(row, "new_tokens", None) is not None and row.cut_off)

    def quantile(q: float) -> int:
        return lengths[min(len(lengths) - 1, int(q * len(lengths)))]

    return {"answers": len(lengths), "cut_off": cut, "new_tokens_median": quantile(0.5),
            "new_tokens_p90": quantile(0.9), "new_tokens_max": lengths[-1]}


def build_report(*, name: str, model_path: Optional[str], tasks_file: Path, generations_file: Path,
                 generations_header: Optional[dict], device: str, verifier_cfg, outcome: VerificationOutcome,
                 input_issues: Sequence[str], config_source: Optional[str], config=None,
                 generation_rows: Sequence[Any] = ()) -> dict[str, Any]:
    """The evaluation report; ``config`` (the run's PipelineConfig) is stored in full with its fingerprints."""
    from ..config.fingerprint import config_fingerprint, resolved_dict, stage_fingerprint
    from ..runtime.freshness import file_sha256

    timing, reason = timing_status(device, verifier_cfg, outcome.records)
    skipped_rows = [*input_issues, *outcome.skipped_rows]
    report = {
        "report_version": REPORT_VERSION,
        "name": name,
        "model_path": model_path,
        "config_file": config.source if config is not None else config_source,
        "config": resolved_dict(config) if config is not None else None,
        "config_fingerprint": config_fingerprint(config) if config is not None else None,
        "eval_fingerprint": stage_fingerprint(config, "eval") if config is not None else None,
        "tasks_file": str(tasks_file),
        "tasks_file_sha256": file_sha256(tasks_file),
        "generations_file": str(generations_file),
        "generation": generations_header,
        "verification": {"device": device, "timing": timing, "no_timing_reason": reason},
        "created_unix": time.time(),
        "metrics": compute_metrics(outcome.records, timing, reason or "no timing was measured"),
        "skipped_tasks": [asdict(s) for s in outcome.skipped_tasks],
        "skipped_rows": skipped_rows,
        "failed_samples_without_response": outcome.failed_samples,
        "answer_lengths": answer_lengths(generation_rows),
        "tasks": [r.to_dict() for r in outcome.records],
    }
    report["complete"] = not report["skipped_tasks"] and not skipped_rows
    return report
