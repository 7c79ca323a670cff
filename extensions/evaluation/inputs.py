"""Readers for evaluation inputs that report every bad row (with its line number) and keep going.

Tasks (``eval_tasks.jsonl``): rows ``{"task_id", "level", "name", "code", ...}``.
Generations (``generations_NAME.jsonl``): an optional first row ``{"header": {...}}`` holding the model
and sampling settings, then rows ``{"task_id", "sample", "response", ...}``; several rows per task.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

from ..runtime.io import BadLine, read_jsonl
from .records import EvalTask


class InputError(ValueError):
    """An input file that cannot be used at all (missing, or nothing usable in it)."""


@dataclass
class Generation:
    task_id: str
    sample: int
    response: Optional[str]  # None when the row had no usable response (see ``problem``)
    problem: Optional[str] = None  # why the response cannot be verified (empty, not text)
    new_tokens: Optional[int] = None  # the answer's length in tokens, when this project generated it
    cut_off: Optional[bool] = None  # True: max_new_tokens ended the answer, not the model


@dataclass
class GenerationsFile:
    header: Optional[dict[str, Any]]
    rows: list[Generation] = field(default_factory=list)
    issues: list[str] = field(default_factory=list)


def _json_lines(path: Path, issues: list[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    if not path.is_file():
        raise InputError(f"file not found: {path}")

    def note(bad: BadLine) -> None:
        if bad.json_error is not None:
            issues.append(f"{path.name}:{bad.number}: malformed JSON line skipped ({bad.json_error})")
        else:
            issues.append(f"{path.name}:{bad.number}: expected a JSON object, got {bad.value_type}; skipped")

    yield from read_jsonl(path, note)


def _task_id(value: Any) -> Optional[str]:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (str, int)) and str(value).strip():
        return str(value)
    return None


def load_tasks(path: Path, levels: Optional[list[int]] = None,
               num_tasks: Optional[int] = None) -> tuple[list[EvalTask], list[str]]:
    """Tasks in file order, filtered to ``levels`` and cut to the first ``num_tasks``; plus issues."""
    path = Path(path)
    issues: list[str] = []
    tasks: list[EvalTask] = []
    seen: set[str] = set()
    for number, row in _json_lines(path, issues):
        task_id = _task_id(row.get("task_id"))
        code = row.get("code")
        if task_id is None:
            issues.append(f"{path.name}:{number}: row has no task_id; skipped")
            continue
        if not isinstance(code, str) or not code.strip():
            issues.append(f"{path.name}:{number}: task {task_id!r} has no code; skipped")
            continue
        if task_id in seen:
            issues.append(f"{path.name}:{number}: duplicate task_id {task_id!r}; the first row is kept")
            continue
        level = row.get("level")
        if level is not None and (isinstance(level, bool) or not isinstance(level, int)):
            issues.append(f"{path.name}:{number}: task {task_id!r} has level {level!r} (not an integer); level unset")
            level = None
        seen.add(task_id)
        tasks.append(EvalTask(task_id=task_id, level=level, name=str(row.get("name") or task_id), code=code))
    if levels is not None:
        tasks = [t for t in tasks if t.level in levels]
    if num_tasks is not None:
        tasks = tasks[: max(0, num_tasks)]
    if not tasks:
        raise InputError(
            f"{path}: no usable task" + (f" at levels {levels}" if levels is not None else "")
            + (f" ({len(issues)} bad rows: {issues[0]} ...)" if issues else "")
        )
    return tasks, issues


def read_generations(path: Path) -> GenerationsFile:
    """All rows of a generations file; bad rows are reported in ``issues`` and skipped.

    A row whose response is missing, empty or not text is kept (it is a failed sample with that
    reason); a row without a task id cannot be attributed and is skipped. Rows without ``sample``
    are numbered in file order within their task.
    """
    path = Path(path)
    result = GenerationsFile(header=None)
    next_sample: dict[str, int] = {}
    used: dict[str, set[int]] = {}
    for number, row in _json_lines(path, result.issues):
        if "header" in row and "task_id" not in row:
            if result.header is not None:
                result.issues.append(f"{path.name}:{number}: second header row ignored")
            elif not isinstance(row["header"], dict):
                result.issues.append(f"{path.name}:{number}: header is not an object; ignored")
            else:
                result.header = row["header"]
            continue
        task_id = _task_id(row.get("task_id"))
        if task_id is None:
            result.issues.append(f"{path.name}:{number}: row has no task_id; skipped")
            continue
        sample = row.get("sample")
        if isinstance(sample, bool) or not isinstance(sample, int) or sample in used.get(task_id, set()):
            sample = next_sample.get(task_id, 0)
            while sample in used.get(task_id, set()):
                sample += 1
        used.setdefault(task_id, set()).add(sample)
        next_sample[task_id] = max(next_sample.get(task_id, 0), sample + 1)
        response = row.get("response")
        problem = None
        if response is None:
            problem = "no response in the generations row"
        elif not isinstance(response, str):
            problem = f"response is {type(response).__name__}, not text"
            response = None
        elif not response.strip():
            problem = "empty response"
            response = None
        new_tokens, cut_off = row.get("new_tokens"), row.get("cut_off")
        if not isinstance(new_tokens, int) or isinstance(new_tokens, bool) or not isinstance(cut_off, bool):
            new_tokens, cut_off = None, None
        result.rows.append(Generation(task_id=task_id, sample=sample, response=response, problem=problem,
                                      new_tokens=new_tokens, cut_off=cut_off))
    return result


def generation_row(task: EvalTask, sample: int, response: str, *, new_tokens: Optional[int] = None,
                   cut_off: Optional[bool] = None) -> dict[str, Any]:
    row = {"task_id": task.task_id, "sample": sample, "level": task.level, "name": task.name, "response": response}
    if new_tokens is not None:  # generated here (rows from elsewhere carry no lengths)
        row["new_tokens"], row["cut_off"] = new_tokens, bool(cut_off)
    return row
