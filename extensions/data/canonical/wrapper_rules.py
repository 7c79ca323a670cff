"""Wrapper-side rules: inductor's host function ``call(args)`` in the policy's plain torch.

| inductor                                             | canonical                                          |
|------------------------------------------------------|----------------------------------------------------|
| ``assert_size_stride(x, ...)``, ``assert_alignment`` | removed (their symbols bind sizes, see ``symbols``) |
| ``with torch.cuda._DeviceGuard(0):`` + ``set_device`` | the body alone                                     |
| ``stream0 = get_raw_stream(0)``, ``stream=stream0``  | removed (launches go to the current stream)        |
| ``empty_strided_cuda(size, stride, dtype)``          | ``torch.empty_strided(size, stride, dtype=..., device=out_device)`` (the first input's) |
| ``reinterpret_tensor(x, size, stride, offset)``      | ``x.as_strided(size, stride, offset)``             |
| ``k.run(a, b, n, stream=s)`` (torch 2.6+)             | ``k[grid](a, b, n, XBLOCK=.., num_warps=.., num_stages=..)`` |
| ``k[grid(n)](..., XBLOCK=128, ...)`` (KernelBook)    | ``k[(triton.cdiv(n, 128),)](..., XBLOCK=128, ...)`` |

A launch's grid follows inductor's grid types: ``Grid1D``/``Grid2D``/``Grid3D`` divide the
``xnumel``/``ynumel``/``znumel`` arguments by the block sizes, ``FixedGrid`` takes the launch's
trailing grid arguments. Other grid types (split scans, combo and cooperative kernels) drop the row.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Optional

from ..difficulty import dotted_name
from .errors import CanonicalizeError

REMOVED_CALLS = {"assert_size_stride", "assert_alignment", "get_raw_stream"}
ALLOCATORS = {"empty_strided_cuda", "empty_strided_cpu", "empty_strided", "empty_strided_xpu"}
LIBRARY_NAMESPACES = {"extern_kernels", "aten", "inductor_ops", "_quantized"}
GRID_AXES = (("xnumel", "XBLOCK"), ("ynumel", "YBLOCK"), ("znumel", "ZBLOCK"))
SUPPORTED_GRIDS = {"Grid1D", "Grid2D", "Grid3D", "FixedGrid"}


@dataclass
class LaunchConfig:
    """What an autotuned launch ran with: constexpr block sizes, warps, stages."""
    kwargs: dict[str, int] = field(default_factory=dict)
    num_warps: int = 4
    num_stages: int = 1


@dataclass
class KernelInfo:
    name: str
    params: list[str]  # runtime (non-constexpr) parameters, in order
    constexprs: list[str]  # constexpr parameters, in order
    heuristic: str = ""  # pointwise / reduction / persistent_reduction / template / "" (plain jit)
    grid_type: str = "Grid1D"
    extra_grid_args: int = 0  # FixedGrid: trailing launch arguments that are the grid
    decorator_launch: Optional[LaunchConfig] = None  # a template's num_warps/num_stages


def default_config(kernel: KernelInfo) -> LaunchConfig:
    """A launch config that is correct for any inductor kernel of this kind (block sizes change speed
    only), used when the capture did not record the autotuner's choice. Tiles of about a thousand
    elements keep the program count low, which is what the CPU interpreter's time depends on."""
    reduction = "reduction" in kernel.heuristic
    kwargs = {}
    for name in kernel.constexprs:
        if name == "XBLOCK":
            kwargs[name] = 8 if reduction else (32 if kernel.grid_type == "Grid2D" else 1024)
        elif name == "YBLOCK":
            kwargs[name] = 32
        elif name == "ZBLOCK":
            kwargs[name] = 1
        elif name.startswith("R") and name.endswith("_BLOCK"):
            kwargs[name] = 128
    return LaunchConfig(kwargs, num_warps=4, num_stages=1)


def _name(node: ast.AST) -> Optional[str]:
    return node.id if isinstance(node, ast.Name) else None


def _call_name(node: ast.AST) -> Optional[str]:
    if isinstance(node, ast.Call):
        return _name(node.func)
    return None


def _dotted(node: ast.AST) -> str:
    return dotted_name(node) or ""


def _cdiv(numel: ast.expr, block: Optional[int]) -> ast.expr:
    if block is None:
        return numel
    if isinstance(numel, ast.Constant) and isinstance(numel.value, int):
        return ast.Constant(-(-numel.value // block))
    return ast.Call(ast.Attribute(ast.Name("triton", ast.Load()), "cdiv", ast.Load()),
                    [numel, ast.Constant(block)], [])


def _launch_kwargs(config: LaunchConfig, kernel: KernelInfo) -> list[ast.keyword]:
    missing = [name for name in kernel.constexprs if name not in config.kwargs]
    if missing:
        raise CanonicalizeError("launch_config_missing", f"{kernel.name}: {missing}")
    keywords = [ast.keyword(name, ast.Constant(config.kwargs[name])) for name in kernel.constexprs]
    keywords += [ast.keyword("num_warps", ast.Constant(config.num_warps)),
                 ast.keyword("num_stages", ast.Constant(config.num_stages))]
    return keywords


class WrapperRewriter(ast.NodeTransformer):
    """Rewrites the body of ``call(args)``; ``device_arg`` names the variable holding the device
    that allocations take."""

    def __init__(self, kernels: dict[str, KernelInfo], configs: dict[str, LaunchConfig], device_arg: str):
        self.kernels = kernels
        self.configs = configs
        self.device_arg = device_arg
        self.rules: set[str] = set()

    # -- statements ---------------------------------------------------------------------------
    def visit_Expr(self, node: ast.Expr):
        if _call_name(node.value) in REMOVED_CALLS:
            self.rules.add("size_asserts" if _call_name(node.value) != "get_raw_stream" else "streams")
            return None
        if isinstance(node.value, ast.Call) and _dotted(node.value.func) in ("torch.cuda.set_device",):
            self.rules.add("device_guard")
            return None
        return self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign):
        if _call_name(node.value) == "get_raw_stream":
            self.rules.add("streams")
            return None
        return self.generic_visit(node)

    def visit_With(self, node: ast.With):
        guards = [item for item in node.items if "_DeviceGuard" in _dotted(getattr(item.context_expr, "func", item.context_expr))]
        if guards and len(guards) == len(node.items):
            self.rules.add("device_guard")
            body = []
            for statement in node.body:
                result = self.visit(statement)
                if result is None:
                    continue
                body.extend(result if isinstance(result, list) else [result])
            return body or [ast.Pass()]
        return self.generic_visit(node)

    # -- expressions --------------------------------------------------------------------------
    def visit_Call(self, node: ast.Call):
        self.generic_visit(node)
        name = _call_name(node)
        dotted = _dotted(node.func)
        if dotted.split(".")[0] in LIBRARY_NAMESPACES or dotted.startswith("torch.ops."):
            raise CanonicalizeError("library_kernel_call", dotted)
        if name in ALLOCATORS:
            return self._allocation(node)
        if name == "reinterpret_tensor":
            if len(node.args) < 3:
                raise CanonicalizeError("unsupported_wrapper_call", "reinterpret_tensor")
            self.rules.add("reinterpret_tensor")
            return ast.Call(ast.Attribute(node.args[0], "as_strided", ast.Load()), node.args[1:], node.keywords)
        if isinstance(node.func, ast.Attribute) and node.func.attr == "run" and _name(node.func.value) in self.kernels:
            return self._launch_run(node, self.kernels[node.func.value.id])
        if isinstance(node.func, ast.Subscript) and _name(node.func.value) in self.kernels:
            return self._launch_subscript(node, self.kernels[node.func.value.id])
        return node

    def _allocation(self, node: ast.Call) -> ast.Call:
        self.rules.add("allocation")
        args = list(node.args)
        keywords = {k.arg: k.value for k in node.keywords}
        if len(args) < 2:
            raise CanonicalizeError("unsupported_wrapper_call", "allocation without size and stride")
        if len(args) >= 3 and "dtype" not in keywords:
            keywords["dtype"] = args[2]
        keywords["device"] = ast.Name(self.device_arg, ast.Load())
        return ast.Call(ast.Attribute(ast.Name("torch", ast.Load()), "empty_strided", ast.Load()), args[:2],
                        [ast.keyword(k, v) for k, v in keywords.items() if k in ("dtype", "device")])

    def _launch_run(self, node: ast.Call, kernel: KernelInfo) -> ast.Call:
        """torch >= 2.6: ``kernel.run(*args, stream=s)``; the grid comes from the grid type."""
        self.rules.add("launch")
        args = list(node.args)
        if kernel.grid_type not in SUPPORTED_GRIDS:
            raise CanonicalizeError(f"unsupported_grid:{kernel.grid_type}")
        if kernel.grid_type == "FixedGrid":
            if kernel.extra_grid_args <= 0 or len(args) < kernel.extra_grid_args:
                raise CanonicalizeError("unsupported_grid:FixedGrid", kernel.name)
            grid = args[len(args) - kernel.extra_grid_args:]
            args = args[:len(args) - kernel.extra_grid_args]
        if len(args) != len(kernel.params):
            raise CanonicalizeError("launch_arity", f"{kernel.name}: {len(args)} args for {len(kernel.params)} params")
        config = kernel.decorator_launch or self.configs.get(kernel.name) or default_config(kernel)
        if kernel.grid_type != "FixedGrid":
            grid = []
            for numel_name, block_name in GRID_AXES[:int(kernel.grid_type[4])]:
                if numel_name not in kernel.params:
                    raise CanonicalizeError("unsupported_grid:no_numel", f"{kernel.name} has no {numel_name}")
                numel = args[kernel.params.index(numel_name)]
                grid.append(_cdiv(numel, config.kwargs.get(block_name)))
        grid_node = ast.Tuple(grid, ast.Load())
        return ast.Call(ast.Subscript(node.func.value, grid_node, ast.Load()), args, _launch_kwargs(config, kernel))

    def _launch_subscript(self, node: ast.Call, kernel: KernelInfo) -> ast.Call:
        """KernelBook era: ``kernel[grid(x, y)](*args, XBLOCK=.., num_warps=.., num_stages=..)``."""
        grid_call = node.func.slice
        if not (isinstance(grid_call, ast.Call) and _name(grid_call.func) == "grid"):
            if isinstance(grid_call, ast.Tuple):
                return node  # already a plain grid
            raise CanonicalizeError("unsupported_grid:" + (_dotted(getattr(grid_call, "func", grid_call)) or "expr"))
        self.rules.add("launch")
        blocks = {k.arg: k.value.value for k in node.keywords
                  if isinstance(k.value, ast.Constant) and isinstance(k.value.value, int)}
        grid = [_cdiv(numel, blocks.get(block)) for numel, (_, block) in zip(grid_call.args, GRID_AXES)]
        return ast.Call(ast.Subscript(node.func.value, ast.Tuple(grid, ast.Load()), ast.Load()), node.args,
                        [k for k in node.keywords if k.arg != "stream"])


def first_tensor_argument(body: list[ast.stmt]) -> Optional[str]:
    """The first argument that ``assert_size_stride`` describes: a tensor, whose device the
    allocations take."""
    for node in ast.walk(ast.Module(body=body, type_ignores=[])):
        if _call_name(node) == "assert_size_stride" and node.args and _name(node.args[0]):
            return node.args[0].id
    return None


def remaining_library_calls(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            dotted = _dotted(node.func)
            if dotted.split(".")[0] in LIBRARY_NAMESPACES or dotted.startswith("torch.ops."):
                found.append(dotted)
    return found
