"""Normalise one KernelBook row into a KernelBench-form task and a ``ModelNew`` solution.

KernelBook (``GPUMODE/KernelBook``) rows carry ``python_code`` (a PyTorch module named by
``entry_point``, with ``get_inputs()`` and ``get_init_inputs()`` returning ``[args, kwargs]``),
``triton_code`` (the Triton version, class ``<entry_point>New``; ``original_triton_code`` when
``triton_code`` is empty), ``uuid`` and repository fields (``repo_name``, ``module_name``,
``synthetic``, ``licenses``, ``stars``, ``sha``, ``repo_link``).

KernelBook's ``triton_code`` is torch inductor output; ``canonical.canonicalize`` rewrites it into
the clean dialect the verifier accepts (a row it cannot rewrite is dropped as
``not_canonicalisable:<reason>``). The rest of the pipeline sees one form only, KernelBench's: the task defines ``class Model`` and a
``get_init_inputs()`` whose flat list constructs it as ``Model(*get_init_inputs())``; the solution
defines ``class ModelNew`` with the same constructor. Renaming works on the AST's name positions,
never on raw text, so strings, attributes and longer names that contain the class name stay intact.
"""
from __future__ import annotations

import ast
import copy
import re
from dataclasses import dataclass, field
from typing import Any, Optional

from . import rejections as R
from .canonical import CanonicalizeError, canonicalize

TASK_CLASS = "Model"
SOLUTION_CLASS = "ModelNew"
REQUIRED_FIELDS = ("uuid", "entry_point", "python_code")
REPO_FIELDS = ("repo_name", "module_name", "synthetic", "licenses", "stars", "sha", "repo_link")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Inductor output that hands the math to vendor libraries rather than Triton kernels.
_LIBRARY_KERNEL_CALL = re.compile(r"\bextern_kernels\.\w+\(|\baten\.\w+\(|\btorch\.ops\.aten\.")


@dataclass
class KernelBookPair:
    uuid: str
    entry_point: str
    task_code: str  # KernelBench form: class Model, get_inputs, get_init_inputs (flat list)
    solution_code: str  # class ModelNew with Triton kernels, in the clean dialect (canonical/)
    repo: dict[str, Any] = field(default_factory=dict)
    dialect: str = "clean"  # the dialect the row shipped in: clean, inductor_kernelbook, inductor_async


def _text_field(row: dict, name: str) -> str:
    if name not in row or row[name] is None:
        raise R.RowRejected(f"{R.MISSING_FIELD}:{name}")
    value = row[name]
    if not isinstance(value, (str, int)):
        raise R.RowRejected(f"{R.MISSING_FIELD}:{name}", f"expected text, got {type(value).__name__}")
    value = str(value)
    if not value.strip():
        raise R.RowRejected(f"{R.EMPTY_FIELD}:{name}")
    return value


def _solution_text(row: dict) -> str:
    for name in ("triton_code", "original_triton_code"):
        value = row.get(name)
        if isinstance(value, str) and value.strip():
            return value
    if row.get("triton_code") is None and row.get("original_triton_code") is None:
        raise R.RowRejected(f"{R.MISSING_FIELD}:triton_code")
    raise R.RowRejected(f"{R.EMPTY_FIELD}:triton_code")


def _line_offsets(source: str) -> list[int]:
    """Byte offset of the start of each line (AST columns are UTF-8 byte offsets)."""
    offsets, total = [0], 0
    for line in source.encode("utf-8").splitlines(keepends=True):
        total += len(line)
        offsets.append(total)
    return offsets


def rename_class(source: str, old: str, new: str) -> str:
    """Rename the class ``old`` to ``new``: its definition and every name that refers to it.

    Attribute names (``pkg.old``), strings, comments and identifiers that merely contain ``old``
    are left alone. Raises SyntaxError when ``source`` does not parse.
    """
    tree = ast.parse(source)
    spans: list[tuple[int, int, int]] = []  # (line, start byte, end byte), 1-based line
    encoded_lines = source.encode("utf-8").splitlines(keepends=True)
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id == old:
            spans.append((node.lineno, node.col_offset, node.end_col_offset))
        elif isinstance(node, ast.ClassDef) and node.name == old:
            line = encoded_lines[node.lineno - 1]
            match = re.compile(rb"class\s+(" + re.escape(old.encode()) + rb")\b").search(line, node.col_offset)
            if match:
                spans.append((node.lineno, match.start(1), match.end(1)))
    if not spans:
        return source
    offsets = _line_offsets(source)
    data = bytearray(source.encode("utf-8"))
    for line, start, end in sorted(spans, reverse=True):
        base = offsets[line - 1]
        data[base + start:base + end] = new.encode("utf-8")
    return data.decode("utf-8")


def _top_level(tree: ast.Module, kind: type, name: str) -> Optional[ast.AST]:
    for node in tree.body:
        if isinstance(node, kind) and getattr(node, "name", None) == name:
            return node
    return None


def _init_positional_params(cls: ast.ClassDef) -> tuple[list[str], dict[str, ast.expr]]:
    """Positional parameter names of ``cls.__init__`` (without self) and their defaults."""
    init = _top_level(ast.Module(body=cls.body, type_ignores=[]), ast.FunctionDef, "__init__")
    if init is None:
        return [], {}
    params = [a.arg for a in [*init.args.posonlyargs, *init.args.args]][1:]
    defaults = dict(zip(params[len(params) - len(init.args.defaults):], init.args.defaults))
    return params, defaults


def flatten_init_inputs(task_code: str, class_name: str = TASK_CLASS) -> str:
    """Rewrite a KernelBook ``get_init_inputs`` returning ``[args, kwargs]`` to a flat list.

    Keyword arguments are placed at their position in ``class_name.__init__``; parameters skipped
    between them get their default expression. Sources already in KernelBench form come back
    unchanged. Raises RowRejected when the kwargs cannot be mapped to positions.
    """
    tree = ast.parse(task_code)
    func = _top_level(tree, ast.FunctionDef, "get_init_inputs")
    if func is None or not func.body or not isinstance(func.body[-1], ast.Return):
        return task_code
    returned = func.body[-1].value
    if not (isinstance(returned, ast.List) and len(returned.elts) == 2
            and isinstance(returned.elts[0], (ast.List, ast.Tuple))
            and isinstance(returned.elts[1], ast.Dict)):
        return task_code  # already a flat list (KernelBench form)
    args_node, kwargs_node = returned.elts
    if any(isinstance(e, ast.Starred) for e in args_node.elts):
        raise R.RowRejected(R.INIT_INPUTS_UNMAPPABLE, "starred positional init inputs")
    keys = []
    for key in kwargs_node.keys:
        if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
            raise R.RowRejected(R.INIT_INPUTS_UNMAPPABLE, "init kwargs with non-literal keys")
        keys.append(key.value)
    values = dict(zip(keys, kwargs_node.values))
    flat: list[ast.expr] = list(args_node.elts)
    if values:
        cls = _top_level(tree, ast.ClassDef, class_name)
        params, defaults = _init_positional_params(cls) if cls is not None else ([], {})
        unknown = [k for k in keys if k not in params]
        if unknown:
            raise R.RowRejected(R.INIT_INPUTS_UNMAPPABLE, f"kwargs {unknown} are not positional parameters")
        last = max(params.index(k) for k in keys)
        for index in range(len(flat), last + 1):
            name = params[index]
            if name in values:
                flat.append(values[name])
            elif name in defaults:
                flat.append(defaults[name])
            else:
                raise R.RowRejected(R.INIT_INPUTS_UNMAPPABLE, f"parameter {name!r} has neither value nor default")
        if any(params.index(k) < len(args_node.elts) for k in keys):
            raise R.RowRejected(R.INIT_INPUTS_UNMAPPABLE, "a kwarg repeats a positional argument")
    new_func = copy.copy(func)
    new_func.body = [*func.body[:-1], ast.Return(ast.List(flat, ast.Load()))]
    ast.fix_missing_locations(new_func)
    lines = task_code.splitlines(keepends=True)
    replacement = ast.unparse(new_func) + "\n"
    return "".join([*lines[:func.lineno - 1], replacement, *lines[func.end_lineno:]])


def _defined_classes(tree: ast.Module) -> set[str]:
    return {n.name for n in tree.body if isinstance(n, ast.ClassDef)}


def _has_triton_kernel(tree: ast.Module) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for deco in node.decorator_list:
                target = deco.func if isinstance(deco, ast.Call) else deco
                if isinstance(target, ast.Attribute) and target.attr in ("jit", "autotune", "heuristics"):
                    return True
    return False


def normalise_row(row: dict, *, drop_library_kernel_solutions: bool = True,
                  max_task_chars: Optional[int] = None,
                  max_solution_chars: Optional[int] = None) -> KernelBookPair:
    """One KernelBook row -> KernelBookPair, or RowRejected naming why it cannot be used."""
    if not isinstance(row, dict):
        raise R.RowRejected(R.NOT_AN_OBJECT, type(row).__name__)
    uuid = _text_field(row, "uuid").strip()
    entry_point = _text_field(row, "entry_point").strip()
    task = _text_field(row, "python_code")
    solution = _solution_text(row)
    if not _IDENTIFIER.match(entry_point):
        raise R.RowRejected(R.NO_ENTRY_POINT_CLASS, f"entry_point {entry_point!r} is not an identifier")

    try:
        task_tree = ast.parse(task)
    except (SyntaxError, ValueError) as exc:
        raise R.RowRejected(R.TASK_SYNTAX_ERROR, str(exc)) from None
    try:
        solution_tree = ast.parse(solution)
    except (SyntaxError, ValueError) as exc:
        raise R.RowRejected(R.SOLUTION_SYNTAX_ERROR, str(exc)) from None

    task_classes = _defined_classes(task_tree)
    if entry_point not in task_classes:
        raise R.RowRejected(R.NO_ENTRY_POINT_CLASS, f"python_code defines no class {entry_point}")
    for name in ("get_inputs", "get_init_inputs"):
        if _top_level(task_tree, ast.FunctionDef, name) is None:
            raise R.RowRejected(R.NO_TASK_FUNCTIONS, f"python_code defines no {name}()")
    solution_name = f"{entry_point}New"
    solution_classes = _defined_classes(solution_tree)
    if solution_name not in solution_classes and not (
            SOLUTION_CLASS in solution_classes and entry_point == TASK_CLASS):
        raise R.RowRejected(R.NO_SOLUTION_CLASS, f"triton_code defines no class {solution_name}")
    if entry_point != TASK_CLASS and TASK_CLASS in task_classes:
        raise R.RowRejected(R.NAME_CONFLICT, "python_code already defines another class Model")
    if solution_name != SOLUTION_CLASS and SOLUTION_CLASS in solution_classes:
        raise R.RowRejected(R.NAME_CONFLICT, "triton_code already defines another class ModelNew")
    try:
        canonical = canonicalize(solution)
    except CanonicalizeError as exc:
        if exc.reason == "solution_without_triton_kernel":
            raise R.RowRejected(R.SOLUTION_WITHOUT_TRITON_KERNEL) from None
        if exc.reason == "library_kernel_call" and drop_library_kernel_solutions:
            raise R.RowRejected(R.SOLUTION_CALLS_LIBRARY_KERNEL, exc.detail) from None
        raise R.RowRejected(f"{R.NOT_CANONICALISABLE}:{exc.reason}", exc.detail) from None
    solution = canonical.code
    if not _has_triton_kernel(ast.parse(solution)):
        raise R.RowRejected(R.SOLUTION_WITHOUT_TRITON_KERNEL)
    if drop_library_kernel_solutions and _LIBRARY_KERNEL_CALL.search(solution):
        raise R.RowRejected(R.SOLUTION_CALLS_LIBRARY_KERNEL)

    task = rename_class(task, entry_point, TASK_CLASS)
    task = flatten_init_inputs(task, TASK_CLASS)
    solution = rename_class(solution, solution_name, SOLUTION_CLASS)
    if max_task_chars is not None and len(task) > max_task_chars:
        raise R.RowRejected(R.TASK_TOO_LONG, f"{len(task)} > {max_task_chars} characters")
    if max_solution_chars is not None and len(solution) > max_solution_chars:
        raise R.RowRejected(R.SOLUTION_TOO_LONG, f"{len(solution)} > {max_solution_chars} characters")
    repo = {name: row[name] for name in REPO_FIELDS if name in row}
    return KernelBookPair(uuid=uuid, entry_point=entry_point, task_code=task, solution_code=solution, repo=repo,
                          dialect=canonical.dialect)
