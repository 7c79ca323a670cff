"""Worked examples for a task's prompt: the KernelBook pairs most similar to it.

``build_index`` (called by the data stage) writes the index of the SFT training pairs under the
run's ``data/processed/retrieval/``; ``ExampleRetriever.open`` reads it back for prompt building
(``extensions.prompting.builder``).
``lexical`` (BM25 over the normalised code tokens, no download) is the default backend; ``dense``
(a sentence-transformers embedding model and FAISS) is optional.
"""
from .index import (Example, ExampleRetriever, RetrievalUnavailable, build_index, index_is_complete,
                    lexical_terms, require_backend)

__all__ = ["Example", "ExampleRetriever", "RetrievalUnavailable", "build_index", "index_is_complete",
           "lexical_terms", "require_backend"]
