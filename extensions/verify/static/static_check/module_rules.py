"""Module-wide checks: imports, references, reflection, patching, fallbacks and kernel bodies."""
from __future__ import annotations

import ast

from extensions.verify.static import policy

from .ast_helpers import handler_produces_values, source
from .findings import Findings
from .forward_path import ForwardPath
from .module_index import ModuleIndex
from .vocabulary import (
    BUILTIN_CATEGORIES, DISPATCH_OVERRIDES, DYNAMIC_ATTRIBUTES, FORWARD_ENTRY_METHODS,
    FRAME_ATTRIBUTES, LOCAL_MARK, REFERENCE_MODULE_WORDS, STREAM_NAMES, categories,
    torch_reference_verdict,
)


class ModuleRules:
    """Checks that hold anywhere in the module, forward path or not."""

    def __init__(self, index: ModuleIndex, findings: Findings, forward: ForwardPath,
                 allow_library_gemm: bool):
        self.index = index
        self.findings = findings
        self.forward = forward
        self.allow_library_gemm = allow_library_gemm

    def run(self) -> None:
        self._scan_module()
        self._check_kernel_bodies()

    def _scan_module(self) -> None:
        for node in self.index.nodes:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                self._check_import(node)
            elif isinstance(node, ast.Name):
                self._check_name(node)
            elif isinstance(node, ast.Attribute):
                self._check_attribute(node)
            elif isinstance(node, ast.Call):
                self._check_reflection_call(node)
            elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
                self._check_assignment(node)
            elif isinstance(node, (ast.Try, getattr(ast, "TryStar", ast.Try))):
                self._check_try(node)
            elif isinstance(node, ast.Constant) and node.value == "Model":
                self.findings.flag("reference_model", node, "string 'Model'")
            elif isinstance(node, (ast.AsyncFunctionDef, ast.Await, ast.AsyncFor, ast.AsyncWith)):
                self.findings.flag("concurrency", node, "async code")
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self._check_definition(node)

    def _check_import(self, node) -> None:
        if isinstance(node, ast.ImportFrom):
            if node.level:
                self.findings.flag("forbidden_import", node, "relative import")
                self.findings.flag("reference_model", node, "relative import (problem module?)")
                return
            modules = [node.module or ""]
            full_names = [f"{node.module}.{a.name}" for a in node.names if a.name != "*"]
            if any(a.name == "*" for a in node.names):
                self.findings.flag("forbidden_import", node, f"from {node.module} import *")
            imported = [a.asname or a.name for a in node.names]
        else:
            modules = [a.name for a in node.names]
            full_names = []
            imported = [a.asname or a.name for a in node.names]
        for module in modules:
            if not policy.import_allowed(module):
                self.findings.flag("forbidden_import", node, f"import of {module}")
            lowered = module.lower()
            if module == "__main__" or any(w in lowered for w in REFERENCE_MODULE_WORDS):
                self.findings.flag("reference_model", node, f"import of {module}")
        for name in modules + full_names:
            for flag in categories(name):
                self.findings.flag(flag, node, f"import of {name}")
        for name in full_names:
            self._check_value_reference(name, node.lineno, name)
        if "Model" in imported or any(n.split(".")[-1] == "Model" for n in full_names):
            self.findings.flag("reference_model", node, "imports Model")

    def _check_name(self, node: ast.Name) -> None:
        if node.id == "Model":
            self.findings.flag("reference_model", node, "uses Model")
            return
        category = BUILTIN_CATEGORIES.get(node.id)
        if category and node.id not in self.index.bound_names:
            self.findings.flag(category, node, f"{node.id}")
            return
        if node.id in STREAM_NAMES:
            self.findings.flag("cuda_stream", node, node.id)
        if not isinstance(node.ctx, ast.Load) or (node.id not in self.index.imports
                                                  and node.id not in self.index.aliases):
            return
        for q in self.index.resolve(node):
            if q.startswith(LOCAL_MARK):
                continue
            for flag in categories(q):
                self.findings.flag(flag, node, f"{node.id} ({q})")
            if not self._is_call_target(node):
                self._check_value_reference(q, node.lineno, node.id)

    def _check_attribute(self, node: ast.Attribute) -> None:
        if node.attr in DYNAMIC_ATTRIBUTES:
            self.findings.flag("dynamic_code", node, f"access to {node.attr}")
        if node.attr in FRAME_ATTRIBUTES:
            self.findings.flag("introspection", node, f"access to {node.attr}")
        if node.attr == "__builtins__":
            self.findings.flag("monkeypatch", node, "access to __builtins__")
        if node.attr == "Model":
            self.findings.flag("reference_model", node, f"uses {source(node)}")
        if node.attr in STREAM_NAMES:
            self.findings.flag("cuda_stream", node, source(node))
        parent = self.index.parents.get(node)
        if isinstance(parent, ast.Attribute) and parent.value is node:
            return  # judged as part of the longer chain
        for q in self.index.resolve(node):
            if q.startswith(LOCAL_MARK):
                continue
            for flag in categories(q):
                self.findings.flag(flag, node, f"{source(node)}" + ("" if q == source(node) else f" ({q})"))
            if isinstance(node.ctx, ast.Load) and not self._is_call_target(node):
                self._check_value_reference(q, node.lineno, source(node))

    def _is_call_target(self, node: ast.AST) -> bool:
        parent = self.index.parents.get(node)
        return isinstance(parent, ast.Call) and parent.func is node

    def _check_value_reference(self, q: str, line: int, label: str) -> None:
        """A PyTorch op used as a value (stored, passed, imported by name) is an alias for it."""
        if q.split(".")[0] == "torch":
            verdict = torch_reference_verdict(q)
            shown = label if label == q else f"{label} ({q})"
            if verdict == "library_gemm" and self.allow_library_gemm:
                self.findings.allow(line, f"{shown} referenced")
            elif verdict:
                self.findings.flag(verdict, line, f"{shown} referenced as a value (alias of a PyTorch op)")

    def _check_reflection_call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Name) and func.id in ("getattr", "setattr", "delattr", "hasattr") \
                and func.id not in self.index.bound_names:
            literal_hasattr = func.id == "hasattr" and len(node.args) >= 2 \
                and isinstance(node.args[1], ast.Constant)
            if literal_hasattr:
                return  # an existence check reads nothing
            literal = len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) \
                and isinstance(node.args[1].value, str)
            if len(node.args) < 2 or not literal:
                self.findings.flag("dynamic_code", node, f"{func.id} with a computed name")
            target = node.args[0] if node.args else None
            modules = {q for q in self.index.resolve(target) if not q.startswith(LOCAL_MARK)} if target else set()
            on_model = isinstance(target, ast.Name) and target.id == "Model"
            if modules or on_model:
                shown = source(target)
                if func.id in ("setattr", "delattr"):
                    self.findings.flag("monkeypatch", node, f"{func.id} on {shown}")
                else:
                    self.findings.flag("dynamic_code", node, f"{func.id} on {shown}")
            if func.id in ("setattr", "delattr") and target is not None and literal \
                    and node.args[1].value in FORWARD_ENTRY_METHODS \
                    and self.index.local_name(target) in self.index.classes:
                self.findings.flag("monkeypatch", node, f"{func.id} replaces {node.args[1].value}")
        elif isinstance(func, ast.Name) and func.id == "type" and len(node.args) == 3 \
                and "type" not in self.index.bound_names:
            self.findings.flag("dynamic_code", node, "type() creating a class")

    def _check_assignment(self, node) -> None:
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.Delete):
            targets = node.targets
        else:
            targets = [node.target]
        for target in targets:
            for sub in ast.walk(target):
                if isinstance(sub, ast.Attribute) and isinstance(sub.ctx, (ast.Store, ast.Del)):
                    base = sub.value
                    modules = {q for q in self.index.resolve(base) if not q.startswith(LOCAL_MARK)}
                    if node in self.index.tree.body and isinstance(sub.ctx, ast.Store) \
                            and self.index.resolve(sub) <= policy.ASSIGNABLE_TORCH_SETTINGS \
                            and self.index.resolve(sub):
                        continue  # a precision switch at import, not a patch
                    if modules or (isinstance(base, ast.Name) and base.id == "Model"):
                        self.findings.flag("monkeypatch", sub, f"assigns {source(sub)}")
                    elif sub.attr in FORWARD_ENTRY_METHODS and self.index.local_name(base) in self.index.classes:
                        self.findings.flag("monkeypatch", sub, f"replaces {source(sub)}")
                elif isinstance(sub, ast.Subscript) and isinstance(sub.ctx, (ast.Store, ast.Del)):
                    if any(q.startswith(("sys.modules", "builtins")) for q in self.index.resolve(sub.value)):
                        self.findings.flag("monkeypatch", sub, f"writes {source(sub.value)}")

    def _check_definition(self, node) -> None:
        if node.name == "Model":
            self.findings.flag("reference_model", node, "defines Model")
        if node.name in DISPATCH_OVERRIDES:
            self.findings.flag("monkeypatch", node, f"defines {node.name}")
        if node.name == "__getattribute__" or (node.name == "__getattr__" and node in self.index.tree.body):
            self.findings.flag("dynamic_code", node, f"defines {node.name}")

    def _check_try(self, node) -> None:
        if not node.handlers and not any(isinstance(n, ast.Return) for s in node.finalbody
                                         for n in ast.walk(s)):
            return
        owner = self.index.enclosing_class(node)
        body = self.forward.scan(node.body, owner, set())
        if self.forward.transitively(body, lambda f: bool(f.launches or f.indirect_launches)):
            self.findings.flag("try_except_fallback", node, "try around a kernel launch")
            return
        for handler in node.handlers:
            facts = self.forward.scan(handler.body, owner, set())
            computes = self.forward.transitively(facts, lambda f: bool(f.compute or f.library))
            if computes or handler_produces_values(handler):
                self.findings.flag("try_except_fallback", handler,
                                   "except handler computes (fallback path)")

    def _check_kernel_bodies(self) -> None:
        """Kernels may use triton, their own locals, other kernels and module constants only."""
        constants = self._module_constants()
        for name in self.index.kernels:
            kernel = self.index.functions.get(name)
            if not isinstance(kernel, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            local = {n.id for n in ast.walk(kernel) if isinstance(n, ast.Name)
                     and not isinstance(n.ctx, ast.Load)} | {a.arg for a in ast.walk(kernel)
                                                            if isinstance(a, ast.arg)}
            for stmt in kernel.body:
                for node in ast.walk(stmt):
                    if not isinstance(node, ast.Name) or not isinstance(node.ctx, ast.Load) \
                            or node.id in local or node.id in constants or node.id in self.index.kernels:
                        continue
                    resolved = self.index.resolve(node)
                    roots = {q.split(".")[0] for q in resolved}
                    if roots and roots <= {"triton", "math"}:
                        continue
                    if not resolved and node.id not in self.index.bound_names:
                        continue  # a builtin (range, min, ...)
                    if "torch" in roots:
                        self.findings.flag("torch_compute", node, f"{node.id} inside Triton kernel {name}")
                    if "numpy" in roots:
                        self.findings.flag("numpy_compute", node, f"{node.id} inside Triton kernel {name}")
                    self.findings.flag("kernel_escape", node, f"{node.id} used inside Triton kernel {name}")

    def _module_constants(self) -> set[str]:
        """Module-level names bound only to literals or ``tl.constexpr(...)``."""
        constants: set[str] = set()
        others: set[str] = set()
        for node in self.index.tree.body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                literal = isinstance(node.value, ast.Constant) or (
                    isinstance(node.value, ast.UnaryOp) and isinstance(node.value.operand, ast.Constant)
                ) or (isinstance(node.value, ast.Call)
                      and any(q.endswith(".constexpr") for q in self.index.resolve(node.value.func)))
                for target in targets:
                    if isinstance(target, ast.Name):
                        (constants if literal else others).add(target.id)
        return constants - others
