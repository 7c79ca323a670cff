"""The example store and its search: which KernelBook pairs a prompt may show, and how they are found.

The index holds the SFT training pairs only. Those rows already passed the data stage's
decontamination (no row whose task resembles an evaluation task survives it), and RL tasks and
validation rows are never shown as examples, so no prompt carries the solution of a task that is
trained on by RL or measured. A query never returns the querying task itself: it is excluded by id
and by its normalised code.

Layout of the index directory (``RunPaths.retrieval_index``):

    examples.jsonl   {"example_id", "task_code", "solution_code"} per indexed pair, in index order
    lexical/         the bm25s index (backend ``lexical``)
    dense.faiss      the FAISS index (backend ``dense``)
    meta.json        backend, example count, vocabulary or dimension, bytes on disk; written last
"""
from __future__ import annotations

import json
import keyword
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional

from ...runtime.run_files import LOCAL_FILES, RunFiles
from ..dedup import canonical_tokens, exact_key
from .backend import RetrievalUnavailable, SearchBackend

EXAMPLES_FILE = "examples.jsonl"
META_FILE = "meta.json"
_PLACEHOLDER = re.compile(r"^_v\d+$")
_WORD = re.compile(r"^[A-Za-z_]\w*$|^\d[\d.eE+-]*$")
_OPERATORS = frozenset({"+", "-", "*", "/", "//", "%", "**", "@"})
_FALLBACK_WORDS = re.compile(r"[A-Za-z_]\w*|\d+(?:\.\d+)?")


@dataclass(frozen=True)
class Example:
    example_id: str
    task_code: str
    solution_code: str


def lexical_terms(code: str) -> list[str]:
    """Search terms of ``code``: the normalised tokens without placeholders, keywords or punctuation,
    the parts of names joined by underscores (``leaky_relu`` also gives ``leaky`` and ``relu``) and
    the arithmetic operators (``x * y + z`` computes something, even with no name in it).
    Code that does not parse falls back to its plain words."""
    try:
        tokens = canonical_tokens(code)
    except (SyntaxError, ValueError, RecursionError):
        return _FALLBACK_WORDS.findall(code)
    terms = []
    for token in tokens:
        if token in _OPERATORS:
            terms.append(token)
        elif _WORD.match(token) and not _PLACEHOLDER.match(token) and not keyword.iskeyword(token):
            terms.append(token)
            parts = [part for part in token.split("_") if len(part) > 1]
            if len(parts) > 1:
                terms += parts
    return terms


def _code_key(code: str) -> Optional[str]:
    try:
        return exact_key(code)
    except (SyntaxError, ValueError, RecursionError):
        return None


def _directory_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def _backend_class(backend: str):
    if backend == "lexical":
        from .lexical import LexicalBackend

        return LexicalBackend
    if backend == "dense":
        from .dense import DenseBackend

        return DenseBackend
    raise RetrievalUnavailable(f"unknown retrieval backend {backend!r} (expected lexical or dense)")


def require_backend(backend: str) -> None:
    """Raise RetrievalUnavailable now when ``backend`` cannot be built here: the data stage asks
    before it verifies pairs (minutes of GPU), not after."""
    _backend_class(backend).available()


def index_is_complete(directory: Path, files: Optional[RunFiles] = None) -> bool:
    return (files or LOCAL_FILES).is_file(Path(directory) / META_FILE)


def build_index(examples: Iterable[Example], directory: Path, backend: str = "lexical",
                dense_model: str = "", progress: bool = False) -> dict:
    """Index ``examples`` into ``directory`` (replaced as a whole); returns the index's meta."""
    from tqdm.auto import tqdm

    directory = Path(directory)
    examples = list(examples)
    backend_class = _backend_class(backend)
    staging = directory.with_name(f".{directory.name}.tmp-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        with open(staging / EXAMPLES_FILE, "w", encoding="utf-8") as handle:
            for example in examples:
                handle.write(json.dumps({"example_id": example.example_id, "task_code": example.task_code,
                                         "solution_code": example.solution_code}) + "\n")
        if backend == "dense":
            _, details = backend_class.build([e.task_code for e in examples], staging, dense_model)
        else:
            terms = [lexical_terms(e.task_code) for e in tqdm(examples, desc="retrieval index", unit="pair",
                                                              disable=not progress, mininterval=1.0)]
            _, details = backend_class.build(terms, staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    meta = {"backend": backend, "examples": len(examples), **details}
    meta["bytes"] = _directory_bytes(staging)
    (staging / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    shutil.rmtree(directory, ignore_errors=True)
    os.replace(staging, directory)
    return meta


@dataclass
class RetrievalStats:
    queries: int = 0
    queries_with_examples: int = 0  # at least one example returned
    examples_returned: int = 0
    self_matches_excluded: int = 0  # the querying task (by id or code) found and left out

    def to_dict(self) -> dict:
        hit_rate = self.queries_with_examples / self.queries if self.queries else 0.0
        return {"queries": self.queries, "queries_with_examples": self.queries_with_examples,
                "hit_rate": round(hit_rate, 4), "examples_returned": self.examples_returned,
                "self_matches_excluded": self.self_matches_excluded}


@dataclass
class ExampleRetriever:
    examples: list[Example]
    backend: SearchBackend
    meta: dict
    stats: RetrievalStats = field(default_factory=RetrievalStats)

    @classmethod
    def open(cls, directory: Path, dense_model: str = "") -> "ExampleRetriever":
        directory = Path(directory)
        if not index_is_complete(directory):
            raise RetrievalUnavailable(f"no retrieval index at {directory}: run prepare_data.py first "
                                       "(prompt.mode raicl needs it)")
        meta = json.loads((directory / META_FILE).read_text())
        with open(directory / EXAMPLES_FILE, encoding="utf-8") as handle:
            examples = [Example(**json.loads(line)) for line in handle if line.strip()]
        backend_class = _backend_class(meta["backend"])
        if meta["backend"] == "dense":
            backend = backend_class.open(directory, meta.get("model") or dense_model)
        else:
            backend = backend_class.open(directory)
        return cls(examples, backend, meta)

    def search(self, task_code: str, k: int, exclude_ids: Iterable[str] = ()) -> list[tuple[Example, float]]:
        """The ``k`` examples most similar to ``task_code``, best first, never the task itself."""
        excluded = set(exclude_ids)
        query_key = _code_key(task_code)
        self.stats.queries += 1
        if k <= 0:
            return []
        # Ask for a few more than k: the task itself (and ids excluded) may be among the best.
        hits = self.backend.search(lexical_terms(task_code), task_code, k + len(excluded) + 1)
        found: list[tuple[Example, float]] = []
        for position, score in hits:
            example = self.examples[position]
            if example.example_id in excluded or (query_key and _code_key(example.task_code) == query_key):
                self.stats.self_matches_excluded += 1
                continue
            found.append((example, score))
            if len(found) == k:
                break
        self.stats.examples_returned += len(found)
        self.stats.queries_with_examples += bool(found)
        return found
