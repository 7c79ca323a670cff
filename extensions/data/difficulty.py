"""Difficulty levels 1/2/3 from the structure of a PyTorch module (no execution).

The labeller reads the module's AST and counts what its ``forward`` (plus every helper method it
calls) and ``__init__`` compute:

* level 3, an architecture: several learned layers (two or more GEMM/convolution layers), layer
  containers (``nn.Sequential``, ``nn.ModuleList``), loops building or running layers, submodule
  classes of its own, recurrent or attention blocks, state carried across calls, or a long forward;
* level 2, a fusion chain: one main operator (GEMM, matmul, convolution) followed by further
  elementwise or reduction operators, or a long elementwise chain without a main operator;
* level 1, a single operator (possibly spelled as a short expression, like a loss).

``label_difficulty`` is the entry point; ``analyse_module`` exposes the counts it decided on.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Optional

# Learned GEMM / convolution layers and the functional forms of the same operators.
MAIN_LAYER_MODULES = frozenset({
    "Linear", "Bilinear", "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d",
    "ConvTranspose3d", "LazyLinear", "LazyConv1d", "LazyConv2d", "LazyConv3d",
})
MAIN_FUNCTIONS = frozenset({
    "matmul", "mm", "bmm", "addmm", "baddbmm", "einsum", "linear", "conv1d", "conv2d", "conv3d",
    "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "mv", "tensordot", "bilinear",
})
# Blocks that are whole architectures on their own.
ARCHITECTURE_MODULES = frozenset({
    "RNN", "LSTM", "GRU", "RNNCell", "LSTMCell", "GRUCell", "MultiheadAttention", "Transformer",
    "TransformerEncoder", "TransformerDecoder", "TransformerEncoderLayer", "TransformerDecoderLayer",
})
CONTAINER_MODULES = frozenset({"Sequential", "ModuleList", "ModuleDict", "ParameterList"})
# Calls that move, view, allocate or describe data: they are not compute operators.
NON_COMPUTE_CALLS = frozenset({
    "view", "reshape", "permute", "transpose", "contiguous", "unsqueeze", "squeeze", "flatten",
    "unflatten", "expand", "expand_as", "view_as", "reshape_as", "size", "dim", "numel", "to",
    "type", "float", "half", "double", "long", "int", "bool", "cpu", "cuda", "detach", "clone",
    "t", "T", "chunk", "split", "unbind", "narrow", "select", "item", "tolist", "empty",
    "empty_like", "zeros", "zeros_like", "ones", "ones_like", "full", "full_like", "arange",
    "tensor", "as_tensor", "randn", "rand", "randn_like", "rand_like", "Size", "stride",
    "is_contiguous", "copy_", "fill_", "zero_", "new_zeros", "new_empty", "new_ones", "Tensor",
    "movedim", "repeat", "get_device", "data_ptr", "no_grad",
})
# Operators that only select part of a matrix another operator produces (triangular masks).
STRUCTURAL_FUNCTIONS = frozenset({"tril", "triu", "diag", "diag_embed", "diagonal"})
BINARY_OPERATORS = {
    ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "div", ast.FloorDiv: "floordiv",
    ast.Mod: "mod", ast.Pow: "pow", ast.MatMult: "matmul",
}
FUNCTIONAL_ROOTS = frozenset({"torch", "F", "functional", "nn", "math"})

LONG_FORWARD_OPS = 10  # operator applications in one forward that make it an architecture
LONG_CHAIN_DISTINCT = 5  # distinct operators without a main op that make a fusion chain


@dataclass
class ModuleAnalysis:
    """What the labeller counted in one module."""

    class_name: str
    distinct_ops: set[str] = field(default_factory=set)
    op_applications: int = 0
    main_ops: set[str] = field(default_factory=set)
    learned_main_layers: int = 0  # GEMM/conv layers built in __init__
    architecture_signals: list[str] = field(default_factory=list)

    @property
    def level(self) -> int:
        if self.architecture_signals:
            return 3
        chain_ops = self.distinct_ops - self.main_ops - STRUCTURAL_FUNCTIONS
        if self.main_ops and chain_ops:
            return 2
        if not self.main_ops and len(chain_ops) >= LONG_CHAIN_DISTINCT:
            return 2
        return 1


def dotted_name(node: ast.AST) -> Optional[str]:
    """``torch.nn.functional.relu`` -> that string; None for anything not a plain dotted name."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _module_constructor(call: ast.Call) -> Optional[str]:
    """``nn.Conv2d(...)`` / ``torch.nn.Conv2d(...)`` -> "Conv2d"."""
    name = dotted_name(call.func)
    if name and (name.startswith("nn.") or name.startswith("torch.nn.")) and name.split(".")[-1][:1].isupper():
        return name.split(".")[-1]
    return None


def _is_module_class(node: ast.ClassDef) -> bool:
    # Helper classes usually derive from nn.Module, sometimes from another helper class.
    return bool(node.bases)


def _is_host_constant(node: ast.AST) -> bool:
    """Literals and ``math.*`` values: arithmetic on them is folded on the host, not a kernel op."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.BinOp):
        return _is_host_constant(node.left) and _is_host_constant(node.right)
    if isinstance(node, ast.Call):
        return (dotted_name(node.func) or "").startswith("math.") and all(map(_is_host_constant, node.args))
    return (dotted_name(node) or "").startswith("math.")


class _ForwardOps(ast.NodeVisitor):
    """Collects operator applications in a method, following ``self.helper(...)`` calls."""

    def __init__(self, analysis: ModuleAnalysis, methods: dict[str, ast.FunctionDef],
                 submodules: dict[str, str], module_functions: dict[str, ast.FunctionDef]):
        self.analysis = analysis
        self.methods = methods
        self.submodules = submodules
        self.module_functions = module_functions
        self.visited: set[str] = set()

    def _record(self, op: str) -> None:
        self.analysis.distinct_ops.add(op)
        self.analysis.op_applications += 1
        if op in MAIN_FUNCTIONS or op in MAIN_LAYER_MODULES:
            self.analysis.main_ops.add(op)

    def visit_method(self, name: str) -> None:
        if name in self.visited or name not in self.methods:
            return
        self.visited.add(name)
        for stmt in self.methods[name].body:
            self.visit(stmt)

    def visit_function(self, name: str) -> None:
        key = f"function:{name}"
        if key in self.visited:
            return
        self.visited.add(key)
        for stmt in self.module_functions[name].body:
            self.visit(stmt)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        op = BINARY_OPERATORS.get(type(node.op))
        if op and not (_is_host_constant(node.left) and _is_host_constant(node.right)):
            self._record(op)
        self.generic_visit(node)

    def visit_For(self, node: ast.For) -> None:
        self.analysis.architecture_signals.append("loop in forward")
        self.generic_visit(node)

    visit_While = visit_For

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            if (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                    and target.value.id == "self"):
                self.analysis.architecture_signals.append(f"state self.{target.attr} updated in forward")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = dotted_name(func)
        if name and name.startswith("self.") and name.count(".") == 1:
            attr = name.split(".", 1)[1]
            if attr in self.submodules:
                self._record(self.submodules[attr])
            elif attr in self.methods:
                self.visit_method(attr)
        elif isinstance(func, ast.Name) and func.id in self.module_functions:
            self.visit_function(func.id)
        elif isinstance(func, ast.Attribute):
            op = func.attr
            root = (name or "").split(".")[0]
            if root == "math":
                pass  # constants folded on the host
            elif op not in NON_COMPUTE_CALLS:
                constructor = _module_constructor(node)
                self._record(constructor or op)
        self.generic_visit(node)


def _find_class(tree: ast.Module, class_name: Optional[str]) -> Optional[ast.ClassDef]:
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef)]
    for candidate in (class_name, "Model"):
        for node in classes:
            if node.name == candidate:
                return node
    module_classes = [n for n in classes if _is_module_class(n)]
    return module_classes[-1] if module_classes else None


def analyse_module(source: str, class_name: Optional[str] = None) -> ModuleAnalysis:
    """Count the operators and structure of ``class_name`` (default ``Model``) in ``source``.

    Raises SyntaxError when the source does not parse and ValueError when no module class exists.
    """
    tree = ast.parse(source)
    cls = _find_class(tree, class_name)
    if cls is None:
        raise ValueError(f"no nn.Module class {class_name or 'Model'!r} in source")
    analysis = ModuleAnalysis(class_name=cls.name)

    other_classes = [n.name for n in tree.body if isinstance(n, ast.ClassDef) and n is not cls
                     and _is_module_class(n)]
    if other_classes:
        analysis.architecture_signals.append(f"submodule classes {sorted(other_classes)}")

    methods = {n.name: n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    module_functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)
                        and n.name not in ("get_inputs", "get_init_inputs")}
    submodules: dict[str, str] = {}
    init = methods.get("__init__")
    if init is not None:
        for node in ast.walk(init):
            if isinstance(node, (ast.For, ast.While, ast.ListComp, ast.GeneratorExp)):
                analysis.architecture_signals.append("loop in __init__")
            if isinstance(node, ast.Call):
                constructor = _module_constructor(node)
                if constructor in MAIN_LAYER_MODULES:
                    analysis.learned_main_layers += 1
                if constructor in CONTAINER_MODULES:
                    analysis.architecture_signals.append(f"container nn.{constructor}")
                if constructor in ARCHITECTURE_MODULES:
                    analysis.architecture_signals.append(f"block nn.{constructor}")
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                constructor = _module_constructor(node.value)
                for target in node.targets:
                    if (constructor and isinstance(target, ast.Attribute)
                            and isinstance(target.value, ast.Name) and target.value.id == "self"):
                        submodules[target.attr] = constructor
    if analysis.learned_main_layers >= 2:
        analysis.architecture_signals.append(f"{analysis.learned_main_layers} GEMM/conv layers")

    walker = _ForwardOps(analysis, methods, submodules, module_functions)
    walker.visit_method("forward")
    if analysis.op_applications >= LONG_FORWARD_OPS:
        analysis.architecture_signals.append(f"{analysis.op_applications} operator applications")
    return analysis


def label_difficulty(source: str, class_name: Optional[str] = None) -> int:
    """The difficulty level (1, 2 or 3) of the module ``class_name`` (default ``Model``)."""
    return analyse_module(source, class_name).level
