"""The tensors a candidate's model holds, read without calling any method of the model or of them.

``model.parameters()``, ``buffers()`` and ``modules()`` are methods of the candidate's class, and
nn.Module's own versions call further methods (``named_parameters``, ``_named_members``) on every
submodule; a tensor's ``detach``/``numel`` are methods of its class or of the tensor object. Any of
them could be the candidate's code, and the verifier reads a model after construction and after
forward, outside every audited region. So the walk reads nn.Module's own tables
(``_parameters``, ``_buffers``, ``_modules``) straight from each module's instance dictionary,
accepts only plain dicts and torch's own tensor types there, and hands out aliases made by
``plain_tensor`` (same storage, nothing of the candidate's left to call).
"""
from __future__ import annotations

from typing import Any

from extensions.timing.tensors import ForeignTensorType, plain_tensor

# nn.Module's tables the walk reads, in the order nn.Module lists them.
_TABLES = ("_parameters", "_buffers")


def _instance_dict(module: Any) -> dict:
    return object.__getattribute__(module, "__dict__")


def _table(state: dict, name: str, owner: str) -> dict:
    table = dict.get(state, name)
    if type(table) is not dict:
        raise ForeignTensorType(f"{owner}.{name} is a {type(table).__name__}, not nn.Module's own table")
    return table


def _uninitialized(value: Any) -> bool:
    """A lazy module's placeholder (torch's own type; it holds no data yet)."""
    import torch

    return type(value) in (torch.nn.parameter.UninitializedParameter, torch.nn.parameter.UninitializedBuffer)


def named_module_tensors(model: Any, attributes: bool = False) -> list[tuple[list[str], Any]]:
    """Like ``module_tensors``, each tensor with every name it is held under: the dotted module
    path and the table or attribute key (``norm1.weight``), as ``named_parameters`` spells a
    parameter. A module reachable by several paths is walked once, under the first."""
    import torch

    found: list[tuple[list[str], Any]] = []
    by_id: dict[int, list[str]] = {}
    seen_modules: set[int] = set()
    pending: list[tuple[str, Any]] = [("", model)]
    while pending:
        prefix, module = pending.pop()
        if id(module) in seen_modules:
            continue
        seen_modules.add(id(module))
        owner = type(module).__name__
        state = _instance_dict(module)
        items = [(k, v) for name in _TABLES for k, v in dict.items(_table(state, name, owner))]
        if attributes:
            items += [(k, v) for k, v in dict.items(state) if isinstance(v, torch.Tensor)]
        for key, value in items:
            if value is None or _uninitialized(value):
                continue
            name = f"{prefix}{key}"
            if id(value) in by_id:
                by_id[id(value)].append(name)
                continue
            names = [name]
            by_id[id(value)] = names
            found.append((names, plain_tensor(value, f"{owner} holds a tensor")))
        children = [(k, m) for k, m in dict.items(_table(state, "_modules", owner)) if m is not None]
        for _key, child in children:
            if not isinstance(child, torch.nn.Module):
                raise ForeignTensorType(f"{owner} lists a submodule of type {type(child).__name__}")
        pending.extend((f"{prefix}{k}.", m) for k, m in reversed(children))
    return found


def module_tensors(model: Any, attributes: bool = False) -> list[Any]:
    """Plain aliases of the parameters and buffers of ``model`` and all its submodules (pre-order,
    as ``model.modules()`` visits them), each tensor object once; with ``attributes`` also the
    tensors held as plain attributes of the modules (``self.w = torch.ones(4)``). A module table
    that is not a dict, or a tensor of a type other than torch's own, raises ``ForeignTensorType``;
    a lazy module's uninitialised placeholders are left out."""
    return [tensor for _names, tensor in named_module_tensors(model, attributes)]
