"""Small AST helpers shared by the static check's passes."""
from __future__ import annotations

import ast
from typing import Optional

from .vocabulary import LOCAL_MARK

def pair_targets(target: ast.expr, value: ast.expr) -> list[tuple[ast.expr, ast.expr]]:
    """(target, value) pairs of an assignment, unpacking ``a, b = x, y``."""
    if isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List)) \
            and len(target.elts) == len(value.elts):
        pairs = []
        for sub_target, sub_value in zip(target.elts, value.elts):
            pairs.extend(pair_targets(sub_target, sub_value))
        return pairs
    return [(target, value)]


def first_param(node) -> Optional[str]:
    args = node.args.posonlyargs + node.args.args
    return args[0].arg if args else None


def params(node) -> set[str]:
    args = node.args
    names = {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}
    if args.vararg:
        names.add(args.vararg.arg)
    if args.kwarg:
        names.add(args.kwarg.arg)
    return names - {"self", "cls", "ctx"}


def self_param(node) -> Optional[str]:
    """The name a method calls its instance (None for static methods)."""
    for dec in node.decorator_list:
        if isinstance(dec, ast.Name) and dec.id == "staticmethod":
            return None
    return first_param(node)


def is_self(node: ast.AST, self_name: Optional[str]) -> bool:
    return self_name is not None and isinstance(node, ast.Name) and node.id == self_name


def is_self_attr(node: ast.AST, self_name: Optional[str]) -> bool:
    return isinstance(node, ast.Attribute) and is_self(node.value, self_name)


def self_attr_source(node: ast.AST, self_name: str) -> Optional[str]:
    """The attribute behind ``self.attr``, ``self.attr[i]`` or ``self.attr.values()``."""
    if isinstance(node, ast.Subscript):
        node = node.value
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
            and node.func.attr in ("values", "children", "modules"):
        node = node.func.value
    if is_self_attr(node, self_name):
        return node.attr
    return None


def is_super_call(func: ast.AST) -> bool:
    return isinstance(func, ast.Attribute) and isinstance(func.value, ast.Call) \
        and isinstance(func.value.func, ast.Name) and func.value.func.id == "super"


def is_builtin_call(node: ast.Call, name: str, bound: set[str]) -> bool:
    return isinstance(node.func, ast.Name) and node.func.id == name and name not in bound


def handler_produces_values(handler: ast.ExceptHandler) -> bool:
    """A handler that returns or computes something is a fallback path, not error reporting."""
    in_raise = {id(n) for stmt in ast.walk(handler) if isinstance(stmt, ast.Raise)
                for n in ast.walk(stmt)}
    for node in ast.walk(handler):
        if id(node) in in_raise:
            continue  # building an error message
        if isinstance(node, (ast.Return, ast.Yield)) and node.value is not None \
                and not isinstance(node.value, ast.Constant):
            return True
        if isinstance(node, ast.BinOp):
            sides = (node.left, node.right)
            if all(isinstance(s, ast.Constant) for s in sides) or isinstance(node.op, ast.Mod) \
                    or any(isinstance(s, (ast.Constant, ast.JoinedStr)) and isinstance(
                        getattr(s, "value", ""), str) for s in sides):
                continue  # constants and string building
            return True
    return False


def local(q: str) -> Optional[str]:
    if q.startswith(LOCAL_MARK) and q.count(".") == 1:
        return q[len(LOCAL_MARK):]
    return None


def source(node: ast.AST) -> str:
    try:
        text = ast.unparse(node)
    except Exception:  # unparse of odd trees; the label is cosmetic
        return type(node).__name__
    return text if len(text) <= 60 else text[:57] + "..."
