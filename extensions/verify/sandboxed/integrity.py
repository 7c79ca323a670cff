"""A snapshot of the worker's own code, checked before each verdict file is written.

The candidate runs in the worker's process. Code that got past the static check could rebind the
worker's functions, swap a function's ``__code__`` or patch the writer of the verdict (``json``)
to forge a result. The snapshot records, for every function and method the listed modules define,
the object bound to its name and its code object, and the object bound to every module-level
constant, allow-list, pattern and class (rebinding ``policy.ALLOWED_ATEN_OPS`` blinds the audit
without changing any code); ``changes()`` names whatever differs. Any change
is treated as cheating (``audit_tampered``). This cannot stop a forger who also rewrites the check
itself, which is why the static allow-list keeps arbitrary Python out in the first place and the
parent compares every output itself.
"""
from __future__ import annotations

import re
import types
from typing import Iterable

# Module-level values whose rebinding changes what the verifier decides without touching code: the
# policy's allow-lists (frozensets), limits (numbers), patterns, C functions (json's encoder) and
# classes. Mutable containers and objects are left out: the worker's own state may change them.
_PINNED_VALUE_TYPES = (str, bytes, int, float, bool, type(None), frozenset, tuple, re.Pattern,
                       types.BuiltinFunctionType, type)


def _functions_of(owner, module_name: str) -> Iterable[tuple[str, object]]:
    for name, value in list(vars(owner).items()):
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        if isinstance(value, types.FunctionType) and value.__module__ == module_name:
            yield name, value
        elif isinstance(value, type) and value.__module__ == module_name and owner is not value:
            for attr, method in _functions_of(value, module_name):
                yield f"{name}.{attr}", method


class CodeSnapshot:
    def __init__(self, modules: Iterable[types.ModuleType]):
        self._entries: list[tuple[str, object, str, object, object]] = []
        self._values: list[tuple[str, object, str, object]] = []
        for module in modules:
            for qualified, function in _functions_of(module, module.__name__):
                owner = module
                attr = qualified
                if "." in qualified:
                    class_name, attr = qualified.split(".", 1)
                    owner = vars(module)[class_name]
                self._entries.append((f"{module.__name__}.{qualified}", owner, attr, function,
                                      function.__code__))
            for name, value in list(vars(module).items()):
                if not name.startswith("__") and isinstance(value, _PINNED_VALUE_TYPES):
                    self._values.append((f"{module.__name__}.{name}", module, name, value))

    def __len__(self) -> int:
        return len(self._entries)

    def changes(self) -> list[str]:
        changed = []
        for name, owner, attr, function, code in self._entries:
            bound = vars(owner).get(attr)
            if isinstance(bound, (staticmethod, classmethod)):
                bound = bound.__func__
            if bound is not function or function.__code__ is not code:
                changed.append(name)
        for name, module, attr, value in self._values:
            if vars(module).get(attr) is not value:
                changed.append(name)
        return changed
