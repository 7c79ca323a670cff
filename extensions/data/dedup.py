"""Code similarity for deduplication and decontamination.

Code is compared after normalisation: docstrings, comments and formatting are dropped (the AST is
re-printed), and every identifier the code defines itself (classes, functions, parameters, locals,
``self.`` attributes) is replaced by a placeholder numbered by first appearance, so renaming a class
or a variable does not hide a copy. Names from outside (``torch.relu``, ``nn.Conv2d``) and literals
stay, so modules that differ in what they compute stay apart. Only the classes and helper functions
are compared; imports, shape constants and the input builders are the same boilerplate everywhere.

Similarity is the Jaccard index of token shingles. ``SimilarityIndex`` finds candidates with
MinHash + LSH banding and confirms each with the exact Jaccard index, so it scales to KernelBook
(tens of thousands of rows) while the decision stays exact.
"""
from __future__ import annotations

import ast
import builtins
import hashlib
import io
import keyword
import tokenize
import zlib
from dataclasses import dataclass, field
from typing import Hashable, Optional

import numpy as np

from ..verify.static.extract import drop_docstrings

SHINGLE_TOKENS = 5
_BOILERPLATE_FUNCTIONS = frozenset({"get_inputs", "get_init_inputs"})
_KEEP_NAMES = frozenset(dir(builtins)) | {"self", "cls"}
_MERSENNE = (1 << 61) - 1


class _DropSpelling(ast.NodeTransformer):
    """Remove what changes spelling but not computation: annotations, ``super(Cls, self)``."""

    def visit_arg(self, node: ast.arg) -> ast.arg:
        node.annotation = None
        return node

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.FunctionDef:
        node.returns = None
        self.generic_visit(node)
        return node

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AST:
        if node.value is None:
            return ast.Pass()
        return ast.Assign(targets=[node.target], value=node.value, lineno=node.lineno)

    def visit_Call(self, node: ast.Call) -> ast.Call:
        self.generic_visit(node)
        if isinstance(node.func, ast.Name) and node.func.id == "super":
            node.args = []
        return node


def _imported_names(tree: ast.Module) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.update(a.asname or a.name for a in node.names)
    return names


def normalised_source(source: str, *, definitions_only: bool = True) -> str:
    """``source`` re-printed from its AST without docstrings; with ``definitions_only``, only the
    classes and functions other than ``get_inputs``/``get_init_inputs``. Raises SyntaxError."""
    tree = ast.parse(source)
    drop_docstrings(tree)
    tree = ast.fix_missing_locations(_DropSpelling().visit(tree))
    if definitions_only:
        tree.body = [n for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                     and n.name not in _BOILERPLATE_FUNCTIONS]
    return ast.unparse(tree)


def canonical_tokens(source: str) -> list[str]:
    """Tokens of the normalised code with the code's own identifiers replaced by placeholders."""
    tree = ast.parse(source)
    external = _imported_names(tree) | _KEEP_NAMES
    text = normalised_source(source)
    placeholders: dict[str, str] = {}
    tokens: list[str] = []
    previous = ""
    before_previous = ""
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                        tokenize.COMMENT, tokenize.ENDMARKER):
            continue
        value = tok.string
        if tok.type == tokenize.NAME and not keyword.iskeyword(value):
            attribute = previous == "."
            own_attribute = attribute and before_previous == "self"
            if (not attribute and value not in external) or own_attribute:
                value = placeholders.setdefault(tok.string, f"_v{len(placeholders)}")
        elif tok.type == tokenize.STRING:
            value = "STR"
        tokens.append(value)
        before_previous, previous = previous, tok.string
    return tokens


def shingles(tokens: list[str], size: int = SHINGLE_TOKENS) -> frozenset[int]:
    """Hashed ``size``-token windows (short inputs give one shingle of everything)."""
    if len(tokens) <= size:
        return frozenset({zlib.crc32("\x1f".join(tokens).encode())})
    return frozenset(zlib.crc32("\x1f".join(tokens[i:i + size]).encode())
                     for i in range(len(tokens) - size + 1))


def code_shingles(source: str) -> frozenset[int]:
    return shingles(canonical_tokens(source))


def exact_key(*sources: str) -> str:
    """Identity of code up to formatting, comments and docstrings (names still count)."""
    digest = hashlib.sha256()
    for source in sources:
        digest.update(normalised_source(source, definitions_only=False).encode())
        digest.update(b"\0")
    return digest.hexdigest()


def jaccard(a: frozenset[int], b: frozenset[int]) -> float:
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


@dataclass
class SimilarityIndex:
    """Shingle sets searchable by Jaccard index (MinHash/LSH candidates, exact confirmation)."""

    num_perm: int = 64
    bands: int = 16
    seed: int = 20240601
    _sets: dict[Hashable, frozenset[int]] = field(default_factory=dict)
    _buckets: list[dict[bytes, list[Hashable]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.num_perm % self.bands:
            raise ValueError(f"num_perm {self.num_perm} is not a multiple of bands {self.bands}")
        rng = np.random.default_rng(self.seed)
        self._a = rng.integers(1, _MERSENNE, size=self.num_perm, dtype=np.uint64)
        self._b = rng.integers(0, _MERSENNE, size=self.num_perm, dtype=np.uint64)
        self._buckets = [dict() for _ in range(self.bands)]

    def __len__(self) -> int:
        return len(self._sets)

    def _signature(self, items: frozenset[int]) -> np.ndarray:
        values = np.fromiter(items, dtype=np.uint64, count=len(items))[:, None]
        # (a*x + b) mod p on 32-bit x and 61-bit a cannot be formed exactly in uint64; the modular
        # wrap-around is still a fixed, well-mixed permutation-like hash, which is all MinHash needs.
        hashed = (values * self._a[None, :] + self._b[None, :]) % np.uint64(_MERSENNE)
        return hashed.min(axis=0)

    def _band_keys(self, items: frozenset[int]) -> list[bytes]:
        signature = self._signature(items)
        rows = self.num_perm // self.bands
        return [signature[i * rows:(i + 1) * rows].tobytes() for i in range(self.bands)]

    def add(self, key: Hashable, items: frozenset[int]) -> None:
        self._sets[key] = items
        for band, band_key in zip(self._buckets, self._band_keys(items)):
            band.setdefault(band_key, []).append(key)

    def most_similar(self, items: frozenset[int], threshold: float) -> Optional[tuple[Hashable, float]]:
        """The indexed key most similar to ``items`` with Jaccard >= ``threshold``, or None."""
        candidates = set()
        for band, band_key in zip(self._buckets, self._band_keys(items)):
            candidates.update(band.get(band_key, ()))
        best: Optional[tuple[Hashable, float]] = None
        for key in candidates:
            score = jaccard(items, self._sets[key])
            if score >= threshold and (best is None or score > best[1]):
                best = (key, score)
        return best
