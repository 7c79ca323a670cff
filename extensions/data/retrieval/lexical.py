"""BM25 over the terms of the normalised code, through the ``bm25s`` package (sparse, numpy/scipy).

The terms are the names a module takes from outside (``Conv2d``, ``relu``, ``softmax``, ``view``,
``dim``) and its literals: the code's own identifiers are placeholders after normalisation and say
nothing about what it computes, so they are left out.
"""
from __future__ import annotations

import sys
from pathlib import Path

from .backend import RetrievalUnavailable

LEXICAL_DIR = "lexical"
# bm25s picks JAX for top-k when it can; JAX then takes 75% of GPU memory and a later SFT run on that
# GPU runs out of it. Name the numpy backend everywhere instead.
_BACKEND = "numpy"
_ABSENT = object()


def _bm25s():
    # Importing bm25s imports jax.lax and runs a top_k on it when it can (bm25s.selection), which
    # initialises JAX: hide jax for that first import (None in sys.modules fails the import).
    hidden = {} if "bm25s" in sys.modules else {name: sys.modules.get(name, _ABSENT) for name in ("jax", "jax.lax")}
    for name in hidden:
        sys.modules[name] = None
    try:
        import bm25s
    except ImportError as exc:
        raise RetrievalUnavailable("data.retrieval: lexical needs the bm25s package (pip install bm25s)") from exc
    finally:
        for name, module in hidden.items():
            if module is _ABSENT:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
    return bm25s


class LexicalBackend:
    def __init__(self, model) -> None:
        self.model = model

    @staticmethod
    def available() -> None:
        _bm25s()

    @classmethod
    def build(cls, documents: list[list[str]], directory: Path) -> tuple["LexicalBackend", dict]:
        model = _bm25s().BM25(backend=_BACKEND)
        # An empty document would leave a row without terms; bm25s needs at least one token each.
        model.index([terms or ["<empty>"] for terms in documents], show_progress=False)
        model.save(str(directory / LEXICAL_DIR), show_progress=False)
        return cls(model), {"vocabulary": len(model.vocab_dict)}

    @classmethod
    def open(cls, directory: Path) -> "LexicalBackend":
        # The saved params name a backend; override it, whatever built the index.
        return cls(_bm25s().BM25.load(str(directory / LEXICAL_DIR), show_progress=False, backend=_BACKEND))

    def search(self, terms: list[str], code: str, k: int) -> list[tuple[int, float]]:
        del code  # lexical search reads the terms only
        size = int(self.model.scores["num_docs"])
        if not terms or size == 0:
            return []
        found = self.model.retrieve([terms], k=min(k, size), show_progress=False, backend_selection=_BACKEND)
        # A score of 0 shares no term with the query: not similar, so not an example.
        return [(int(doc), float(score)) for doc, score in zip(found.documents[0], found.scores[0]) if score > 0]
