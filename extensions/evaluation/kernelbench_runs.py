"""KernelBench run folders: read them as generations, write generations as one.

KernelBench's ``scripts/generate_samples.py`` stores each generated kernel as
``RUN_DIR/level_L_problem_P_sample_S_kernel.py`` (the code extracted from the model's response;
``P`` is the problem's number, the prefix of its name, e.g. 19 for ``19_ReLU``), and
``scripts/eval_from_generations.py`` reads that layout back. Reading a folder lets our verifier
judge kernels made with KernelBench's tools; writing one lets KernelBench's own scripts judge ours,
so the two verdicts can be cross-checked.

Our KernelBench tasks are ``L{level}_{name}`` with that name (data/kernelbench.py); a task whose
name has no problem number (the bundled tasks) has no place in the layout and is reported as such.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from ..runtime.io import atomic_write_text
from .inputs import Generation, GenerationsFile, InputError
from .records import EvalTask

KERNEL_FILE = re.compile(r"^level_(?P<level>\d+)_problem_(?P<problem>\d+)_sample_(?P<sample>\d+)_kernel\.py$")
_PROBLEM_NUMBER = re.compile(r"^(?P<number>\d+)_")


def kernel_file_name(level: int, problem: int, sample: int) -> str:
    return f"level_{level}_problem_{problem}_sample_{sample}_kernel.py"


def problem_key(task: EvalTask) -> Optional[tuple[int, int]]:
    """(level, problem number) of a KernelBench task, or None for a task outside KernelBench."""
    match = _PROBLEM_NUMBER.match(task.name)
    if task.level is None or match is None:
        return None
    return int(task.level), int(match.group("number"))


def read_kernelbench_run(directory: Path, tasks: Sequence[EvalTask]) -> GenerationsFile:
    """Every ``level_L_problem_P_sample_S_kernel.py`` in ``directory`` as a generation row of the
    task with that level and problem number; files of unknown problems are reported and skipped."""
    directory = Path(directory)
    if not directory.is_dir():
        raise InputError(f"KernelBench run folder not found: {directory}")
    by_key = {key: task for task in tasks if (key := problem_key(task)) is not None}
    result = GenerationsFile(header={"model_path": None, "kernelbench_run": str(directory.resolve())})
    kernel_files = sorted(directory.glob("*_kernel.py"))
    for path in kernel_files:
        match = KERNEL_FILE.match(path.name)
        if match is None:
            result.issues.append(f"{path.name}: not named level_L_problem_P_sample_S_kernel.py; skipped")
            continue
        level, problem, sample = (int(match.group(k)) for k in ("level", "problem", "sample"))
        task = by_key.get((level, problem))
        if task is None:
            result.issues.append(f"{path.name}: no task at level {level} with problem number {problem}; skipped")
            continue
        try:
            code = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            result.rows.append(Generation(task.task_id, sample, None, f"unreadable file: {type(exc).__name__}"))
            continue
        result.rows.append(Generation(task.task_id, sample, code, None if code.strip() else "empty file"))
    if not kernel_files:
        raise InputError(f"{directory}: no level_L_problem_P_sample_S_kernel.py files")
    result.rows.sort(key=lambda row: (row.task_id, row.sample))
    return result


@dataclass
class ExportSummary:
    directory: Path
    written: int = 0
    skipped: list[str] = field(default_factory=list)  # "task sample: why"

    def describe(self) -> str:
        text = f"KernelBench layout: {self.written} kernel file(s) in {self.directory}"
        if self.skipped:
            text += f"; {len(self.skipped)} sample(s) not written (first: {self.skipped[0]})"
        return text


def export_kernelbench_run(generations: GenerationsFile, tasks: Sequence[EvalTask], directory: Path) -> ExportSummary:
    """Write each row's code (extracted from the response as the verifier extracts it) to
    ``directory/level_L_problem_P_sample_S_kernel.py``. Rows without code, or of tasks outside
    KernelBench, are counted in ``skipped`` with the reason; KernelBench has no file for them either."""
    from ..verify.static.extract import extract_code

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    by_id = {task.task_id: task for task in tasks}
    summary = ExportSummary(directory)
    for row in generations.rows:
        where = f"{row.task_id} sample {row.sample}"
        task = by_id.get(row.task_id)
        key = problem_key(task) if task is not None else None
        if key is None:
            summary.skipped.append(f"{where}: not a KernelBench task (no level and problem number)")
            continue
        if row.response is None:
            summary.skipped.append(f"{where}: {row.problem or 'no response'}")
            continue
        extraction = extract_code(row.response)
        if extraction.code is None:
            summary.skipped.append(f"{where}: no code in the response ({extraction.error})")
            continue
        atomic_write_text(directory / kernel_file_name(*key, row.sample), extraction.code)
        summary.written += 1
    return summary
