"""One name per value in ``forward``: inductor's renamings folded away, its ``del``s dropped.

With the wrapper's body in ``forward`` (``inline_rules``), one value still goes by two or three
names: the input is rebound to inductor's argument name, each size to an ``argN_M`` name and then
to its symbol, and the names are deleted again once the last kernel has read them:

    def forward(self, x):                        def forward(self, x):
        arg3_1 = x                                   s33 = x.size(0)
        arg0_1 = arg3_1.size(0)                      out_device = x.device
        out_device = arg3_1.device                   buf0 = torch.empty_strided((s33,), ...)
        s33 = arg0_1                                 kernel[grid](x, buf0, s33, XBLOCK=256)
        buf0 = torch.empty_strided((s33,), ...)      return buf0
        kernel[grid](arg3_1, buf0, s33, XBLOCK=256)
        del arg3_1
        return buf0

Most of the 0.5B model's held-out answers after SFT on the left form that fail the static check
name a value that its own code never bound (``s50``, ``arg2_1``): the bookkeeping, not the kernel,
went wrong. A renaming ``a = b`` is folded where ``a`` is bound by it alone and ``b`` is one of
``forward``'s parameters or bound once before it: ``b``'s single binding takes the name ``a`` when
the renaming is ``b``'s only use (the later name is the one the launches read), else every ``a``
reads ``b``. A ``del`` of plain names at the top of ``forward`` only ends a local name's life (the
caller still holds the tensors), so it goes. Where ``forward`` binds names in nested scopes or by
``global``/``nonlocal``, nothing changes. The statements left run in the same order on the same
values, so the kernels' meaning does not change.
"""
from __future__ import annotations

import ast
from collections import Counter

RULE = "one_name_per_value"


def _forward_methods(module: ast.Module) -> list[ast.FunctionDef]:
    return [item for node in module.body if isinstance(node, ast.ClassDef) for item in node.body
            if isinstance(item, ast.FunctionDef) and item.name == "forward"]


def _has_nested_scope(function: ast.FunctionDef) -> bool:
    nested = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.ListComp, ast.SetComp,
              ast.DictComp, ast.GeneratorExp, ast.Global, ast.Nonlocal, ast.NamedExpr)
    return any(isinstance(node, nested) for statement in function.body for node in ast.walk(statement))


def _parameters(function: ast.FunctionDef) -> set[str]:
    arguments = function.args
    names = [a.arg for a in arguments.posonlyargs + arguments.args + arguments.kwonlyargs]
    names += [a.arg for a in (arguments.vararg, arguments.kwarg) if a is not None]
    return set(names)


def _bindings(function: ast.FunctionDef) -> Counter:
    """How many times each name is bound (or deleted) in the body."""
    counts: Counter = Counter()
    for statement in function.body:
        for node in ast.walk(statement):
            if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
                counts[node.id] += 1
    return counts


def _loads(function: ast.FunctionDef) -> Counter:
    counts: Counter = Counter()
    for statement in function.body:
        for node in ast.walk(statement):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                counts[node.id] += 1
    return counts


def _is_plain_del(statement: ast.stmt) -> bool:
    return isinstance(statement, ast.Delete) and all(isinstance(t, ast.Name) for t in statement.targets)


def _renaming(statement: ast.stmt) -> tuple[str, str] | None:
    if (isinstance(statement, ast.Assign) and len(statement.targets) == 1
            and isinstance(statement.targets[0], ast.Name) and isinstance(statement.value, ast.Name)):
        return statement.targets[0].id, statement.value.id
    return None


def _single_binding(function: ast.FunctionDef, name: str) -> ast.Assign | None:
    """The top-level ``name = ...`` statement, where it is the name's one binding."""
    found = [s for s in function.body if isinstance(s, ast.Assign) and len(s.targets) == 1
             and isinstance(s.targets[0], ast.Name) and s.targets[0].id == name]
    return found[0] if len(found) == 1 else None


def _rename_loads(function: ast.FunctionDef, old: str, new: str) -> None:
    for statement in function.body:
        for node in ast.walk(statement):
            if isinstance(node, ast.Name) and node.id == old and isinstance(node.ctx, ast.Load):
                node.id = new


def _fold_one(function: ast.FunctionDef) -> bool:
    """Fold the first renaming that can be folded; whether one was."""
    parameters = _parameters(function)
    bound = _bindings(function)
    loads = _loads(function)
    for position, statement in enumerate(function.body):
        pair = _renaming(statement)
        if pair is None:
            continue
        new, old = pair
        if new == old or new in parameters or bound[new] != 1:
            continue
        if old in parameters and bound[old] == 0:
            function.body.pop(position)
            _rename_loads(function, new, old)
            return True
        source = _single_binding(function, old)
        if source is None or bound[old] != 1 or function.body.index(source) > position:
            continue
        function.body.pop(position)
        if loads[old] == 1:  # the renaming was the only reader: the binding takes the later name
            source.targets[0].id = new
        else:
            _rename_loads(function, new, old)
        return True
    return False


def fold_names(module: ast.Module) -> bool:
    """Rewrite every ``forward`` of ``module`` in place as the docstring says; whether anything
    changed."""
    changed = False
    for function in _forward_methods(module):
        if _has_nested_scope(function):
            continue
        kept = [s for s in function.body if not _is_plain_del(s)]
        if len(kept) != len(function.body) and kept:
            function.body = kept
            changed = True
        while _fold_one(function):
            changed = True
    if changed:
        ast.fix_missing_locations(module)
    return changed
