"""The project's bundled starter set: PyTorch -> Triton pairs and separate evaluation tasks.

The set is data, kept outside the code package in ``datasets/bundled/`` at the repository's top
level; this module reads it. Each pair lives in ``pairs/<name>.py`` in KernelBook form: the PyTorch
half (a module named by its class, ``get_inputs``, ``get_init_inputs`` returning ``[args, kwargs]``)
after a ``# === pytorch ===`` line and the Triton half (class ``<Name>New``) after a ``# === triton ===`` line. Each evaluation
task lives in ``eval_tasks/<name>.py`` in KernelBench form: ``# level: N``, then the task
(``class Model``) after ``# === task ===`` and a reference Triton solution (``class ModelNew``)
after ``# === solution ===``. The files are data: they are read as text, never imported.
"""
from __future__ import annotations

import ast
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

REPOSITORY_ROOT = Path(__file__).resolve().parents[2]
BUNDLED_DIR = REPOSITORY_ROOT / "datasets" / "bundled"
PAIRS_DIR = BUNDLED_DIR / "pairs"
EVAL_TASKS_DIR = BUNDLED_DIR / "eval_tasks"
_MARKER = re.compile(r"^# === (\w+) ===[ \t]*$", re.MULTILINE)
_LEVEL = re.compile(r"^# level:\s*([123])\s*$", re.MULTILINE)


@dataclass(frozen=True)
class BundledEvalTask:
    name: str
    level: int
    code: str  # KernelBench form: class Model, get_inputs, get_init_inputs
    solution: str  # reference Triton solution: class ModelNew


def _sections(path: Path, expected: tuple[str, str]) -> dict[str, str]:
    text = path.read_text(encoding="utf-8")
    markers = list(_MARKER.finditer(text))
    names = tuple(m.group(1) for m in markers)
    if names != expected:
        raise ValueError(f"{path}: expected sections {expected}, found {names}")
    sections = {}
    for i, marker in enumerate(markers):
        end = markers[i + 1].start() if i + 1 < len(markers) else len(text)
        sections[marker.group(1)] = text[marker.end():end].strip() + "\n"
    return sections


def _first_class(source: str, path: Path) -> str:
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef):
            return node.name
    raise ValueError(f"{path}: the PyTorch half defines no class")


def _data_files(folder: Path) -> list[Path]:
    # A missing folder (a copy of the code without its data) must not read as an empty set.
    if not folder.is_dir():
        raise FileNotFoundError(f"bundled data folder not found: {folder}")
    return sorted(folder.glob("*.py"))


def bundled_pairs() -> list[dict]:
    """The pairs as KernelBook rows (same columns as GPUMODE/KernelBook), sorted by file name."""
    rows = []
    for path in _data_files(PAIRS_DIR):
        halves = _sections(path, ("pytorch", "triton"))
        rows.append({
            "uuid": f"bundled-{path.stem}",
            "entry_point": _first_class(halves["pytorch"], path),
            "python_code": halves["pytorch"],
            "triton_code": halves["triton"],
            "original_triton_code": halves["triton"],
            "repo_name": "bundled",
            "module_name": path.stem,
            "synthetic": False,
            "licenses": ["project"],
            "stars": 0,
            "sha": "",
            "repo_link": "",
        })
    return rows


def bundled_eval_tasks() -> list[BundledEvalTask]:
    tasks = []
    for path in _data_files(EVAL_TASKS_DIR):
        text = path.read_text(encoding="utf-8")
        level = _LEVEL.search(text)
        if level is None:
            raise ValueError(f"{path}: missing '# level: N' line")
        sections = _sections(path, ("task", "solution"))
        tasks.append(BundledEvalTask(name=path.stem, level=int(level.group(1)),
                                     code=sections["task"], solution=sections["solution"]))
    return tasks


def bundled_fingerprint() -> str:
    digest = hashlib.sha256()
    for path in sorted([*_data_files(PAIRS_DIR), *_data_files(EVAL_TASKS_DIR)]):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()
