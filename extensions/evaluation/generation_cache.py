"""Which saved generations may be reused: keyed on what the model is, the tasks and the sampling.

A generations file starts with a header naming the model by content (``model_identity``: the
sha256 of a LoRA adapter's weights, or a full model's name and weight files), the sampling settings
and the prompt builder, plus the sha256 of every task's code. Saved rows are reused only for tasks
whose code is unchanged, under a header whose model and sampling match; so retraining an adapter in
the same directory regenerates, and evaluating an adapter whose weights equal those of one already
evaluated (an RL adapter that no update changed) copies that one's generations instead of sampling
them again.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from ..config.sections import ModelConfig
from ..prompting.templates import prompt_text_digest
from ..runtime.checkpoints import META, adapter_content_hash
from .inputs import read_generations
from .records import EvalTask

# A label recorded in every generations file header, not an import path: it keeps the spelling the
# prompt builder had when caches were first written, so a module move does not discard them.
PROMPT_BUILDER = "extensions.prompts.build_messages"
# What decides the prompts' text (PromptBuilder.describe()); plain prompts when none is given.
PLAIN_PROMPT = {"builder": PROMPT_BUILDER, "mode": "plain", "text": prompt_text_digest()}
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth")


def task_code_hash(task: EvalTask) -> str:
    return hashlib.sha256(task.code.encode()).hexdigest()[:16]


def model_identity(model_path: str, model_cfg: Optional[ModelConfig] = None) -> dict[str, Any]:
    """What decides a model's outputs, by content where that is cheap to know.

    A LoRA adapter directory: its weights' sha256 and its base model. A local full-model directory:
    its weight files' names, sizes and modification times (hashing 15 GB per evaluation is too
    slow). A hub id or ``pkg:`` name: the name and GGUF file. Plus the dtype and quantization of
    this run, which change the numbers too.
    """
    local = Path(model_path).expanduser()
    identity: dict[str, Any]
    adapter = adapter_content_hash(local) if local.is_dir() else None
    if adapter is not None:
        try:
            meta = json.loads((local / META).read_text())
        except (OSError, ValueError):
            meta = {}
        identity = {"adapter_sha256": adapter, "base_model": meta.get("base_model"),
                    "gguf_file": (meta.get("model") or {}).get("gguf_file")}
    elif local.is_dir():
        files = sorted(p for p in local.rglob("*") if p.is_file() and p.suffix in _WEIGHT_SUFFIXES)
        identity = {"model_dir": str(local.resolve()),
                    "weights": [[str(p.relative_to(local)), p.stat().st_size, p.stat().st_mtime_ns] for p in files]}
    else:
        same_as_config = model_cfg is not None and model_path == model_cfg.name_or_path
        identity = {"model": model_path,
                    "gguf_file": model_cfg.gguf_file if same_as_config or model_path.startswith("pkg:") else None}
    if model_cfg is not None:
        identity.update(dtype=model_cfg.dtype, quantization=model_cfg.quantization)
    return identity


def make_header(model_path: str, identity: dict, sampling: dict, task_codes: dict[str, str],
                prompt: dict) -> dict[str, Any]:
    return {"model_path": model_path, "model": identity, "sampling": sampling, "prompt": prompt,
            "tasks": dict(sorted(task_codes.items())), "created_unix": time.time()}


def same_generator(header: Optional[dict], identity: dict, sampling: dict, prompt: dict) -> bool:
    return (bool(header) and header.get("model") == identity and header.get("sampling") == sampling
            and header.get("prompt") == prompt)


def write_rows(path: Path, header: Optional[dict], rows: Sequence[dict], mode: str) -> None:
    """Write (or append) rows in one locked write: generation workers append to the same file."""
    import fcntl

    lines = ([json.dumps({"header": header})] if header is not None else []) + [json.dumps(row) for row in rows]
    text = "".join(line + "\n" for line in lines)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, mode, encoding="utf-8") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _rewrite(path: Path, header: dict, rows: Sequence[dict]) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    write_rows(tmp, header, rows, "w")
    os.replace(tmp, path)


def _reusable_rows(path: Path, tasks: Sequence[EvalTask], identity: dict, sampling: dict, prompt: dict,
                   samples: int, log: Callable[[str], None]) -> Optional[list[dict]]:
    """Rows of ``path`` that fit (complete tasks with unchanged code), or None when the file does not."""
    saved = read_generations(path)
    if not same_generator(saved.header, identity, sampling, prompt):
        return None
    for issue in saved.issues:
        log(f"reusing {path}: {issue}")
    recorded = saved.header.get("tasks") or {}
    wanted = {t.task_id: task_code_hash(t) for t in tasks}
    counts = Counter(row.task_id for row in saved.rows)
    fitting = {task_id for task_id, n in counts.items()
               if n >= samples and task_id in wanted and recorded.get(task_id) == wanted[task_id]}
    changed = sorted(t for t in counts if t in wanted and t in recorded and recorded[t] != wanted[t])
    if changed:
        log(f"{path}: the code of {len(changed)} task(s) changed since they were generated "
            f"({', '.join(changed[:5])}{' ...' if len(changed) > 5 else ''}); generating them again")
    def row(r) -> dict:
        kept = {"task_id": r.task_id, "sample": r.sample, "response": r.response or ""}
        if r.new_tokens is not None:  # the lengths travel with the answers they describe
            kept.update(new_tokens=r.new_tokens, cut_off=r.cut_off)
        return kept

    return [row(r) for r in saved.rows if r.task_id in fitting]


def pending_tasks(path: Path, tasks: Sequence[EvalTask], model_path: str, settings, log=print, *,
                  model_cfg: Optional[ModelConfig] = None, identity: Optional[dict] = None, prompt: Optional[dict] = None) -> list[EvalTask]:
    """Tasks still to generate; prepares ``path`` so that new rows can be appended to it.

    Saved rows are reused when the file's header names the same model (by content) and sampling
    settings and the task's code is unchanged; tasks with fewer than ``samples_per_task`` rows (a
    crash mid-chunk) are generated again. Without such a file, a sibling ``generations_*.jsonl``
    made by the same model content and settings is reused (an RL adapter equal to the SFT one).
    A file with another model or settings is kept as ``<name>.old``.
    """
    path = Path(path)
    identity = identity if identity is not None else model_identity(model_path, model_cfg)
    sampling = settings.sampling_key()
    prompt = {"builder": PROMPT_BUILDER, **(prompt or PLAIN_PROMPT)}
    codes = {t.task_id: task_code_hash(t) for t in tasks}
    rows = None
    if path.is_file():
        rows = _reusable_rows(path, tasks, identity, sampling, prompt, settings.samples_per_task, log)
        if rows is None:
            old = path.with_name(path.name + ".old")
            os.replace(path, old)
            log(f"{path} was generated by another model or with other settings (or has no header); "
                f"moved to {old}, generating anew")
    if not rows:
        sibling_rows, sibling = _sibling_rows(path, tasks, identity, sampling, prompt, settings.samples_per_task)
        if sibling_rows:
            log(f"{sibling.name} was generated by identical model weights with the same settings; reusing it")
            rows = sibling_rows
    rows = rows or []
    _rewrite(path, make_header(model_path, identity, sampling, codes, prompt), rows)
    done = {row["task_id"] for row in rows}
    pending = [t for t in tasks if t.task_id not in done]
    if done:
        log(f"reusing saved generations for {len(tasks) - len(pending)} of {len(tasks)} tasks from {path}")
    return pending


def _sibling_rows(path: Path, tasks: Sequence[EvalTask], identity: dict, sampling: dict, prompt: dict,
                  samples: int) -> tuple[list[dict], Optional[Path]]:
    best: tuple[list[dict], Optional[Path]] = ([], None)
    for other in sorted(path.parent.glob("generations_*.jsonl")):
        if other == path:
            continue
        try:
            rows = _reusable_rows(other, tasks, identity, sampling, prompt, samples, lambda _msg: None)
        except (OSError, ValueError):
            continue
        if rows and len(rows) > len(best[0]):
            best = (rows, other)
    return best
