"""Static anti-cheat analysis of a candidate module (AST only; nothing is executed).

The check answers two questions from source alone:

* Is this a Triton solution at all?  ``class ModelNew`` exists, at least one ``@triton.jit`` kernel
  exists, and a kernel is launched (``kernel[grid](...)``) from the forward path.
* Does anything do the math or game the harness instead of the kernels?  The **forward path** is
  ``ModelNew.forward`` (and ``__call__``, forward hooks) plus every module function, method,
  module class and lambda it reaches: direct calls, ``self.method``, ``self.submodule(...)``,
  ``Fn.apply`` of a module-defined autograd Function, names bound by assignment. PyTorch and
  library calls are flagged on that path only (``__init__`` may build weights with torch).
  Everything else in :data:`FLAG_DESCRIPTIONS` is flagged anywhere in the module.

Names are resolved through imports and assignments (``import torch as T``, ``from torch import
matmul as mm``, ``F = torch.nn.functional``, ``fn = torch.matmul``, ``getattr(torch, "matmul")``), so
an alias resolves to what it names. Operators on tensors (``a + b``) are left to the runtime audit;
``@`` is a matrix multiply and is reported as one. The vocabulary of allowed calls is shared with
the runtime audit in :mod:`extensions.verify.policy`.
"""
from __future__ import annotations

import ast
import functools
from dataclasses import dataclass, field
from typing import Iterable, Optional

from extensions.verify import policy

FLAG_DESCRIPTIONS: dict[str, str] = {
    "syntax_error": "the code does not parse as Python",
    "no_modelnew": "no module-level class ModelNew",
    "no_triton_kernel": "no @triton.jit kernel (directly or under @triton.autotune/@triton.heuristics)",
    "no_kernel_launch": "no Triton kernel is launched (kernel[grid](...)) from the forward path",
    "torch_compute": "PyTorch computes in the forward path: torch.*/F.* calls, tensor math methods, "
                     "nn module calls, torch.ops, torch._C, super().forward, or a PyTorch op "
                     "referenced as a value anywhere (aliasing)",
    "library_gemm": "library GEMM/convolution (torch.matmul, F.linear, F.conv2d, '@', nn.Linear, "
                    "nn.Conv*) in the forward path while the policy forbids it",
    "try_except_fallback": "a try whose body launches a kernel or whose handler computes: a hidden "
                           "fallback when the kernel fails",
    "concurrency": "threads, processes, async code or subprocesses",
    "cuda_stream": "CUDA stream or graph creation, stream context or stream switching",
    "monkeypatch": "changes torch/triton/numpy/builtins/Model/sys.modules or overrides torch "
                   "dispatch (__torch_function__)",
    "dynamic_code": "dynamic imports, exec/eval/compile, reflection (getattr with computed names or "
                    "on torch/triton, globals(), vars(), __dict__, __class__, __subclasses__, ...)",
    "introspection": "frame, tracer or garbage-collector inspection (sys._getframe, inspect, gc, "
                     "traceback, ctypes, sys.settrace)",
    "io_access": "file, network, process, signal or environment access (open, os, pathlib, socket, "
                 "pickle, torch.load/save, os.environ)",
    "reference_model": "uses the reference class Model or imports the problem module",
    "numpy_compute": "NumPy (imported or reached through .numpy())",
    "kernel_escape": "a @triton.jit body uses Python objects (torch, mutable module globals, "
                     "non-jit helpers) that only the CPU interpreter would run",
    "forbidden_import": "imports a module outside the allow-list (torch, torch.nn, "
                        "torch.nn.functional, torch.nn.init, torch.autograd, triton.*, math, "
                        "typing, functools, dataclasses)",
}

_FLAG_ORDER = {flag: i for i, flag in enumerate(FLAG_DESCRIPTIONS)}
_MESSAGES_PER_FLAG = 4

# Qualified-name prefixes (dotted) that raise a flag wherever they appear: imports and references.
_CATEGORY_PREFIXES: dict[str, tuple[str, ...]] = {
    "concurrency": (
        "threading", "_thread", "multiprocessing", "concurrent", "asyncio", "subprocess",
        "os.fork", "os.forkpty", "os.spawnl", "os.spawnv", "os.spawnlp", "os.spawnvp",
        "os.posix_spawn", "os.system", "os.popen", "torch.multiprocessing", "torch.jit.fork",
        "torch.jit._fork", "torch.jit.wait", "torch.futures", "torch.distributed",
    ),
    "cuda_stream": (
        "torch.cuda.Stream", "torch.cuda.stream", "torch.cuda.set_stream",
        "torch.cuda.current_stream", "torch.cuda.default_stream", "torch.cuda.ExternalStream",
        "torch.cuda.StreamContext", "torch.cuda.streams", "torch.cuda.graph", "torch.cuda.graphs",
        "torch.cuda.CUDAGraph", "torch.cuda.make_graphed_callables", "torch.Stream",
    ),
    "io_access": (
        "os", "pathlib", "socket", "urllib", "requests", "http", "shutil", "pickle", "signal",
        "tempfile", "glob", "io", "sqlite3", "ftplib", "smtplib", "ssl", "mmap", "fcntl", "dill",
        "cloudpickle", "joblib", "shelve", "marshal", "torch.load", "torch.save", "torch.hub",
        "torch.from_file", "torch.serialization", "numpy.load", "numpy.save", "numpy.fromfile",
        "sys.stdin", "sys.argv",
    ),
    "introspection": (
        "inspect", "gc", "traceback", "ctypes", "dis", "faulthandler", "tracemalloc",
        "sys._getframe", "sys._current_frames", "sys.settrace", "sys.setprofile", "sys.gettrace",
        "sys.getprofile", "sys.exc_info", "threading.settrace", "threading.setprofile",
    ),
    "dynamic_code": (
        "importlib", "imp", "types", "code", "codeop", "runpy", "pkgutil", "zipimport",
        "torch.utils.cpp_extension",
    ),
    "monkeypatch": (
        "builtins", "sys.modules", "sys.meta_path", "sys.path_hooks", "sys.path", "torch.library",
        "torch.overrides", "unittest.mock", "mock",
    ),
    "numpy_compute": ("numpy",),
}
# Unresolved names that still mean a CUDA stream or graph.
_STREAM_NAMES = frozenset({
    "Stream", "ExternalStream", "set_stream", "current_stream", "default_stream", "StreamContext",
    "CUDAGraph",
})
_LIBRARY_ROOTS = frozenset({"torch", "triton", "numpy"})
_REFERENCE_MODULE_WORDS = ("problem", "reference", "kernelbench", "task")

_BUILTIN_CATEGORIES = {
    "exec": "dynamic_code", "eval": "dynamic_code", "compile": "dynamic_code",
    "__import__": "dynamic_code", "globals": "dynamic_code", "vars": "dynamic_code",
    "locals": "dynamic_code", "open": "io_access", "input": "io_access",
    "breakpoint": "introspection", "__builtins__": "monkeypatch",
}
_DYNAMIC_ATTRIBUTES = frozenset({
    "__dict__", "__class__", "__subclasses__", "__getattribute__", "__bases__", "__mro__",
    "__base__", "__import__", "__loader__", "__spec__", "__reduce__", "__reduce_ex__",
    "__setattr__", "__delattr__", "__wrapped__",
})
_FRAME_ATTRIBUTES = frozenset({
    "f_back", "f_globals", "f_locals", "f_code", "f_builtins", "gi_frame", "cr_frame", "tb_frame",
    "tb_next", "__code__", "__globals__", "__closure__",
})
_DISPATCH_OVERRIDES = frozenset({"__torch_function__", "__torch_dispatch__"})

# torch.<name> values that are not computations: dtypes, layouts, constants, submodules.
_TORCH_VALUES = frozenset({
    "dtype", "layout", "memory_format", "strided", "sparse_coo", "sparse_csr", "jagged",
    "contiguous_format", "preserve_format", "channels_last", "channels_last_3d", "inf", "nan",
    "pi", "e", "newaxis", "__version__", "version", "types",
    "bfloat16", "bool", "cdouble", "cfloat", "chalf", "complex128", "complex32", "complex64",
    "double", "float", "float16", "float32", "float64", "float8_e4m3fn", "float8_e4m3fnuz",
    "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2", "half", "int",
    "int16", "int32", "int64", "int8", "long", "short", "uint16", "uint32", "uint64", "uint8",
    "qint8", "qint32", "quint8",
})
_TORCH_SUBMODULES = frozenset({
    "nn", "cuda", "backends", "autograd", "functional", "init", "utils", "jit", "distributed",
    "fx", "library", "testing", "linalg", "fft", "special", "sparse", "amp", "cpu", "mps", "xpu",
    "profiler", "overrides", "hub", "futures", "multiprocessing", "compiler", "export", "random",
    "masked", "nested", "quantization", "ao", "onnx", "package", "storage", "version", "types",
})
_TRITON_JIT = frozenset({"triton.jit", "triton.runtime.jit", "triton.runtime.jit.jit"})
_TRITON_WRAPPERS = frozenset({
    "triton.autotune", "triton.heuristics", "triton.runtime.autotune", "triton.runtime.heuristics",
    "triton.runtime.autotuner.autotune", "triton.runtime.autotuner.heuristics",
})
_FORWARD_ENTRY_METHODS = ("forward", "__call__")
_LOCAL_MARK = "$."  # qualified names of things the candidate module itself defines


@dataclass
class StaticReport:
    ok: bool  # no error and no cheating flag
    flags: list[str]  # from FLAG_DESCRIPTIONS, in its order
    errors: list[str]  # readable problems with line numbers, e.g. "line 12: torch.matmul in forward path"
    allowed_library_calls: list[str]  # library GEMM/conv calls seen when the policy allows them
    kernel_names: list[str]  # @triton.jit functions defined


def static_check(code: str, allow_library_gemm: bool = False) -> StaticReport:
    """Judge ``code`` from its AST. ``allow_library_gemm`` moves library GEMM/conv calls in the
    forward path from the ``library_gemm`` flag into ``allowed_library_calls``."""
    try:
        tree = ast.parse(code)
    except SyntaxError as exc:
        line = exc.lineno or 0
        return _report_for_unparseable(f"line {line}: syntax error: {exc.msg}")
    except (ValueError, RecursionError, MemoryError) as exc:
        return _report_for_unparseable(f"line 0: does not parse: {exc}")
    return _Analysis(tree, allow_library_gemm).run()


def _report_for_unparseable(message: str) -> StaticReport:
    return StaticReport(False, ["syntax_error"], [message], [], [])


# --- findings ----------------------------------------------------------------------------------

class _Findings:
    def __init__(self) -> None:
        self._messages: dict[str, list[tuple[int, str]]] = {}
        self._allowed: list[tuple[int, str]] = []

    def flag(self, flag: str, node_or_line, message: str) -> None:
        line = node_or_line if isinstance(node_or_line, int) else getattr(node_or_line, "lineno", 0)
        entry = (line, message)
        bucket = self._messages.setdefault(flag, [])
        if entry not in bucket:
            bucket.append(entry)

    def allow(self, line: int, message: str) -> None:
        if (line, message) not in self._allowed:
            self._allowed.append((line, message))

    def has(self, flag: str) -> bool:
        return flag in self._messages

    def report(self, kernel_names: list[str]) -> StaticReport:
        flags = sorted(self._messages, key=_FLAG_ORDER.__getitem__)
        errors = []
        for flag in flags:
            entries = sorted(self._messages[flag])
            for line, message in entries[:_MESSAGES_PER_FLAG]:
                errors.append(f"line {line}: {message}")
            if len(entries) > _MESSAGES_PER_FLAG:
                errors.append(f"({flag}: {len(entries) - _MESSAGES_PER_FLAG} more)")
        allowed = [f"line {line}: {message}" for line, message in sorted(self._allowed)]
        return StaticReport(not flags, flags, errors, allowed, kernel_names)


# --- what one stretch of code does -------------------------------------------------------------

@dataclass
class _Facts:
    launches: list[int] = field(default_factory=list)  # kernel[grid](...) of a known kernel
    indirect_launches: list[int] = field(default_factory=list)  # x[grid](...) of an unknown x
    callees: set[str] = field(default_factory=set)  # keys of module functions/methods it calls
    compute: list[tuple[str, int, str]] = field(default_factory=list)  # (flag, line, message)
    library: list[tuple[int, str]] = field(default_factory=list)  # library GEMM/conv calls


@dataclass
class _ClassInfo:
    node: ast.ClassDef
    methods: dict[str, ast.AST]  # FunctionDef / Lambda / other expression bound in the class body
    bases: list[str]  # names of module-defined base classes
    self_attrs: dict[str, list[ast.expr]] = field(default_factory=dict)
    tensor_attrs: set[str] = field(default_factory=set)  # parameters and buffers


class _Analysis:
    def __init__(self, tree: ast.Module, allow_library_gemm: bool):
        self.tree = tree
        self.allow_library_gemm = allow_library_gemm
        self.findings = _Findings()
        # One walk of the tree; every module-wide pass reuses it.
        self.nodes: list[ast.AST] = list(ast.walk(tree))
        self.parents: dict[ast.AST, ast.AST] = {}
        for node in self.nodes:
            for child in ast.iter_child_nodes(node):
                self.parents[child] = node
        self.imports: dict[str, set[str]] = {}
        self.functions: dict[str, ast.AST] = {}  # module-level defs and name = lambda
        self.classes: dict[str, _ClassInfo] = {}
        self.aliases: dict[str, set[str]] = {}
        self.bound_names: set[str] = set()
        self.kernels: list[str] = []
        self._facts_cache: dict[str, _Facts] = {}
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
            info.bases = [b for b in (self._local_name(base) for base in info.node.bases) if b]
        self._collect_self_attributes()
        self._find_kernels()

    def _class_info(self, node: ast.ClassDef) -> _ClassInfo:
        methods: dict[str, ast.AST] = {}
        for item in node.body:
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                methods[item.name] = item
            elif isinstance(item, ast.Assign):
                for target in item.targets:
                    if isinstance(target, ast.Name):
                        methods[target.id] = item.value
        return _ClassInfo(node, methods, [])

    def _index_aliases(self) -> None:
        assignments: list[tuple[ast.expr, ast.expr]] = []
        for node in self.nodes:
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    assignments.extend(_pair_targets(target, node.value))
            elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
                assignments.extend(_pair_targets(node.target, node.value))
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
            method, info = self._enclosing_method(node)
            if info is None:
                continue
            self_name = _first_param(method)
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                if node.value is None:
                    continue
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    for sub_target, value in _pair_targets(target, node.value):
                        if _is_self_attr(sub_target, self_name):
                            info.self_attrs.setdefault(sub_target.attr, []).append(value)
                            if self._is_parameter_value(value):
                                info.tensor_attrs.add(sub_target.attr)
            elif isinstance(node.func, ast.Attribute) and _is_self(node.func.value, self_name) \
                    and len(node.args) >= 2 and isinstance(node.args[0], ast.Constant) \
                    and isinstance(node.args[0].value, str):
                name = node.args[0].value
                if node.func.attr in ("add_module", "register_module"):
                    info.self_attrs.setdefault(name, []).append(node.args[1])
                elif node.func.attr in ("register_buffer", "register_parameter"):
                    info.tensor_attrs.add(name)

    def _enclosing_method(self, node: ast.AST):
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
        return bool(self.resolve(target) & _TRITON_JIT)

    def _contains_jit_call(self, value: ast.expr) -> bool:
        return any(
            isinstance(n, ast.Call) and self.resolve(n.func) & _TRITON_JIT for n in ast.walk(value)
        )

    # -- name resolution --

    def resolve(self, node: ast.AST) -> set[str]:
        """Qualified names ``node`` may stand for: "torch.matmul", "$.my_kernel", ..."""
        if isinstance(node, ast.Name):
            names: set[str] = set()
            if node.id in self.functions or node.id in self.classes:
                names.add(_LOCAL_MARK + node.id)
            names |= self.imports.get(node.id, set())
            names |= self.aliases.get(node.id, set())
            return names
        if isinstance(node, ast.Attribute):
            return {f"{q}.{node.attr}" for q in self.resolve(node.value)}
        if isinstance(node, ast.Call) and _is_builtin_call(node, "getattr", self.bound_names) \
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) \
                and isinstance(node.args[1].value, str):
            return {f"{q}.{node.args[1].value}" for q in self.resolve(node.args[0])}
        return set()

    def _local_name(self, node: ast.AST) -> Optional[str]:
        for q in self.resolve(node):
            if q.startswith(_LOCAL_MARK) and q.count(".") == 1:
                return q[len(_LOCAL_MARK):]
        return None

    def _find_method(self, class_name: str, method: str, seen=None) -> Optional[str]:
        """Key "$.Class.method" of the definition ``class_name`` uses, through module bases."""
        seen = seen or set()
        if class_name in seen or class_name not in self.classes:
            return None
        seen.add(class_name)
        info = self.classes[class_name]
        if method in info.methods:
            return f"{_LOCAL_MARK}{class_name}.{method}"
        for base in info.bases:
            found = self._find_method(base, method, seen)
            if found:
                return found
        return None

    def _self_attr_values(self, class_name: str, attr: str, seen=None) -> list[ast.expr]:
        seen = seen or set()
        if class_name in seen or class_name not in self.classes:
            return []
        seen.add(class_name)
        info = self.classes[class_name]
        values = list(info.self_attrs.get(attr, []))
        for base in info.bases:
            values += self._self_attr_values(base, attr, seen)
        return values

    def _function_node(self, key: str) -> Optional[ast.AST]:
        parts = key[len(_LOCAL_MARK):].split(".")
        if len(parts) == 1:
            return self.functions.get(parts[0])
        info = self.classes.get(parts[0])
        return info.methods.get(parts[1]) if info else None

    # -- the run --

    def run(self) -> StaticReport:
        modelnew = self._modelnew_class()
        if modelnew is None:
            self.findings.flag("no_modelnew", 1, "no class ModelNew defined at module level")
        if not self.kernels:
            self.findings.flag("no_triton_kernel", 1, "no @triton.jit kernel defined")
        self._scan_module()
        self._check_kernel_bodies()
        if modelnew is not None:
            self._check_forward_path(modelnew)
        return self.findings.report(list(self.kernels))

    def _modelnew_class(self) -> Optional[str]:
        if "ModelNew" in self.classes:
            return "ModelNew"
        for node in self.tree.body:
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "ModelNew" for t in node.targets
            ):
                return self._local_name(node.value) or ""
        return None

    # -- forward path --

    def _forward_roots(self, modelnew: str) -> list[str]:
        roots = [key for key in (self._find_method(modelnew, m) for m in _FORWARD_ENTRY_METHODS) if key]
        for node in self.nodes:
            # Forward hooks run inside the module call.
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr.startswith("register_") and "hook" in node.func.attr:
                owner = self._enclosing_class(node)
                for arg in list(node.args) + [kw.value for kw in node.keywords]:
                    roots += self._callable_keys(arg, owner)
            # ModelNew.forward = something
            if isinstance(node, (ast.Assign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Attribute) and target.attr in _FORWARD_ENTRY_METHODS \
                            and self._local_name(target.value) == modelnew:
                        roots += self._callable_keys(node.value, None)
        return roots

    def _callable_keys(self, node: ast.AST, owner: Optional[str]) -> list[str]:
        if isinstance(node, ast.Lambda):
            key = f"{_LOCAL_MARK}<lambda:{node.lineno}:{node.col_offset}>"
            self._facts_cache.setdefault(key, self._scan([node.body], owner, _params(node)))
            return [key]
        keys = []
        if isinstance(node, ast.Attribute) and owner and _is_self(node.value, "self"):
            method = self._find_method(owner, node.attr)
            if method:
                keys.append(method)
        keys += [q for q in self.resolve(node) if q.startswith(_LOCAL_MARK) and self._function_node(q)]
        return keys

    def _check_forward_path(self, modelnew: str) -> None:
        roots = self._forward_roots(modelnew)
        if not roots and modelnew:
            self.findings.flag("no_kernel_launch", self.classes[modelnew].node,
                               "ModelNew defines no forward")
        reached = self._reachable(roots)
        launched = False
        indirect = False
        for key in reached:
            facts = self._facts(key)
            launched = launched or bool(facts.launches)
            indirect = indirect or bool(facts.indirect_launches)
            for flag, line, message in facts.compute:
                self.findings.flag(flag, line, message)
            for line, message in facts.library:
                if self.allow_library_gemm:
                    self.findings.allow(line, message)
                else:
                    self.findings.flag("library_gemm", line, f"{message} in forward path")
        if indirect and not launched:
            launched = self._kernel_passed_as_value()
        if self.kernels and not launched and roots:
            self.findings.flag("no_kernel_launch", self._function_node(roots[0]) or 1,
                               "no kernel[grid](...) launch reachable from ModelNew.forward")

    def _reachable(self, roots: Iterable[str]) -> list[str]:
        order: list[str] = []
        pending = list(roots)
        while pending:
            key = pending.pop()
            if key in order:
                continue
            order.append(key)
            pending.extend(sorted(self._facts(key).callees - set(order)))
        return order

    def _kernel_passed_as_value(self) -> bool:
        for node in self.nodes:
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in self.kernels:
                parent = self.parents.get(node)
                if not (isinstance(parent, ast.Subscript) and parent.value is node):
                    return True
        return False

    def _facts(self, key: str) -> _Facts:
        if key not in self._facts_cache:
            node = self._function_node(key)
            parts = key[len(_LOCAL_MARK):].split(".")
            owner = parts[0] if len(parts) == 2 else None
            if node is None or (len(parts) == 1 and parts[0] in self.kernels):
                facts = _Facts()
            elif isinstance(node, ast.Lambda):
                facts = self._scan([node.body], owner, _params(node))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                facts = self._scan([node], owner, _params(node))
            else:  # class attribute bound to another callable: forward = _impl
                facts = _Facts(callees=set(self._callable_keys(node, owner)))
            self._facts_cache[key] = facts
        return self._facts_cache[key]

    def _transitively(self, facts: _Facts, has) -> bool:
        if has(facts):
            return True
        return any(has(self._facts(key)) for key in self._reachable(facts.callees))

    # -- scanning a stretch of code --

    def _scan(self, nodes: list[ast.AST], owner: Optional[str], params: set[str]) -> _Facts:
        facts = _Facts()
        local_attrs: dict[str, str] = {}  # local name -> self attribute it iterates or indexes
        self_name = "self" if owner else None
        for root in nodes:
            if isinstance(root, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self_name = _self_param(root) if owner else None
            for node in ast.walk(root):
                if isinstance(node, (ast.For, ast.comprehension)):
                    attr = _self_attr_source(node.iter, self_name)
                    if attr and isinstance(node.target, ast.Name):
                        local_attrs[node.target.id] = attr
                elif isinstance(node, ast.Assign) and len(node.targets) == 1 \
                        and isinstance(node.targets[0], ast.Name):
                    attr = _self_attr_source(node.value, self_name)
                    if attr:
                        local_attrs[node.targets[0].id] = attr
        for root in nodes:
            for node in ast.walk(root):
                if isinstance(node, ast.Call):
                    self._scan_call(node, owner, self_name, params, local_attrs, facts)
                elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
                    facts.library.append((node.lineno, "'@' matrix multiply"))
                elif isinstance(node, ast.AugAssign) and isinstance(node.op, ast.MatMult):
                    facts.library.append((node.lineno, "'@=' matrix multiply"))
                elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    for dec in node.decorator_list:
                        target = dec.func if isinstance(dec, ast.Call) else dec
                        facts.callees |= set(self._callable_keys(target, owner))
        return facts

    def _scan_call(self, call: ast.Call, owner: Optional[str], self_name: Optional[str], params: set[str],
                   local_attrs: dict[str, str], facts: _Facts) -> None:
        func = call.func
        line = call.lineno
        label = _source(func)
        if isinstance(func, ast.Subscript):
            attr = self._self_attribute_behind(func.value, owner, self_name, local_attrs)
            values = self._self_attr_values(owner, attr) if attr else []
            if any(isinstance(v, ast.Call) for v in values):  # self.layers[i](x)
                for value in values:
                    self._classify_attribute_value(value, line, label, owner, facts)
                return
            targets = self._resolve_with_self(func.value, owner, self_name, local_attrs)
            if any(_local(q) in self.kernels for q in targets):
                facts.launches.append(line)
            elif not targets or all(not q.startswith(_LOCAL_MARK) for q in targets):
                facts.indirect_launches.append(line)
            return
        if isinstance(func, ast.Attribute) and func.attr in ("run", "warmup"):
            if any(_local(q) in self.kernels for q in self.resolve(func.value)):
                facts.launches.append(line)
                return
        if isinstance(func, ast.Call):  # getattr(torch, "relu")(x) or SomeModule(...)(x)
            for q in self.resolve(func):
                self._classify_callable(q, line, label, facts)
            for q in self.resolve(func.func):
                self._classify_module_call(q, line, label, facts)
            return
        if _is_super_call(func):
            method = func.attr
            key = None
            if owner:
                for base in self.classes[owner].bases if owner in self.classes else []:
                    key = key or self._find_method(base, method)
            if key:
                facts.callees.add(key)
            elif method not in ("__init__",):
                facts.compute.append(("torch_compute", line, f"super().{method}(...) in forward path"))
            return
        # self.method(...), self.submodule(...), or a local bound to a self attribute
        attr = None
        if isinstance(func, ast.Attribute) and _is_self(func.value, self_name) and owner:
            method = self._find_method(owner, func.attr)
            if method:
                facts.callees.add(method)
                return
            attr = func.attr
        elif isinstance(func, ast.Name) and func.id in local_attrs and owner:
            attr = local_attrs[func.id]
        if attr is not None:
            for value in self._self_attr_values(owner, attr):
                self._classify_attribute_value(value, line, label, owner, facts)
            return
        resolved = self.resolve(func)
        for q in resolved:
            self._classify_callable(q, line, label, facts)
        if not resolved and isinstance(func, ast.Attribute):
            self._classify_method(func, line, label, owner, self_name, params, facts)

    @staticmethod
    def _self_attribute_behind(node: ast.AST, owner: Optional[str], self_name: Optional[str],
                               local_attrs: dict[str, str]) -> Optional[str]:
        if not owner:
            return None
        if isinstance(node, ast.Attribute) and _is_self(node.value, self_name):
            return node.attr
        if isinstance(node, ast.Name):
            return local_attrs.get(node.id)
        return None

    def _resolve_with_self(self, node: ast.AST, owner: Optional[str], self_name: Optional[str],
                           local_attrs: dict[str, str]) -> set[str]:
        attr = self._self_attribute_behind(node, owner, self_name, local_attrs)
        if attr is None:
            return self.resolve(node)
        names: set[str] = set()
        for value in self._self_attr_values(owner, attr):
            names |= self.resolve(value)
        return names

    def _classify_callable(self, q: str, line: int, label: str, facts: _Facts) -> None:
        shown = label if label == q else f"{label} ({q})"
        if q.startswith(_LOCAL_MARK):
            parts = q[len(_LOCAL_MARK):].split(".")
            if parts[0] in self.kernels:
                return
            if parts[0] in self.classes:
                if len(parts) == 1:  # instantiating a module class in forward
                    facts.callees |= {k for k in (self._find_method(parts[0], m) for m in
                                                  ("__init__",) + _FORWARD_ENTRY_METHODS) if k}
                elif len(parts) == 2:
                    method = self._find_method(parts[0], parts[1])
                    if method is None and parts[1] == "apply":  # autograd.Function.apply
                        method = self._find_method(parts[0], "forward")
                    if method:
                        facts.callees.add(method)
                return
            if parts[0] in self.functions:
                facts.callees.add(_LOCAL_MARK + parts[0])
            return
        root = q.split(".")[0]
        if root == "torch":
            verdict = _torch_call_verdict(q)
            if verdict == "library_gemm":
                facts.library.append((line, shown))
            elif verdict:
                facts.compute.append((verdict, line, f"{shown} in forward path"))
        elif root == "numpy":
            facts.compute.append(("numpy_compute", line, f"{shown} in forward path"))
        elif root == "Model" or q == "Model":
            facts.compute.append(("reference_model", line, f"{shown} in forward path"))

    def _classify_module_call(self, q: str, line: int, label: str, facts: _Facts) -> None:
        """Calling the result of ``q(...)``: a module instance called in forward."""
        if q.startswith(_LOCAL_MARK):
            name = q[len(_LOCAL_MARK):]
            if name in self.classes:
                facts.callees |= {k for k in (self._find_method(name, m) for m in
                                              _FORWARD_ENTRY_METHODS) if k}
            return
        self._classify_torch_module(q, line, label, facts)

    def _classify_torch_module(self, q: str, line: int, label: str, facts: _Facts) -> None:
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
                                  facts: _Facts) -> None:
        """``self.attr(...)`` where ``__init__`` did ``self.attr = value``."""
        if isinstance(value, ast.Call):
            constructor = self.resolve(value.func)
            containers = {q for q in constructor if q.split(".")[-1] in policy.NN_CONTAINERS}
            if containers:
                for inner in self._container_contents(value):
                    for q in self.resolve(inner.func):
                        self._classify_module_call(q, line, label, facts)
                return
            for q in constructor:
                self._classify_module_call(q, line, label, facts)
            return
        for q in self.resolve(value):
            self._classify_callable(q, line, label, facts)

    def _container_contents(self, container: ast.Call) -> list[ast.Call]:
        """Constructor calls that fill ``nn.Sequential(...)``/``nn.ModuleList(...)``, including
        those appended to a local list that is then passed in (``nn.Sequential(*layers)``)."""
        calls = [n for n in ast.walk(container) if n is not container and isinstance(n, ast.Call)]
        names = {n.id for n in ast.walk(container) if isinstance(n, ast.Name)}
        function = self.parents.get(container)
        while function is not None and not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = self.parents.get(function)
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
                         self_name: str, params: set[str], facts: _Facts) -> None:
        """``obj.name(...)`` on an object the analysis cannot name: judge by the method name."""
        name = func.attr
        receiver = func.value
        if _is_self(receiver, self_name):
            return
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
        if isinstance(node, ast.Attribute) and _is_self(node.value, self_name) and owner in self.classes:
            return node.attr in self.classes[owner].tensor_attrs
        return False

    # -- module-wide checks --

    def _scan_module(self) -> None:
        for node in self.nodes:
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
            if module == "__main__" or any(w in lowered for w in _REFERENCE_MODULE_WORDS):
                self.findings.flag("reference_model", node, f"import of {module}")
        for name in modules + full_names:
            for flag in _categories(name):
                self.findings.flag(flag, node, f"import of {name}")
        for name in full_names:
            self._check_value_reference(name, node.lineno, name)
        if "Model" in imported or any(n.split(".")[-1] == "Model" for n in full_names):
            self.findings.flag("reference_model", node, "imports Model")

    def _check_name(self, node: ast.Name) -> None:
        if node.id == "Model":
            self.findings.flag("reference_model", node, "uses Model")
            return
        category = _BUILTIN_CATEGORIES.get(node.id)
        if category and node.id not in self.bound_names:
            self.findings.flag(category, node, f"{node.id}")
            return
        if node.id in _STREAM_NAMES:
            self.findings.flag("cuda_stream", node, node.id)
        if not isinstance(node.ctx, ast.Load) or (node.id not in self.imports
                                                  and node.id not in self.aliases):
            return
        for q in self.resolve(node):
            if q.startswith(_LOCAL_MARK):
                continue
            for flag in _categories(q):
                self.findings.flag(flag, node, f"{node.id} ({q})")
            if not self._is_call_target(node):
                self._check_value_reference(q, node.lineno, node.id)

    def _check_attribute(self, node: ast.Attribute) -> None:
        if node.attr in _DYNAMIC_ATTRIBUTES:
            self.findings.flag("dynamic_code", node, f"access to {node.attr}")
        if node.attr in _FRAME_ATTRIBUTES:
            self.findings.flag("introspection", node, f"access to {node.attr}")
        if node.attr == "__builtins__":
            self.findings.flag("monkeypatch", node, "access to __builtins__")
        if node.attr == "Model":
            self.findings.flag("reference_model", node, f"uses {_source(node)}")
        if node.attr in _STREAM_NAMES:
            self.findings.flag("cuda_stream", node, _source(node))
        parent = self.parents.get(node)
        if isinstance(parent, ast.Attribute) and parent.value is node:
            return  # judged as part of the longer chain
        for q in self.resolve(node):
            if q.startswith(_LOCAL_MARK):
                continue
            for flag in _categories(q):
                self.findings.flag(flag, node, f"{_source(node)}" + ("" if q == _source(node) else f" ({q})"))
            if isinstance(node.ctx, ast.Load) and not self._is_call_target(node):
                self._check_value_reference(q, node.lineno, _source(node))

    def _is_call_target(self, node: ast.AST) -> bool:
        parent = self.parents.get(node)
        return isinstance(parent, ast.Call) and parent.func is node

    def _check_value_reference(self, q: str, line: int, label: str) -> None:
        """A PyTorch op used as a value (stored, passed, imported by name) is an alias for it."""
        if q.split(".")[0] == "torch":
            verdict = _torch_reference_verdict(q)
            shown = label if label == q else f"{label} ({q})"
            if verdict == "library_gemm" and self.allow_library_gemm:
                self.findings.allow(line, f"{shown} referenced")
            elif verdict:
                self.findings.flag(verdict, line, f"{shown} referenced as a value (alias of a PyTorch op)")

    def _check_reflection_call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Name) and func.id in ("getattr", "setattr", "delattr", "hasattr") \
                and func.id not in self.bound_names:
            literal_hasattr = func.id == "hasattr" and len(node.args) >= 2 \
                and isinstance(node.args[1], ast.Constant)
            if literal_hasattr:
                return  # an existence check reads nothing
            literal = len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) \
                and isinstance(node.args[1].value, str)
            if len(node.args) < 2 or not literal:
                self.findings.flag("dynamic_code", node, f"{func.id} with a computed name")
            target = node.args[0] if node.args else None
            modules = {q for q in self.resolve(target) if not q.startswith(_LOCAL_MARK)} if target else set()
            on_model = isinstance(target, ast.Name) and target.id == "Model"
            if modules or on_model:
                shown = _source(target)
                if func.id in ("setattr", "delattr"):
                    self.findings.flag("monkeypatch", node, f"{func.id} on {shown}")
                else:
                    self.findings.flag("dynamic_code", node, f"{func.id} on {shown}")
            if func.id in ("setattr", "delattr") and target is not None and literal \
                    and node.args[1].value in _FORWARD_ENTRY_METHODS \
                    and self._local_name(target) in self.classes:
                self.findings.flag("monkeypatch", node, f"{func.id} replaces {node.args[1].value}")
        elif isinstance(func, ast.Name) and func.id == "type" and len(node.args) == 3 \
                and "type" not in self.bound_names:
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
                    modules = {q for q in self.resolve(base) if not q.startswith(_LOCAL_MARK)}
                    if modules or (isinstance(base, ast.Name) and base.id == "Model"):
                        self.findings.flag("monkeypatch", sub, f"assigns {_source(sub)}")
                    elif sub.attr in _FORWARD_ENTRY_METHODS and self._local_name(base) in self.classes:
                        self.findings.flag("monkeypatch", sub, f"replaces {_source(sub)}")
                elif isinstance(sub, ast.Subscript) and isinstance(sub.ctx, (ast.Store, ast.Del)):
                    if any(q.startswith(("sys.modules", "builtins")) for q in self.resolve(sub.value)):
                        self.findings.flag("monkeypatch", sub, f"writes {_source(sub.value)}")

    def _check_definition(self, node) -> None:
        if node.name == "Model":
            self.findings.flag("reference_model", node, "defines Model")
        if node.name in _DISPATCH_OVERRIDES:
            self.findings.flag("monkeypatch", node, f"defines {node.name}")
        if node.name == "__getattribute__" or (node.name == "__getattr__" and node in self.tree.body):
            self.findings.flag("dynamic_code", node, f"defines {node.name}")

    def _check_try(self, node) -> None:
        if not node.handlers and not any(isinstance(n, ast.Return) for s in node.finalbody
                                         for n in ast.walk(s)):
            return
        owner = self._enclosing_class(node)
        body = self._scan(node.body, owner, set())
        if self._transitively(body, lambda f: bool(f.launches or f.indirect_launches)):
            self.findings.flag("try_except_fallback", node, "try around a kernel launch")
            return
        for handler in node.handlers:
            facts = self._scan(handler.body, owner, set())
            computes = self._transitively(facts, lambda f: bool(f.compute or f.library))
            if computes or _handler_produces_values(handler):
                self.findings.flag("try_except_fallback", handler,
                                   "except handler computes (fallback path)")

    def _check_kernel_bodies(self) -> None:
        """Kernels may use triton, their own locals, other kernels and module constants only."""
        constants = self._module_constants()
        for name in self.kernels:
            kernel = self.functions.get(name)
            if not isinstance(kernel, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            local = {n.id for n in ast.walk(kernel) if isinstance(n, ast.Name)
                     and not isinstance(n.ctx, ast.Load)} | {a.arg for a in ast.walk(kernel)
                                                            if isinstance(a, ast.arg)}
            for stmt in kernel.body:
                for node in ast.walk(stmt):
                    if not isinstance(node, ast.Name) or not isinstance(node.ctx, ast.Load) \
                            or node.id in local or node.id in constants or node.id in self.kernels:
                        continue
                    resolved = self.resolve(node)
                    roots = {q.split(".")[0] for q in resolved}
                    if roots and roots <= {"triton", "math"}:
                        continue
                    if not resolved and node.id not in self.bound_names:
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
        for node in self.tree.body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                literal = isinstance(node.value, ast.Constant) or (
                    isinstance(node.value, ast.UnaryOp) and isinstance(node.value.operand, ast.Constant)
                ) or (isinstance(node.value, ast.Call)
                      and any(q.endswith(".constexpr") for q in self.resolve(node.value.func)))
                for target in targets:
                    if isinstance(target, ast.Name):
                        (constants if literal else others).add(target.id)
        return constants - others

    def _enclosing_class(self, node: ast.AST) -> Optional[str]:
        current = self.parents.get(node)
        while current is not None:
            if isinstance(current, ast.ClassDef):
                return current.name if current.name in self.classes else None
            current = self.parents.get(current)
        return None


# --- verdicts on qualified names ---------------------------------------------------------------

def _torch_call_verdict(q: str) -> Optional[str]:
    """Flag for calling ``q`` (a torch.* name) in the forward path; None when allowed."""
    parts = q.split(".")
    if len(parts) < 2 or _categories(q):
        return None  # module-wide categories (streams, io, ...) are reported on their own
    head, last = parts[1], parts[-1]
    if head in ("ops", "_C") or any(_is_private(p) for p in parts[1:]):
        return "torch_compute"
    if head == "nn":
        if len(parts) >= 4 and parts[2] == "functional":
            return "library_gemm" if last in policy.LIBRARY_GEMM_TORCH_FUNCTIONS else "torch_compute"
        if last[:1].isupper():
            if last in policy.NN_MODULES_WITHOUT_COMPUTE or last in ("Parameter", "Buffer"):
                return None
            return "library_gemm" if last in policy.NN_LIBRARY_GEMM_MODULES else "torch_compute"
        return "torch_compute"
    if head == "cuda":
        return None if last in policy.ALLOWED_TORCH_CUDA_FUNCTIONS or last[:1].isupper() \
            else "torch_compute"
    if head == "Tensor" and len(parts) == 3:
        return _method_verdict(last)
    if len(parts) == 2:
        if last in policy.ALLOWED_TORCH_FUNCTIONS or last in _TORCH_VALUES or last[:1].isupper():
            return None
        return "library_gemm" if last in policy.LIBRARY_GEMM_TORCH_FUNCTIONS else "torch_compute"
    if last[:1].isupper():
        return None
    return "torch_compute"


def _torch_reference_verdict(q: str) -> Optional[str]:
    """Flag for naming ``q`` (a torch.* name) as a value: only known PyTorch ops count."""
    parts = q.split(".")
    if len(parts) < 2:
        return None
    head, last = parts[1], parts[-1]
    if last[:1].isupper() or (last.startswith("__") and last.endswith("__")):
        return None
    if head in ("ops", "_C"):
        return "torch_compute"
    if head == "nn" and len(parts) == 4 and parts[2] == "functional":
        return "library_gemm" if last in policy.LIBRARY_GEMM_TORCH_FUNCTIONS else "torch_compute"
    if head == "Tensor" and len(parts) == 3:
        return _method_verdict(last)
    if head in ("linalg", "fft", "special") and len(parts) == 3:
        return "torch_compute"
    if len(parts) == 2 and not (last in policy.ALLOWED_TORCH_FUNCTIONS or last in _TORCH_VALUES
                                or last in _TORCH_SUBMODULES or _is_private(last)):
        return "library_gemm" if last in policy.LIBRARY_GEMM_TORCH_FUNCTIONS else "torch_compute"
    return None


def _method_verdict(name: str) -> Optional[str]:
    if name in policy.TENSOR_LIBRARY_GEMM_METHODS:
        return "library_gemm"
    return "torch_compute" if name in policy.TENSOR_COMPUTE_METHODS else None


@functools.lru_cache(maxsize=4096)
def _categories(q: str) -> tuple[str, ...]:
    # Library modules re-export the standard library (torch.os, triton.sys): judge every tail.
    parts = q.split(".")
    tails = [q] + [".".join(parts[i:]) for i in range(1, len(parts))]
    return tuple(
        flag for flag, prefixes in _CATEGORY_PREFIXES.items()
        if any(t == p or t.startswith(p + ".") for t in tails for p in prefixes
               if t == q or p.split(".")[0] not in _LIBRARY_ROOTS)
    )


def _is_private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


# --- small AST helpers -------------------------------------------------------------------------

def _pair_targets(target: ast.expr, value: ast.expr) -> list[tuple[ast.expr, ast.expr]]:
    """(target, value) pairs of an assignment, unpacking ``a, b = x, y``."""
    if isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List)) \
            and len(target.elts) == len(value.elts):
        pairs = []
        for sub_target, sub_value in zip(target.elts, value.elts):
            pairs.extend(_pair_targets(sub_target, sub_value))
        return pairs
    return [(target, value)]


def _first_param(node) -> Optional[str]:
    args = node.args.posonlyargs + node.args.args
    return args[0].arg if args else None


def _params(node) -> set[str]:
    args = node.args
    names = {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}
    if args.vararg:
        names.add(args.vararg.arg)
    if args.kwarg:
        names.add(args.kwarg.arg)
    return names - {"self", "cls", "ctx"}


def _self_param(node) -> Optional[str]:
    """The name a method calls its instance (None for static methods)."""
    for dec in node.decorator_list:
        if isinstance(dec, ast.Name) and dec.id == "staticmethod":
            return None
    return _first_param(node)


def _is_self(node: ast.AST, self_name: Optional[str]) -> bool:
    return self_name is not None and isinstance(node, ast.Name) and node.id == self_name


def _is_self_attr(node: ast.AST, self_name: Optional[str]) -> bool:
    return isinstance(node, ast.Attribute) and _is_self(node.value, self_name)


def _self_attr_source(node: ast.AST, self_name: str) -> Optional[str]:
    """The attribute behind ``self.attr``, ``self.attr[i]`` or ``self.attr.values()``."""
    if isinstance(node, ast.Subscript):
        node = node.value
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
            and node.func.attr in ("values", "children", "modules"):
        node = node.func.value
    if _is_self_attr(node, self_name):
        return node.attr
    return None


def _is_super_call(func: ast.AST) -> bool:
    return isinstance(func, ast.Attribute) and isinstance(func.value, ast.Call) \
        and isinstance(func.value.func, ast.Name) and func.value.func.id == "super"


def _is_builtin_call(node: ast.Call, name: str, bound: set[str]) -> bool:
    return isinstance(node.func, ast.Name) and node.func.id == name and name not in bound


def _handler_produces_values(handler: ast.ExceptHandler) -> bool:
    """A handler that returns or computes something is a fallback path, not error reporting."""
    in_raise = {id(n) for stmt in ast.walk(handler) if isinstance(stmt, ast.Raise)
                for n in ast.walk(stmt)}
    for node in ast.walk(handler):
        if id(node) in in_raise:
            continue  # building an error message
        if isinstance(node, (ast.Return, ast.Yield)) and node.value is not None \
                and not isinstance(node.value, ast.Constant):
            return True
        if isinstance(node, ast.BinOp):
            sides = (node.left, node.right)
            if all(isinstance(s, ast.Constant) for s in sides) or isinstance(node.op, ast.Mod) \
                    or any(isinstance(s, (ast.Constant, ast.JoinedStr)) and isinstance(
                        getattr(s, "value", ""), str) for s in sides):
                continue  # constants and string building
            return True
    return False


def _local(q: str) -> Optional[str]:
    if q.startswith(_LOCAL_MARK) and q.count(".") == 1:
        return q[len(_LOCAL_MARK):]
    return None


def _source(node: ast.AST) -> str:
    try:
        text = ast.unparse(node)
    except Exception:  # unparse of odd trees; the label is cosmetic
        return type(node).__name__
    return text if len(text) <= 60 else text[:57] + "..."
