"""What a retrieval backend is, shared by the index and both backends: the ``SearchBackend``
protocol and the error a backend raises when it cannot run here.

A leaf of the package: the index imports the backends and the backends import only this, so
neither backend imports the index that chooses it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Protocol


class RetrievalUnavailable(ValueError):
    """The configured retrieval backend cannot run here (a package is missing, no index built)."""


class SearchBackend(Protocol):
    """A built index over the examples, in index order (``LexicalBackend``, ``DenseBackend``)."""

    @staticmethod
    def available() -> None:
        """Raise RetrievalUnavailable when the packages the backend needs are missing here."""

    @classmethod
    def open(cls, directory: Path, *args) -> "SearchBackend":
        """The index saved in ``directory`` (``build`` wrote it)."""

    def search(self, terms: list[str], code: str, k: int) -> list[tuple[int, float]]:
        """Up to ``k`` (example index, score) pairs, best first, for a query given both as its
        lexical terms and as its code: each backend reads the form it searches on."""
