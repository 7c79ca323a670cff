"""Static anti-cheat analysis: honest Triton solutions pass, each cheating trick is caught."""
from __future__ import annotations

import json
import re
import sys
import time

import pytest

from extensions.verify.static.extract import extract_code
from extensions.verify.static.static_check import FLAG_DESCRIPTIONS, StaticReport, static_check

HEADER = """\
import math
import torch
import torch.nn as nn
import torch.nn.functional as F
import triton
import triton.language as tl
"""

COPY_KERNEL = """
@triton.jit
def scale_kernel(x_ptr, y_ptr, n, scale, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) * scale, mask=mask)


def launch_scale(x, scale=1.0):
    x = x.contiguous()
    y = torch.empty_like(x)
    n = x.numel()
    grid = lambda meta: (triton.cdiv(n, meta["BLOCK"]),)
    scale_kernel[grid](x, y, n, scale, BLOCK=1024)
    return y
"""

# ---------------------------------------------------------------------------------------------
# Honest solutions: every one must be ok.

CORRECT = {
    "elementwise_helper": HEADER + COPY_KERNEL + """
class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        assert x.is_cuda, "needs a GPU tensor"
        return launch_scale(x, 2.0).view(x.shape)
""",
    "autotuned_matmul": HEADER + """
@triton.autotune(
    configs=[
        triton.Config({"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32}, num_warps=4),
        triton.Config({"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 32}, num_warps=8),
    ],
    key=["M", "N", "K"],
)
@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                  stride_cm, stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_ptr + rm[:, None] * stride_am + (k * BLOCK_K + rk[None, :]) * stride_ak,
                    mask=(rm[:, None] < M) & (k * BLOCK_K + rk[None, :] < K), other=0.0)
        b = tl.load(b_ptr + (k * BLOCK_K + rk[:, None]) * stride_bk + rn[None, :] * stride_bn,
                    mask=(k * BLOCK_K + rk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(a, b)
    tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc,
             mask=(rm[:, None] < M) & (rn[None, :] < N))


class ModelNew(nn.Module):
    def __init__(self):
        super(ModelNew, self).__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        assert A.shape[1] == B.shape[0], "incompatible shapes"
        M, K = A.shape
        _, N = B.shape
        C = torch.empty((M, N), device=A.device, dtype=A.dtype)
        grid = lambda meta: (triton.cdiv(M, meta["BLOCK_M"]), triton.cdiv(N, meta["BLOCK_N"]))
        matmul_kernel[grid](A, B, C, M, N, K, A.stride(0), A.stride(1), B.stride(0), B.stride(1),
                            C.stride(0), C.stride(1))
        return C
""",
    "linear_weight_from_nn_linear": HEADER + """
@triton.jit
def linear_relu_kernel(x_ptr, w_ptr, b_ptr, y_ptr, K, N, BLOCK_K: tl.constexpr):
    row = tl.program_id(0)
    col = tl.program_id(1)
    offs = tl.arange(0, BLOCK_K)
    acc = 0.0
    for k in range(0, K, BLOCK_K):
        x = tl.load(x_ptr + row * K + k + offs, mask=k + offs < K, other=0.0)
        w = tl.load(w_ptr + col * K + k + offs, mask=k + offs < K, other=0.0)
        acc += tl.sum(x * w, axis=0)
    acc += tl.load(b_ptr + col)
    tl.store(y_ptr + row * N + col, tl.maximum(acc, 0.0))


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.scale = 1.0 / math.sqrt(in_features)

    def forward(self, x):
        x = x.contiguous()
        batch, k = x.shape
        n = self.linear.weight.shape[0]
        y = torch.empty(batch, n, device=x.device, dtype=x.dtype)
        linear_relu_kernel[(batch, n)](x, self.linear.weight, self.linear.bias, y, k, n,
                                       BLOCK_K=triton.next_power_of_2(min(k, 1024)))
        return y
""",
    "softmax_rows": HEADER + """
@triton.jit
def softmax_kernel(out_ptr, in_ptr, in_stride, out_stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(in_ptr + row * in_stride + cols, mask=cols < n_cols, other=-float("inf"))
    x = x - tl.max(x, axis=0)
    num = tl.exp(x)
    tl.store(out_ptr + row * out_stride + cols, num / tl.sum(num, axis=0), mask=cols < n_cols)


class ModelNew(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype not in (torch.float16, torch.float32):
            raise ValueError(f"unsupported dtype {x.dtype}")
        x2 = x.view(-1, x.shape[-1])
        out = torch.empty_like(x2)
        n_rows, n_cols = x2.shape
        softmax_kernel[(n_rows,)](out, x2, x2.stride(0), out.stride(0), n_cols,
                                  BLOCK=triton.next_power_of_2(n_cols))
        return out.view_as(x)
""",
    "libdevice_with_import_fallback": HEADER + """
try:
    from triton.language.extra import libdevice
except ImportError:
    from triton.language.extra.cuda import libdevice


@triton.jit
def gelu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = 0.5 * x * (1.0 + libdevice.erf(x * 0.7071067811865476))
    tl.store(y_ptr + offs, y, mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        n = out.numel()
        gelu_kernel[(triton.cdiv(n, 1024),)](x, out, n, BLOCK=1024)
        return out
""",
    "autograd_function_wrapper": HEADER + COPY_KERNEL + """
class _Scale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, s):
        ctx.s = s
        return launch_scale(x, s)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.s, None


class ModelNew(nn.Module):
    def __init__(self, s: float = 3.0):
        super().__init__()
        self.s = s

    def forward(self, x):
        return _Scale.apply(x, self.s)
""",
    "module_list_of_triton_layers": HEADER + COPY_KERNEL + """
class TritonScale(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        nn.init.ones_(self.weight)

    def forward(self, x):
        return launch_scale(x, 0.5)


class ModelNew(nn.Module):
    def __init__(self, dim, depth=3):
        super().__init__()
        layers = []
        for _ in range(depth):
            layers.append(TritonScale(dim))
        self.layers = nn.ModuleList(layers)
        self.register_buffer("mask", torch.ones(dim))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x
""",
    "row_sum_with_device_context": HEADER + """
@triton.jit
def row_sum_kernel(x_ptr, out_ptr, n_cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + row * stride + cols, mask=cols < n_cols, other=0.0)
    tl.store(out_ptr + row, tl.sum(acc, axis=0))


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    @torch.no_grad()
    def forward(self, x):
        if not x.is_contiguous():
            x = x.contiguous()
        rows = x.size(0)
        out = x.new_empty((rows,))
        with torch.cuda.device(x.device):
            row_sum_kernel[(rows,)](x, out, x.shape[1], x.stride(0), BLOCK=256)
        return out.unsqueeze(1)
""",
    "cached_config_and_dataclass": """
from __future__ import annotations
import functools
from dataclasses import dataclass
from typing import Tuple
import torch
from torch import nn
import triton
import triton.language as tl


@dataclass(frozen=True)
class LaunchConfig:
    block: int
    warps: int


@functools.lru_cache(maxsize=None)
def pick_config(n: int) -> LaunchConfig:
    return LaunchConfig(block=min(4096, triton.next_power_of_2(n)), warps=4 if n < 8192 else 8)


@triton.jit
def leaky_relu_kernel(x_ptr, y_ptr, n, slope, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, tl.where(x > 0, x, x * slope), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, negative_slope: float = 0.01):
        super().__init__()
        self.negative_slope = negative_slope

    def _launch(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1)
        out = torch.empty_like(flat)
        cfg = pick_config(flat.numel())
        leaky_relu_kernel[(triton.cdiv(flat.numel(), cfg.block),)](
            flat, out, flat.numel(), self.negative_slope, BLOCK=cfg.block, num_warps=cfg.warps)
        return out.view(x.shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._launch(x)


batch_size = 16
dim = 16384


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
""",
    "kernel_via_call_form_and_self_attribute": HEADER + """
def _add_impl(a_ptr, b_ptr, c_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(c_ptr + offs, tl.load(a_ptr + offs, mask=mask) + tl.load(b_ptr + offs, mask=mask),
             mask=mask)


add_kernel = triton.jit(_add_impl)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.kernel = add_kernel
        self.block = 512

    def forward(self, a, b):
        assert a.dtype == b.dtype and a.dtype in (torch.float16, torch.bfloat16, torch.float32)
        assert a.dim() == b.dim()
        c = torch.empty_like(a)
        n = c.numel()
        self.kernel[(triton.cdiv(n, self.block),)](a, b, c, n, BLOCK=self.block)
        return c
""",
}


@pytest.mark.parametrize("name", sorted(CORRECT))
def test_honest_solution_passes(name):
    report = static_check(CORRECT[name])
    assert report.ok, report.errors
    assert report.flags == [] and report.errors == []
    assert report.kernel_names


def test_kernel_names_listed_in_definition_order():
    report = static_check(CORRECT["kernel_via_call_form_and_self_attribute"])
    assert report.kernel_names == ["add_kernel"]
    assert static_check(CORRECT["autotuned_matmul"]).kernel_names == ["matmul_kernel"]


# ---------------------------------------------------------------------------------------------
# Cheats: a template with a working kernel; each case swaps in one trick.

def cheat(forward: str, prelude: str = "", init: str = "pass", base: str = "nn.Module") -> str:
    return (HEADER + prelude + COPY_KERNEL + f"""
class ModelNew({base}):
    def __init__(self):
        super().__init__()
        {init}

    def forward(self, x):
        {forward}
""")


CHEATS = {
    # PyTorch compute and aliases
    "torch_function": (cheat("y = launch_scale(x)\n        return torch.relu(y)"), "torch_compute"),
    "functional_call": (cheat("return F.gelu(launch_scale(x))"), "torch_compute"),
    "torch_matmul": (cheat("launch_scale(x)\n        return torch.matmul(x, x)"), "library_gemm"),
    "import_as_alias": (cheat("launch_scale(x)\n        return T.matmul(x, x)",
                              prelude="import torch as T\n"), "library_gemm"),
    "from_import_alias": (cheat("launch_scale(x)\n        return mm(x, x)",
                                prelude="from torch import matmul as mm\n"), "library_gemm"),
    "functional_module_alias": (cheat("launch_scale(x)\n        return FF.softmax(x, dim=-1)",
                                      prelude="FF = torch.nn.functional\n"), "torch_compute"),
    "assigned_function_alias": (cheat("launch_scale(x)\n        fn = torch.sigmoid\n"
                                      "        return fn(x)"), "torch_compute"),
    "getattr_computed_name": (cheat('launch_scale(x)\n        op = getattr(torch, "mat" + "mul")\n'
                                    "        return op(x, x)"), "dynamic_code"),
    "getattr_literal_on_torch": (cheat('launch_scale(x)\n        return getattr(torch, "relu")(x)'),
                                 "torch_compute"),
    "tensor_method_math": (cheat("return launch_scale(x).sum(dim=-1)"), "torch_compute"),
    "tensor_add_method_on_param": (cheat("return x.add(launch_scale(x))"), "torch_compute"),
    "matmul_operator": (cheat("return launch_scale(x) @ x.t()"), "library_gemm"),
    "aten_ops": (cheat("launch_scale(x)\n        return torch.ops.aten.relu.default(x)"), "torch_compute"),
    "torch_C": (cheat("launch_scale(x)\n        return torch._C._nn.gelu(x)"), "torch_compute"),
    "submodule_conv": (cheat("return self.conv(launch_scale(x))", init="self.conv = nn.Conv2d(3, 3, 3)"),
                       "library_gemm"),
    "submodule_activation": (cheat("return self.act(launch_scale(x))", init="self.act = nn.GELU()"),
                             "torch_compute"),
    "sequential_in_loop": (cheat("for m in self.body:\n            x = m(x)\n        return launch_scale(x)",
                                 init="self.body = nn.Sequential(nn.Linear(4, 4), nn.Tanh())"),
                           "torch_compute"),
    "self_attribute_alias": (cheat("launch_scale(x)\n        return self.op(x, x)",
                                   init="self.op = torch.bmm"), "library_gemm"),
    "dict_of_ops": (cheat('launch_scale(x)\n        return OPS["act"](x)',
                          prelude='OPS = {"act": torch.tanh}\n'), "torch_compute"),
    "helper_function_computes": (cheat("launch_scale(x)\n        return helper(x)",
                                       prelude="def helper(t):\n    return torch.softmax(t, -1)\n"),
                                 "torch_compute"),
    "nested_def_computes": (cheat("def inner(t):\n            return torch.cumsum(t, 0)\n"
                                  "        launch_scale(x)\n        return inner(x)"), "torch_compute"),
    "forward_hook": (cheat("return launch_scale(x)",
                           init="self.register_forward_hook(lambda m, i, o: torch.relu(i[0]))"),
                     "torch_compute"),
    "super_forward": (cheat("launch_scale(x)\n        return super().forward(x)"), "torch_compute"),
    "numpy_via_method": (cheat("launch_scale(x)\n        return torch.as_tensor(x.cpu().numpy())"),
                         "numpy_compute"),
    "numpy_import": (cheat("launch_scale(x)\n        return torch.from_numpy(np.tanh(x.numpy()))",
                           prelude="import numpy as np\n"), "numpy_compute"),
    # reference model
    "reference_instance": (cheat("launch_scale(x)\n        return Model()(x)"), "reference_model"),
    "reference_subclass": (cheat("return super().forward(launch_scale(x))", base="Model"),
                           "reference_model"),
    "problem_import": (cheat("launch_scale(x)\n        return Ref()(x)",
                             prelude="from problem import Model as Ref\n"), "reference_model"),
    # fallback
    "try_except_fallback": (cheat("try:\n            return launch_scale(x)\n"
                                  "        except Exception:\n            return torch.relu(x)"),
                            "try_except_fallback"),
    "try_except_kernel_in_method": (cheat("try:\n            return self.fast(x)\n"
                                          "        except RuntimeError:\n            return x * 2",
                                          prelude="", init="self.fast = launch_scale"),
                                    "try_except_fallback"),
    # concurrency, streams
    "thread": (cheat("t = threading.Thread(target=launch_scale, args=(x,))\n        t.start()\n"
                     "        return launch_scale(x)", prelude="import threading\n"), "concurrency"),
    "thread_pool": (cheat("pool = ThreadPoolExecutor(2)\n        return pool.submit(launch_scale, x).result()",
                          prelude="from concurrent.futures import ThreadPoolExecutor\n"), "concurrency"),
    "subprocess": (cheat("subprocess.run(['nvidia-smi'])\n        return launch_scale(x)",
                         prelude="import subprocess\n"), "concurrency"),
    "side_stream": (cheat("s = torch.cuda.Stream()\n        with torch.cuda.stream(s):\n"
                          "            y = launch_scale(x)\n        return y"), "cuda_stream"),
    "set_stream": (cheat("torch.cuda.set_stream(torch.cuda.Stream())\n        return launch_scale(x)"),
                   "cuda_stream"),
    # monkeypatching
    "patch_allclose": (cheat("return launch_scale(x)",
                             prelude="torch.allclose = lambda *a, **k: True\n"), "monkeypatch"),
    "setattr_on_torch": (cheat("return launch_scale(x)",
                               prelude='setattr(torch, "allclose", lambda *a, **k: True)\n'), "monkeypatch"),
    "patch_triton_jit": (cheat("return launch_scale(x)", prelude="triton.jit = lambda f: f\n"),
                         "monkeypatch"),
    "patch_builtins": (cheat("return launch_scale(x)",
                             prelude="import builtins\nbuiltins.print = lambda *a: None\n"), "monkeypatch"),
    "sys_modules_write": (cheat("return launch_scale(x)",
                                prelude="import sys\nsys.modules['torch'].testing = None\n"), "monkeypatch"),
    "torch_function_override": (cheat("return launch_scale(x)",
                                      prelude="class T2(torch.Tensor):\n    @classmethod\n"
                                              "    def __torch_function__(cls, f, t, a=(), k=None):\n"
                                              "        return 0\n"), "monkeypatch"),
    "replace_forward": (cheat("return launch_scale(x)") + "\nModelNew.forward = lambda self, x: x * 1\n",
                        "monkeypatch"),
    # dynamic code, introspection, io
    "eval": (cheat('launch_scale(x)\n        return eval("torch.relu(x)")'), "dynamic_code"),
    "dunder_import": (cheat('launch_scale(x)\n        return __import__("torch").relu(x)'), "dynamic_code"),
    "globals_lookup": (cheat('launch_scale(x)\n        return globals()["Mod" + "el"]()(x)'),
                       "dynamic_code"),
    "class_dunder": (cheat("launch_scale(x)\n        return x.__class__.__mro__[0]"), "dynamic_code"),
    "importlib": (cheat('m = importlib.import_module("torch")\n        return launch_scale(x)',
                        prelude="import importlib\n"), "dynamic_code"),
    "frame_inspection": (cheat("f = sys._getframe(1)\n        return f.f_locals['expected']",
                               prelude="import sys\n"), "introspection"),
    "gc_objects": (cheat("objs = gc.get_objects()\n        return launch_scale(x)", prelude="import gc\n"),
                   "introspection"),
    "open_file": (cheat('open("/tmp/expected.txt").read()\n        return launch_scale(x)'), "io_access"),
    "torch_load": (cheat('return torch.load("/tmp/expected.pt")'), "io_access"),
    "environment": (cheat('os.environ.get("AWS_SECRET_ACCESS_KEY")\n        return launch_scale(x)',
                          prelude="import os\n"), "io_access"),
    "environment_through_torch": (cheat("e = torch.os.environ\n        return launch_scale(x)"), "io_access"),
    "forbidden_import": (cheat("return launch_scale(x)", prelude="import json\n"), "forbidden_import"),
    "star_import": (cheat("return launch_scale(x)", prelude="from torch import *\n"), "forbidden_import"),
    # kernel bodies escaping to Python (CPU interpreter only)
    "kernel_uses_torch": (HEADER + """
STASH = {}

@triton.jit
def bad_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    STASH["y"].copy_(torch.relu(STASH["x"]))


class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        STASH["x"], STASH["y"] = x, y
        bad_kernel[(1,)](x, y, x.numel(), BLOCK=16)
        return y
""", "kernel_escape"),
    # not a Triton solution
    "kernel_never_launched": (cheat("return x.clone()"), "no_kernel_launch"),
    "no_kernel_defined": (HEADER + "class ModelNew(nn.Module):\n    def forward(self, x):\n"
                          "        return x.clone()\n", "no_triton_kernel"),
    "no_modelnew": (HEADER + COPY_KERNEL + "class Solution(nn.Module):\n    def forward(self, x):\n"
                    "        return launch_scale(x)\n", "no_modelnew"),
    "syntax_error": (cheat("return launch_scale(x")[:-1], "syntax_error"),
}


@pytest.mark.parametrize("name", sorted(CHEATS))
def test_cheat_is_caught(name):
    code, flag = CHEATS[name]
    report = static_check(code)
    assert not report.ok
    assert flag in report.flags, (report.flags, report.errors)
    assert all(f in FLAG_DESCRIPTIONS for f in report.flags)
    assert report.errors and all(re.match(r"^(line \d+: |\()", e) for e in report.errors), report.errors


def test_template_without_trick_is_honest():
    assert static_check(cheat("return launch_scale(x)")).ok


def test_cheat_table_is_large_enough():
    assert len(CHEATS) >= 20


def test_errors_name_the_line():
    report = static_check(CHEATS["torch_matmul"][0])
    line = next(i for i, text in enumerate(CHEATS["torch_matmul"][0].splitlines(), 1)
                if "torch.matmul" in text)
    assert any(e.startswith(f"line {line}:") and "torch.matmul" in e for e in report.errors)


def test_library_gemm_policy_reports_instead_of_flagging():
    code = HEADER + COPY_KERNEL + """
class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        y = F.linear(x, self.proj.weight)
        y = self.proj(y)
        return launch_scale(y)
"""
    strict = static_check(code)
    assert strict.flags == ["library_gemm"] and strict.allowed_library_calls == []
    allowed = static_check(code, allow_library_gemm=True)
    assert allowed.ok, allowed.errors
    assert len(allowed.allowed_library_calls) == 2
    assert any("F.linear" in call for call in allowed.allowed_library_calls)
    # The policy covers GEMM/conv only: other PyTorch math stays a flag.
    relu = code.replace("return launch_scale(y)", "return torch.relu(launch_scale(y))")
    assert static_check(relu, allow_library_gemm=True).flags == ["torch_compute"]


def test_torch_in_init_is_not_forward_path():
    code = cheat("return launch_scale(x)",
                 init="self.w = nn.Parameter(torch.randn(4, 4).softmax(-1))\n"
                      "        nn.init.kaiming_uniform_(self.w, a=math.sqrt(5))")
    assert static_check(code).ok


def test_backward_of_autograd_function_is_not_forward_path():
    assert static_check(CORRECT["autograd_function_wrapper"].replace(
        "return grad * ctx.s, None", "return torch.mul(grad, ctx.s), None")).ok


def test_flag_vocabulary_is_documented():
    assert set(FLAG_DESCRIPTIONS) >= {
        "syntax_error", "no_modelnew", "no_triton_kernel", "no_kernel_launch", "torch_compute",
        "library_gemm", "try_except_fallback", "concurrency", "cuda_stream", "monkeypatch",
        "dynamic_code", "introspection", "io_access", "reference_model", "numpy_compute",
        "forbidden_import",
    }
    assert all(isinstance(v, str) and v for v in FLAG_DESCRIPTIONS.values())


def test_report_type():
    report = static_check(CORRECT["softmax_rows"])
    assert isinstance(report, StaticReport)


def test_fast_enough():
    codes = list(CORRECT.values()) + [code for code, _ in CHEATS.values()]
    start = time.perf_counter()
    for code in codes:
        static_check(code)
    per_candidate = (time.perf_counter() - start) / len(codes)
    assert per_candidate < 0.05, per_candidate


# ---------------------------------------------------------------------------------------------
# Calibration against real data: KernelBench references and the project's candidate fixtures.

def test_kernelbench_references_renamed_are_rejected(kernelbench_jsonl):
    """Every reference, passed off as ModelNew, is no Triton solution; all but the two whose
    math is pure tensor operators (left to the runtime audit) show PyTorch compute."""
    operator_only = {"5_Matrix_scalar_multiplication", "12_Matmul_with_diagonal_matrices_"}
    rows = [json.loads(line) for line in kernelbench_jsonl.read_text().splitlines() if line.strip()]
    assert len(rows) >= 200
    for row in rows:
        report = static_check(re.sub(r"\bModel\b", "ModelNew", row["code"]))
        assert "no_triton_kernel" in report.flags, row["name"]
        computes = {"torch_compute", "library_gemm", "numpy_compute"} & set(report.flags)
        assert computes or row["name"] in operator_only, (row["name"], report.flags)


def _candidate_folder(name: str):
    from project_paths import FIXTURES_DIR, TESTS_DIR

    if not (FIXTURES_DIR / "candidates" / name).is_dir():
        pytest.skip("candidate fixtures not present")
    if str(TESTS_DIR) not in sys.path:
        sys.path.insert(0, str(TESTS_DIR))
    from candidate_catalog import load_folder
    return load_folder(name, require_expectation=name != "kernelbench")


def test_fixture_solutions_pass():
    for candidate in _candidate_folder("kernelbench"):
        extraction = extract_code(candidate.text)
        report = static_check(extraction.code)
        assert report.ok, (candidate.name, report.errors)


def test_fixture_honest_wrong_kernels_are_not_called_cheats():
    for candidate in _candidate_folder("wrong"):
        report = static_check(extract_code(candidate.text).code)
        assert report.flags == [], (candidate.name, report.errors)


def test_fixture_cheats_expected_at_extract_stage_are_caught_statically():
    """Cheats whose expectation is rejection before anything runs must be flagged here."""
    checked = 0
    for candidate in _candidate_folder("cheats"):
        if candidate.expect_max_stage not in ("none", "extract"):
            continue  # left to the runtime stages
        report = static_check(extract_code(candidate.text).code)
        accepted = candidate.accepted_flags()
        assert not report.ok, candidate.name
        if accepted:
            assert accepted & set(report.flags), (candidate.name, report.flags)
        checked += 1
    assert checked >= 10
