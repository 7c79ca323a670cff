"""Kernel-side rules: inductor's private helper namespaces become public Triton spellings.

Inductor's kernels call three namespaces that live inside ``torch._inductor`` and that the static
policy does not admit: ``triton_helpers`` (reductions with NaN propagation, Welford, integer
division with Python's rounding), ``tl_math`` (an alias of ``triton.language.math``) and
``libdevice`` (imported through inductor's compat module). The rules:

* ``libdevice.f(x)``  -> ``libdevice.f(x)`` with ``from triton.language.extra import libdevice``;
* ``tl_math.f(x)``    -> ``tl.f(x)`` where ``tl`` has ``f``, else ``tl.math.f(x)``;
* ``triton_helpers.f(...)`` -> a ``@triton.jit`` function ``_inductor_f`` written into the module
  (``HELPER_SOURCES``), computing what inductor's helper computes (NaN-propagating maximum, the
  Welford merge, floor division of integers...). A helper not in the table drops the row
  (``unsupported_helper:<name>``).
"""
from __future__ import annotations

import ast
from typing import Iterable

from ...verify.static.triton_api import TRITON_LANGUAGE_API
from .errors import CanonicalizeError

HELPER_PREFIX = "_inductor_"

# Each entry: the helpers it needs first, then its source. Written for this project; semantics
# follow inductor's documented behaviour (torch._inductor.runtime.triton_helpers).
HELPER_SOURCES: dict[str, tuple[tuple[str, ...], str]] = {
    "maximum": ((), '''
@triton.jit
def _inductor_maximum(a, b):
    # NaN wins, as torch.maximum: (a != a) is false for integers.
    return tl.where((a > b) | (a != a), a, b)
'''),
    "minimum": ((), '''
@triton.jit
def _inductor_minimum(a, b):
    return tl.where((a < b) | (a != a), a, b)
'''),
    "max2": (("maximum",), '''
@triton.jit
def _inductor_max2(a, dim):
    return tl.reduce(a, dim, _inductor_maximum)
'''),
    "min2": (("minimum",), '''
@triton.jit
def _inductor_min2(a, dim):
    return tl.reduce(a, dim, _inductor_minimum)
'''),
    "prod": (("_multiply",), '''
@triton.jit
def _inductor_prod(a, dim):
    return tl.reduce(a, dim, _inductor__multiply)
'''),
    "_multiply": ((), '''
@triton.jit
def _inductor__multiply(a, b):
    return a * b
'''),
    "any": (("_either",), '''
@triton.jit
def _inductor_any(a, dim):
    return tl.reduce(a, dim, _inductor__either)
'''),
    "_either": ((), '''
@triton.jit
def _inductor__either(a, b):
    return a | b
'''),
    "select_one": ((), '''
@triton.jit
def _inductor_select_one(x, mask, dim, keep_dims=False):
    # The one element of each line where mask holds (adding zeros elsewhere is exact).
    return tl.sum(tl.where(mask, x, 0), dim, keep_dims=keep_dims)
'''),
    "promote_to_tensor": ((), '''
@triton.jit
def _inductor_promote_to_tensor(x):
    return x + tl.zeros((1,), tl.int1)
'''),
    "div_floor_integer": ((), '''
@triton.jit
def _inductor_div_floor_integer(a, b):
    # Triton's // truncates toward zero; Python and torch round toward minus infinity.
    quotient = a // b
    inexact = (a % b) != 0
    return tl.where(inexact & ((a < 0) != (b < 0)), quotient - 1, quotient)
'''),
    "remainder_integer": ((), '''
@triton.jit
def _inductor_remainder_integer(a, b):
    # The remainder takes the divisor's sign, as Python's and torch's do.
    rest = a % b
    return tl.where((rest != 0) & ((a < 0) != (b < 0)), rest + b, rest)
'''),
    "welford_reduce": ((), '''
@triton.jit
def _inductor_welford_reduce(value, mean, m2, weight, first_iteration):
    if first_iteration:
        new_weight = tl.full(weight.shape, 1, weight.dtype)
        new_mean = value
        new_m2 = tl.zeros_like(m2)
    else:
        delta = value - mean
        new_weight = weight + 1
        new_mean = mean + delta / new_weight
        new_m2 = m2 + delta * (value - new_mean)
    return new_mean, new_m2, new_weight
'''),
    "welford_combine": ((), '''
@triton.jit
def _inductor_welford_combine(mean_a, m2_a, weight_a, mean_b, m2_b, weight_b):
    # Chan et al.'s merge of two partial (mean, M2, count) triples; equal means add no spread,
    # which also keeps inf - inf out of an overflowing half-precision row.
    delta = tl.where(mean_a == mean_b, 0.0, mean_b - mean_a)
    weight = weight_a + weight_b
    share_b = tl.where(weight == 0.0, 0.0, weight_b / weight)
    return mean_a + delta * share_b, m2_a + m2_b + delta * delta * weight_a * share_b, weight
'''),
    "welford": (("welford_combine",), '''
@triton.jit
def _inductor_welford(mean, m2, weight, dim):
    return tl.reduce((mean, m2, weight), dim, _inductor_welford_combine)
'''),
    "maximum_with_index": ((), '''
@triton.jit
def _inductor_maximum_with_index(a_value, a_index, b_value, b_index):
    # argmax: NaN is the largest value; ties go to the lower index.
    a_nan = a_value != a_value
    b_nan = b_value != b_value
    take_a = (a_value > b_value) | (a_nan & ~b_nan)
    tie = (a_value == b_value) | (a_nan & b_nan)
    take_a = take_a | (tie & (a_index < b_index))
    return tl.where(take_a, a_value, b_value), tl.where(take_a, a_index, b_index)
'''),
    "minimum_with_index": ((), '''
@triton.jit
def _inductor_minimum_with_index(a_value, a_index, b_value, b_index):
    a_nan = a_value != a_value
    b_nan = b_value != b_value
    take_a = (a_value < b_value) | (a_nan & ~b_nan)
    tie = (a_value == b_value) | (a_nan & b_nan)
    take_a = take_a | (tie & (a_index < b_index))
    return tl.where(take_a, a_value, b_value), tl.where(take_a, a_index, b_index)
'''),
    "max_with_index": (("maximum_with_index",), '''
@triton.jit
def _inductor_max_with_index(value, index, dim):
    return tl.reduce((value, index), dim, _inductor_maximum_with_index)
'''),
    "min_with_index": (("minimum_with_index",), '''
@triton.jit
def _inductor_min_with_index(value, index, dim):
    return tl.reduce((value, index), dim, _inductor_minimum_with_index)
'''),
}

# Names of inductor's kernel-side imports, and what they stand for.
HELPER_NAMESPACE = "triton_helpers"
MATH_NAMESPACE = "tl_math"
LIBDEVICE = "libdevice"


class KernelRewriter(ast.NodeTransformer):
    """Rewrites one kernel's calls into the private namespaces; records what it needs."""

    def __init__(self) -> None:
        self.helpers: set[str] = set()
        self.uses_libdevice = False
        self.rules: set[str] = set()

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        self.generic_visit(node)
        if not isinstance(node.value, ast.Name):
            return node
        namespace, name = node.value.id, node.attr
        if namespace == HELPER_NAMESPACE:
            if name not in HELPER_SOURCES or name.startswith("_"):
                raise CanonicalizeError(f"unsupported_helper:{name}")
            self.helpers.add(name)
            self.rules.add("triton_helpers")
            return ast.copy_location(ast.Name(HELPER_PREFIX + name, ast.Load()), node)
        if namespace == MATH_NAMESPACE:
            self.rules.add("tl_math")
            if name in TRITON_LANGUAGE_API:
                return ast.copy_location(ast.Attribute(ast.Name("tl", ast.Load()), name, ast.Load()), node)
            return ast.copy_location(
                ast.Attribute(ast.Attribute(ast.Name("tl", ast.Load()), "math", ast.Load()), name, ast.Load()), node)
        if namespace == LIBDEVICE:
            self.uses_libdevice = True
            self.rules.add("libdevice")
        return node


def helper_closure(names: Iterable[str]) -> list[str]:
    """The helpers ``names`` need, dependencies first, each once."""
    ordered: list[str] = []

    def visit(name: str) -> None:
        if name in ordered:
            return
        for dependency in HELPER_SOURCES[name][0]:
            visit(dependency)
        ordered.append(name)

    for name in sorted(names):
        visit(name)
    return ordered


def helper_definitions(names: Iterable[str]) -> list[ast.stmt]:
    body: list[ast.stmt] = []
    for name in helper_closure(names):
        body.extend(ast.parse(HELPER_SOURCES[name][1]).body)
    return body
