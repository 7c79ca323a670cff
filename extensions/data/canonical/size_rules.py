"""Sizes read inside ``call``: the wrapper takes the forward's tensors only.

Inductor's dynamic-shape wrapper takes its symbolic sizes as leading arguments, and the module
calls it as ``call([x.size(0), x.size(1), x, y])``; ``call`` unpacks them by position. A model
trained on that form has to keep two lists in step across the answer, and most of its answers that
compile fail there (a size passed where a tensor belongs, the wrong count). This rule moves each size
into ``call``, read from the tensor it came from, so the module writes ``call([x, y])``:

    def call(args):                          def call(args):
        arg0_1, arg1_1, arg2_1 = args            arg2_1, = args
        ...                                      arg0_1 = arg2_1.size(0)
                                                 arg1_1 = arg2_1.size(1)
                                                 ...
    ... return call([x.size(0), x.size(1), x])[0]    ... return call([x])[0]

Applied only where every size argument is ``T.size(k)`` or ``T.stride(k)`` of a tensor argument
``T`` of the same list and ``call`` unpacks ``args`` once by name; anything else is left as it is.
The values are the same ones, read from the same tensor, so the kernel's meaning does not change.
"""
from __future__ import annotations

import ast
from typing import Optional

RULE = "sizes_from_tensors"


def _call_list(module: ast.Module) -> Optional[ast.List]:
    """The list literal of ``call([...])`` in a module class's ``forward`` (``ModelNew``, or
    KernelBook's ``<Name>New`` before it is renamed), when there is exactly one."""
    found = []
    for node in module.body:
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "forward":
                    found += [n.args[0] for n in ast.walk(item)
                              if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "call"
                              and len(n.args) == 1 and not n.keywords and isinstance(n.args[0], ast.List)]
    return found[0] if len(found) == 1 else None


def _call_def(module: ast.Module) -> Optional[ast.FunctionDef]:
    defs = [n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == "call"]
    return defs[0] if len(defs) == 1 else None


def _unpacking(call_def: ast.FunctionDef) -> Optional[tuple[int, list[str]]]:
    """Index and names of the one ``a, b, c = args`` statement of ``call``."""
    found = []
    for index, statement in enumerate(call_def.body):
        if (isinstance(statement, ast.Assign) and len(statement.targets) == 1
                and isinstance(statement.value, ast.Name) and statement.value.id == "args"):
            target = statement.targets[0]
            if isinstance(target, ast.Tuple) and all(isinstance(e, ast.Name) for e in target.elts):
                found.append((index, [e.id for e in target.elts]))
            else:
                return None
    return found[0] if len(found) == 1 else None


def _size_of(expression: ast.expr) -> Optional[tuple[str, str, int]]:
    """``T.size(k)`` / ``T.stride(k)`` as (text of T, method, k)."""
    if (isinstance(expression, ast.Call) and isinstance(expression.func, ast.Attribute)
            and expression.func.attr in ("size", "stride") and len(expression.args) == 1 and not expression.keywords
            and isinstance(expression.args[0], ast.Constant) and type(expression.args[0].value) is int):
        return ast.unparse(expression.func.value), expression.func.attr, expression.args[0].value
    return None


def fold_size_arguments(module: ast.Module) -> bool:
    """Rewrite ``module`` in place as the docstring says; whether anything changed."""
    call_list, call_def = _call_list(module), _call_def(module)
    if call_list is None or call_def is None:
        return False
    unpacking = _unpacking(call_def)
    if unpacking is None or len(unpacking[1]) != len(call_list.elts):
        return False
    index, names = unpacking
    texts = [ast.unparse(e) for e in call_list.elts]
    sizes = {position: _size_of(e) for position, e in enumerate(call_list.elts)}
    size_positions = [p for p, size in sizes.items() if size is not None]
    if not size_positions:
        return False
    tensor_positions = [p for p in range(len(texts)) if p not in size_positions]
    reads = []
    for position in size_positions:
        owner, method, dim = sizes[position]
        owners = [p for p in tensor_positions if texts[p] == owner]
        if len(owners) != 1:
            return False  # the size of something the wrapper is not handed: leave the form alone
        reads.append(f"{names[position]} = {names[owners[0]]}.{method}({dim})")
    kept = [names[p] for p in tensor_positions]
    call_def.body[index] = ast.parse(f"{', '.join(kept)}{',' if len(kept) == 1 else ''} = args").body[0]
    call_def.body[index + 1:index + 1] = [ast.parse(line).body[0] for line in reads]
    call_list.elts = [call_list.elts[p] for p in tensor_positions]
    ast.fix_missing_locations(module)
    return True
