"""Index of a candidate module and name resolution (imports, aliases, self attributes)."""
from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Optional

from .ast_helpers import first_param, is_self, is_self_attr, is_builtin_call, pair_targets
from .vocabulary import LOCAL_MARK, TRITON_JIT

@dataclass
class ClassInfo:
    node: ast.ClassDef
    methods: dict[str, ast.AST]  # FunctionDef / Lambda / other expression bound in the class body
    bases: list[str]  # names of module-defined base classes
    self_attrs: dict[str, list[ast.expr]] = field(default_factory=dict)
    tensor_attrs: set[str] = field(default_factory=set)  # parameters and buffers


class ModuleIndex:
    """Everything the passes look up: one walk of the tree, imports, aliases, module functions and
    classes, kernels, and the resolution of a name or attribute chain to qualified names."""

    def __init__(self, tree: ast.Module):
        self.tree = tree
        self.nodes: list[ast.AST] = list(ast.walk(tree))
        self.parents: dict[ast.AST, ast.AST] = {}
        for node in self.nodes:
            for child in ast.iter_child_nodes(node):
                self.parents[child] = node
        self.imports: dict[str, set[str]] = {}
        self.functions: dict[str, ast.AST] = {}  # module-level defs and name = lambda
        self.classes: dict[str, ClassInfo] = {}
        self.aliases: dict[str, set[str]] = {}
        self.bound_names: set[str] = set()
        self.kernels: list[str] = []
        self._index_module()

    # -- indexing --

    def _index_module(self) -> None:
        for node in self.nodes:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        self.imports.setdefault(alias.asname, set()).add(alias.name)
                    else:
                        root = alias.name.split(".")[0]
                        self.imports.setdefault(root, set()).add(root)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    if alias.name != "*":
                        name = alias.asname or alias.name
                        self.imports.setdefault(name, set()).add(f"{node.module}.{alias.name}")
            elif isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
                self.bound_names.add(node.id)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.bound_names.add(node.name)
            elif isinstance(node, ast.arg):
                self.bound_names.add(node.arg)
        for node in self.tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.functions[node.name] = node
            elif isinstance(node, ast.ClassDef):
                self.classes[node.name] = self._class_info(node)
            elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Lambda):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        self.functions[target.id] = node.value
        self._index_aliases()
        for info in self.classes.values():
            info.bases = [b for b in (self.local_name(base) for base in info.node.bases) if b]
        self._collect_self_attributes()
        self._find_kernels()

    def _class_info(self, node: ast.ClassDef) -> ClassInfo:
        methods: dict[str, ast.AST] = {}
        for item in node.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                methods[item.name] = item
            elif isinstance(item, ast.Assign):
                for target in item.targets:
                    if isinstance(target, ast.Name):
                        methods[target.id] = item.value
        return ClassInfo(node, methods, [])

    def _index_aliases(self) -> None:
        assignments: list[tuple[ast.expr, ast.expr]] = []
        for node in self.nodes:
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    assignments.extend(pair_targets(target, node.value))
            elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
                assignments.extend(pair_targets(node.target, node.value))
        for _ in range(6):  # chains like a = torch; b = a.nn; c = b.functional
            changed = False
            for target, value in assignments:
                if not isinstance(target, ast.Name) or isinstance(value, ast.Lambda):
                    continue
                resolved = self.resolve(value)
                known = self.aliases.setdefault(target.id, set())
                if not resolved <= known:
                    known |= resolved
                    changed = True
            if not changed:
                break

    def _collect_self_attributes(self) -> None:
        for node in self.nodes:
            if not isinstance(node, (ast.Assign, ast.AnnAssign, ast.Call)):
                continue
            method, info = self.enclosing_method(node)
            if info is None:
                continue
            self_name = first_param(method)
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                if node.value is None:
                    continue
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    for sub_target, value in pair_targets(target, node.value):
                        if is_self_attr(sub_target, self_name):
                            info.self_attrs.setdefault(sub_target.attr, []).append(value)
                            if self._is_parameter_value(value):
                                info.tensor_attrs.add(sub_target.attr)
            elif isinstance(node.func, ast.Attribute) and is_self(node.func.value, self_name) \
                    and len(node.args) >= 2 and isinstance(node.args[0], ast.Constant) \
                    and isinstance(node.args[0].value, str):
                name = node.args[0].value
                if node.func.attr in ("add_module", "register_module"):
                    info.self_attrs.setdefault(name, []).append(node.args[1])
                elif node.func.attr in ("register_buffer", "register_parameter"):
                    info.tensor_attrs.add(name)

    def enclosing_method(self, node: ast.AST):
        """(method, class info) of the innermost method of a module class around ``node``."""
        current = self.parents.get(node)
        method = None
        while current is not None:
            if isinstance(current, (ast.FunctionDef, ast.AsyncFunctionDef)):
                method = current
            elif isinstance(current, ast.ClassDef):
                info = self.classes.get(current.name)
                if method is not None and info is not None and info.node is current:
                    return method, info
                return None, None
            current = self.parents.get(current)
        return None, None

    def _is_parameter_value(self, value: ast.expr) -> bool:
        return isinstance(value, ast.Call) and any(
            q.endswith(("nn.Parameter", "nn.parameter.Parameter")) for q in self.resolve(value.func)
        )

    def _find_kernels(self) -> None:
        for node in self.tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if any(self._is_jit(dec) for dec in node.decorator_list):
                    self.kernels.append(node.name)
            elif isinstance(node, ast.Assign) and self._contains_jit_call(node.value):
                self.kernels.extend(t.id for t in node.targets if isinstance(t, ast.Name))

    def _is_jit(self, decorator: ast.expr) -> bool:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        return bool(self.resolve(target) & TRITON_JIT)

    def _contains_jit_call(self, value: ast.expr) -> bool:
        return any(
            isinstance(n, ast.Call) and self.resolve(n.func) & TRITON_JIT for n in ast.walk(value)
        )

    # -- name resolution --

    def resolve(self, node: ast.AST) -> set[str]:
        """Qualified names ``node`` may stand for: "torch.matmul", "$.my_kernel", ..."""
        if isinstance(node, ast.Name):
            names: set[str] = set()
            if node.id in self.functions or node.id in self.classes:
                names.add(LOCAL_MARK + node.id)
            names |= self.imports.get(node.id, set())
            names |= self.aliases.get(node.id, set())
            return names
        if isinstance(node, ast.Attribute):
            return {f"{q}.{node.attr}" for q in self.resolve(node.value)}
        if isinstance(node, ast.Call) and is_builtin_call(node, "getattr", self.bound_names) \
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) \
                and isinstance(node.args[1].value, str):
            return {f"{q}.{node.args[1].value}" for q in self.resolve(node.args[0])}
        return set()

    def local_name(self, node: ast.AST) -> Optional[str]:
        for q in self.resolve(node):
            if q.startswith(LOCAL_MARK) and q.count(".") == 1:
                return q[len(LOCAL_MARK):]
        return None

    def find_method(self, class_name: str, method: str, seen=None) -> Optional[str]:
        """Key "$.Class.method" of the definition ``class_name`` uses, through module bases."""
        seen = seen or set()
        if class_name in seen or class_name not in self.classes:
            return None
        seen.add(class_name)
        info = self.classes[class_name]
        if method in info.methods:
            return f"{LOCAL_MARK}{class_name}.{method}"
        for base in info.bases:
            found = self.find_method(base, method, seen)
            if found:
                return found
        return None

    def self_attr_values(self, class_name: str, attr: str, seen=None) -> list[ast.expr]:
        seen = seen or set()
        if class_name in seen or class_name not in self.classes:
            return []
        seen.add(class_name)
        info = self.classes[class_name]
        values = list(info.self_attrs.get(attr, []))
        for base in info.bases:
            values += self.self_attr_values(base, attr, seen)
        return values

    def function_node(self, key: str) -> Optional[ast.AST]:
        parts = key[len(LOCAL_MARK):].split(".")
        if len(parts) == 1:
            return self.functions.get(parts[0])
        info = self.classes.get(parts[0])
        return info.methods.get(parts[1]) if info else None


    def enclosing_class(self, node: ast.AST) -> Optional[str]:
        current = self.parents.get(node)
        while current is not None:
            if isinstance(current, ast.ClassDef):
                return current.name if current.name in self.classes else None
            current = self.parents.get(current)
        return None
