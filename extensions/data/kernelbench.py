"""KernelBench problems (and the bundled evaluation tasks) as evaluation tasks."""
from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Iterable

from . import rejections as R
from .difficulty import label_difficulty
from .report import SourceTally
from .sources import SourceRow


@dataclass
class EvalTask:
    task_id: str  # L1_19_ReLU for KernelBench, bundled_<name> for the bundled set
    level: int  # the known level
    name: str
    code: str
    predicted_level: int
    source: str  # "kernelbench" | "bundled"

    def to_row(self) -> dict:
        return {"task_id": self.task_id, "level": self.level, "name": self.name, "code": self.code,
                "predicted_level": self.predicted_level, "source": self.source}


def check_task_code(code: str) -> None:
    """Raise RowRejected unless ``code`` is a KernelBench-form task."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError) as exc:
        raise R.RowRejected(R.TASK_SYNTAX_ERROR, str(exc)) from None
    names = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    if "Model" not in names:
        raise R.RowRejected(R.NO_ENTRY_POINT_CLASS, "no class Model")
    if not {"get_inputs", "get_init_inputs"} <= names:
        raise R.RowRejected(R.NO_TASK_FUNCTIONS)


def _field(row: dict, name: str):
    if row.get(name) is None:
        raise R.RowRejected(f"{R.MISSING_FIELD}:{name}")
    if isinstance(row[name], str) and not row[name].strip():
        raise R.RowRejected(f"{R.EMPTY_FIELD}:{name}")
    return row[name]


def kernelbench_task(row: dict, levels: Iterable[int]) -> EvalTask:
    """One KernelBench row (level, problem_id, name, code) -> EvalTask, or RowRejected."""
    try:
        level = int(_field(row, "level"))
    except (TypeError, ValueError):
        raise R.RowRejected(R.BAD_LEVEL, repr(row.get("level"))) from None
    if level not in set(levels):
        raise R.RowRejected(R.LEVEL_NOT_SELECTED, str(level))
    name = str(_field(row, "name")).strip()
    code = str(_field(row, "code"))
    check_task_code(code)
    return EvalTask(task_id=f"L{level}_{name}", level=level, name=name, code=code,
                    predicted_level=label_difficulty(code), source="kernelbench")


def read_eval_tasks(rows: Iterable[SourceRow], levels: list[int], tally: SourceTally) -> list[EvalTask]:
    tasks = []
    for item in rows:
        tally.count_read()
        if item.rejected:
            tally.drop(item.rejected)
            continue
        try:
            tasks.append(kernelbench_task(item.row, levels))
            tally.keep()
        except R.RowRejected as exc:
            tally.drop(exc.reason)
    return tasks
