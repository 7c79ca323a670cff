"""Inductor's dialect -> the clean dialect the verifier accepts, keeping every kernel's meaning.

KernelBook's ``triton_code`` (and what ``torch.compile`` writes today) is torch inductor output: it
imports ``torch._inductor`` internals, allocates with private guards, launches on raw streams and
calls helper namespaces the static policy refuses. ``canonicalize(source)`` rewrites it into the
dialect that training and reward share: public ``triton``/``tl`` names, ``torch.empty_strided``
allocations, plain ``kernel[grid](...)`` launches. Two inductor dialects are read:

* ``inductor_kernelbook``: top-level ``@triton.jit`` kernels launched as ``k[grid(n)](...)`` with
  their block sizes (the form KernelBook ships);
* ``inductor_async``: kernels inside ``async_compile.triton('name', '''source''')`` strings with
  ``@triton_heuristics.*`` autotuning decorators and ``k.run(..., stream=stream0)`` launches in a
  ``Runner.call`` method (torch 2.6 and later). The autotuner's choice is not in the text:
  ``configs`` passes it (the synthesizer records it), else a correct default is used.

Source without inductor's markers is returned unchanged (``dialect == "clean"``) but for the
wrapper's form: size arguments read inside ``call`` (``size_rules``) and ``call``'s body written in
``forward`` (``inline_rules``) with one name per value (``name_rules``), and kernels without the
names nothing reads (``dead_rules``), so canonicalising twice is the same as once. A source that cannot be rewritten raises ``CanonicalizeError`` with
the reason the data stage counts it under. The rules, with before/after, are in docs/data.md.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Optional

from .dead_rules import RULE as UNREAD_RULE, drop_unread_names
from .errors import CanonicalizeError
from .inline_rules import RULE as INLINE_RULE, inline_wrapper
from .name_rules import RULE as NAMES_RULE, fold_names
from .size_rules import RULE as SIZES_RULE, fold_size_arguments
from .kernel_rules import HELPER_PREFIX, KernelRewriter, helper_definitions
from .wrapper_rules import (KernelInfo, LaunchConfig, WrapperRewriter, first_tensor_argument,
                            remaining_library_calls)

__all__ = ["Canonical", "CanonicalizeError", "LaunchConfig", "canonicalize", "detect_dialect"]

CLEAN = "clean"
KERNELBOOK = "inductor_kernelbook"
ASYNC = "inductor_async"
# Module-level names inductor's wrapper defines or imports; none of them survives.
INDUCTOR_MARKERS = ("torch._inductor", "async_compile", "empty_strided_cuda", "assert_size_stride",
                    "get_raw_stream", "triton_helpers", "reinterpret_tensor", "_DeviceGuard")
KEPT_IMPORTS = {"torch", "torch.nn", "torch.nn.functional", "triton", "triton.language"}
DEVICE_NAME = "out_device"  # the device every allocation of call() takes: its first tensor input's
WRAPPER_ONLY_DEFS = {"get_args", "benchmark_compiled_module", "recursively_apply_fns"}


@dataclass
class Canonical:
    code: str
    dialect: str
    rules: list[str] = field(default_factory=list)  # the rule families that changed something


def detect_dialect(source: str) -> str:
    if "async_compile.triton(" in source:
        return ASYNC
    if any(marker in source for marker in INDUCTOR_MARKERS):
        return KERNELBOOK
    return CLEAN


def _is_jit(decorator: ast.expr) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return isinstance(target, ast.Attribute) and target.attr == "jit" and getattr(target.value, "id", "") == "triton"


def _constexpr_params(func: ast.FunctionDef) -> tuple[list[str], list[str]]:
    runtime, constexpr = [], []
    for arg in func.args.args:
        annotation = ast.unparse(arg.annotation) if arg.annotation is not None else ""
        (constexpr if annotation.endswith("constexpr") else runtime).append(arg.arg)
    return runtime, constexpr


def _decorator_meta(func: ast.FunctionDef) -> tuple[str, dict]:
    """The ``@triton_heuristics.<kind>(...)`` decorator: its kind and literal keyword values."""
    for decorator in func.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if isinstance(target, ast.Attribute) and getattr(target.value, "id", "") == "triton_heuristics":
            values = {}
            for keyword in getattr(decorator, "keywords", []):
                try:
                    values[keyword.arg] = ast.literal_eval(keyword.value)
                except (ValueError, SyntaxError):
                    if keyword.arg == "inductor_meta":  # holds set() and other calls
                        values[keyword.arg] = _literal_dict_entries(keyword.value)
            return target.attr, values
    return "", {}


def _literal_dict_entries(node: ast.expr) -> dict:
    out = {}
    if isinstance(node, ast.Dict):
        for key, value in zip(node.keys, node.values):
            try:
                out[ast.literal_eval(key)] = ast.literal_eval(value)
            except (ValueError, SyntaxError):
                continue
    return out


def _kernel_info(func: ast.FunctionDef) -> KernelInfo:
    runtime, constexpr = _constexpr_params(func)
    kind, meta = _decorator_meta(func)
    inductor_meta = meta.get("inductor_meta", {}) or {}
    info = KernelInfo(func.name, runtime, constexpr, heuristic=kind,
                      grid_type=inductor_meta.get("grid_type", "Grid1D"),
                      extra_grid_args=len(inductor_meta.get("extra_launcher_args", []) or []))
    if kind == "template":
        info.decorator_launch = LaunchConfig({}, num_warps=int(meta.get("num_warps", 4)),
                                             num_stages=int(meta.get("num_stages", 1)))
    return info


def _strip_decorators(func: ast.FunctionDef) -> ast.FunctionDef:
    func.decorator_list = [d for d in func.decorator_list if _is_jit(d)]
    return func


def _jit_functions(tree: ast.Module) -> list[ast.FunctionDef]:
    return [node for node in tree.body if isinstance(node, ast.FunctionDef)
            and any(_is_jit(d) for d in node.decorator_list)]


def _async_kernel_source(node: ast.stmt) -> Optional[str]:
    """``name = async_compile.triton('name', '''source''', ...)`` -> source."""
    if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
        func = node.value.func
        if isinstance(func, ast.Attribute) and func.attr == "triton" and getattr(func.value, "id", "") == "async_compile":
            for arg in node.value.args[1:2]:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    return arg.value
    return None


def _import_names(node: ast.stmt) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        return [f"{node.module}.{alias.name}" if node.module else alias.name for alias in node.names]
    return []


def _call_function(node: ast.ClassDef) -> Optional[ast.FunctionDef]:
    for item in node.body:
        if isinstance(item, ast.FunctionDef) and item.name == "call":
            func = ast.FunctionDef(name="call", args=item.args, body=item.body, decorator_list=[],
                                   returns=None, type_comment=None, type_params=[])
            func.args = ast.arguments(posonlyargs=[], args=[a for a in item.args.args if a.arg != "self"],
                                      vararg=None, kwonlyargs=[], kw_defaults=[], kwarg=None, defaults=[])
            return func
    return None


def _is_inductor_scaffolding(node: ast.stmt) -> bool:
    """Module-level statements of inductor's wrapper that carry no computation."""
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return True
    if isinstance(node, ast.Expr):  # async_compile.wait(globals()), triton_helpers.set_driver_to_gpu()
        return True
    if isinstance(node, ast.Delete):
        return True
    if isinstance(node, ast.If):  # if __name__ == "__main__":
        return True
    if isinstance(node, ast.Assign):
        text = ast.unparse(node.value)
        return text.startswith(("torch._C", "torch.ops", "AsyncCompile", "runner", "Runner("))
    if isinstance(node, ast.FunctionDef) and node.name in WRAPPER_ONLY_DEFS:
        return True
    return False


def canonicalize(source: str, configs: Optional[dict[str, LaunchConfig]] = None) -> Canonical:
    dialect = detect_dialect(source)
    if dialect == CLEAN:
        return _clean(source)
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError) as exc:
        raise CanonicalizeError("solution_syntax_error", str(exc)) from None
    rules: set[str] = set()
    kernel_rewriter = KernelRewriter()
    kernels: dict[str, KernelInfo] = {}
    jit_defs: list[ast.FunctionDef] = []
    seen_defs: dict[str, str] = {}
    body: list[ast.stmt] = []  # the module's own statements, in order (kernels go first)
    call_def: Optional[ast.FunctionDef] = None
    imports_kept: list[ast.stmt] = []

    def add_jit(func: ast.FunctionDef) -> None:
        is_kernel = func.name not in seen_defs
        info = _kernel_info(func)
        func = kernel_rewriter.visit(_strip_decorators(func))
        text = ast.unparse(func)
        if func.name in seen_defs:
            if seen_defs[func.name] != text:
                raise CanonicalizeError("kernel_name_clash", func.name)
            return
        seen_defs[func.name] = text
        if is_kernel:
            kernels[func.name] = info
        jit_defs.append(func)

    for node in tree.body:
        kernel_source = _async_kernel_source(node)
        if kernel_source is not None:
            rules.add("async_compile")
            try:
                kernel_tree = ast.parse(kernel_source)
            except SyntaxError as exc:
                raise CanonicalizeError("kernel_syntax_error", str(exc)) from None
            for func in _jit_functions(kernel_tree):
                add_jit(func)
            continue
        if isinstance(node, ast.FunctionDef) and any(_is_jit(d) for d in node.decorator_list):
            add_jit(node)
            continue
        if isinstance(node, ast.ClassDef) and node.name == "Runner":
            call_def = _call_function(node)
            continue
        if isinstance(node, ast.FunctionDef) and node.name == "call":
            call_def = node
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = _import_names(node)
            if all(name in KEPT_IMPORTS for name in names):
                imports_kept.append(node)
            continue
        if _is_inductor_scaffolding(node):
            continue
        body.append(node)
    if call_def is None:
        raise CanonicalizeError("no_wrapper_call")
    if not kernels:
        raise CanonicalizeError("solution_without_triton_kernel")
    device_arg = first_tensor_argument(call_def.body)
    if device_arg is None:
        raise CanonicalizeError("no_tensor_argument")
    wrapper = WrapperRewriter(kernels, configs or {}, DEVICE_NAME)
    call_def = wrapper.visit(call_def)
    # Bound before any ``del argN``: allocations after an input is released still need its device.
    call_def.body.insert(_after_unpacking(call_def.body), ast.parse(f"{DEVICE_NAME} = {device_arg}.device").body[0])
    rules |= wrapper.rules | kernel_rewriter.rules
    module = ast.Module(body=[*_canonical_imports(kernel_rewriter.uses_libdevice, imports_kept),
                              *helper_definitions(kernel_rewriter.helpers), *jit_defs, call_def, *body],
                        type_ignores=[])
    ast.fix_missing_locations(module)
    if fold_size_arguments(module):
        rules.add(SIZES_RULE)
    if inline_wrapper(module):
        rules.add(INLINE_RULE)
    if fold_names(module):
        rules.add(NAMES_RULE)
    if drop_unread_names(module):
        rules.add(UNREAD_RULE)
    leftovers = remaining_library_calls(module)
    if leftovers:
        raise CanonicalizeError("library_kernel_call", leftovers[0])
    unresolved = _private_names(module)
    if unresolved:
        raise CanonicalizeError("unsupported_wrapper_call", unresolved[0])
    return Canonical(ast.unparse(module) + "\n", dialect, sorted(rules))


def _clean(source: str) -> Canonical:
    """Clean source as it is, but for the wrapper's form (``size_rules``, ``inline_rules``,
    ``name_rules``) and unread kernel names (``dead_rules``): pairs canonicalised before those rules
    existed get the same form as new ones."""
    try:
        module = ast.parse(source)
    except (SyntaxError, ValueError):
        return Canonical(source, CLEAN)  # the verifier says what is wrong with it
    rules = [rule for rule, applied in ((SIZES_RULE, fold_size_arguments(module)),
                                        (INLINE_RULE, inline_wrapper(module)),
                                        (NAMES_RULE, fold_names(module)),
                                        (UNREAD_RULE, drop_unread_names(module))) if applied]
    if not rules:
        return Canonical(source, CLEAN)
    return Canonical(ast.unparse(module) + "\n", CLEAN, rules)


def _after_unpacking(body: list[ast.stmt]) -> int:
    """Index just after ``a, b = args`` (and ``args.clear()``), where every input has its name."""
    position = 0
    for index, statement in enumerate(body):
        text = ast.unparse(statement)
        if text.endswith("= args") or text == "args.clear()":
            position = index + 1
    return position


def _canonical_imports(uses_libdevice: bool, kept: list[ast.stmt]) -> list[ast.stmt]:
    lines = ["import torch", "import torch.nn as nn", "import triton", "import triton.language as tl"]
    if uses_libdevice:
        lines.append("from triton.language.extra import libdevice")
    have = set(lines)
    for node in kept:
        text = ast.unparse(node)
        if text not in have:
            lines.append(text)
            have.add(text)
    return ast.parse("\n".join(lines)).body


def _private_names(module: ast.Module) -> list[str]:
    """Inductor names that a rule did not replace (a helper this module does not know)."""
    private = {"triton_helpers", "tl_math", "triton_heuristics", "async_compile", "empty_strided_cuda",
               "reinterpret_tensor", "assert_size_stride", "get_raw_stream", "grid", "extern_kernels",
               "empty_strided_cpu", "alloc_from_pool", "align"}
    found = []
    for node in ast.walk(module):
        if isinstance(node, ast.Name) and node.id in private and not node.id.startswith(HELPER_PREFIX):
            found.append(node.id)
        if isinstance(node, ast.Attribute) and ast.unparse(node).startswith("torch._"):
            found.append(ast.unparse(node))
    return found
