"""Kernels without the names nothing reads: inductor's bookkeeping assignments dropped.

Inductor writes every kernel from one template and binds names that the kernel at hand may never
read: ``rnumel = r0_numel``, ``RBLOCK: tl.constexpr = R0_BLOCK``, ``rbase = r0_base``,
``roffset = r0_offset``, ``rindex = r0_index`` in reductions, ``x2 = xindex // 16`` where the
loads use other indices. They are a tenth of a reduction kernel's lines, and a model trained on
them writes them too, spending its token budget (a quarter of the 0.5B model's held-out answers
after SFT were cut off at it, docs/benchmarks.md) and naming values it never defines.

An assignment to a plain name inside a ``@triton.jit`` function is dropped where no statement of
that function reads the name and its value only computes: names, constants, operators,
subscripts, attributes and calls of ``tl`` functions that neither store, synchronise nor print
(``PURE_CALLS``). Repeated until nothing more goes, so a chain of unread names goes whole. A loop
or branch left empty keeps a ``pass``. What the kernel stores, and every value a store or a
launch reads, is computed by the same statements as before, so the kernel's meaning does not
change.
"""
from __future__ import annotations

import ast

RULE = "unread_names_dropped"

# tl functions with no effect but their value (loads included: a masked-out load has none either).
PURE_CALLS = frozenset({
    "arange", "full", "zeros", "zeros_like", "full_like", "program_id", "num_programs", "load", "where",
    "broadcast_to", "reshape", "view", "expand_dims", "cast", "to", "abs", "exp", "exp2", "log", "log2",
    "sqrt", "rsqrt", "sigmoid", "maximum", "minimum", "sum", "max", "min", "argmax", "argmin", "cdiv",
    "multiple_of", "max_contiguous", "splat", "trans", "permute", "sin", "cos", "erf", "floor", "ceil",
    "fma", "umulhi", "clamp", "softmax", "xor_sum", "reduce", "cumsum", "cumprod", "dot",
})


def _is_jit(function: ast.FunctionDef) -> bool:
    return any(ast.unparse(d).split("(")[0] in ("triton.jit", "jit") for d in function.decorator_list)


def _pure(value: ast.expr) -> bool:
    for node in ast.walk(value):
        if isinstance(node, (ast.NamedExpr, ast.Lambda, ast.Yield, ast.Await)):
            return False
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
            if name not in PURE_CALLS:
                return False
    return True


def _target_name(statement: ast.stmt) -> str | None:
    if isinstance(statement, ast.Assign) and len(statement.targets) == 1 and isinstance(statement.targets[0], ast.Name):
        return statement.targets[0].id
    if isinstance(statement, ast.AnnAssign) and statement.value is not None and isinstance(statement.target, ast.Name):
        return statement.target.id
    return None


def _read_names(function: ast.FunctionDef) -> set[str]:
    """Names some statement reads; ``x += 1`` reads ``x`` too."""
    read = set()
    for statement in function.body:
        for node in ast.walk(statement):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                read.add(node.id)
            elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
                read.add(node.target.id)
    return read


def _drop_unread(statements: list[ast.stmt], read: set[str]) -> tuple[list[ast.stmt], bool]:
    kept, changed = [], False
    for statement in statements:
        name = _target_name(statement)
        if name is not None and name not in read and _pure(statement.value):
            changed = True
            continue
        for block in ("body", "orelse"):
            inner = getattr(statement, block, None)
            if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
                new_inner, inner_changed = _drop_unread(inner, read)
                if inner_changed:
                    setattr(statement, block, new_inner or ([ast.Pass()] if block == "body" else []))
                    changed = True
        kept.append(statement)
    return kept, changed


def drop_unread_names(module: ast.Module) -> bool:
    """Rewrite every ``@triton.jit`` function of ``module`` in place as the docstring says; whether
    anything changed."""
    changed = False
    for function in (n for n in module.body if isinstance(n, ast.FunctionDef) and _is_jit(n)):
        while True:
            body, step = _drop_unread(function.body, _read_names(function))
            if not step:
                break
            function.body = body or [ast.Pass()]
            changed = True
    if changed:
        ast.fix_missing_locations(module)
    return changed
