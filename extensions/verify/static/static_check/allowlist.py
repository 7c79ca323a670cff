"""The allow-list: what a kernel module may import, name and call (vocabulary in policy.py).

The other passes explain what a candidate does wrong; this one is the boundary. Whatever it does
not know is refused, so a way out of it needs a name on the list, not a trick the list forgot:

* names: every name read is bound in its own scope by the module, or an allowed builtin;
  ``getattr``, ``eval``, ``open``, ``type``, ... are refused in every position;
* private and dunder names: only ``__init__`` (``super().__init__()``), and ``_attr`` names the
  module defines itself; frame, code and class-graph attributes never;
* attribute chains into torch, triton and the standard library: only their public
  kernel-writing API (:func:`policy.api_name_allowed`);
* code that runs implicitly: decorators, context managers, base classes from short lists; no
  calls in default arguments or class bodies, no class keywords (metaclasses);
* grids: tuples, or lambdas/functions that return tuples.
"""
from __future__ import annotations

import ast
import re
from typing import Optional

from extensions.verify.static import policy, value_api

from .ast_helpers import source
from .findings import Findings
from .module_index import ModuleIndex
from .scopes import Scopes
from .vocabulary import LOCAL_MARK

# Attributes of a compiled kernel (JITFunction, Autotuner) that hold its code or launch path.
_KERNEL_OBJECT_ATTRIBUTES = frozenset({
    "fn", "src", "run", "warmup", "cache", "device_caches", "launch_metadata", "kernel", "params",
    "arg_names", "configs", "do_bench", "pre_hook", "post_hook", "hash", "binder",
})
# What a launch site may use of a kernel object besides kernel[grid](...).
_KERNEL_PUBLIC_ATTRIBUTES = frozenset({"run", "warmup", "best_config"})
# str.format fields that read attributes or items: "{0.__class__}", "{x[key]}".
_FORMAT_FIELD_ACCESS = re.compile(r"\{[^{}!:]*[.\[]")
_PROPERTY_DECORATOR_ATTRIBUTES = frozenset({"setter", "getter", "deleter"})
# nn.Module methods that bind an attribute named by a string.
_REGISTERING_METHODS = frozenset({"register_buffer", "register_parameter", "add_module", "register_module"})


class AllowList:
    def __init__(self, index: ModuleIndex, findings: Findings):
        self.index = index
        self.findings = findings
        self.scopes = Scopes(index.tree, index.parents)
        self.own_private_attributes = self._own_private_attributes()
        self.own_names = self._own_names()

    def run(self) -> None:
        for node in self.index.nodes:
            if isinstance(node, ast.Name):
                self._check_name(node)
                self._check_module_value(node)
            elif isinstance(node, ast.Attribute):
                self._check_attribute(node)
                self._check_module_value(node)
            elif isinstance(node, ast.ImportFrom):
                self._check_import_from(node)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self._check_function(node)
            elif isinstance(node, ast.Lambda):
                self._check_defaults(node.args, "lambda")
            elif isinstance(node, ast.ClassDef):
                self._check_class(node)
            elif isinstance(node, (ast.With, ast.AsyncWith)):
                self._check_with(node)
            elif isinstance(node, ast.Call):
                self._check_call(node)
            elif isinstance(node, getattr(ast, "Match", ())):
                self.findings.flag("forbidden_api", node,
                                   "match statement (class patterns read attributes by name)")
        for name, binder in self.scopes.bindings:
            parameter = isinstance(binder, ast.arg) and name in policy.BINDABLE_NEVER_BUILTINS
            if name in policy.NEVER_BUILTINS and not parameter:
                self.findings.flag("forbidden_builtin", binder,
                                   f"binding the name '{name}' is not allowed")
            elif name.startswith("__") and isinstance(binder, (ast.Import, ast.ImportFrom, ast.ExceptHandler)):
                self.findings.flag("private_access", binder, f"binding the name '{name}' is not allowed")

    # -- names --

    def _check_name(self, node: ast.Name) -> None:
        name = node.id
        if name.startswith("__"):
            self.findings.flag("private_access", node, f"name '{name}' is not allowed")
            return
        if not isinstance(node.ctx, ast.Load) or self.scopes.is_bound(name, node):
            return
        if name in policy.NEVER_BUILTINS:
            self.findings.flag("forbidden_builtin", node, f"builtin '{name}' is not allowed")
        elif name not in policy.ALLOWED_BUILTINS:
            self.findings.flag("forbidden_builtin", node,
                               f"name '{name}' is neither defined in the module nor an allowed builtin")

    def _check_module_value(self, node: ast.expr) -> None:
        """A module is only ever the start of an attribute chain (``tl.load``) or aliased to a plain
        name (``F = torch.nn.functional``). Held in a tuple, passed to a function, bound by a loop
        or a default argument, it leaves name resolution behind, and every public attribute of a
        module (``torch.cuda.os``, ``tl.core.builtins``) becomes reachable."""
        if not isinstance(node.ctx, ast.Load):
            return
        parent = self.index.parents.get(node)
        if isinstance(parent, ast.Attribute) and parent.value is node:
            return
        # A class attribute is read back as ``Cls.ns``/``self.ns``, which resolves to the module's
        # own names, not to the module it holds: only module and function scopes may alias one.
        in_class_body = isinstance(self.index.parents.get(parent), ast.ClassDef)
        if isinstance(parent, (ast.Assign, ast.AnnAssign)) and parent.value is node and not in_class_body \
                and all(isinstance(t, ast.Name) for t in (parent.targets if isinstance(parent, ast.Assign)
                                                          else [parent.target])):
            return
        modules = sorted(q for q in self.index.resolve(node)
                         if not q.startswith(LOCAL_MARK) and policy.names_module(q))
        if modules:
            self.findings.flag("forbidden_api", node,
                               f"module {modules[0]} used as a value (only its attributes may be named)")

    # -- attributes --

    def _check_attribute(self, node: ast.Attribute) -> None:
        attr = node.attr
        if attr.startswith("__"):
            if not (attr in policy.ALLOWED_DUNDERS and self._is_constructor_call(node)):
                owner = "a builtin" if self._is_builtin_name(node.value) else _short(node.value)
                self.findings.flag("private_access", node,
                                   f"attribute '{attr}' of {owner} is not allowed")
        elif attr.startswith("_") and not (self.index.resolve(node) & policy.ALLOWED_PRIVATE_API):
            base_is_library = any(not q.startswith(LOCAL_MARK) for q in self.index.resolve(node.value))
            if base_is_library or attr not in self.own_private_attributes:
                self.findings.flag("private_access", node,
                                   f"private attribute '{attr}' of {_short(node.value)} is not allowed")
        if attr in policy.FRAME_AND_CLASS_ATTRIBUTES:
            self.findings.flag("private_access", node, f"attribute '{attr}' is not allowed")
        if isinstance(node.ctx, (ast.Store, ast.Del)):
            self._check_attribute_store(node)
        elif attr not in _KERNEL_PUBLIC_ATTRIBUTES and self._is_kernel(node.value, node):
            self.findings.flag("forbidden_api", node,
                               f"attribute '{attr}' of kernel {_short(node.value)} (only launches)")
        self._check_value_attribute(node)
        parent = self.index.parents.get(node)
        if isinstance(parent, ast.Attribute) and parent.value is node:
            return  # the longest chain is judged
        for q in sorted(self.index.resolve(node)):
            if q.startswith(LOCAL_MARK) or policy.api_name_allowed(q):
                continue
            if isinstance(node.ctx, ast.Store) and q in policy.ASSIGNABLE_TORCH_SETTINGS:
                continue
            self.findings.flag("forbidden_api", node, f"{q} is not part of the allowed API")

    def _check_value_attribute(self, node: ast.Attribute) -> None:
        """An attribute of a value whose kind name resolution cannot tell (a call's result, a
        parameter, a subscript, a local): only what the kinds a kernel module handles expose, or a
        name the module defines (``value_api``)."""
        if node.attr.startswith("_") or self.index.resolve(node.value):
            return
        if self._is_own_instance(node.value) and (node.attr not in value_api.FOREIGN_KIND_ATTRIBUTES
                                                  or node.attr in self.own_names):
            return  # self.weight, self.cache: the module's own attribute or nn.Module's
        if not value_api.value_attribute_allowed(node.attr, policy.TENSOR_METHOD_NAMES, self.own_names):
            self.findings.flag("forbidden_api", node,
                               f"attribute '{node.attr}' of {_short(node.value)} (not the API of a tensor, "
                               "a module, a container or a Triton value)")

    def _is_own_instance(self, node: ast.expr) -> bool:
        """``self``/``cls``: the first parameter of a method of one of the module's classes."""
        if not isinstance(node, ast.Name):
            return False
        scope = self.scopes.scope_of(node)
        if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                or not isinstance(self.index.parents.get(scope), ast.ClassDef):
            return False
        params = scope.args.posonlyargs + scope.args.args
        is_static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in scope.decorator_list)
        return bool(params) and not is_static and params[0].arg == node.id

    def _is_autograd_context(self, node: ast.expr) -> bool:
        """``ctx``: the first parameter of a static method of a torch.autograd.Function subclass."""
        if not isinstance(node, ast.Name):
            return False
        scope = self.scopes.scope_of(node)
        owner = self.index.parents.get(scope)
        if not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)) or not isinstance(owner, ast.ClassDef):
            return False
        params = scope.args.posonlyargs + scope.args.args
        return bool(params) and params[0].arg == node.id and any(
            q == "torch.autograd.Function" for base in owner.bases for q in self.index.resolve(base))

    def _own_names(self) -> frozenset[str]:
        """Attribute names the module defines: stored on any object, bound in a class body (fields,
        class attributes), methods of its classes."""
        own: set[str] = set()
        for node in self.index.nodes:
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                own.add(node.attr)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in _REGISTERING_METHODS and node.args \
                    and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                own.add(node.args[0].value)  # self.register_buffer("scale", ...)
            elif isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        own.add(item.name)
                    elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        own.add(item.target.id)
                    elif isinstance(item, ast.Assign):
                        own.update(t.id for t in item.targets if isinstance(t, ast.Name))
        return frozenset(own)

    def _check_attribute_store(self, node: ast.Attribute) -> None:
        """Objects the module owns may get attributes; its module-level definitions (kernels,
        functions, classes) and a kernel's code or launch path may not."""
        resolved = self.index.resolve(node.value)
        defined = [q for q in resolved if q.startswith(LOCAL_MARK)]
        imported = [q for q in resolved if not q.startswith(LOCAL_MARK)]
        module_level = self._statement_of(node) in self.index.tree.body
        if imported and not (module_level and self.index.resolve(node) <= policy.ASSIGNABLE_TORCH_SETTINGS):
            self.findings.flag("forbidden_api", node, f"assigning {node.attr} of {imported[0]}")
        if defined:
            self.findings.flag("forbidden_api", node,
                               f"assigning {node.attr} of module-level {_short(node.value)}")
        elif node.attr in _KERNEL_OBJECT_ATTRIBUTES and not isinstance(node.value, ast.Name):
            self.findings.flag("forbidden_api", node, f"assigning '{node.attr}' of {_short(node.value)}")
        # An instance attribute hides the method of its class: the harness's model.parameters() or
        # output.detach() would call the candidate's function, after forward and outside the audit.
        module_method = node.attr in policy.NN_MODULE_RESERVED_METHODS
        tensor_method = policy.shadows_tensor_method(node.attr) and not self._is_own_instance(node.value) \
            and not self._is_autograd_context(node.value)
        if module_method or tensor_method:
            kind = " and ".join(k for k, hit in (("nn.Module", module_method), ("tensor", tensor_method)) if hit)
            self.findings.flag("forbidden_api", node,
                               f"assigning {_short(node.value)}.{node.attr} would hide the {kind} method "
                               f"{node.attr}() that the harness calls after forward")

    def _statement_of(self, node: ast.AST) -> ast.AST:
        current = node
        while not isinstance(current, ast.stmt) and current in self.index.parents:
            current = self.index.parents[current]
        return current

    def _is_constructor_call(self, node: ast.Attribute) -> bool:
        """``super().__init__``, ``super(C, self).__init__``, ``Base.__init__`` (module class or
        torch.nn class), used as a call."""
        parent = self.index.parents.get(node)
        if not (isinstance(parent, ast.Call) and parent.func is node):
            return False
        base = node.value
        if isinstance(base, ast.Call) and isinstance(base.func, ast.Name) and base.func.id == "super" \
                and not self.scopes.is_bound("super", base.func):
            return True
        for q in self.index.resolve(base):
            if q.startswith(LOCAL_MARK) and q[len(LOCAL_MARK):] in self.index.classes:
                return True
            if _is_base_class_name(q):
                return True
        return False

    def _is_builtin_name(self, node: ast.AST) -> bool:
        return isinstance(node, ast.Name) and not self.scopes.is_bound(node.id, node)

    def _own_private_attributes(self) -> set[str]:
        """``_name`` attributes the module defines: assigned on an object, or methods it defines."""
        own: set[str] = set()
        for node in self.index.nodes:
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) \
                    and node.attr.startswith("_") and not node.attr.startswith("__") \
                    and not self.index.resolve(node.value):
                own.add(node.attr)
            elif isinstance(node, ast.ClassDef):
                own |= {item.name for item in node.body
                        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
                        and item.name.startswith("_") and not item.name.startswith("__")}
        return own - policy.NN_MODULE_RESERVED_METHODS - policy.NN_MODULE_STATE

    def _check_import_from(self, node: ast.ImportFrom) -> None:
        if not node.module or node.level or not policy.import_allowed(node.module):
            return  # the import rules report it
        for alias in node.names:
            if alias.name == "*":
                continue
            q = f"{node.module}.{alias.name}"
            if alias.name.startswith("_"):
                self.findings.flag("private_access", node, f"import of private name {q}")
            elif not policy.api_name_allowed(q) and not policy.import_allowed(q):
                self.findings.flag("forbidden_api", node, f"{q} is not part of the allowed API")

    # -- code that runs without being called by name --

    def _check_function(self, node) -> None:
        if node.name.startswith("__") and node.name not in policy.ALLOWED_DUNDERS:
            self.findings.flag("private_access", node, f"defining '{node.name}' is not allowed")
        elif node.name == "__init__" and not isinstance(self.index.parents.get(node), ast.ClassDef):
            self.findings.flag("private_access", node, "'__init__' outside a class")
        if isinstance(self.index.parents.get(node), ast.ClassDef) \
                and node.name in policy.NN_MODULE_RESERVED_METHODS:
            self.findings.flag("forbidden_api", node,
                               f"redefining nn.Module.{node.name} (the harness calls it)")
        for decorator in node.decorator_list:
            self._check_decorator(decorator)
        self._check_defaults(node.args, node.name)

    def _check_decorator(self, decorator: ast.expr) -> None:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if isinstance(target, ast.Name) and not self.scopes.is_bound(target.id, target):
            if target.id in policy.ALLOWED_DECORATORS:
                return
        elif any(q in policy.ALLOWED_DECORATORS for q in self.index.resolve(target)):
            return
        elif isinstance(target, ast.Attribute) and target.attr in _PROPERTY_DECORATOR_ATTRIBUTES \
                and isinstance(target.value, ast.Name):
            return  # @weight.setter of a property defined in the class
        self.findings.flag("hidden_code", decorator,
                           f"decorator {_short(target)} is not on the allow-list (it runs code)")

    def _check_defaults(self, args: ast.arguments, owner: str) -> None:
        for default in list(args.defaults) + [d for d in args.kw_defaults if d is not None]:
            if any(isinstance(n, (ast.Call, ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp,
                                  ast.GeneratorExp, ast.NamedExpr))
                   for n in ast.walk(default)):
                self.findings.flag("hidden_code", default,
                                   f"default argument of {owner} runs code ({_short(default)})")

    def _check_class(self, node: ast.ClassDef) -> None:
        if node.name.startswith("__"):
            self.findings.flag("private_access", node, f"class name '{node.name}' is not allowed")
        for keyword in node.keywords:
            self.findings.flag("hidden_code", node,
                               f"class keyword '{keyword.arg or '**'}' (metaclasses run code)")
        for base in node.bases:
            if any(policy.tensor_type(q) for q in self.index.resolve(base) if not q.startswith(LOCAL_MARK)):
                self.findings.flag("forbidden_api", base,
                                   f"base class {_short(base)} is a tensor type (its methods would run "
                                   "when the verifier reads outputs and parameters, outside the audit)")
            elif not self._base_allowed(base):
                self.findings.flag("forbidden_api", base, f"base class {_short(base)} is not allowed")
        for decorator in node.decorator_list:
            self._check_decorator(decorator)
        for statement in node.body:
            if not _class_body_statement_allowed(statement):
                self.findings.flag("hidden_code", statement,
                                   f"class body of {node.name} runs code ({_short(statement)})")
            for name in _class_body_bindings(statement):
                if name in policy.NN_MODULE_RESERVED_METHODS:
                    self.findings.flag("forbidden_api", statement,
                                       f"redefining nn.Module.{name} (the harness calls it)")

    def _base_allowed(self, base: ast.expr) -> bool:
        if isinstance(base, ast.Name) and not self.scopes.is_bound(base.id, base):
            return base.id == "object"
        resolved = self.index.resolve(base)
        return bool(resolved) and all(
            (q.startswith(LOCAL_MARK) and q[len(LOCAL_MARK):] in self.index.classes)
            or _is_base_class_name(q) for q in resolved)

    def _check_with(self, node) -> None:
        for item in node.items:
            manager = item.context_expr
            target = manager.func if isinstance(manager, ast.Call) else None
            if target is None or not (self.index.resolve(target) & policy.ALLOWED_CONTEXT_MANAGERS):
                self.findings.flag("forbidden_api", manager,
                                   f"with {_short(manager)}: context manager not on the allow-list")

    # -- calls --

    def _check_call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Subscript):
            if self._is_kernel(func.value, node):
                self._check_grid(func.slice, node)
        elif isinstance(func, ast.Name) and func.id == "hasattr" \
                and not self.scopes.is_bound("hasattr", func):
            name = node.args[1] if len(node.args) >= 2 else None
            if not (isinstance(name, ast.Constant) and isinstance(name.value, str)
                    and not name.value.startswith("_")):
                self.findings.flag("forbidden_builtin", node,
                                   "hasattr with a computed or private name")
        elif isinstance(func, ast.Attribute) and func.attr in ("format", "format_map"):
            # A pattern built at run time ("{0._" + "_globals_" + "_}") reads whatever it names,
            # so only a literal pattern without attribute or item fields may be formatted.
            text = func.value.value if isinstance(func.value, ast.Constant) else None
            if func.attr == "format_map" or not isinstance(text, str) or _FORMAT_FIELD_ACCESS.search(text):
                self.findings.flag("private_access", node,
                                   "str.format reading attributes or items of its arguments")

    def _is_kernel(self, node: ast.expr, launch: ast.AST) -> bool:
        """``kernel`` or ``self.kernel`` naming one of the module's kernels."""
        names = set(self.index.resolve(node))
        owner = self.index.enclosing_class(launch)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and owner:
            for value in self.index.self_attr_values(owner, node.attr):
                names |= self.index.resolve(value)
        return any(q.startswith(LOCAL_MARK) and q[len(LOCAL_MARK):] in self.index.kernels for q in names)

    def _check_grid(self, grid: ast.expr, launch: ast.Call) -> None:
        problem = self._grid_problem(grid, launch, depth=0)
        if problem:
            self.findings.flag("unsafe_grid", launch, f"grid {_short(grid)}: {problem}")

    def _grid_problem(self, grid: ast.expr, launch: ast.AST, depth: int) -> Optional[str]:
        """None for a tuple, or a lambda/function returning tuples; otherwise why not."""
        if isinstance(grid, (ast.Tuple, ast.List)):
            return None
        if isinstance(grid, ast.IfExp):
            return self._grid_problem(grid.body, launch, depth + 1) \
                or self._grid_problem(grid.orelse, launch, depth + 1)
        if isinstance(grid, ast.Call) and isinstance(grid.func, ast.Name) \
                and grid.func.id in ("tuple", "list") and not self.scopes.is_bound(grid.func.id, grid.func):
            return None  # tuple(sizes): what it iterates is judged where it was built
        if isinstance(grid, ast.Lambda):
            return None if _returns_tuples([grid.body]) else "a lambda that does not return a tuple"
        if isinstance(grid, ast.Attribute) or depth > 3:
            return None  # self.grid: a value the module built, judged where it was built
        if isinstance(grid, ast.Name):
            values = self._values_bound_to(grid, launch)
            if values is None:
                return None  # a parameter: the caller's grid is judged at its launch
            for value in values:
                if isinstance(value, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    if not _returns_tuples([r.value for r in ast.walk(value)
                                            if isinstance(r, ast.Return)]):
                        return f"function {value.name} does not return tuples"
                else:
                    problem = self._grid_problem(value, launch, depth + 1)
                    if problem:
                        return problem
            return None if values else "a name the module does not bind"
        if isinstance(grid, ast.Call):
            for node in self._grid_functions(grid.func, launch):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                    returns = [node.body] if isinstance(node, ast.Lambda) else \
                        [r.value for r in ast.walk(node) if isinstance(r, ast.Return)]
                    if _returns_tuples(returns):
                        return None
            return "an object built by a call (grids are tuples or functions returning tuples)"
        return "not a tuple or a function returning one"

    def _grid_functions(self, func: ast.expr, launch: ast.AST) -> list[ast.AST]:
        """Definitions a grid-building call may run: module functions, or ``self.method``."""
        found = [self.index.function_node(q) for q in self.index.resolve(func) if q.startswith(LOCAL_MARK)]
        owner = self.index.enclosing_class(launch)
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and owner:
            key = self.index.find_method(owner, func.attr)
            found.append(self.index.function_node(key) if key else None)
        return [node for node in found if node is not None]

    def _values_bound_to(self, name: ast.Name, launch: ast.AST) -> Optional[list[ast.AST]]:
        """What ``name`` is assigned or defined as in the launch's scope (or the module's);
        None when it is a parameter there."""
        scope = self.scopes.scope_of(launch)
        if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            arguments = scope.args
            if name.id in {a.arg for a in arguments.posonlyargs + arguments.args + arguments.kwonlyargs}:
                return None
        values: list[ast.AST] = []
        for candidate_scope in (scope, self.index.tree):
            for node in ast.walk(candidate_scope):
                if isinstance(node, ast.Assign) and any(
                        isinstance(t, ast.Name) and t.id == name.id for t in node.targets):
                    values.append(node.value)
                elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name.id:
                    values.append(node)
            if values:
                break
        return values


def _is_base_class_name(q: str) -> bool:
    """``object``, ``typing.NamedTuple``, ``torch.autograd.Function`` or an nn.Module class of
    ``torch.nn`` (never ``nn.Parameter``, ``nn.Buffer`` or another non-module class)."""
    return q in policy.ALLOWED_BASE_CLASSES or policy.nn_module_class(q)


def _class_body_bindings(statement: ast.stmt) -> list[str]:
    """Names a class-body statement binds as class attributes (``parameters = helper``)."""
    if isinstance(statement, ast.Assign):
        targets = statement.targets
    elif isinstance(statement, (ast.AnnAssign, ast.AugAssign)):
        targets = [statement.target]
    else:
        return []
    return [n.id for target in targets for n in ast.walk(target)
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]


def _returns_tuples(values: list[Optional[ast.expr]]) -> bool:
    if not values:
        return False
    for value in values:
        if isinstance(value, ast.IfExp):
            if not _returns_tuples([value.body, value.orelse]):
                return False
        elif not isinstance(value, (ast.Tuple, ast.List)):
            return False
    return True


def _class_body_statement_allowed(statement: ast.stmt) -> bool:
    """Definitions, docstrings and plain bindings; nothing that calls."""
    if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Pass)):
        return True
    if isinstance(statement, ast.Expr):
        return isinstance(statement.value, ast.Constant)
    if isinstance(statement, (ast.Assign, ast.AnnAssign)):
        value = statement.value
        return value is None or not any(isinstance(n, ast.Call) for n in ast.walk(value))
    return False


def _short(node: ast.AST) -> str:
    text = source(node).splitlines()[0] if source(node) else type(node).__name__
    return text if len(text) <= 40 else text[:37] + "..."
