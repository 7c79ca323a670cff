"""Tensor values in host code, and the two ways an allowed call hands a task's math to PyTorch or
Python without naming an operator:

* a cast to an integer or bool dtype (``x.to(torch.int64)``, ``x.long()``, ``x.bool()``,
  ``int_buffer.copy_(x)``): on a floating tensor it truncates or compares, which is the whole answer
  of a rounding or masking task, and it runs as ``_to_copy``/``copy_``, operators forward needs for
  honest copies, so the runtime audit cannot tell it from one (``host_cast_compute``);
* a Python scalar conversion of tensor data (``float(partial[0])``, ``if flag_tensor:``,
  ``math.fsum(partial)``, ``max(partial)``, ``"{:e}".format(partial[0])``, ``"%e" % v``, and a
  conversion builtin handed on as a value, ``map(float, partial)``): the value leaves torch and the
  arithmetic on it is Python's; a few of them stay under the runtime audit's host-extraction limit
  (``host_extraction``).

Which names hold tensors is decided per function from what the module itself shows: the inputs of
``forward``, locals built by torch calls or tensor methods, parameters and buffers, and what other
functions of the module are handed or return. Shape, stride and size reads are metadata, never
tensor data: ``int(x.shape[0])``, ``int(x.numel())``, ``float(self.scale)`` of a Python attribute
stay allowed.
"""
from __future__ import annotations

import ast
import functools
from typing import Iterable, Optional

from .ast_helpers import first_param, is_self, self_param, source
from .module_index import ModuleIndex
from .vocabulary import FORWARD_ENTRY_METHODS, LOCAL_MARK

_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
# Methods whose result holds the same values as the tensor they are called on.
_VIEW_METHODS = frozenset({"view", "reshape", "contiguous", "clone", "detach", "flatten", "squeeze", "unsqueeze",
                           "permute", "transpose", "expand", "t", "narrow", "select", "as_strided", "unflatten",
                           "movedim"})

# Tensor methods and attributes that describe a tensor: their results are Python numbers, shapes,
# dtypes or devices, never the tensor's values.
METADATA_METHODS = frozenset({
    "size", "stride", "numel", "dim", "ndimension", "element_size", "data_ptr", "is_contiguous",
    "storage_offset", "get_device", "nelement", "is_floating_point", "is_complex", "is_signed",
    "type", "dim_order", "is_pinned", "is_shared", "is_set_to", "is_same_size", "untyped_storage",
})
METADATA_ATTRIBUTES = frozenset({
    "shape", "ndim", "dtype", "device", "is_cuda", "is_cpu", "is_meta", "is_sparse", "layout",
    "requires_grad", "is_leaf", "itemsize", "nbytes", "names", "grad_fn", "is_quantized",
})
# Attributes that are tensors again.
TENSOR_ATTRIBUTES = frozenset({"T", "mT", "H", "mH", "data", "real", "imag", "grad"})
# torch.<name> results that are not tensors.
TORCH_NON_TENSOR_RESULTS = frozenset({
    "is_tensor", "is_floating_point", "is_complex", "numel", "result_type", "promote_types",
    "finfo", "iinfo", "device", "dtype", "Size", "no_grad", "inference_mode", "enable_grad",
    "get_default_dtype", "is_grad_enabled", "can_cast",
})
# Python builtins that turn tensor data into a Python value (bool() and the implicit truth test
# run ``is_nonzero``; str/repr/format print the values).
SCALAR_CONVERSIONS = frozenset({"float", "int", "bool", "complex", "str", "repr", "format", "round",
                                "divmod", "ord", "chr"})
# Builtins that take the truth value of, or compare, the elements they are given: on tensor data
# each step is a read to the host, and their result is decided by the values in Python.
ELEMENT_JUDGES = frozenset({"any", "all", "max", "min", "sorted", "filter"})
# str methods that print the values they are given.
FORMAT_METHODS = frozenset({"format", "format_map"})
# Calls where a conversion builtin named as a value is a dtype or a type test, not a conversion.
_TYPE_TAKING_METHODS = frozenset({"to", "type", "view", "new_empty", "new_zeros", "new_ones", "new_full",
                                  "new_tensor"})
# Builtins that hand out a container of the tensor's elements (0-d tensors, still tensor data).
ELEMENT_CONTAINERS = frozenset({"list", "tuple", "iter", "reversed", "sorted", "enumerate", "zip"})
# Tensor methods that cast to an integer or bool dtype.
INTEGER_CAST_METHODS = frozenset({"long", "int", "short", "bool", "byte", "char"})
# Allocation functions whose ``dtype=`` decides the dtype of a new tensor.
_ALLOCATIONS = frozenset({
    "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like", "full",
    "full_like", "arange", "tensor", "as_tensor",
})
_NEW_ALLOCATION_METHODS = frozenset({"new_empty", "new_zeros", "new_ones", "new_full", "new_tensor"})
# Torch calls that convert data (a tensor) to a tensor of ``dtype=``.
DATA_CONVERSIONS = frozenset({"tensor", "as_tensor", "asarray"})
_INTEGER_TYPE_NAMES = ("Long", "Int", "Short", "Bool", "Byte", "Char")


@functools.lru_cache(maxsize=None)
def integer_dtype_name(name: str) -> bool:
    """``torch.<name>`` is a dtype that is neither floating nor complex (bool, int*, uint*, ...)."""
    try:
        import torch
    except ImportError:
        return name in {"bool", "int", "long", "short", "int8", "int16", "int32", "int64", "uint8"}
    value = getattr(torch, name, None)
    return isinstance(value, torch.dtype) and not value.is_floating_point and not value.is_complex


class HostValues:
    """Per function of the module: the names that hold tensors and those that hold integer or
    bool tensors (allocated with such a dtype), found by a fixpoint over the module's calls."""

    def __init__(self, index: ModuleIndex):
        self.index = index
        self._functions = [n for n in index.nodes if isinstance(n, _FUNCTIONS)
                           and n.name not in index.kernels]
        self.tensors: dict[ast.AST, set[str]] = {f: set() for f in self._functions}
        self.integer_tensors: dict[ast.AST, set[str]] = {f: set() for f in self._functions}
        self._returns_tensor: set[ast.AST] = set()
        self._returns_integers: set[ast.AST] = set()
        self._attribute_values: dict[tuple[str, str], list[ast.AST]] = {}
        # forward's inputs: their dtype is the problem's, which the module does not show, so a
        # cast of one (an int64 index narrowed to int32, a bool mask made int8) is judged at run
        # time by the dtype it really has (the audit's ``host_cast_compute``), not refused here.
        self.inputs: dict[ast.AST, set[str]] = {}
        for function in self._functions:
            if function.name in FORWARD_ENTRY_METHODS and isinstance(index.parents.get(function), ast.ClassDef):
                self.inputs[function] = self._parameters(function, skip_first=True)
                self.tensors[function] |= self.inputs[function]
        self._solve()

    # -- queries --

    def names_in(self, node: ast.AST) -> tuple[set[str], set[str], set[str]]:
        """(tensor names, integer tensor names, forward's input names) visible at ``node``: its
        function's and, for closures, those of the functions around it."""
        tensors: set[str] = set()
        integers: set[str] = set()
        inputs: set[str] = set()
        current = node if isinstance(node, _FUNCTIONS) else self.index.parents.get(node)
        while current is not None:
            if current in self.tensors:
                tensors |= self.tensors[current]
                integers |= self.integer_tensors[current]
                inputs |= self.inputs.get(current, set())
            current = self.index.parents.get(current)
        return tensors, integers, inputs

    def from_input(self, node: Optional[ast.AST], inputs: set[str]) -> bool:
        """Whether ``node`` is one of forward's inputs or a view or copy of one."""
        if isinstance(node, ast.Name):
            return node.id in inputs
        if isinstance(node, ast.Subscript):
            return self.from_input(node.value, inputs)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _VIEW_METHODS:
            return self.from_input(node.func.value, inputs)
        return False

    def reads_tensor(self, node: ast.AST, tensors: set[str], owner_self: Optional[str] = None) -> bool:
        """Whether evaluating ``node`` yields tensor data (not a shape, size or dtype of it)."""
        if isinstance(node, ast.Name):
            return node.id in tensors
        if isinstance(node, ast.Starred):
            return self.reads_tensor(node.value, tensors, owner_self)
        if isinstance(node, ast.Subscript):
            return self.reads_tensor(node.value, tensors, owner_self)
        if isinstance(node, ast.Attribute):
            if node.attr in METADATA_ATTRIBUTES:
                return False
            if node.attr in TENSOR_ATTRIBUTES:
                return self.reads_tensor(node.value, tensors, owner_self)
            return self._is_tensor_attribute(node)
        if isinstance(node, ast.BinOp):
            return self.reads_tensor(node.left, tensors, owner_self) or \
                self.reads_tensor(node.right, tensors, owner_self)
        if isinstance(node, ast.UnaryOp):
            return self.reads_tensor(node.operand, tensors, owner_self)
        if isinstance(node, ast.IfExp):
            return self.reads_tensor(node.body, tensors, owner_self) or \
                self.reads_tensor(node.orelse, tensors, owner_self)
        if isinstance(node, ast.Compare):
            if all(isinstance(op, (ast.Is, ast.IsNot, ast.In, ast.NotIn)) for op in node.ops):
                return False
            return any(self.reads_tensor(v, tensors, owner_self) for v in [node.left] + node.comparators)
        if isinstance(node, ast.NamedExpr):
            return self.reads_tensor(node.value, tensors, owner_self)
        if isinstance(node, ast.Call):
            return self._call_yields_tensor(node, tensors, owner_self)
        return False

    def is_integer_tensor(self, node: ast.AST, integers: set[str]) -> bool:
        """Whether ``node`` is a tensor the module allocated with an integer or bool dtype (or a
        view or copy of one)."""
        if isinstance(node, ast.Name):
            return node.id in integers
        if isinstance(node, ast.Subscript):
            return self.is_integer_tensor(node.value, integers)
        if isinstance(node, ast.Attribute):
            return self._is_integer_attribute(node)
        if isinstance(node, ast.Call):
            func = node.func
            if self._allocation_name(func) is not None:
                return self._allocates_integers(node)
            callee = self._called_function(node)
            if callee is not None:
                return callee in self._returns_integers
            if isinstance(func, ast.Attribute):
                if func.attr in _NEW_ALLOCATION_METHODS:
                    return self.integer_dtype(self._keyword(node, "dtype"), integers) or (
                        self._keyword(node, "dtype") is None and self.is_integer_tensor(func.value, integers))
                if func.attr in INTEGER_CAST_METHODS:
                    return True
                if func.attr in ("to", "type") and any(self.integer_dtype(a, integers)
                                                       for a in self._dtype_arguments(node)):
                    return True
                if func.attr in _VIEW_METHODS:
                    return self.is_integer_tensor(func.value, integers)
        return False

    def integer_dtype(self, node: Optional[ast.AST], integers: set[str]) -> bool:
        """Whether ``node`` names an integer or bool dtype: ``torch.int64``, an alias of one, the
        builtins ``int``/``bool``, a type string (``"torch.LongTensor"``), another integer tensor
        (``x.to(indices)``) or its ``.dtype``."""
        if node is None:
            return False
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return any(f"{name}Tensor" in node.value for name in _INTEGER_TYPE_NAMES)
        if isinstance(node, ast.Name) and node.id in ("int", "bool") and node.id not in self.index.bound_names:
            return True
        if isinstance(node, ast.Attribute) and node.attr == "dtype":
            return self.is_integer_tensor(node.value, integers)
        for q in self.index.resolve(node):
            parts = q.split(".")
            if len(parts) == 2 and parts[0] == "torch" and integer_dtype_name(parts[1]):
                return True
        return self.is_integer_tensor(node, integers)

    @staticmethod
    def _dtype_arguments(call: ast.Call) -> list[ast.AST]:
        """What may name the target dtype of ``t.to(...)``/``t.type(...)``: positional arguments
        (``to(dtype)``, ``to(device, dtype)``, ``to(other)``) and ``dtype=``."""
        return list(call.args) + [v for v in [HostValues._keyword(call, "dtype")] if v is not None]

    @staticmethod
    def _keyword(call: ast.Call, name: str) -> Optional[ast.AST]:
        """The value passed as ``name=``, also from a literal ``**{"name": ...}``."""
        for kw in call.keywords:
            if kw.arg == name:
                return kw.value
            if kw.arg is None and isinstance(kw.value, ast.Dict):
                for key, value in zip(kw.value.keys, kw.value.values):
                    if isinstance(key, ast.Constant) and key.value == name:
                        return value
        return None

    # -- building the sets --

    @staticmethod
    def _parameters(function, skip_first: bool) -> set[str]:
        args = function.args.posonlyargs + function.args.args
        if skip_first and self_param(function) is not None:
            args = args[1:]
        names = {a.arg for a in args + function.args.kwonlyargs}
        if function.args.vararg:
            names.add(function.args.vararg.arg)
        return names

    def _solve(self) -> None:
        for _ in range(20):  # a fixpoint; every round only adds names
            before = (sum(map(len, self.tensors.values())), sum(map(len, self.integer_tensors.values())),
                      len(self._returns_tensor), len(self._returns_integers))
            for function in self._functions:
                self._scan_function(function)
            after = (sum(map(len, self.tensors.values())), sum(map(len, self.integer_tensors.values())),
                     len(self._returns_tensor), len(self._returns_integers))
            if after == before:
                return

    def _own_nodes(self, function) -> Iterable[ast.AST]:
        """Nodes of ``function`` that are not inside a nested function (those are scanned alone)."""
        pending = list(ast.iter_child_nodes(function))
        while pending:
            node = pending.pop()
            yield node
            if not isinstance(node, _FUNCTIONS + (ast.Lambda, ast.ClassDef)):
                pending.extend(ast.iter_child_nodes(node))

    def _scan_function(self, function) -> None:
        tensors, integers, _inputs = self.names_in(function)
        own_tensors = self.tensors[function]
        own_integers = self.integer_tensors[function]
        owner_self = first_param(function) if isinstance(self.index.parents.get(function), ast.ClassDef) else None
        for node in self._own_nodes(function):
            pairs: list[tuple[ast.AST, ast.AST]] = []
            if isinstance(node, ast.Assign):
                pairs = [(t, node.value) for t in node.targets]
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.NamedExpr)) and node.value is not None:
                pairs = [(node.target, node.value)]
            elif isinstance(node, (ast.For, ast.comprehension)):
                pairs = [(node.target, node.iter)]
            elif isinstance(node, ast.withitem) and node.optional_vars is not None:
                pairs = [(node.optional_vars, node.context_expr)]
            elif isinstance(node, ast.Return) and node.value is not None:
                if self.reads_tensor(node.value, tensors, owner_self):
                    self._returns_tensor.add(function)
                if self.is_integer_tensor(node.value, integers):
                    self._returns_integers.add(function)
            elif isinstance(node, ast.Call):
                self._propagate_arguments(node, tensors, owner_self)
            for target, value in pairs:
                for name, sub_value in self._bound_names(target, value):
                    if self.reads_tensor(sub_value, tensors, owner_self) or (
                            isinstance(node, (ast.For, ast.comprehension))
                            and self._iterates_tensor(sub_value, tensors, owner_self)):
                        if name not in own_tensors:
                            own_tensors.add(name)
                            tensors.add(name)
                    if self.is_integer_tensor(sub_value, integers) and name not in own_integers:
                        own_integers.add(name)
                        integers.add(name)

    def _iterates_tensor(self, node: ast.AST, tensors: set[str], owner_self: Optional[str]) -> bool:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in ("enumerate", "zip", "reversed", "sorted", "list", "tuple", "iter"):
            return any(self.reads_tensor(a, tensors, owner_self) for a in node.args)
        return False

    @staticmethod
    def _bound_names(target: ast.AST, value: ast.AST) -> list[tuple[str, ast.AST]]:
        if isinstance(target, ast.Name):
            return [(target.id, value)]
        if isinstance(target, ast.Starred):
            return HostValues._bound_names(target.value, value)
        if isinstance(target, (ast.Tuple, ast.List)):
            if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts):
                return [pair for t, v in zip(target.elts, value.elts) for pair in HostValues._bound_names(t, v)]
            return [pair for t in target.elts for pair in HostValues._bound_names(t, value)]
        return []

    def _callee(self, call: ast.Call) -> tuple[Optional[ast.AST], int]:
        """(module function a call runs, how many of its leading parameters the call does not fill)."""
        callee = self._called_function(call)
        if callee is None:
            return None, 0
        through_self = isinstance(call.func, ast.Attribute)
        return callee, 1 if through_self and self_param(callee) is not None else 0

    def _propagate_arguments(self, call: ast.Call, tensors: set[str], owner_self: Optional[str]) -> None:
        callee, skipped = self._callee(call)
        if callee is None or callee not in self.tensors:
            return
        positional = (callee.args.posonlyargs + callee.args.args)[skipped:]
        for param, arg in zip(positional, call.args):
            if not isinstance(arg, ast.Starred) and self.reads_tensor(arg, tensors, owner_self):
                self.tensors[callee].add(param.arg)
        names = {a.arg for a in callee.args.posonlyargs + callee.args.args + callee.args.kwonlyargs}
        for kw in call.keywords:
            if kw.arg in names and self.reads_tensor(kw.value, tensors, owner_self):
                self.tensors[callee].add(kw.arg)

    # -- pieces of reads_tensor --

    def _self_attribute_values(self, node: ast.Attribute) -> Optional[tuple[str, list[ast.AST]]]:
        """(attribute, values the class assigns or registers under it) for ``self.attr`` inside a
        method of a module class; None for any other attribute."""
        if not isinstance(node.value, ast.Name):
            return None
        method, info = self.index.enclosing_method(node)
        if info is None or method is None or node.value.id != first_param(method):
            return None
        key = (info.node.name, node.attr)
        if key not in self._attribute_values:
            values = list(self.index.self_attr_values(info.node.name, node.attr))
            for call in ast.walk(info.node):
                if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) \
                        and call.func.attr in ("register_buffer", "register_parameter") and len(call.args) >= 2 \
                        and isinstance(call.args[0], ast.Constant) and call.args[0].value == node.attr:
                    values.append(call.args[1])
            self._attribute_values[key] = values
        return info.node.name, self._attribute_values[key]

    def _is_tensor_attribute(self, node: ast.Attribute) -> bool:
        """``self.weight``: a parameter or buffer of the class around it, or an attribute it binds
        to a torch result (``self.partial = torch.empty(2)``)."""
        found = self._self_attribute_values(node)
        if found is None:
            return False
        class_name, values = found
        if node.attr in self.index.classes[class_name].tensor_attrs:
            return True
        return any(isinstance(v, ast.Call) and self._call_yields_tensor(v, set(), None) for v in values)

    def _is_integer_attribute(self, node: ast.Attribute) -> bool:
        """``self.codes`` where the class allocates ``codes`` with an integer or bool dtype."""
        found = self._self_attribute_values(node)
        return found is not None and any(self.is_integer_tensor(v, set()) for v in found[1])

    def _allocation_name(self, func: ast.AST) -> Optional[str]:
        for q in self.index.resolve(func):
            parts = q.split(".")
            if len(parts) == 2 and parts[0] == "torch" and parts[1] in _ALLOCATIONS:
                return parts[1]
        return None

    def _allocates_integers(self, call: ast.Call) -> bool:
        dtype = self._keyword(call, "dtype")
        if dtype is not None:
            return self.integer_dtype(dtype, set())
        name = self._allocation_name(call.func)
        if name == "arange":  # integer arguments give int64
            return not any(isinstance(a, ast.Constant) and isinstance(a.value, float) for a in call.args)
        return False

    def _called_function(self, call: ast.Call) -> Optional[ast.AST]:
        """The module function or method (``self.m(...)``) a call runs, if the module defines it."""
        func = call.func
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            method, info = self.index.enclosing_method(call)
            if info is not None and method is not None and func.value.id == first_param(method):
                key = self.index.find_method(info.node.name, func.attr)
                node = self.index.function_node(key) if key else None
                return node if isinstance(node, _FUNCTIONS) else None
        for q in self.index.resolve(func):
            if q.startswith(LOCAL_MARK) and q.count(".") == 1:
                node = self.index.function_node(q)
                if isinstance(node, _FUNCTIONS) and node.name not in self.index.kernels:
                    return node
        return None

    def _call_yields_tensor(self, call: ast.Call, tensors: set[str], owner_self: Optional[str]) -> bool:
        func = call.func
        if isinstance(func, ast.Name) and func.id not in self.index.bound_names:
            if func.id in ELEMENT_CONTAINERS:
                return any(self.reads_tensor(a, tensors, owner_self) for a in call.args)
            return False
        callee = self._called_function(call)
        if callee is not None:
            return callee in self._returns_tensor
        for q in self.index.resolve(func):
            parts = q.split(".")
            if parts[0] == "torch":
                return (len(parts) == 2 or parts[1] in ("Tensor", "nn", "linalg", "fft", "special")) \
                    and parts[-1] not in TORCH_NON_TENSOR_RESULTS and not parts[-1][:1].isupper()
        if isinstance(func, ast.Attribute):
            if is_self(func.value, owner_self):
                return False
            if func.attr in METADATA_METHODS or func.attr in ("tolist", "item"):
                return False
            return self.reads_tensor(func.value, tensors, owner_self)
        return False


class HostValueRules:
    """The casts and scalar reads of one stretch of held code (see the module docstring)."""

    def __init__(self, values: HostValues):
        self.values = values
        self.index = values.index

    def judge(self, node: ast.AST, tensors: set[str], integers: set[str], inputs: set[str],
              self_name: Optional[str]) -> list[tuple[str, int, str]]:
        values = self.values
        found: list[tuple[str, int, str]] = []
        reads = functools.partial(values.reads_tensor, tensors=tensors, owner_self=self_name)
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id in SCALAR_CONVERSIONS \
                    and func.id not in self.index.bound_names and any(reads(a) for a in node.args):
                found.append(("host_extraction", line,
                              f"{func.id}(...) of tensor data hands it to Python in forward path"))
            elif any(q.split(".")[0] == "math" for q in self.index.resolve(func)) \
                    and any(reads(a) for a in node.args):
                found.append(("host_extraction", line,
                              f"{source(func)}(...) of tensor data computes in Python in forward path"))
            elif isinstance(func, ast.Name) and func.id in ELEMENT_JUDGES \
                    and func.id not in self.index.bound_names \
                    and any(reads(a) and not (isinstance(a, ast.Name) and a.id in inputs) for a in node.args):
                # An input as it is may be a Python number the problem passes (``min(k, 4)``):
                # judged at run time by the audit, like the casts of inputs.
                found.append(("host_extraction", line,
                              f"{func.id}(...) of tensor data judges its values in Python in forward path"))
            elif isinstance(func, ast.Attribute) and func.attr in FORMAT_METHODS and not self.index.resolve(func) \
                    and any(reads(v) for a in list(node.args) + [k.value for k in node.keywords]
                            for v in self._elements(a)):
                found.append(("host_extraction", line,
                              f".{func.attr}(...) prints tensor data into a string in forward path"))
            cast = self._integer_cast(node, integers, inputs, reads)
            if cast:
                found.append(("host_cast_compute", line, f"{cast} in forward path"))
        elif isinstance(node, (ast.If, ast.While, ast.IfExp, ast.Assert)) and reads(node.test):
            found.append(("host_extraction", line,
                          "the truth value of tensor data decides Python control flow in forward path"))
        elif isinstance(node, ast.BoolOp) and any(reads(v) for v in node.values[:-1]):
            found.append(("host_extraction", line,
                          "the truth value of tensor data decides `and`/`or` in forward path"))
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not) and reads(node.operand):
            found.append(("host_extraction", line, "`not` of tensor data in forward path"))
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) \
                and node.attr in INTEGER_CAST_METHODS | {"to", "type_as"} \
                and not self._called(node) and not self.index.resolve(node.value) \
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
            found.append(("host_cast_compute", line,
                          f"{source(node)} taken as a value (a cast called out of sight) in forward path"))
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) \
                and node.attr in INTEGER_CAST_METHODS | {"to", "type", "type_as"} and not self._called(node) \
                and any(q.startswith("torch.Tensor.") for q in self.index.resolve(node)):
            found.append(("host_cast_compute", line,
                          f"{source(node)} taken as a value (a cast called out of sight) in forward path"))
        elif isinstance(node, ast.FormattedValue) and reads(node.value):
            found.append(("host_extraction", line, "tensor data formatted into a string in forward path"))
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) and not reads(node.left) \
                and any(reads(v) for v in self._elements(node.right)):
            # Whatever the left side is named (a literal, ``fmt``, ``self.pattern``), a value that
            # is no tensor taken % tensor data is a format string or a number made a tensor op.
            found.append(("host_extraction", line, "tensor data %-formatted into a string in forward path"))
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in SCALAR_CONVERSIONS \
                and node.id not in self.index.bound_names and not self._called(node) \
                and not self._names_a_type(node):
            found.append(("host_extraction", line,
                          f"{node.id} taken as a value (a conversion called out of sight) in forward path"))
        elif isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Subscript) and values.is_integer_tensor(target.value, integers) \
                        and reads(node.value) and not values.is_integer_tensor(node.value, integers) \
                        and not values.from_input(node.value, inputs):
                    found.append(("host_cast_compute", line,
                                  f"{source(target)} = ... stores tensor data into an integer or bool "
                                  f"tensor (a cast) in forward path"))
        return found

    def _called(self, node: ast.AST) -> bool:
        parent = self.index.parents.get(node)
        return isinstance(parent, ast.Call) and parent.func is node

    @staticmethod
    def _elements(node: ast.AST) -> list[ast.AST]:
        """``node``, or the items of a tuple, list, set or dict display (keys and values)."""
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return [v for e in node.elts for v in HostValueRules._elements(e)]
        if isinstance(node, ast.Dict):
            return [v for e in list(node.keys) + list(node.values) if e is not None
                    for v in HostValueRules._elements(e)]
        if isinstance(node, ast.Starred):
            return HostValueRules._elements(node.value)
        return [node]

    def _names_a_type(self, node: ast.Name) -> bool:
        """Whether a conversion builtin named as a value stands for a type, not a conversion: an
        annotation, a type test (``isinstance(v, (int, float))``) or a dtype (``x.to(float)``,
        ``dtype=float``, an argument of a torch call)."""
        child, parent = node, self.index.parents.get(node)
        while isinstance(parent, (ast.Tuple, ast.Subscript, ast.BinOp, ast.Attribute)):
            child, parent = parent, self.index.parents.get(parent)
        if isinstance(parent, ast.arg) or (isinstance(parent, ast.AnnAssign) and parent.annotation is child):
            return True
        if isinstance(parent, _FUNCTIONS) and parent.returns is child:
            return True
        if isinstance(parent, ast.keyword):
            keyword, parent = parent, self.index.parents.get(parent)
            if keyword.arg == "dtype":
                return True
        if not isinstance(parent, ast.Call) or parent.func is child:
            return False
        func = parent.func
        if isinstance(func, ast.Name) and func.id in ("isinstance", "issubclass"):
            return True
        if any(q.split(".")[0] == "torch" for q in self.index.resolve(func)):
            return True
        return isinstance(func, ast.Attribute) and func.attr in _TYPE_TAKING_METHODS

    def _integer_cast(self, call: ast.Call, integers: set[str], inputs: set[str], reads) -> Optional[str]:
        """What makes ``call`` a cast of tensor data to an integer or bool dtype, or None."""
        values = self.values
        func = call.func
        receiver: Optional[ast.AST] = None
        method: Optional[str] = None
        args = list(call.args)
        if isinstance(func, ast.Attribute) and not self.index.resolve(func):
            receiver, method = func.value, func.attr
        elif isinstance(func, ast.Call) and isinstance(func.func, ast.Name) and func.func.id == "getattr" \
                and len(func.args) == 2 and isinstance(func.args[1], ast.Constant) \
                and not self.index.resolve(func.args[0]):
            receiver, method = func.args[0], func.args[1].value  # getattr(x, "long")()
        else:
            for q in self.index.resolve(func):
                parts = q.split(".")
                if parts[:2] == ["torch", "Tensor"] and len(parts) == 3 and args:
                    receiver, method, args = args[0], parts[2], args[1:]
                elif len(parts) == 2 and parts[0] == "torch" and parts[1] in DATA_CONVERSIONS and args \
                        and not values.from_input(args[0], inputs) \
                        and values.integer_dtype(values._keyword(call, "dtype"), integers) \
                        and reads(args[0]) and not values.is_integer_tensor(args[0], integers):
                    return f"{source(func)}(..., dtype=<integer>) converts tensor data to an integer dtype"
                elif len(parts) == 2 and parts[0] == "torch" and parts[1] in ("full", "full_like") \
                        and len(args) >= 2 and reads(args[1]) \
                        and values.integer_dtype(values._keyword(call, "dtype"), integers):
                    return f"{source(func)}(..., dtype=<integer>) fills an integer tensor with tensor data"
        if receiver is None or method is None:
            return None
        if isinstance(receiver, ast.Name) and receiver.id in ("self", "cls"):
            return None  # nn.Module.half()/.to(...): moves the module's parameters, never integers
        source_value = args[0] if method in ("copy_", "fill_", "new_full", "new_tensor") and args else receiver
        if method == "new_full" and len(args) >= 2:
            source_value = args[1]
        if values.from_input(source_value, inputs):
            return None  # judged at run time by the input's real dtype (see ``HostValues.inputs``)
        shown = f"{source(receiver)}.{method}(...)"
        receiver_integer = values.is_integer_tensor(receiver, integers)
        if method in INTEGER_CAST_METHODS and not args and not receiver_integer:
            return f"{shown} casts to an integer or bool dtype"
        if method in ("to", "type") and not receiver_integer and any(
                values.integer_dtype(a, integers) for a in args + [values._keyword(call, "dtype")]):
            return f"{shown} casts to an integer or bool dtype"
        if method == "type_as" and args and values.is_integer_tensor(args[0], integers) and not receiver_integer:
            return f"{shown} casts to an integer or bool dtype"
        if method in ("copy_", "fill_") and args and receiver_integer and reads(args[0]) \
                and not values.is_integer_tensor(args[0], integers):
            return f"{shown} copies tensor data into an integer or bool tensor (a cast)"
        if method == "new_full" and len(args) >= 2 and reads(args[1]) \
                and values.integer_dtype(values._keyword(call, "dtype"), integers):
            return f"{shown} fills an integer or bool tensor with tensor data (a cast)"
        if method == "new_tensor" and args and reads(args[0]) and not values.is_integer_tensor(args[0], integers):
            dtype = values._keyword(call, "dtype")
            if values.integer_dtype(dtype, integers) or (dtype is None and receiver_integer):
                return f"{shown} converts tensor data to an integer dtype"
        return None
