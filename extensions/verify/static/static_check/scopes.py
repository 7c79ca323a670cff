"""Python's scoping, as far as the allow-list needs it: is a name bound where it is read?

A name that no enclosing scope binds is a builtin, and builtins are judged by the allow-list. A
binding anywhere else in the module does not count (``def f(getattr): ...`` does not make the
``getattr`` in another function the candidate's own).
"""
from __future__ import annotations

import ast
from typing import Optional

SCOPE_NODES = (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef,
               ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
_FUNCTION_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


class Scopes:
    def __init__(self, tree: ast.Module, parents: dict[ast.AST, ast.AST]):
        self.tree = tree
        self.parents = parents
        self.bound: dict[ast.AST, set[str]] = {tree: set()}
        self.bindings: list[tuple[str, ast.AST]] = []  # (name, node that binds it)
        self._collect(tree)

    def scope_of(self, node: ast.AST) -> ast.AST:
        """The scope a name at ``node`` is looked up in first (decorators, defaults and bases
        belong to the enclosing scope; a comprehension's first iterable too)."""
        grandchild, child = None, node
        current = self.parents.get(node)
        while current is not None:
            if isinstance(current, SCOPE_NODES) and not self._evaluated_outside(current, child, grandchild):
                return current
            grandchild, child, current = child, current, self.parents.get(current)
        return self.tree

    def is_bound(self, name: str, node: ast.AST) -> bool:
        """Whether ``name`` read at ``node`` refers to something the module binds."""
        scope = self.scope_of(node)
        first = True
        while scope is not None:
            # A class body's names are visible in the class body only, not in its methods.
            if (first or not isinstance(scope, ast.ClassDef)) and name in self.bound.get(scope, ()):
                return True
            first = False
            scope = self._enclosing_scope(scope)
        return False

    def _enclosing_scope(self, scope: ast.AST) -> Optional[ast.AST]:
        if scope is self.tree:
            return None
        return self.scope_of(scope)

    @staticmethod
    def _evaluated_outside(scope: ast.AST, child: ast.AST, grandchild: Optional[ast.AST]) -> bool:
        if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return child in scope.decorator_list or child is scope.args or child is scope.returns
        if isinstance(scope, ast.Lambda):
            return child is scope.args
        if isinstance(scope, ast.ClassDef):
            return child in scope.decorator_list or child in scope.bases \
                or any(child is k for k in scope.keywords)
        if isinstance(scope, _COMPREHENSIONS):
            return bool(scope.generators) and child is scope.generators[0] \
                and grandchild is scope.generators[0].iter
        return False

    def _collect(self, tree: ast.Module) -> None:
        global_names: dict[ast.AST, set[str]] = {}
        for node in ast.walk(tree):
            if isinstance(node, SCOPE_NODES) and node is not tree:
                self.bound.setdefault(node, set())
            if isinstance(node, ast.Global):
                global_names.setdefault(self.scope_of(node), set()).update(node.names)
        for node in ast.walk(tree):
            for name, scope in self._binds(node):
                if name in global_names.get(scope, ()):
                    scope = tree
                self.bound.setdefault(scope, set()).add(name)
                self.bindings.append((name, node))

    def _binds(self, node: ast.AST):
        """(name, scope) pairs that ``node`` binds."""
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            scope = self.scope_of(node)
            if isinstance(scope, _COMPREHENSIONS) and isinstance(self.parents.get(node), ast.NamedExpr):
                while isinstance(scope, _COMPREHENSIONS):  # walrus binds outside the comprehension
                    scope = self._enclosing_scope(scope)
            yield node.id, scope
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield node.name, self.scope_of(node)
        elif isinstance(node, ast.arg):
            yield node.arg, self.parents.get(self.parents.get(node))  # arg -> arguments -> def
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name != "*":
                    yield (alias.asname or alias.name).split(".")[0], self.scope_of(node)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            yield node.name, self.scope_of(node)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            for name in node.names:
                yield name, self.scope_of(node)
        elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
            yield node.name, self.scope_of(node)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            yield node.rest, self.scope_of(node)
