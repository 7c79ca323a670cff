"""Python that Triton's compiler refuses in a ``@triton.jit`` function, and libdevice names that
CUDA's libdevice lacks: ``interpreter_only``.

On CPU the verifier runs kernels in Triton's interpreter, which executes a ``@triton.jit`` function
as Python: ``break``, a lambda, ``abs(x)`` or ``libdevice.fast_tanhf`` run there, and the candidate
is judged correct. Compiled for a GPU, the same function goes through Triton's code generator
(``triton/compiler/code_generator.py``), which refuses them: the kernel never runs on the GPU.
This pass refuses, in every function decorated with ``triton.jit`` (however spelled) and in its
argument annotations and defaults, what the code generators of triton 3.6 and of 3.9 both refuse
wherever they reach it:

* statements without a ``visit_*`` method (``unsupported AST node type``): ``break``,
  ``continue``, ``try``, ``raise``, ``del``, ``global``, ``nonlocal``, ``import``, class
  definitions; nested function definitions; ``else`` after a ``for`` or ``while`` loop;
* expressions without one: ``lambda``, dict and set displays, dict/set comprehensions, generator
  expressions, ``yield``, ``*x`` outside a call's arguments;
* list comprehensions with several ``for`` clauses or over ``range``/``tl.range``/
  ``tl.static_range``/``tl.arange`` (only a tuple can be comprehended);
* a ``for`` loop over anything but ``range(...)``, ``tl.range(...)``, ``tl.static_range(...)``;
* ``in``/``not in`` and ``@`` (no operator method), item and attribute assignment;
* a builtin outside the compiler's own short list (``COMPILER_BUILTINS``): ``abs``, ``sum``,
  ``bool``, ``enumerate``, ``zip``, ``tuple``, ``round``, ... are ``not defined`` there;
* a ``tl.extra.libdevice``/``tl.extra.cuda.libdevice`` name that CUDA's libdevice module does not
  define (``fast_tanhf`` is in the generic stub and the HIP module only), anywhere in the module.

A ``raise`` under an ``if`` decided from constexpr values (``else: raise ValueError(...)`` after
the supported cases) is let through: the compiler reaches it only where the branch is taken, and
there the interpreter raises too. Statements after a ``return`` in the same block are skipped, as
the compiler skips them. Other constructs in a branch the compiler skips (an ``if`` on a constexpr
that is false for every launch, a ``@triton.jit`` helper nothing calls) are still refused. What
the compiler refuses only for some values (a non-constexpr f-string, ``return`` inside a loop under
a runtime condition) or only in one of the two versions (chained comparisons and ``:=``, refused by
3.6) is not judged here.
"""
from __future__ import annotations

import ast
import builtins
from typing import Iterator, Optional

from extensions.verify.static.triton_api import CUDA_LIBDEVICE_API

from .findings import Findings
from .module_index import ModuleIndex
from .scopes import Scopes
from .vocabulary import LOCAL_MARK, TRITON_JIT

FLAG = "interpreter_only"

# The builtins Triton's code generator resolves (``CodeGenerator.builtin_namespace``, 3.6 and 3.9).
COMPILER_BUILTINS = frozenset({
    "len", "list", "range", "float", "int", "isinstance", "getattr", "hasattr", "print", "min", "max",
})
PYTHON_BUILTINS = frozenset(name for name in dir(builtins) if not name.startswith("_"))

_STATEMENTS: dict[type, str] = {
    ast.Break: "`break`",
    ast.Continue: "`continue`",
    ast.Try: "`try`",
    ast.Raise: "`raise`",
    ast.Delete: "`del`",
    ast.Global: "`global`",
    ast.Nonlocal: "`nonlocal`",
    ast.Import: "`import`",
    ast.ImportFrom: "`import`",
    ast.ClassDef: "a class definition",
    ast.FunctionDef: "a nested function definition",
    ast.AsyncFunctionDef: "a nested function definition",
}
if hasattr(ast, "TryStar"):
    _STATEMENTS[ast.TryStar] = "`try`"
_EXPRESSIONS: dict[type, str] = {
    ast.Lambda: "`lambda`",
    ast.Dict: "a dict display",
    ast.Set: "a set display",
    ast.DictComp: "a dict comprehension",
    ast.SetComp: "a set comprehension",
    ast.GeneratorExp: "a generator expression",
    ast.Yield: "`yield`",
    ast.YieldFrom: "`yield from`",
}
_RANGES = frozenset({"triton.language.range", "triton.language.static_range"})
_NOT_TUPLES = _RANGES | {"triton.language.arange"}
_LIBDEVICE_NAMESPACES = ("triton.language.extra.libdevice.", "triton.language.extra.cuda.libdevice.")


def jit_functions(index: ModuleIndex) -> list[ast.AST]:
    """Every function the module compiles with ``triton.jit``: decorated (``@triton.jit``,
    ``@triton.jit(...)``, ``@jit`` imported from triton, under ``autotune``/``heuristics``) at any
    depth, or passed to a ``triton.jit(...)`` call by name."""
    found: dict[int, ast.AST] = {}
    for node in index.nodes:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for decorator in node.decorator_list:
                target = decorator.func if isinstance(decorator, ast.Call) else decorator
                if index.resolve(target) & TRITON_JIT:
                    found[id(node)] = node
        elif isinstance(node, ast.Call) and index.resolve(node.func) & TRITON_JIT:
            for arg in node.args[:1]:
                function = index.functions.get(arg.id) if isinstance(arg, ast.Name) else None
                if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    found[id(function)] = function
    return list(found.values())


class KernelLanguage:
    """Flags what only the interpreter runs: see the module docstring."""

    def __init__(self, index: ModuleIndex, findings: Findings, scopes: Optional[Scopes] = None):
        self.index = index
        self.findings = findings
        self.scopes = scopes or Scopes(index.tree, index.parents)
        self._params: set[str] = set()  # of the function being judged
        self._constexpr_params: set[str] = set()

    def run(self) -> None:
        for function in jit_functions(self.index):
            self._check_function(function)
        self._check_libdevice_names()

    # -- @triton.jit functions --

    def _check_function(self, function) -> None:
        name = function.name
        arguments = function.args
        self._constexpr_params = {arg.arg for arg in arguments.posonlyargs + arguments.args + arguments.kwonlyargs
                                  if arg.annotation is not None and self._is_constexpr(arg.annotation)}
        self._params = {arg.arg for arg in arguments.posonlyargs + arguments.args + arguments.kwonlyargs}
        for arg in arguments.args:
            if arg.annotation is not None:
                self._walk(arg.annotation, name, False)
        for default in arguments.defaults:
            self._walk(default, name, False)
        for statement in _live(function.body):
            self._walk(statement, name, False)

    def _walk(self, node: ast.AST, kernel: str, static_branch: bool) -> None:
        """``static_branch``: ``node`` is inside an ``if`` (or several) whose condition the
        compiler decides from constexpr values, so it compiles the branch only where it is taken."""
        if isinstance(node, ast.Raise) and static_branch:
            # Compiled only where the branch is taken, and there the interpreter raises too: the
            # CPU and the GPU agree (``else: raise ValueError(...)`` after constexpr cases).
            return
        if self._check(node, kernel):
            return  # refused: what is inside is not judged again
        if isinstance(node, ast.If):
            self._walk(node.test, kernel, static_branch)
            inner = static_branch or self._static_test(node.test)
            for statement in _live(node.body):
                self._walk(statement, kernel, inner)
            for statement in _live(node.orelse):
                self._walk(statement, kernel, inner)
            return
        for child in _children(node):
            self._walk(child, kernel, static_branch)

    def _is_constexpr(self, annotation: ast.expr) -> bool:
        if isinstance(annotation, ast.Constant):
            return isinstance(annotation.value, str) and annotation.value.split(".")[-1] == "constexpr"
        return any(q.split(".")[-1] == "constexpr" for q in self.index.resolve(annotation))

    def _static_test(self, test: ast.expr) -> bool:
        """Whether an ``if`` condition is decided at compile time: it reads constexpr parameters,
        module-level names (constants, ``tl.float16``), the ``dtype``/``type`` of a parameter and
        ``is None`` comparisons only, through comparisons, boolean and arithmetic operators."""
        allowed = (ast.BoolOp, ast.UnaryOp, ast.BinOp, ast.Compare, ast.Constant, ast.Name, ast.Attribute,
                   ast.Load, ast.boolop, ast.unaryop, ast.operator, ast.cmpop, ast.Tuple)
        for node in ast.walk(test):
            if not isinstance(node, allowed):
                return False
            if isinstance(node, ast.Name) and node.id in self._params and node.id not in self._constexpr_params:
                parent = self.index.parents.get(node)
                typed = isinstance(parent, ast.Attribute) and parent.attr in ("dtype", "type")
                none_test = isinstance(parent, ast.Compare) and all(isinstance(op, (ast.Is, ast.IsNot))
                                                                     for op in parent.ops)
                if not (typed or none_test):
                    return False
            elif isinstance(node, ast.Name) and node.id not in self._params \
                    and self.scopes.scope_of(node) is not self.index.tree \
                    and self._bound_in_function(node):
                return False  # a local of the kernel: a runtime value
        return True

    def _bound_in_function(self, node: ast.Name) -> bool:
        scope = self.scopes.scope_of(node)
        return node.id in self.scopes.bound.get(scope, ())

    def _refuse(self, node: ast.AST, what: str, kernel: str, why: str = "") -> bool:
        self.findings.flag(FLAG, node, f"Triton's compiler refuses {what} in a @triton.jit function "
                                       f"({kernel}){why}; only the CPU interpreter runs it")
        return True

    def _check(self, node: ast.AST, kernel: str) -> bool:
        """Flag ``node`` if the compiler refuses it; True when it was refused."""
        what = _STATEMENTS.get(type(node)) or _EXPRESSIONS.get(type(node))
        if what:
            return self._refuse(node, what, kernel)
        if isinstance(node, (ast.For, ast.While)) and node.orelse:
            return self._refuse(node, f"`else` after a `{'for' if isinstance(node, ast.For) else 'while'}` loop",
                                kernel)
        if isinstance(node, ast.For) and self._iterates_other_than_range(node.iter):
            return self._refuse(node, f"a `for` loop over {_short(node.iter)}", kernel,
                                " (it iterates only range, tl.range and tl.static_range)")
        if isinstance(node, ast.ListComp):
            if len(node.generators) > 1:
                return self._refuse(node, "a comprehension with several `for` clauses", kernel)
            if self._call_to(node.generators[0].iter, _NOT_TUPLES, builtin="range"):
                return self._refuse(node, f"a list comprehension over {_short(node.generators[0].iter)}",
                                    kernel, " (only over a tuple)")
        if isinstance(node, ast.Starred) and not self._call_argument(node):
            return self._refuse(node, "`*` unpacking outside a call's arguments", kernel)
        if isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
            return self._refuse(node, "`in`/`not in`", kernel)
        if isinstance(node, (ast.BinOp, ast.AugAssign)) and isinstance(node.op, ast.MatMult):
            return self._refuse(node, "the `@` operator", kernel, " (tl.dot multiplies matrices)")
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for sub in _target_leaves(target):
                    if isinstance(sub, ast.Subscript):
                        return self._refuse(sub, f"item assignment ({_short(sub)} = ...)", kernel)
                    if isinstance(sub, ast.Attribute):
                        return self._refuse(sub, f"attribute assignment ({_short(sub)} = ...)", kernel)
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) \
                and node.id in PYTHON_BUILTINS and node.id not in COMPILER_BUILTINS \
                and not self.scopes.is_bound(node.id, node):
            return self._refuse(node, f"the builtin `{node.id}`", kernel,
                                " (it knows only " + ", ".join(sorted(COMPILER_BUILTINS)) + ")")
        return False

    def _call_argument(self, node: ast.Starred) -> bool:
        parent = self.index.parents.get(node)
        return isinstance(parent, ast.Call) and node in parent.args

    def _call_to(self, node: ast.AST, qualified: frozenset, builtin: Optional[str] = None) -> bool:
        """Whether ``node`` is a call of one of ``qualified`` (or of the builtin ``builtin``)."""
        if not isinstance(node, ast.Call):
            return False
        func = node.func
        if builtin and isinstance(func, ast.Name) and func.id == builtin \
                and not self.scopes.is_bound(builtin, func):
            return True
        return bool(self.index.resolve(func) & qualified)

    def _iterates_other_than_range(self, iterable: ast.expr) -> bool:
        """A ``for`` loop the compiler refuses: over a value (a tuple, a name), or over a call of
        something known that is not a range (a builtin, a module function, another ``tl``
        function). A call of something unknown (a local) is given the benefit of the doubt."""
        if not isinstance(iterable, ast.Call):
            return True
        if self._call_to(iterable, _RANGES, builtin="range"):
            return False
        func = iterable.func
        if isinstance(func, ast.Name) and not self.scopes.is_bound(func.id, func):
            return True  # a builtin other than range (enumerate, zip, reversed, ...)
        return bool(self.index.resolve(func))

    # -- libdevice --

    def _check_libdevice_names(self) -> None:
        for node in self.index.nodes:
            if isinstance(node, ast.Attribute):
                parent = self.index.parents.get(node)
                if isinstance(parent, ast.Attribute) and parent.value is node:
                    continue  # the longest chain is judged
                names = self.index.resolve(node)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = {f"{node.module}.{alias.name}" for alias in node.names if alias.name != "*"}
            else:
                continue
            for q in sorted(names):
                function = _libdevice_function(q)
                if function is not None and function not in CUDA_LIBDEVICE_API:
                    self.findings.flag(FLAG, node, f"libdevice.{function} is not a function of CUDA's "
                                                   "libdevice: Triton's compiler refuses it on a GPU "
                                                   "(only the CPU interpreter computes it)")


def _libdevice_function(q: str) -> Optional[str]:
    for namespace in _LIBDEVICE_NAMESPACES:
        if q.startswith(namespace):
            rest = q[len(namespace):]
            if rest and "." not in rest and not rest.startswith("_"):
                return rest
    return None


def _live(statements: list) -> Iterator[ast.stmt]:
    """The statements of a block up to its first ``return`` (the compiler stops there)."""
    for statement in statements:
        yield statement
        if isinstance(statement, ast.Return):
            return


def _children(node: ast.AST) -> Iterator[ast.AST]:
    for _field, value in ast.iter_fields(node):
        if isinstance(value, list):
            items = [v for v in value if isinstance(v, ast.AST)]
            yield from _live(items) if items and isinstance(items[0], ast.stmt) else items
        elif isinstance(value, ast.AST):
            yield value


def _target_leaves(target: ast.expr) -> Iterator[ast.expr]:
    if isinstance(target, (ast.Tuple, ast.List)):
        for element in target.elts:
            yield from _target_leaves(element)
    elif isinstance(target, ast.Starred):
        yield from _target_leaves(target.value)
    else:
        yield target


def _short(node: ast.AST, limit: int = 40) -> str:
    try:
        text = ast.unparse(node)
    except Exception:  # noqa: BLE001 - a label only
        return type(node).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."
