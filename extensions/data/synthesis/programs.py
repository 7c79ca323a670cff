"""KernelBench-like PyTorch programs, drawn from a seed: the inputs of the synthesizer.

Each program is a KernelBench-form module (``class Model``, ``get_inputs()``, ``get_init_inputs()``)
whose sizes are module-level constants, so the verifier tries it at other shapes and the kernels
inductor compiles for it (with dynamic shapes) must hold at those shapes too. Float hyperparameters
(slopes, eps, scales) and window sizes are written as literals where they are used: the verifier
varies module-level constants and constructor arguments, and a kernel compiled for ``0.2`` is
right only for ``0.2``. Sizes within a program are distinct (no two dimensions equal), because
inductor would otherwise be free to treat them as one symbol.

Families: elementwise chains, activations, short programs (one or two operations: what a one-op
problem's kernel looks like), reductions over any axis, norms, softmax family, scans, pooling,
broadcasting, GEMM and convolution with epilogues, in fp32, fp16 and bf16.
"""
from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import Callable

FAMILIES = ("elementwise", "activation", "short", "reduction", "norm", "softmax", "scan", "pooling",
            "broadcast", "gemm", "conv")
# Families whose main op inductor hands to a library unless asked for its Triton templates.
TEMPLATE_FAMILIES = ("gemm", "conv")


@dataclass(frozen=True)
class Program:
    name: str  # family_index, unique within a draw
    family: str
    source: str
    uses_templates: bool  # compile with inductor's Triton GEMM/conv templates

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()[:16]


# unary ops: (template over {x}, needs positive input)
UNARY = [
    ("torch.relu({x})", False), ("torch.sigmoid({x})", False), ("torch.tanh({x})", False),
    ("F.gelu({x})", False), ("F.gelu({x}, approximate='tanh')", False), ("F.silu({x})", False),
    ("F.mish({x})", False), ("F.softplus({x})", False), ("F.elu({x}, alpha={a})", False),
    ("F.leaky_relu({x}, {s})", False), ("F.hardtanh({x}, -{b}, {b})", False), ("F.hardswish({x})", False),
    ("F.hardsigmoid({x})", False), ("torch.exp(-torch.abs({x}))", False), ("torch.abs({x})", False),
    ("torch.sin({x})", False), ("torch.cos({x})", False), ("torch.clamp({x}, min=-{b}, max={b})", False),
    ("torch.sqrt(torch.abs({x}) + {e})", False), ("torch.log1p(torch.abs({x}))", False),
    ("torch.erf({x})", False), ("{x} * {c}", False), ("{x} + {c}", False), ("torch.square({x})", False),
    ("F.selu({x})", False), ("F.relu6({x})", False), ("torch.rsqrt(torch.abs({x}) + {e})", False),
    ("F.softsign({x})", False), ("torch.floor({x} * {c})", False), ("torch.sign({x})", False),
]
BINARY = ["{a} + {b}", "{a} - {b}", "{a} * {b}", "torch.maximum({a}, {b})", "torch.minimum({a}, {b})",
          "torch.where({a} > {b}, {a}, {b} * {c})", "{a} * torch.sigmoid({b})", "{a} / (torch.abs({b}) + {e})"]
REDUCTIONS = [
    ("torch.sum({x}, dim={d})", "float"), ("torch.mean({x}, dim={d})", "float"),
    ("torch.amax({x}, dim={d})", "float"), ("torch.amin({x}, dim={d})", "float"),
    ("torch.var({x}, dim={d})", "float32"), ("torch.std({x}, dim={d})", "float32"),
    ("torch.logsumexp({x}, dim={d})", "float32"), ("torch.norm({x}, p=2, dim={d})", "float32"),
    ("torch.argmax({x}, dim={d})", "float"), ("torch.argmin({x}, dim={d})", "float"),
    ("torch.sum(torch.abs({x}), dim={d})", "float"), ("torch.mean({x} * {x}, dim={d})", "float32"),
]
DIM_NAMES = ["batch_size", "dim1", "dim2", "dim3"]


def _lit(rng: random.Random, low: float, high: float) -> str:
    return f"{rng.uniform(low, high):.3g}"


def _unary(rng: random.Random, x: str) -> str:
    template, _ = rng.choice(UNARY)
    return template.format(x=x, a=_lit(rng, 0.5, 1.5), s=_lit(rng, 0.01, 0.3), b=_lit(rng, 0.5, 3.0),
                           e=_lit(rng, 1e-3, 1e-1), c=_lit(rng, 0.5, 2.5))


def _binary(rng: random.Random, a: str, b: str) -> str:
    return rng.choice(BINARY).format(a=a, b=b, c=_lit(rng, 0.1, 0.9), e=_lit(rng, 0.1, 1.0))


def _sizes(rng: random.Random, rank: int, total: int) -> list[int]:
    """``rank`` distinct sizes >= 2 whose product is near ``total``."""
    while True:
        sizes = [rng.choice([2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32]) for _ in range(rank - 1)]
        rest = max(3, total // max(1, _prod(sizes)))
        last = max(3, int(rest * rng.uniform(0.6, 1.4)))
        sizes.append(last)
        if rank >= 2:
            sizes[-1], sizes[-2] = sizes[-2], sizes[-1]
            sizes[rng.randrange(rank)] = max(3, rng.choice([33, 47, 64, 96, 100, 127, 128, 200, 256, 300, 512]))
        if len(set(sizes)) == rank and all(s >= 2 for s in sizes):
            return sizes


def _prod(values: list[int]) -> int:
    out = 1
    for v in values:
        out *= v
    return out


def _dtype(rng: random.Random) -> str:
    return rng.choices(["", ", dtype=torch.float16", ", dtype=torch.bfloat16"], weights=[6, 1, 1])[0]


def _distinct(constants: dict[str, int]) -> dict[str, int]:
    """Bump repeated sizes until every constant differs (equal sizes may share one symbol)."""
    seen: set[int] = set()
    out = {}
    for name, value in constants.items():
        while value in seen:
            value += 1
        seen.add(value)
        out[name] = value
    return out


def _module(constants: dict[str, int], init: str, forward_args: list[str], forward_body: str,
            inputs: list[str], init_inputs: str = "[]") -> str:
    constants = _distinct(constants)
    lines = ["import torch", "import torch.nn as nn", "import torch.nn.functional as F", ""]
    lines += [f"{name} = {value}" for name, value in constants.items()]
    lines += ["", "", "class Model(nn.Module):"]
    lines += ["    def __init__(self" + (", " + ", ".join(_init_params(init)) if _init_params(init) else "") + "):",
              "        super().__init__()"]
    lines += [f"        {line}" for line in init.splitlines() if line.strip() and not line.startswith("#")]
    lines += ["", f"    def forward(self, {', '.join(forward_args)}):"]
    lines += [f"        {line}" for line in forward_body.splitlines()]
    lines += ["", "", "def get_inputs():", f"    return [{', '.join(inputs)}]", "", "",
              "def get_init_inputs():", f"    return {init_inputs}", ""]
    return "\n".join(lines)


def _init_params(init: str) -> list[str]:
    for line in init.splitlines():
        if line.startswith("#params "):
            return line[len("#params "):].split()
    return []


def _shape_call(names: list[str], dtype: str) -> str:
    return f"torch.randn({', '.join(names)}{dtype})"


def _elementwise(rng: random.Random) -> tuple[str, bool]:
    rank = rng.randint(2, 4)
    sizes = _sizes(rng, rank, rng.choice([4096, 16384, 65536, 262144]))
    names = DIM_NAMES[:rank]
    dtype = _dtype(rng)
    n_inputs = rng.randint(1, 3)
    args = ["x", "y", "z"][:n_inputs]
    expr = args[0]
    for _ in range(rng.randint(1, 3)):
        expr = _unary(rng, expr)
    for other in args[1:]:
        expr = _binary(rng, expr, _unary(rng, other) if rng.random() < 0.5 else other)
    if rng.random() < 0.5:
        expr = _unary(rng, expr)
    body = f"return {expr}"
    return _module(dict(zip(names, sizes)), "", args, body, [_shape_call(names, dtype)] * n_inputs), False


def _activation(rng: random.Random) -> tuple[str, bool]:
    rank = rng.randint(2, 3)
    names = DIM_NAMES[:rank]
    sizes = _sizes(rng, rank, rng.choice([16384, 65536, 262144]))
    return _module(dict(zip(names, sizes)), "", ["x"], f"return {_unary(rng, 'x')}",
                   [_shape_call(names, _dtype(rng))]), False


SCALAR_STEPS = ["{x} * {c}", "{x} + {c}", "{x} - {c}", "{x} / {c}", "{c} - {x}"]


def _scalar_step(rng: random.Random, x: str) -> str:
    return rng.choice(SCALAR_STEPS).format(x=x, c=_lit(rng, 0.2, 3.0))


def _short(rng: random.Random) -> tuple[str, bool]:
    """One or two operations on one input of rank 1-4: a model trained only on long chains writes
    long chains for a one-op problem, so these show the kernel such a problem needs. The
    operation pairs are many (30 unary ops, 5 scalar steps, either order, or two unary ops), so
    they survive the near-duplicate rule that single activations mostly do not."""
    rank = rng.randint(1, 4)
    names = DIM_NAMES[:rank]
    sizes = _sizes(rng, rank, rng.choice([4096, 16384, 65536, 262144])) if rank > 1 else \
        [rng.choice([1000, 4096, 5000, 16384, 65537])]
    shape = rng.choice(["unary_then_scalar", "scalar_then_unary", "unary_unary", "reduce_scalar"])
    if shape == "unary_then_scalar":
        expr = _scalar_step(rng, _unary(rng, "x"))
    elif shape == "scalar_then_unary":
        expr = _unary(rng, f"({_scalar_step(rng, 'x')})")
    elif shape == "unary_unary":
        expr = _unary(rng, _unary(rng, "x"))
    else:
        template, _ = rng.choice(REDUCTIONS[:4])
        expr = _scalar_step(rng, template.format(x="x", d=rng.randrange(rank)))
    return _module(dict(zip(names, sizes)), "", ["x"], f"return {expr}",
                   [_shape_call(names, _dtype(rng))]), False


def _reduction(rng: random.Random) -> tuple[str, bool]:
    rank = rng.randint(2, 4)
    names = DIM_NAMES[:rank]
    sizes = _sizes(rng, rank, rng.choice([8192, 32768, 131072]))
    template, kind = rng.choice(REDUCTIONS)
    axis = rng.randrange(rank) if rng.random() < 0.6 else rank - 1
    pre = _unary(rng, "x") if rng.random() < 0.5 else "x"
    dtype = _dtype(rng) if kind == "float" else ""
    body = f"return {template.format(x=pre, d=axis)}"
    if "argm" in template:
        body = f"return {template.format(x=pre, d=axis)}"
    elif rng.random() < 0.4:
        body = f"return {_unary(rng, template.format(x=pre, d=axis))}"
    return _module(dict(zip(names, sizes)), "", ["x"], body, [_shape_call(names, dtype)]), False


def _norm(rng: random.Random) -> tuple[str, bool]:
    kind = rng.choice(["layer", "rms", "group", "l2"])
    if kind == "group":
        groups = rng.choice([2, 4, 8])
        channels = groups * rng.choice([3, 4, 6, 8])
        sizes = {"batch_size": rng.choice([4, 8, 16]), "height": rng.choice([12, 16, 20, 28]),
                 "width": rng.choice([9, 17, 24, 31])}
        init = f"self.norm = nn.GroupNorm({groups}, {channels}, eps={_lit(rng, 1e-6, 1e-4)})"
        body = f"return {_unary(rng, 'self.norm(x)') if rng.random() < 0.5 else 'self.norm(x)'}"
        return _module(sizes, init, ["x"], body,
                       [f"torch.randn(batch_size, {channels}, height, width)"]), False
    rank = rng.randint(2, 3)
    names = DIM_NAMES[:rank - 1] + ["features"]
    sizes = _sizes(rng, rank, rng.choice([16384, 65536]))
    constants = dict(zip(names, sizes))
    eps = _lit(rng, 1e-6, 1e-4)
    if kind == "layer":
        # The functional form with the shape read from x: nn.LayerNorm keeps its size as a Python int,
        # which inductor compiles in, and the verifier varies it.
        init = "#params features\nself.weight = nn.Parameter(torch.randn(features))\nself.bias = nn.Parameter(torch.randn(features))"
        normed = f"F.layer_norm(x, x.shape[-1:], self.weight, self.bias, {eps})"
        body = f"return {normed}" if rng.random() < 0.5 else f"return {_unary(rng, normed)}"
        return _module(constants, init, ["x"], body, [_shape_call(names, "")], "[features]"), False
    if kind == "rms":
        init = "#params features\nself.weight = nn.Parameter(torch.randn(features))"
        body = f"scale = torch.rsqrt(torch.mean(x * x, dim=-1, keepdim=True) + {eps})\nreturn x * scale * self.weight"
        return _module(constants, init, ["x"], body, [_shape_call(names, "")], "[features]"), False
    body = f"return x / (torch.norm(x, p=2, dim=-1, keepdim=True) + {eps})"
    return _module(constants, "", ["x"], body, [_shape_call(names, "")]), False


def _softmax(rng: random.Random) -> tuple[str, bool]:
    rank = rng.randint(2, 3)
    names = DIM_NAMES[:rank]
    sizes = _sizes(rng, rank, rng.choice([8192, 32768, 131072]))
    axis = rng.choice([-1, rng.randrange(rank)])
    op = rng.choice(["torch.softmax", "torch.log_softmax", "softmin"])
    x = f"x * {_lit(rng, 0.3, 3.0)}" if rng.random() < 0.5 else "x"
    if op == "softmin":
        expr = f"F.softmin({x}, dim={axis})"
    else:
        expr = f"{op}({x}, dim={axis})"
    if rng.random() < 0.3:
        expr = _unary(rng, expr)
    return _module(dict(zip(names, sizes)), "", ["x"], f"return {expr}",
                   [_shape_call(names, _dtype(rng) if op != "torch.log_softmax" else "")]), False


def _scan(rng: random.Random) -> tuple[str, bool]:
    rank = rng.randint(2, 3)
    names = DIM_NAMES[:rank]
    sizes = _sizes(rng, rank, rng.choice([4096, 16384, 65536]))
    axis = rng.randrange(rank)
    pre = _unary(rng, "x") if rng.random() < 0.5 else "x"
    expr = f"torch.cumsum({pre}, dim={axis})"
    return _module(dict(zip(names, sizes)), "", ["x"], f"return {expr}", [_shape_call(names, "")]), False


def _pooling(rng: random.Random) -> tuple[str, bool]:
    kernel = rng.choice([2, 3])
    stride = rng.choice([kernel, 1, 2])
    sizes = {"batch_size": rng.choice([2, 4, 8]), "channels": rng.choice([3, 6, 16, 24]),
             "height": rng.choice([16, 20, 28, 33]), "width": rng.choice([17, 24, 30, 40])}
    op = rng.choice(["F.max_pool2d", "F.avg_pool2d"])
    expr = f"{op}(x, {kernel}, stride={stride})"
    if rng.random() < 0.4:
        expr = _unary(rng, expr)
    return _module(sizes, "", ["x"], f"return {expr}", ["torch.randn(batch_size, channels, height, width)"]), False


def _broadcast(rng: random.Random) -> tuple[str, bool]:
    names = ["batch_size", "features"]
    sizes = _sizes(rng, 2, rng.choice([16384, 65536]))
    constants = dict(zip(names, sizes))
    kind = rng.choice(["row", "col", "param"])
    if kind == "param":
        init = "#params features\nself.scale = nn.Parameter(torch.randn(features))\nself.shift = nn.Parameter(torch.randn(features))"
        body = f"return {_unary(rng, 'x * self.scale + self.shift')}"
        return _module(constants, init, ["x"], body, [_shape_call(names, "")], "[features]"), False
    other = "torch.randn(features)" if kind == "row" else "torch.randn(batch_size, 1)"
    body = f"return {_binary(rng, 'x', 'y')}"
    return _module(constants, "", ["x", "y"], body, [_shape_call(names, ""), other]), False


def _gemm(rng: random.Random) -> tuple[str, bool]:
    constants = {"batch_size": rng.choice([16, 32, 48, 64, 100, 128]),
                 "in_features": rng.choice([32, 64, 96, 128, 200, 256]),
                 "out_features": rng.choice([24, 40, 64, 80, 160, 192])}
    if len(set(constants.values())) < 3:
        constants["out_features"] += 8
    kind = rng.choice(["linear", "linear", "matmul"])
    epilogue = (lambda e: _unary(rng, e)) if rng.random() < 0.8 else (lambda e: e)
    if kind == "linear":
        init = "#params in_features out_features\nself.linear = nn.Linear(in_features, out_features)"
        body = f"return {epilogue('self.linear(x)')}"
        return _module(constants, init, ["x"], body, ["torch.randn(batch_size, in_features)"],
                       "[in_features, out_features]"), True
    body = f"return {epilogue('torch.matmul(a, b)')}"
    return _module(constants, "", ["a", "b"], body,
                   ["torch.randn(batch_size, in_features)", "torch.randn(in_features, out_features)"]), True


def _conv(rng: random.Random) -> tuple[str, bool]:
    constants = {"batch_size": rng.choice([2, 4, 8]), "in_channels": rng.choice([3, 4, 8]),
                 "out_channels": rng.choice([6, 12, 16]), "height": rng.choice([16, 20, 24]),
                 "width": rng.choice([17, 21, 30])}
    kernel = rng.choice([1, 3])
    init = (f"#params in_channels out_channels\nself.conv = nn.Conv2d(in_channels, out_channels, {kernel})")
    body = f"return {_unary(rng, 'self.conv(x)')}"
    return _module(constants, init, ["x"], body, ["torch.randn(batch_size, in_channels, height, width)"],
                   "[in_channels, out_channels]"), True


BUILDERS: dict[str, Callable[[random.Random], tuple[str, bool]]] = {
    "elementwise": _elementwise, "activation": _activation, "short": _short, "reduction": _reduction, "norm": _norm,
    "softmax": _softmax, "scan": _scan, "pooling": _pooling, "broadcast": _broadcast, "gemm": _gemm,
    "conv": _conv,
}
# Draw weights: the cheap, varied families most; templates (slow to autotune) least.
WEIGHTS = {"elementwise": 16, "activation": 6, "short": 24, "reduction": 18, "norm": 10, "softmax": 8, "scan": 4,
           "pooling": 6, "broadcast": 8, "gemm": 6, "conv": 3}


def draw_programs(count: int, seed: int, families: tuple[str, ...] = FAMILIES) -> list[Program]:
    """``count`` programs, the same for the same seed; program ``i`` depends on (seed, i) only, so a
    larger count extends a smaller one."""
    programs = []
    names = [f for f in FAMILIES if f in families]
    weights = [WEIGHTS[f] for f in names]
    for index in range(count):
        rng = random.Random(f"{seed}:{index}")
        family = rng.choices(names, weights=weights)[0]
        source, templates = BUILDERS[family](rng)
        programs.append(Program(f"{family}_{index:05d}", family, source, templates))
    return programs
