"""Which functions are held to the forward path's rules although forward may not visibly call them.

Following calls from ``forward`` misses every function that is reached another way: stored in a
dict or list and called through it, passed to ``map``/``sorted``, a lambda handed to Triton (grid,
heuristics), a nested def stored on ``self``. So the rule is inverted: every function, method and
lambda of the module is held to the forward rules (allocate, view, copy, launch), except

* kernels (their bodies have rules of their own),
* ``__init__``, and functions whose every use is a call from ``__init__``, from module level or
  from another such function (the way a module mirrors the reference's parameter init),
* ``backward`` of an autograd Function (never run by the verifier),
* unused copies of the problem's ``get_inputs``/``get_init_inputs``.

Functions nothing refers to are held too: a library may call a method by its protocol name
(``run``, ``forward``) without the module naming it.
"""
from __future__ import annotations

import ast
from typing import Optional

from .module_index import ModuleIndex
from .vocabulary import LOCAL_MARK

_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
_HARNESS_FUNCTIONS = frozenset({"get_inputs", "get_init_inputs"})
# Run only when gradients are computed (setup_context runs inside apply, so it is held).
_AUTOGRAD_ONLY_METHODS = frozenset({"backward", "jvp", "vjp"})


class HeldFunctions:
    def __init__(self, index: ModuleIndex, forward):
        self.index = index
        self.forward = forward  # ForwardPath: owns the facts of lambdas and nested defs
        self._definitions = self._collect_definitions()
        self._setup_only = self._find_setup_only()

    def keys(self) -> list[str]:
        keys: list[str] = []
        for node, key, owner in self._definitions:
            if node in self._setup_only or self._is_unused_harness_copy(node):
                continue
            keys.append(key if key else self._nested_key(node, owner))
        for node in self.index.nodes:
            if isinstance(node, ast.Lambda) and not self._inside_kernel(node) \
                    and not self._is_setup_use(node, self._setup_only):
                keys += self.forward.callable_keys(node, self.index.enclosing_class(node))
        return keys

    # -- what is defined --

    def _collect_definitions(self) -> list[tuple[ast.AST, Optional[str], Optional[str]]]:
        """(def node, facts key or None for nested defs, owning class) of every candidate root."""
        found: list[tuple[ast.AST, Optional[str], Optional[str]]] = []
        for name, node in self.index.functions.items():
            if isinstance(node, _FUNCTIONS) and name not in self.index.kernels:
                found.append((node, f"{LOCAL_MARK}{name}", None))
        for class_name, info in self.index.classes.items():
            autograd = self._is_autograd_function(info.node)
            for item in info.node.body:
                if not isinstance(item, _FUNCTIONS) or item.name == "__init__":
                    continue
                if autograd and item.name in _AUTOGRAD_ONLY_METHODS:
                    continue
                found.append((item, f"{LOCAL_MARK}{class_name}.{item.name}", class_name))
        for node in self.index.nodes:
            if isinstance(node, _FUNCTIONS) and isinstance(self._enclosing_function(node), _FUNCTIONS):
                found.append((node, None, None))
        return found

    def _is_unused_harness_copy(self, node: ast.AST) -> bool:
        """``get_inputs``/``get_init_inputs`` copied from the problem: the verifier takes them
        from the problem, never from the candidate, so an unused copy never runs."""
        return node in self.index.tree.body and node.name in _HARNESS_FUNCTIONS \
            and not self._references(node)

    def _is_autograd_function(self, node: ast.ClassDef) -> bool:
        return any(q == "torch.autograd.Function" for base in node.bases
                   for q in self.index.resolve(base))

    def _nested_key(self, node: ast.AST, owner: Optional[str]) -> str:
        key = f"{LOCAL_MARK}<def:{node.lineno}:{node.col_offset}>"
        self.forward.remember(key, node, owner)
        return key

    def _inside_kernel(self, node: ast.AST) -> bool:
        current = self.index.parents.get(node)
        while current is not None:
            if isinstance(current, _FUNCTIONS) and current.name in self.index.kernels \
                    and current in self.index.tree.body:
                return True
            current = self.index.parents.get(current)
        return False

    # -- who uses it --

    def _references(self, node: ast.AST) -> list[ast.AST]:
        name = node.name
        if isinstance(self.index.parents.get(node), ast.ClassDef):
            return [n for n in self.index.nodes if isinstance(n, ast.Attribute) and n.attr == name
                    and isinstance(n.ctx, ast.Load)]
        scope = self._enclosing_function(node) or self.index.tree
        return [n for n in ast.walk(scope) if isinstance(n, ast.Name) and n.id == name
                and isinstance(n.ctx, ast.Load)]

    def _find_setup_only(self) -> set[ast.AST]:
        setup: set[ast.AST] = set()
        changed = True
        while changed:
            changed = False
            for node, _, _ in self._definitions:
                if node in setup:
                    continue
                references = self._references(node)
                if references and all(self._is_setup_use(ref, setup) for ref in references):
                    setup.add(node)
                    changed = True
        return setup

    def _is_setup_use(self, ref: ast.AST, setup: set[ast.AST]) -> bool:
        parent = self.index.parents.get(ref)
        called = isinstance(parent, ast.Call) and parent.func is ref
        applied = isinstance(parent, ast.Call) and ref in parent.args \
            and isinstance(parent.func, ast.Attribute) and parent.func.attr == "apply"
        if not (called or applied):
            return False
        context = self._enclosing_function(ref)
        if context is None:
            return True  # module level
        if isinstance(context, ast.Lambda):
            return False
        return context.name == "__init__" or context in setup

    def _enclosing_function(self, node: ast.AST):
        current = self.index.parents.get(node)
        while current is not None:
            if isinstance(current, _FUNCTIONS + (ast.Lambda,)):
                return current
            current = self.index.parents.get(current)
        return None
