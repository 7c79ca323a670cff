"""The forward path: what ModelNew.forward reaches, and what PyTorch it runs on the way."""
from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Iterable, Optional

from extensions.verify.static import policy

from .ast_helpers import (
    is_self, is_super_call, local, params, self_attr_source, self_param, source,
)
from .findings import Findings
from .held_functions import HeldFunctions
from .host_values import HostValueRules, HostValues
from .module_index import ModuleIndex
from .vocabulary import FORWARD_ENTRY_METHODS, LOCAL_MARK, torch_call_verdict

# --- what one stretch of code does -------------------------------------------------------------

@dataclass
class Facts:
    launches: list[int] = field(default_factory=list)  # kernel[grid](...) of a known kernel
    indirect_launches: list[int] = field(default_factory=list)  # x[grid](...) of an unknown x
    callees: set[str] = field(default_factory=set)  # keys of module functions/methods it calls
    compute: list[tuple[str, int, str]] = field(default_factory=list)  # (flag, line, message)
    library: list[tuple[int, str]] = field(default_factory=list)  # library GEMM/conv calls



class ForwardPath:
    """What the forward path (and every function held to its rules) does: kernel launches, callees,
    PyTorch compute and library calls, collected per function and followed transitively."""

    def __init__(self, index: ModuleIndex, findings: Findings, allow_library_gemm: bool):
        self.index = index
        self.findings = findings
        self.allow_library_gemm = allow_library_gemm
        self._facts_cache: dict[str, Facts] = {}
        self.host_rules = HostValueRules(HostValues(index))

    def _forward_roots(self, modelnew: str) -> list[str]:
        roots = [key for key in (self.index.find_method(modelnew, m) for m in FORWARD_ENTRY_METHODS) if key]
        for node in self.index.nodes:
            # Forward hooks run inside the module call.
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr.startswith("register_") and "hook" in node.func.attr:
                owner = self.index.enclosing_class(node)
                for arg in list(node.args) + [kw.value for kw in node.keywords]:
                    roots += self.callable_keys(arg, owner)
            # ModelNew.forward = something
            if isinstance(node, (ast.Assign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Attribute) and target.attr in FORWARD_ENTRY_METHODS \
                            and self.index.local_name(target.value) == modelnew:
                        roots += self.callable_keys(node.value, None)
        return roots

    def remember(self, key: str, node: ast.AST, owner: Optional[str]) -> None:
        """Facts of a nested def under ``key`` (it has no module-level name to look up). Its first
        parameter is not an instance, so it is scanned without an owner."""
        self._facts_cache.setdefault(key, self.scan([node], None, params(node)))

    def callable_keys(self, node: ast.AST, owner: Optional[str]) -> list[str]:
        if isinstance(node, ast.Lambda):
            key = f"{LOCAL_MARK}<lambda:{node.lineno}:{node.col_offset}>"
            self._facts_cache.setdefault(key, self.scan([node.body], owner, params(node)))
            return [key]
        keys = []
        if isinstance(node, ast.Attribute) and owner and is_self(node.value, "self"):
            method = self.index.find_method(owner, node.attr)
            if method:
                keys.append(method)
        keys += [q for q in self.index.resolve(node) if q.startswith(LOCAL_MARK) and self.index.function_node(q)]
        return keys

    def check(self, modelnew: str) -> None:
        roots = self._forward_roots(modelnew)
        if not roots and modelnew:
            self.findings.flag("no_kernel_launch", self.index.classes[modelnew].node,
                               "ModelNew defines no forward")
        reached = self.reachable(roots)
        launched = False
        indirect = False
        for key in reached:
            facts = self.facts(key)
            launched = launched or bool(facts.launches)
            indirect = indirect or bool(facts.indirect_launches)
        # Functions forward does not visibly call are held to the same rules (held_functions.py).
        forward_keys = set(reached)
        for key in self.reachable(roots + HeldFunctions(self.index, self).keys()):
            facts = self.facts(key)
            where = "in forward path" if key in forward_keys else "in code held to the forward rules"
            for flag, line, message in facts.compute:
                self.findings.flag(flag, line, message.replace("in forward path", where))
            for line, message in facts.library:
                if self.allow_library_gemm:
                    self.findings.allow(line, message)
                else:
                    self.findings.flag("library_gemm", line, f"{message} {where}")
        if indirect and not launched:
            launched = self._kernel_passed_as_value()
        if self.index.kernels and not launched and roots:
            self.findings.flag("no_kernel_launch", self.index.function_node(roots[0]) or 1,
                               "no kernel[grid](...) launch reachable from ModelNew.forward")

    def reachable(self, roots: Iterable[str]) -> list[str]:
        order: list[str] = []
        pending = list(roots)
        while pending:
            key = pending.pop()
            if key in order:
                continue
            order.append(key)
            pending.extend(sorted(self.facts(key).callees - set(order)))
        return order

    def _kernel_passed_as_value(self) -> bool:
        for node in self.index.nodes:
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in self.index.kernels:
                parent = self.index.parents.get(node)
                if not (isinstance(parent, ast.Subscript) and parent.value is node):
                    return True
        return False

    def facts(self, key: str) -> Facts:
        if key not in self._facts_cache:
            node = self.index.function_node(key)
            parts = key[len(LOCAL_MARK):].split(".")
            owner = parts[0] if len(parts) == 2 else None
            if node is None or (len(parts) == 1 and parts[0] in self.index.kernels):
                facts = Facts()
            elif isinstance(node, ast.Lambda):
                facts = self.scan([node.body], owner, params(node))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                facts = self.scan([node], owner, params(node))
            else:  # class attribute bound to another callable: forward = _impl
                facts = Facts(callees=set(self.callable_keys(node, owner)))
            self._facts_cache[key] = facts
        return self._facts_cache[key]

    def transitively(self, facts: Facts, has) -> bool:
        if has(facts):
            return True
        return any(has(self.facts(key)) for key in self.reachable(facts.callees))

    # -- scanning a stretch of code --

    def scan(self, nodes: list[ast.AST], owner: Optional[str], params: set[str]) -> Facts:
        facts = Facts()
        local_attrs: dict[str, str] = {}  # local name -> self attribute it iterates or indexes
        self_name = "self" if owner else None
        for root in nodes:
            if isinstance(root, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self_name = self_param(root) if owner else None
            for node in ast.walk(root):
                if isinstance(node, (ast.For, ast.comprehension)):
                    attr = self_attr_source(node.iter, self_name)
                    if attr and isinstance(node.target, ast.Name):
                        local_attrs[node.target.id] = attr
                elif isinstance(node, ast.Assign) and len(node.targets) == 1 \
                        and isinstance(node.targets[0], ast.Name):
                    attr = self_attr_source(node.value, self_name)
                    if attr:
                        local_attrs[node.targets[0].id] = attr
        for root in nodes:
            tensors, integers, inputs = self.host_rules.values.names_in(root)
            for node in ast.walk(root):
                facts.compute += self.host_rules.judge(node, tensors, integers, inputs, self_name)
                if isinstance(node, ast.Call):
                    self._scan_call(node, owner, self_name, params, local_attrs, facts)
                elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
                    facts.library.append((node.lineno, "'@' matrix multiply"))
                elif isinstance(node, ast.AugAssign) and isinstance(node.op, ast.MatMult):
                    facts.library.append((node.lineno, "'@=' matrix multiply"))
                elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    for dec in node.decorator_list:
                        target = dec.func if isinstance(dec, ast.Call) else dec
                        facts.callees |= set(self.callable_keys(target, owner))
        return facts

    def _scan_call(self, call: ast.Call, owner: Optional[str], self_name: Optional[str], params: set[str],
                   local_attrs: dict[str, str], facts: Facts) -> None:
        func = call.func
        line = call.lineno
        label = source(func)
        if isinstance(func, ast.Subscript):
            attr = self._self_attribute_behind(func.value, owner, self_name, local_attrs)
            values = self.index.self_attr_values(owner, attr) if attr else []
            if any(isinstance(v, ast.Call) for v in values):  # self.layers[i](x)
                for value in values:
                    self._classify_attribute_value(value, line, label, owner, facts)
                return
            targets = self._resolve_with_self(func.value, owner, self_name, local_attrs)
            if any(local(q) in self.index.kernels for q in targets):
                facts.launches.append(line)
            elif not targets or all(not q.startswith(LOCAL_MARK) for q in targets):
                facts.indirect_launches.append(line)
            return
        if isinstance(func, ast.Attribute) and func.attr in ("run", "warmup"):
            if any(local(q) in self.index.kernels for q in self.index.resolve(func.value)):
                facts.launches.append(line)
                return
        if isinstance(func, ast.Call):  # getattr(torch, "relu")(x) or SomeModule(...)(x)
            for q in self.index.resolve(func):
                self._classify_callable(q, line, label, facts)
            for q in self.index.resolve(func.func):
                self._classify_module_call(q, line, label, facts)
            return
        if is_super_call(func):
            method = func.attr
            key = None
            if owner:
                for base in self.index.classes[owner].bases if owner in self.index.classes else []:
                    key = key or self.index.find_method(base, method)
            if key:
                facts.callees.add(key)
            elif method not in ("__init__",):
                facts.compute.append(("torch_compute", line, f"super().{method}(...) in forward path"))
            return
        # self.method(...), self.submodule(...), or a local bound to a self attribute
        attr = None
        if isinstance(func, ast.Attribute) and is_self(func.value, self_name) and owner:
            method = self.index.find_method(owner, func.attr)
            if method:
                facts.callees.add(method)
                return
            attr = func.attr
        elif isinstance(func, ast.Name) and func.id in local_attrs and owner:
            attr = local_attrs[func.id]
        if attr is not None:
            for value in self.index.self_attr_values(owner, attr):
                self._classify_attribute_value(value, line, label, owner, facts)
            return
        resolved = self.index.resolve(func)
        for q in resolved:
            self._classify_callable(q, line, label, facts)
        if not resolved and isinstance(func, ast.Attribute):
            self._classify_method(func, line, label, owner, self_name, params, facts)

    @staticmethod
    def _self_attribute_behind(node: ast.AST, owner: Optional[str], self_name: Optional[str],
                               local_attrs: dict[str, str]) -> Optional[str]:
        if not owner:
            return None
        if isinstance(node, ast.Attribute) and is_self(node.value, self_name):
            return node.attr
        if isinstance(node, ast.Name):
            return local_attrs.get(node.id)
        return None

    def _resolve_with_self(self, node: ast.AST, owner: Optional[str], self_name: Optional[str],
                           local_attrs: dict[str, str]) -> set[str]:
        attr = self._self_attribute_behind(node, owner, self_name, local_attrs)
        if attr is None:
            return self.index.resolve(node)
        names: set[str] = set()
        for value in self.index.self_attr_values(owner, attr):
            names |= self.index.resolve(value)
        return names

    def _classify_callable(self, q: str, line: int, label: str, facts: Facts) -> None:
        shown = label if label == q else f"{label} ({q})"
        if q.startswith(LOCAL_MARK):
            parts = q[len(LOCAL_MARK):].split(".")
            if parts[0] in self.index.kernels:
                return
            if parts[0] in self.index.classes:
                if len(parts) == 1:  # instantiating a module class in forward
                    facts.callees |= {k for k in (self.index.find_method(parts[0], m) for m in
                                                  ("__init__",) + FORWARD_ENTRY_METHODS) if k}
                elif len(parts) == 2:
                    method = self.index.find_method(parts[0], parts[1])
                    if method is None and parts[1] == "apply":  # autograd.Function.apply
                        method = self.index.find_method(parts[0], "forward")
                    if method:
                        facts.callees.add(method)
                return
            if parts[0] in self.index.functions:
                facts.callees.add(LOCAL_MARK + parts[0])
            return
        root = q.split(".")[0]
        if root == "torch":
            verdict = torch_call_verdict(q)
            if verdict == "library_gemm":
                facts.library.append((line, shown))
            elif verdict:
                facts.compute.append((verdict, line, f"{shown} in forward path"))
        elif root == "numpy":
            facts.compute.append(("numpy_compute", line, f"{shown} in forward path"))
        elif root == "Model" or q == "Model":
            facts.compute.append(("reference_model", line, f"{shown} in forward path"))

    def _classify_module_call(self, q: str, line: int, label: str, facts: Facts) -> None:
        """Calling the result of ``q(...)``: a module instance called in forward."""
        if q.startswith(LOCAL_MARK):
            name = q[len(LOCAL_MARK):]
            if name in self.index.classes:
                facts.callees |= {k for k in (self.index.find_method(name, m) for m in
                                              FORWARD_ENTRY_METHODS) if k}
            return
        self._classify_torch_module(q, line, label, facts)

    def _classify_torch_module(self, q: str, line: int, label: str, facts: Facts) -> None:
        parts = q.split(".")
        if parts[0] != "torch" or not parts[-1][:1].isupper():
            return
        name = parts[-1]
        if name in policy.NN_MODULES_WITHOUT_COMPUTE:
            return
        if name in policy.NN_LIBRARY_GEMM_MODULES:
            facts.library.append((line, f"{label} (nn.{name})"))
        else:
            facts.compute.append(("torch_compute", line, f"{label} (nn.{name}) called in forward path"))

    def _classify_attribute_value(self, value: ast.expr, line: int, label: str, owner: str,
                                  facts: Facts) -> None:
        """``self.attr(...)`` where ``__init__`` did ``self.attr = value``."""
        if isinstance(value, ast.Call):
            constructor = self.index.resolve(value.func)
            containers = {q for q in constructor if q.split(".")[-1] in policy.NN_CONTAINERS}
            if containers:
                for inner in self._container_contents(value):
                    for q in self.index.resolve(inner.func):
                        self._classify_module_call(q, line, label, facts)
                return
            for q in constructor:
                self._classify_module_call(q, line, label, facts)
            return
        for q in self.index.resolve(value):
            self._classify_callable(q, line, label, facts)

    def _container_contents(self, container: ast.Call) -> list[ast.Call]:
        """Constructor calls that fill ``nn.Sequential(...)``/``nn.ModuleList(...)``, including
        those appended to a local list that is then passed in (``nn.Sequential(*layers)``)."""
        calls = [n for n in ast.walk(container) if n is not container and isinstance(n, ast.Call)]
        names = {n.id for n in ast.walk(container) if isinstance(n, ast.Name)}
        function = self.index.parents.get(container)
        while function is not None and not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = self.index.parents.get(function)
        if function is None or not names:
            return calls
        for node in ast.walk(function):
            filled = None
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id in names for t in targets):
                    filled = node.value
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and isinstance(node.func.value, ast.Name) and node.func.value.id in names \
                    and node.func.attr in ("append", "extend", "insert", "add_module"):
                filled = node
            if filled is not None:
                calls += [n for n in ast.walk(filled) if isinstance(n, ast.Call) and n is not node]
        return calls

    def _classify_method(self, func: ast.Attribute, line: int, label: str, owner: Optional[str],
                         self_name: str, params: set[str], facts: Facts) -> None:
        """``obj.name(...)`` on an object the analysis cannot name: judge by the method name."""
        name = func.attr
        receiver = func.value
        if is_self(receiver, self_name):
            return
        if name in policy.HOST_EXTRACTION_METHODS:
            facts.compute.append(("host_extraction", line,
                                   f"{label}() hands tensor data to Python in forward path"))
        if name == "numpy":
            facts.compute.append(("numpy_compute", line, f"{label}() in forward path"))
        elif name in policy.TENSOR_LIBRARY_GEMM_METHODS:
            facts.library.append((line, f"{label}()"))
        elif name in policy.TENSOR_COMPUTE_METHODS:
            if name in policy.TENSOR_METHODS_SHARED_WITH_CONTAINERS and not self._is_tensor(
                    receiver, owner, self_name, params):
                return
            facts.compute.append(("torch_compute", line, f"{label}() tensor method in forward path"))

    def _is_tensor(self, node: ast.expr, owner: Optional[str], self_name: str, params: set[str]) -> bool:
        if isinstance(node, ast.Name):
            return node.id in params
        if isinstance(node, ast.Attribute) and is_self(node.value, self_name) and owner in self.index.classes:
            return node.attr in self.index.classes[owner].tensor_attrs
        return False
