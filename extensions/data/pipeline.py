"""The data preparation stage: sources in, the run's ``data/processed`` files out.

``prepare(cfg, out_dir)`` reads KernelBook (hub, local file or the bundled set) and KernelBench,
normalises and validates every row, removes exact and near duplicates and training rows that copy an
evaluation problem (by text, and by what they compute: ``operator_graph``), labels difficulty, splits deterministically and writes (each file atomically,
the report last):

    sft_train.jsonl  sft_val.jsonl   {"uuid", "level", "prompt", "completion"}
    rl_tasks.jsonl                   {"task_id", "level", "name", "code"}
    eval_tasks.jsonl                 {"task_id", "level", "name", "code", "predicted_level", "source"}
    difficulty_labels.jsonl          {"uuid", "level", "signals"}
    retrieval/                       worked-example index of the SFT training pairs (RA-ICL)
    prepare_report.json              per-source read/kept/dropped-by-reason, agreement, fingerprint,
                                     the index's size, the prompts' retrieval statistics, the
                                     verification of every kept pair (``verification``) and the
                                     decontamination (``decontamination``: counts by rule, the
                                     pairs dropped for computing an evaluation task, untraceable)

KernelBook rows are canonicalised from inductor's dialect (``canonical/``) while they are read, and
every kept pair is judged by the verifier (``pair_verification``) before it is split: a pair the
reward would reject is dropped as ``verify_failed:<stage>`` and never trained on or retrieved.

A second call with the same inputs, configuration and code finds the report's fingerprint unchanged
and does nothing.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from ..config.sections import DataConfig, PipelineConfig, PromptConfig
from ..prompting.builder import PromptBuilder
from ..prompting.templates import format_completion
from ..runtime.io import atomic_write_json, atomic_write_jsonl
from ..runtime.paths import retrieval_index_dir
from ..runtime.run_files import LOCAL_FILES, RunFiles
from ..verify.common.problem_constants import find_size_constants
from . import rejections as R
from .bundled import bundled_eval_tasks, bundled_fingerprint
from .dedup import SimilarityIndex, code_shingles, exact_key
from .difficulty import analyse_module
from .kernelbench import EvalTask, read_eval_tasks
from .kernelbook import KernelBookPair, normalise_row
from .operator_graph import ComputationIndex, SignatureTracer
from .pair_verification import summarize as summarize_verification, verifier_digest, verify_pairs
from .report import SourceTally, difficulty_agreement, format_summary
from .retrieval import Example, ExampleRetriever, build_index, index_is_complete, require_backend
from .sources import read_kernelbench, read_kernelbook, source_identity
from .splits import split_ids

log = logging.getLogger(__name__)

OUTPUT_FILES = ("sft_train.jsonl", "sft_val.jsonl", "rl_tasks.jsonl", "eval_tasks.jsonl",
                "difficulty_labels.jsonl")
REPORT_FILE = "prepare_report.json"
_CODE_FILES = ("kernelbook.py", "kernelbench.py", "dedup.py", "difficulty.py", "splits.py",
               "pipeline.py", "rejections.py", "sources.py", "pair_verification.py", "operator_graph.py")


@dataclass
class PrepareOutcome:
    out_dir: Path
    report: dict[str, Any]
    up_to_date: bool  # nothing was done: the outputs match the inputs


@dataclass
class _KeptPair:
    pair: KernelBookPair
    level: int
    signals: list[str]


def _code_fingerprint() -> str:
    digest = hashlib.sha256()
    here = Path(__file__).resolve().parent
    library = here.parent
    for path in [*(here / name for name in _CODE_FILES), library / "prompting" / "templates.py",
                 library / "prompting" / "builder.py",
                 *sorted((here / "retrieval").glob("*.py")), *sorted((here / "canonical").glob("*.py"))]:
        digest.update(path.read_bytes())
    return digest.hexdigest()


def input_fingerprint(data_cfg: DataConfig, prompt_cfg: Optional[PromptConfig] = None) -> dict[str, Any]:
    """Everything the outputs depend on: source identities, the data and prompt config, the code."""
    return {
        "prompt": dataclasses.asdict(prompt_cfg) if prompt_cfg is not None else None,
        "kernelbook": source_identity(data_cfg.kernelbook),
        "kernelbench": source_identity(data_cfg.kernelbench),
        "bundled_eval_tasks": bundled_fingerprint() if data_cfg.bundled_eval_tasks else None,
        "config": dataclasses.asdict(data_cfg),
        "code": _code_fingerprint(),
        "verifier": verifier_digest() if data_cfg.verify_pairs else None,
    }


def is_up_to_date(out_dir: Path, fingerprint: dict[str, Any], files: RunFiles = LOCAL_FILES) -> bool:
    report_path = out_dir / REPORT_FILE
    if not files.is_file(report_path) or not all(files.is_file(out_dir / name) for name in OUTPUT_FILES):
        return False
    if not index_is_complete(retrieval_index_dir(out_dir), files):
        return False
    try:
        return json.loads(files.read_text(report_path)).get("fingerprint") == json.loads(json.dumps(fingerprint))
    except (json.JSONDecodeError, OSError):
        return False


def _progress(iterable, desc: str, enabled: bool, total: Optional[int] = None):
    if not enabled:
        return iterable
    from tqdm.auto import tqdm

    return tqdm(iterable, desc=desc, total=total, unit="row", mininterval=1.0)


def collect_eval_tasks(data_cfg, tallies: dict[str, SourceTally], progress: bool) -> list[EvalTask]:
    tasks: list[EvalTask] = []
    if data_cfg.kernelbench != "none":
        tally = tallies.setdefault("kernelbench", SourceTally(data_cfg.kernelbench))
        rows = read_kernelbench(data_cfg.kernelbench, list(data_cfg.kernelbench_levels))
        tasks += read_eval_tasks(_progress(rows, "kernelbench", progress), list(data_cfg.kernelbench_levels), tally)
    if data_cfg.bundled_eval_tasks:
        tally = tallies.setdefault("bundled_eval", SourceTally("bundled eval tasks"))
        for task in bundled_eval_tasks():
            tally.count_read()
            tally.keep()
            tasks.append(EvalTask(task_id=f"bundled_{task.name}", level=task.level, name=task.name,
                                  code=task.code, predicted_level=analyse_module(task.code).level,
                                  source="bundled"))
    return tasks


def collect_pairs(data_cfg, eval_tasks: list[EvalTask], tally: SourceTally, *, max_samples: Optional[int],
                  progress: bool) -> list[_KeptPair]:
    """Normalise, validate, deduplicate and decontaminate KernelBook rows, in input order."""
    eval_index = SimilarityIndex()
    for task in eval_tasks:
        eval_index.add(task.task_id, code_shingles(task.code))
    kept_index = SimilarityIndex()
    seen_exact: set[str] = set()
    seen_uuid: set[str] = set()
    kept: list[_KeptPair] = []
    rows = read_kernelbook(data_cfg.kernelbook)
    for item in _progress(rows, "kernelbook", progress, total=max_samples):
        if max_samples is not None and tally.read >= max_samples:
            break
        tally.count_read()
        if item.rejected:
            tally.drop(item.rejected)
            continue
        try:
            pair = normalise_row(item.row, drop_library_kernel_solutions=data_cfg.drop_library_kernel_solutions,
                                 max_task_chars=data_cfg.max_prompt_chars,
                                 max_solution_chars=data_cfg.max_completion_chars)
            if pair.uuid in seen_uuid:
                raise R.RowRejected(R.EXACT_DUPLICATE, f"uuid {pair.uuid} seen before")
            key = exact_key(pair.task_code, pair.solution_code)
            if key in seen_exact:
                raise R.RowRejected(R.EXACT_DUPLICATE)
            task_shingles = code_shingles(pair.task_code)
            match = eval_index.most_similar(task_shingles, data_cfg.decontamination_threshold)
            if match:
                raise R.RowRejected(R.CONTAMINATED, f"{match[0]} (jaccard {match[1]:.2f})")
            match = kept_index.most_similar(task_shingles, data_cfg.near_duplicate_threshold)
            if match:
                raise R.RowRejected(R.NEAR_DUPLICATE, f"{match[0]} (jaccard {match[1]:.2f})")
            try:
                analysis = analyse_module(pair.task_code)
            except (ValueError, SyntaxError, RecursionError) as exc:
                raise R.RowRejected(R.NO_ENTRY_POINT_CLASS, str(exc)) from None
        except R.RowRejected as exc:
            tally.drop(exc.reason)
            log.debug("row %d dropped: %s", item.index, exc)
            continue
        seen_uuid.add(pair.uuid)
        seen_exact.add(key)
        kept_index.add(pair.uuid, task_shingles)
        kept.append(_KeptPair(pair, analysis.level, analysis.architecture_signals))
        tally.keep()
    return kept


def drop_same_computation(kept: list[_KeptPair], eval_tasks: list[EvalTask], tally: SourceTally, *,
                          enabled: bool, tracer: Optional[SignatureTracer] = None) -> tuple[list[_KeptPair], dict]:
    """Drop every kept pair whose task computes what an evaluation task computes (its traced operator
    graph, shapes abstracted, equals the task's), counted as ``same_computation_as_eval_problem``.
    A pair or task that does not trace stays under the text rule alone, and is counted."""
    by_text = tally.dropped.get(R.CONTAMINATED, 0)
    if not enabled:
        return kept, {"by_text": by_text, "by_computation": None,
                      "skipped": "data.decontaminate_by_computation is false"}
    if not eval_tasks or not kept:
        return kept, {"by_text": by_text, "by_computation": 0, "eval_tasks_traced": 0, "pairs_traced": 0,
                      "untraceable_eval_tasks": [], "untraceable_pairs": 0, "dropped": []}
    started = time.time()
    own_tracer = tracer is None
    tracer = tracer or SignatureTracer()
    try:
        index = ComputationIndex()
        for task in eval_tasks:
            index.add(task.task_id, tracer.signature(task.code))
        passed, dropped, untraceable = [], [], 0
        for item in kept:
            signature = tracer.signature(item.pair.task_code)
            untraceable += not signature.traceable
            match = index.match(signature)
            if match is None:
                passed.append(item)
                continue
            tally.unkeep(R.SAME_COMPUTATION)
            dropped.append({"uuid": item.pair.uuid, "eval_task": match.key, "exact_graph": match.exact,
                            "ops": list(signature.ops)})
            log.debug("pair %s computes what %s computes", item.pair.uuid, match.key)
    finally:
        if own_tracer:
            tracer.close()
    return passed, {
        "by_text": by_text, "by_computation": len(dropped),
        "eval_tasks_traced": len(eval_tasks) - len(index.untraceable), "pairs_traced": len(kept) - untraceable,
        "untraceable_eval_tasks": list(index.untraceable), "untraceable_pairs": untraceable,
        "dropped": dropped, "seconds": round(time.time() - started, 2),
    }


FAILED_PAIRS_LISTED = 50


def failed_pair_rows(uuids: list[str], verdicts: list, limit: int = FAILED_PAIRS_LISTED) -> list[dict[str, str]]:
    """The pairs the verifier rejected, by name (the first ``limit``): counts alone cannot say
    whether the same pair fails again on another machine."""
    rows = [{"uuid": uuid, "stage": verdict.stage, "error": (verdict.error or "")[:200]}
            for uuid, verdict in zip(uuids, verdicts) if not verdict.correct]
    return rows[:limit]


def verify_kept_pairs(kept: list[_KeptPair], cfg: PipelineConfig, tally: SourceTally,
                      progress: bool) -> tuple[list[_KeptPair], dict[str, Any]]:
    """Judge every kept pair with the reward's verifier; the rejected ones are dropped and counted."""
    if not cfg.data.verify_pairs:
        return kept, {"pairs": len(kept), "skipped": "data.verify_pairs is false: pairs are not verified"}
    verdicts = verify_pairs([k.pair for k in kept], cfg.verifier, progress=progress)
    passed = []
    for item, verdict in zip(kept, verdicts):
        if verdict.correct:
            passed.append(item)
        else:
            tally.unkeep(f"{R.VERIFY_FAILED}:{verdict.stage}")
            log.debug("pair %s failed verification at %s: %s", item.pair.uuid, verdict.stage, verdict.error)
    summary = summarize_verification(verdicts)
    summary["failed_pairs"] = failed_pair_rows([k.pair.uuid for k in kept], verdicts)
    summary["every_kept_pair_verified"] = True
    # KernelBook writes its shapes as literals: no size constant for the verifier to vary, so such a
    # pair (and its kernels, compiled for those sizes) is judged at the row's own shape only.
    summary["judged_at_own_shape_only"] = sum(1 for item in passed if not find_size_constants(item.pair.task_code))
    return passed, summary


def pair_id(uuid: str) -> str:
    """A KernelBook pair's id wherever it appears: RL task ids and retrieval example ids."""
    return f"kb_{uuid}"


def prepare(cfg: PipelineConfig, out_dir: Path, *, force: bool = False, max_samples: Optional[int] = None,
            progress: bool = True) -> PrepareOutcome:
    """Run data preparation for ``cfg`` (a PipelineConfig) into ``out_dir``."""
    data_cfg = cfg.data
    if max_samples is not None:
        data_cfg = dataclasses.replace(data_cfg, max_samples=max_samples)
    if data_cfg.max_samples is not None and data_cfg.max_samples < 1:
        raise ValueError(f"max_samples must be >= 1, got {data_cfg.max_samples}")
    out_dir = Path(out_dir)
    fingerprint = input_fingerprint(data_cfg, cfg.prompt)
    if not force and is_up_to_date(out_dir, fingerprint):
        return PrepareOutcome(out_dir, json.loads((out_dir / REPORT_FILE).read_text()), up_to_date=True)

    require_backend(data_cfg.retrieval)
    started = time.time()
    tallies: dict[str, SourceTally] = {"kernelbook": SourceTally(data_cfg.kernelbook)}
    eval_tasks = collect_eval_tasks(data_cfg, tallies, progress)
    kept = collect_pairs(data_cfg, eval_tasks, tallies["kernelbook"], max_samples=data_cfg.max_samples,
                         progress=progress)
    kept, decontamination = drop_same_computation(kept, eval_tasks, tallies["kernelbook"],
                                                  enabled=data_cfg.decontaminate_by_computation)
    kept, verification = verify_kept_pairs(kept, cfg, tallies["kernelbook"], progress)

    by_uuid = {k.pair.uuid: k for k in kept}
    split = split_ids([k.pair.uuid for k in kept], val_fraction=data_cfg.val_fraction,
                      rl_fraction=data_cfg.rl_fraction, rl_ids=data_cfg.rl_task_ids)
    rl_ids_missing = [uuid for uuid in data_cfg.rl_task_ids if uuid not in by_uuid]

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / REPORT_FILE).unlink(missing_ok=True)  # outputs are incomplete until the report is back
    index_dir = retrieval_index_dir(out_dir)
    retrieval_meta = build_index(
        (Example(pair_id(uuid), by_uuid[uuid].pair.task_code, by_uuid[uuid].pair.solution_code)
         for uuid in split.train), index_dir, data_cfg.retrieval, data_cfg.retrieval_dense_model, progress=progress)
    prompts = PromptBuilder.from_config(
        cfg.prompt, lambda: ExampleRetriever.open(index_dir, data_cfg.retrieval_dense_model))

    def sft_rows(ids):
        for uuid in ids:
            item = by_uuid[uuid]
            yield {"uuid": uuid, "level": item.level,
                   "prompt": prompts.messages(item.pair.task_code, task_id=pair_id(uuid)),
                   "completion": format_completion(item.pair.solution_code)}
    outputs = {
        "sft_train": atomic_write_jsonl(out_dir / "sft_train.jsonl", sft_rows(split.train)),
        "sft_val": atomic_write_jsonl(out_dir / "sft_val.jsonl", sft_rows(split.val)),
        "rl_tasks": atomic_write_jsonl(out_dir / "rl_tasks.jsonl", (
            {"task_id": pair_id(uuid), "level": by_uuid[uuid].level, "name": by_uuid[uuid].pair.entry_point,
             "code": by_uuid[uuid].pair.task_code} for uuid in split.rl)),
        "eval_tasks": atomic_write_jsonl(out_dir / "eval_tasks.jsonl", (t.to_row() for t in eval_tasks)),
        "difficulty_labels": atomic_write_jsonl(out_dir / "difficulty_labels.jsonl", (
            {"uuid": k.pair.uuid, "level": k.level, "signals": k.signals} for k in kept)),
    }
    kernelbench = [(t.level, t.predicted_level) for t in eval_tasks if t.source == "kernelbench"]
    bundled = [(t.level, t.predicted_level) for t in eval_tasks if t.source == "bundled"]
    report = {
        "fingerprint": fingerprint,
        "sources": {name: tally.to_dict() for name, tally in tallies.items()},
        "outputs": outputs,
        "difficulty": {
            "kernelbook_levels": {str(lvl): sum(1 for k in kept if k.level == lvl) for lvl in (1, 2, 3)},
            "kernelbench_agreement": difficulty_agreement(kernelbench),
            "bundled_eval_agreement": difficulty_agreement(bundled),
        },
        "retrieval": {"index": retrieval_meta, "sft_prompts": prompts.stats()},
        "rl_task_ids_missing": rl_ids_missing,
        "verification": verification,
        "decontamination": decontamination,
        "dialects": dict(sorted(Counter(k.pair.dialect for k in kept).items())),
        "seconds": round(time.time() - started, 2),
    }
    atomic_write_json(out_dir / REPORT_FILE, report, sort_keys=False, default=None)
    return PrepareOutcome(out_dir, report, up_to_date=False)


__all__ = ["PrepareOutcome", "prepare", "input_fingerprint", "is_up_to_date", "format_summary"]
