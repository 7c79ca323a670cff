"""BM25 over the terms of the normalised code, through the ``bm25s`` package (sparse, numpy/scipy).

The terms are the names a module takes from outside (``Conv2d``, ``relu``, ``softmax``, ``view``,
``dim``) and its literals: the code's own identifiers are placeholders after normalisation and say
nothing about what it computes, so they are left out.
"""
from __future__ import annotations

from pathlib import Path

LEXICAL_DIR = "lexical"


def _bm25s():
    try:
        import bm25s
    except ImportError as exc:
        from .index import RetrievalUnavailable

        raise RetrievalUnavailable("data.retrieval: lexical needs the bm25s package (pip install bm25s)") from exc
    return bm25s


class LexicalBackend:
    def __init__(self, model) -> None:
        self.model = model

    @classmethod
    def build(cls, documents: list[list[str]], directory: Path) -> tuple["LexicalBackend", dict]:
        model = _bm25s().BM25()
        # An empty document would leave a row without terms; bm25s needs at least one token each.
        model.index([terms or ["<empty>"] for terms in documents], show_progress=False)
        model.save(str(directory / LEXICAL_DIR), show_progress=False)
        return cls(model), {"vocabulary": len(model.vocab_dict)}

    @classmethod
    def open(cls, directory: Path) -> "LexicalBackend":
        return cls(_bm25s().BM25.load(str(directory / LEXICAL_DIR), show_progress=False))

    def search(self, terms: list[str], code: str, k: int) -> list[tuple[int, float]]:
        del code  # lexical search reads the terms only
        size = int(self.model.scores["num_docs"])
        if not terms or size == 0:
            return []
        found = self.model.retrieve([terms], k=min(k, size), show_progress=False)
        # A score of 0 shares no term with the query: not similar, so not an example.
        return [(int(doc), float(score)) for doc, score in zip(found.documents[0], found.scores[0]) if score > 0]
