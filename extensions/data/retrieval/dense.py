"""Dense retrieval: a sentence-transformers code embedding model and a FAISS inner-product index
over normalised embeddings (cosine similarity). Optional: the packages and the model's download are
the user's choice (``data.retrieval: dense``, ``data.retrieval_dense_model``)."""
from __future__ import annotations

from pathlib import Path

from .backend import RetrievalUnavailable

DENSE_FILE = "dense.faiss"


def _packages():
    try:
        import faiss
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:
        raise RetrievalUnavailable(
            f"data.retrieval: dense needs sentence-transformers and faiss ({exc}); install them with "
            "`pip install sentence-transformers faiss-cpu`, or set data.retrieval: lexical") from exc
    return faiss, SentenceTransformer


class DenseBackend:
    def __init__(self, encoder, index) -> None:
        self.encoder, self.index = encoder, index

    @staticmethod
    def available() -> None:
        _packages()

    @staticmethod
    def _embed(encoder, texts: list[str]):
        import numpy as np

        vectors = encoder.encode(texts, normalize_embeddings=True, show_progress_bar=len(texts) > 64)
        return np.ascontiguousarray(vectors, dtype=np.float32)

    @classmethod
    def build(cls, codes: list[str], directory: Path, model_name: str) -> tuple["DenseBackend", dict]:
        faiss, SentenceTransformer = _packages()
        encoder = SentenceTransformer(model_name)
        vectors = cls._embed(encoder, codes)
        index = faiss.IndexFlatIP(vectors.shape[1])
        index.add(vectors)
        faiss.write_index(index, str(directory / DENSE_FILE))
        return cls(encoder, index), {"model": model_name, "dimension": int(vectors.shape[1])}

    @classmethod
    def open(cls, directory: Path, model_name: str) -> "DenseBackend":
        faiss, SentenceTransformer = _packages()
        return cls(SentenceTransformer(model_name), faiss.read_index(str(directory / DENSE_FILE)))

    def search(self, terms: list[str], code: str, k: int) -> list[tuple[int, float]]:
        del terms
        if self.index.ntotal == 0:
            return []
        scores, ids = self.index.search(self._embed(self.encoder, [code]), min(k, self.index.ntotal))
        return [(int(i), float(s)) for i, s in zip(ids[0], scores[0]) if i >= 0]
