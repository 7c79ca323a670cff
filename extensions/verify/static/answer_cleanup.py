"""What an extracted answer loses before it is judged: a test harness under ``if __name__ ==
"__main__"`` (it never runs on import) and an unreferenced echo of the reference ``class Model``
(noise, not a cheat). Text in, text out: nothing here executes code."""
from __future__ import annotations

import ast
from typing import Optional


def try_parse(code: str) -> tuple[Optional[ast.Module], Optional[SyntaxError]]:
    try:
        return ast.parse(code), None
    except SyntaxError as exc:  # IndentationError and TabError are SyntaxErrors
        return None, exc
    except (ValueError, RecursionError, MemoryError) as exc:
        return None, SyntaxError(str(exc))


def remove_harness_and_echo(code: str) -> tuple[str, list[str]]:
    code, harness_note = _remove_main_guard(code)
    code, echo_note = _remove_echoed_reference(code)
    return code, [note for note in (harness_note, echo_note) if note]


def _remove_echoed_reference(code: str) -> tuple[str, Optional[str]]:
    """Drop a top-level ``class Model`` that nothing else in the module names.

    Answers often repeat the original module before the rewrite. An unreferenced copy never runs,
    so it is noise, not a cheat; any other mention of ``Model`` (subclassing, calling, a string)
    keeps the class in place for the static check to flag.
    """
    tree, _ = try_parse(code)
    if tree is None:
        return code, None
    echoes = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model"]
    if not echoes:
        return code, None
    inside = {id(sub) for echo in echoes for sub in ast.walk(echo)}
    for node in ast.walk(tree):
        if id(node) in inside:
            continue
        if (isinstance(node, ast.Name) and node.id == "Model") \
                or (isinstance(node, ast.Attribute) and node.attr == "Model") \
                or (isinstance(node, ast.Constant) and node.value == "Model") \
                or (isinstance(node, ast.alias) and "Model" in (node.name, node.asname)):
            return code, None
    lines = code.split("\n")
    for echo in sorted(echoes, key=lambda n: n.lineno, reverse=True):
        start = min([echo.lineno] + [d.lineno for d in echo.decorator_list])
        del lines[start - 1:echo.end_lineno]
    cleaned = tidy("\n".join(lines))
    if try_parse(cleaned)[0] is None:
        return code, None
    return cleaned, "removed an unreferenced copy of the reference class Model"


def _remove_main_guard(code: str) -> tuple[str, Optional[str]]:
    tree, _ = try_parse(code)
    if tree is None:
        return code, None
    lines = code.split("\n")
    removed = 0
    for node in reversed(tree.body):
        if isinstance(node, ast.If) and _is_main_test(node.test):
            del lines[node.lineno - 1:node.end_lineno]
            removed += 1
    if not removed:
        return code, None
    cleaned = tidy("\n".join(lines))
    if try_parse(cleaned)[0] is None:
        return code, None
    return cleaned, "removed the `if __name__ == \"__main__\"` block"


def _is_main_test(test: ast.expr) -> bool:
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    has_name = any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides)
    has_main = any(isinstance(s, ast.Constant) and s.value == "__main__" for s in sides)
    return has_name and has_main


def tidy(code: str) -> str:
    return code.strip("\n") + "\n"
