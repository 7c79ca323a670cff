"""Module-level size constants of a KernelBench-style problem, read and rewritten in the source.

KernelBench problems set their shapes with module-level assignments (``batch_size = 16``,
``N = 2048 * 2``). The verifier shrinks them for the CPU interpreter, builds a tiny input set
(batch 2) and other shapes (odd sizes that catch missing masks) by rewriting these assignments
in the source text, so ``get_inputs()`` and ``get_init_inputs()`` of the rewritten problem stay the
problem's own functions. Pure AST work: no torch here.
"""
from __future__ import annotations

import ast
import operator
from dataclasses import dataclass
from typing import Iterator

_BINOPS = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv, ast.Pow: operator.pow, ast.Mod: operator.mod,
}


@dataclass(frozen=True)
class SizeConstant:
    name: str
    value: int
    lineno: int  # 1-based line of the assignment (the last one wins, as at run time)


def _const_int(node: ast.AST, known: dict[str, int]) -> int | None:
    """Value of an integer constant expression (literals, earlier constants, + - * // ** %)."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.Name) and node.id in known:
        return known[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _const_int(node.operand, known)
        return None if inner is None else -inner
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = _const_int(node.left, known), _const_int(node.right, known)
        if left is None or right is None:
            return None
        if isinstance(node.op, ast.Pow) and (right < 0 or right > 64):
            return None
        if isinstance(node.op, (ast.FloorDiv, ast.Mod)) and right == 0:
            return None
        return _BINOPS[type(node.op)](left, right)
    return None


def _name_assignments(tree: ast.Module) -> Iterator[tuple[ast.stmt, str, ast.expr]]:
    """Module-level ``NAME = value`` and ``NAME: T = value`` statements, in order, with the name
    and the value's node."""
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            yield stmt, stmt.targets[0].id, stmt.value
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
            yield stmt, stmt.target.id, stmt.value


def find_size_constants(source: str) -> dict[str, SizeConstant]:
    """Module-level ``NAME = <integer expression>`` assignments (booleans are not sizes)."""
    tree = ast.parse(source)
    known: dict[str, int] = {}
    found: dict[str, SizeConstant] = {}
    for stmt, target, value_node in _name_assignments(tree):
        value = _const_int(value_node, known)
        if value is None:
            known.pop(target, None)
            found.pop(target, None)
            continue
        known[target] = value
        found[target] = SizeConstant(target, value, stmt.lineno)
    return found


def find_scalar_constants(source: str) -> dict[str, float]:
    """Module-level ``NAME = <float literal>`` assignments (``multiplier = 2.0``, ``eps = -1e-5``):
    the scalars a problem may hand its constructor."""
    found: dict[str, float] = {}
    for _stmt, target, node in _name_assignments(ast.parse(source)):
        sign = 1.0
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            sign, node = -1.0, node.operand
        if isinstance(node, ast.Constant) and type(node.value) is float:
            found[target] = sign * node.value
        else:
            found.pop(target, None)
    return found


def varied_scalar(value: float, factor: float) -> float:
    """Another value for a constructor scalar: zero stays zero (a disabled option stays disabled;
    ``varied_zero`` is the value for a zero the reference was run with and found to take), whole
    numbers move one step away from zero (an exponent or a bound stays whole), others are
    scaled by ``factor``."""
    if value == 0.0 or value != value:
        return value
    if float(value).is_integer():
        return value + (1.0 if value > 0 else -1.0)
    return value * factor


def varied_zero(factor: float) -> float:
    """Another value for a scalar equal to 0.0 (a clamp bound, a shift), where the problem is
    known to stay valid with one: ``factor - 1``, of either sign and a few tenths from zero
    (``factor`` is drawn per batch). ``varied_scalar`` leaves zeros alone because a zero may be a
    disabled option; the caller decides, by running the reference, that this one is a value."""
    return factor - 1.0


def varied_int(value: int, step: int = 1) -> int:
    """Another value for a Python integer input: ``step`` away from zero, as ``varied_scalar``
    moves whole numbers (a count, an exponent, a bound) by one."""
    return value + step if value >= 0 else value - step


def rewrite_constants(source: str, new_values: dict[str, int | float]) -> str:
    """The source with the named module-level constants set to new literal values.

    Every module-level assignment of a named constant is replaced, so later expressions that use
    it (``dim = N * 2``) see the new value through Python itself.
    """
    if not new_values:
        return source
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    edits: list[tuple[int, int, int, int, str]] = []
    for _stmt, name, value in _name_assignments(tree):
        if name in new_values:
            edits.append((value.lineno, value.col_offset, value.end_lineno, value.end_col_offset,
                          _literal(new_values[name])))
    # Apply from the end so earlier offsets stay valid.
    for start_line, start_col, end_line, end_col, text in sorted(edits, reverse=True):
        first, last = lines[start_line - 1], lines[end_line - 1]
        # AST offsets are UTF-8 byte offsets.
        head = first.encode()[:start_col].decode()
        tail = last.encode()[end_col:].decode()
        lines[start_line - 1:end_line] = [head + text + tail]
    return "".join(lines)


def _literal(value: int | float) -> str:
    return repr(float(value)) if isinstance(value, float) else repr(int(value))


def is_batch_name(name: str) -> bool:
    return "batch" in name.lower()


def shrink_step(values: dict[str, int], min_value: int = 9) -> dict[str, int] | None:
    """Halve the largest constant above ``min_value`` (small ones are kernel sizes, strides...)."""
    candidates = [(v, n) for n, v in values.items() if v >= min_value]
    if not candidates:
        return None
    _, name = max(candidates)
    return {**values, name: max(1, values[name] // 2)}


def odd_size(value: int) -> int:
    """A nearby size that is not a power of two nor a multiple of common block sizes."""
    if value < 4:
        return value
    return max(3, (value * 3) // 4 + 1) | 1


def grown_size(value: int) -> int:
    """A size above ``value`` (about 5/4 of it), odd: wider rows and columns than the problem's own
    catch kernels that handle only the first block, or only as many elements as the problem had."""
    return ((value * 5) // 4 + 1) | 1
