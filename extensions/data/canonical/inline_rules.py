"""The wrapper's body written in ``forward``: one place names the tensors a kernel is launched with.

Inductor's module hands its tensors to a module-level ``call`` as a list, which ``call`` unpacks by
position; the launch arguments name the unpacked values. A model trained on that form writes the
list in ``forward`` and the unpacking in ``call`` separately, and in most of its answers that
compile the two disagree in length (``not enough values to unpack``). This rule moves ``call``'s
body into ``forward``, binding each unpacked name to the expression the list held, so the tensors
are named once, next to the launches that use them:

    def call(args):                              class ModelNew(nn.Module):
        arg2_1, = args                               def forward(self, x):
        arg0_1 = arg2_1.size(0)                          arg2_1 = x
        args.clear()                                     arg0_1 = arg2_1.size(0)
        buf0 = torch.empty_strided(...)                  buf0 = torch.empty_strided(...)
        kernel[grid](arg2_1, buf0, ...)                  kernel[grid](arg2_1, buf0, ...)
        return (buf0,)                                   return buf0
    ... def forward(self, x):
            return call([x])[0]

Applied only where ``forward`` is ``return call([...])[k]`` alone, ``call`` unpacks ``args`` once by
name, returns one tuple at its end and is used nowhere else, and no name of ``call``'s body is one
of ``forward``'s; anything else is left as it is. The statements are the same ones, run in the
same order on the same tensors, so the kernels' meaning does not change.
"""
from __future__ import annotations

import ast
from typing import Optional

RULE = "wrapper_in_forward"


def _forward_return(module: ast.Module) -> Optional[tuple[ast.FunctionDef, ast.List, int]]:
    """The one ``forward`` of the module whose body is ``return call([...])[k]``, with the list
    and ``k``."""
    found = []
    for node in module.body:
        if not isinstance(node, ast.ClassDef):
            continue
        for item in node.body:
            if not (isinstance(item, ast.FunctionDef) and item.name == "forward" and len(item.body) == 1):
                continue
            statement = item.body[0]
            value = statement.value if isinstance(statement, ast.Return) else None
            if (isinstance(value, ast.Subscript) and isinstance(value.slice, ast.Constant)
                    and type(value.slice.value) is int and isinstance(value.value, ast.Call)
                    and isinstance(value.value.func, ast.Name) and value.value.func.id == "call"
                    and len(value.value.args) == 1 and not value.value.keywords
                    and isinstance(value.value.args[0], ast.List)):
                found.append((item, value.value.args[0], value.slice.value))
    return found[0] if len(found) == 1 else None


def _names(nodes: list[ast.AST]) -> set[str]:
    return {n.id for root in nodes for n in ast.walk(root) if isinstance(n, ast.Name)}


def _is_args_clear(statement: ast.stmt) -> bool:
    return ast.unparse(statement) == "args.clear()"


def inline_wrapper(module: ast.Module) -> bool:
    """Rewrite ``module`` in place as the docstring says; whether anything changed."""
    target = _forward_return(module)
    calls = [n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == "call"]
    if target is None or len(calls) != 1:
        return False
    forward, call_list, index = target
    call_def = calls[0]
    arguments = call_def.args
    if ([a.arg for a in arguments.args] != ["args"] or arguments.vararg or arguments.kwarg
            or arguments.kwonlyargs or arguments.posonlyargs or call_def.decorator_list):
        return False
    # ``call`` is named once outside its own definition: in forward.
    uses = sum(isinstance(n, ast.Name) and n.id == "call" for n in ast.walk(module))
    if uses != 1:
        return False
    body = [s for s in call_def.body if not _is_args_clear(s)]
    if len(body) < 2 or not isinstance(body[0], ast.Assign) or ast.unparse(body[0].value) != "args":
        return False
    target_tuple = body[0].targets[0] if len(body[0].targets) == 1 else None
    if not (isinstance(target_tuple, ast.Tuple) and all(isinstance(e, ast.Name) for e in target_tuple.elts)
            and len(target_tuple.elts) == len(call_list.elts)):
        return False
    returned = body[-1]
    if not (isinstance(returned, ast.Return) and isinstance(returned.value, ast.Tuple)
            and 0 <= index < len(returned.value.elts)):
        return False
    middle = body[1:-1]
    if any(isinstance(n, (ast.Return, ast.FunctionDef, ast.Lambda, ast.Global, ast.Nonlocal)) for s in middle
           for n in ast.walk(s)) or "args" in _names(middle):
        return False
    forward_names = {a.arg for a in forward.args.args + forward.args.kwonlyargs} | _names([call_list])
    if forward_names & (_names(middle) | {e.id for e in target_tuple.elts}):
        return False
    bindings = [ast.Assign(targets=[ast.Name(name.id, ast.Store())], value=element)
                for name, element in zip(target_tuple.elts, call_list.elts)]
    forward.body = [*bindings, *middle, ast.Return(value=returned.value.elts[index])]
    module.body.remove(call_def)
    ast.fix_missing_locations(module)
    return True
