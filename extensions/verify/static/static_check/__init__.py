"""Static anti-cheat analysis of a candidate module (AST only; nothing is executed).

The check is the boundary that keeps arbitrary Python out of the worker. It is an allow-list
(:mod:`.allowlist`, vocabulary in :mod:`extensions.verify.static.policy`): a candidate may import a short
list of modules, reach only the public kernel-writing API of torch and triton, call builtins from a
short list, and touch no private or dunder name beyond ``__init__``. On top of it, the rules that
explain *why* something is refused:

* Is this a Triton solution at all?  ``class ModelNew`` exists, at least one ``@triton.jit`` kernel
  exists, and a kernel is launched (``kernel[grid](...)``) from the forward path
  (:mod:`.forward_path`).
* Does anything do the math or game the harness instead of the kernels?  Every function except
  ``__init__`` (and what only ``__init__`` reaches) and autograd ``backward`` is held to the
  forward allow-list: PyTorch may allocate, view and copy, never compute. Everything else in
  :data:`FLAG_DESCRIPTIONS` is flagged anywhere in the module (:mod:`.module_rules`).
* Would the kernels compile for a GPU?  Python that Triton's compiler refuses inside a
  ``@triton.jit`` function runs in the CPU interpreter all the same (:mod:`.kernel_language`).

Names are resolved through imports and assignments (:mod:`.module_index`), so an alias is judged
by what it names.
"""
from __future__ import annotations

import ast

from .allowlist import AllowList
from .findings import FLAG_DESCRIPTIONS, Findings, StaticReport
from .forward_path import ForwardPath
from .kernel_language import KernelLanguage
from .module_index import ModuleIndex
from .module_rules import ModuleRules

__all__ = ["FLAG_DESCRIPTIONS", "StaticReport", "static_check"]


def static_check(code: str, allow_library_gemm: bool = False) -> StaticReport:
    """Judge ``code`` from its AST. ``allow_library_gemm`` moves library GEMM/conv calls in the
    forward path from the ``library_gemm`` flag into ``allowed_library_calls``."""
    try:
        tree = ast.parse(code)
    except SyntaxError as exc:
        line = exc.lineno or 0
        return _report_for_unparseable(f"line {line}: syntax error: {exc.msg}")
    except (ValueError, RecursionError, MemoryError) as exc:
        return _report_for_unparseable(f"line 0: does not parse: {exc}")
    index = ModuleIndex(tree)
    findings = Findings()
    modelnew = _modelnew_class(index)
    if modelnew is None:
        findings.flag("no_modelnew", 1, "no class ModelNew defined at module level")
    if not index.kernels:
        findings.flag("no_triton_kernel", 1, "no @triton.jit kernel defined")
    forward = ForwardPath(index, findings, allow_library_gemm)
    ModuleRules(index, findings, forward, allow_library_gemm).run()
    AllowList(index, findings).run()
    KernelLanguage(index, findings).run()
    if modelnew is not None:
        forward.check(modelnew)
    return findings.report(list(index.kernels))


def _report_for_unparseable(message: str) -> StaticReport:
    return StaticReport(False, ["syntax_error"], [message], [], [])


def _modelnew_class(index: ModuleIndex):
    """Name of the class ModelNew is ("" when bound to something else), None when absent."""
    if "ModelNew" in index.classes:
        return "ModelNew"
    for node in index.tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "ModelNew" for t in node.targets
        ):
            return index.local_name(node.value) or ""
    return None
