"""The static allow-list: what a kernel module may import, name and call.

Each escape below is a way to run arbitrary Python in the worker (or to hide work from the runtime
audit) that a deny-list misses; each must be refused with the named flag and a message that names
the construct and its line. The honest modules use every pattern a correct Triton solution is
likely to use and must pass without any flag.
"""
from __future__ import annotations

import re

import pytest

from extensions.verify.static import policy, triton_api
from extensions.verify.static.static_check import FLAG_DESCRIPTIONS, static_check

HEADER = """\
import math
import torch
import torch.nn as nn
import triton
import triton.language as tl

@triton.jit
def copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)
"""


def module(forward: str, prelude: str = "", init: str = "pass", extra_class_body: str = "") -> str:
    """A working candidate with one construct swapped in."""
    return HEADER + prelude + f"""

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        {init}
{extra_class_body}
    def forward(self, x):
        y = torch.empty_like(x)
        copy_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        {forward}
"""


ESCAPES = {
    # builtins reached without naming them
    "builtin_self": (module("b = print.__self__\n        return b.eval('y')"), "private_access"),
    "builtins_subscript": (module("return __builtins__['eval']('y')"), "private_access"),
    "getattr_as_map_argument": (module("f = list(map(getattr, [torch], ['relu']))[0]\n        return f(y)"),
                                "forbidden_builtin"),
    "getattr_as_sort_key": (module("return sorted([y], key=getattr)[0]"), "forbidden_builtin"),
    "getattr_aliased": (module("return y", prelude="fetch = getattr\n"), "forbidden_builtin"),
    "getattr_rebound": (module("return getattr(y)", prelude="def getattr(t):\n    return t\n"),
                        "forbidden_builtin"),
    "getattr_shadowed_elsewhere_only": (
        module("return getattr(torch, 'relu')(y)",
               prelude="def unrelated(getattr):\n    return getattr\n"), "forbidden_builtin"),
    "vars_lookup": (module("return vars(torch)['relu'](y)"), "forbidden_builtin"),
    "type_mro_walk": (module("return type(y).mro()[-1]"), "forbidden_builtin"),
    "object_subclasses": (module("k = object.__subclasses__()\n        return y"), "private_access"),
    "unknown_builtin": (module("return memoryview(y)"), "forbidden_builtin"),
    "input_builtin_unshadowed": (module("input('?')\n        return y"), "forbidden_builtin"),
    "hasattr_private_name": (module("return y if hasattr(y, '__dict__') else x"), "forbidden_builtin"),
    "format_field_access": (module("s = '{0.__class__}'.format(y)\n        return y"), "private_access"),
    # private and dunder attributes
    "function_globals": (module("return copy_kernel.fn.__globals__['torch'].relu(x)"), "private_access"),
    "module_private_state": (module("self._forward_hooks.clear()\n        return y"), "private_access"),
    "torch_private_module": (module("return torch._C._nn.gelu(y)"), "private_access"),
    "generator_frame": (module("g = (v for v in [1])\n        f = g.gi_frame.f_builtins\n        return y"),
                        "private_access"),
    "dunder_method_defined": (module("return y", extra_class_body="    def __getattr__(self, n):\n"
                                                                  "        return n\n"), "private_access"),
    "import_as_dunder": (module("return y", prelude="import math as __loader__\n"), "private_access"),
    "module_getattr": (module("return y", prelude="def __getattr__(name):\n    return torch.relu\n"),
                       "private_access"),
    # attribute chains outside the public API
    "triton_runtime_driver": (module("d = triton.runtime.driver.active\n        return y"), "forbidden_api"),
    "torch_os_through_chain": (module("return y", prelude="E = torch.nn.modules.module.torch.os.environ\n"),
                               "forbidden_api"),
    "tl_extra_pkgutil": (module("m = tl.extra.pkgutil\n        return y"), "forbidden_api"),
    "libdevice_core": (module("return y", prelude="from triton.language.extra import libdevice\n"
                                                  "CORE = libdevice.core\n"), "forbidden_api"),
    "cpp_extension": (module("return y", prelude="L = torch.utils.cpp_extension.load_inline\n"),
                      "forbidden_api"),
    "from_triton_import_runtime": (module("return y", prelude="from triton import runtime\n"),
                                   "forbidden_api"),
    "typing_evaluates_strings": (module("return y", prelude="import typing\nH = typing.get_type_hints\n"),
                                 "forbidden_api"),
    "cuda_event_timer": (module("e = torch.cuda.Event(enable_timing=True)\n        return y"),
                         "forbidden_api"),
    "kernel_function_replaced": (module("return y", prelude="copy_kernel.fn = lambda *a: None\n"),
                                 "forbidden_api"),
    "unknown_context_manager": (module("with torch.autograd.profiler.record_function('k'):\n"
                                       "            return y"), "forbidden_api"),
    "nn_module_method_redefined": (module("return y", extra_class_body="    def to(self, *args):\n"
                                                                      "        return self\n"),
                                   "forbidden_api"),
    "tensor_subclass": (module("return y", prelude="class T(torch.Tensor):\n    pass\n"), "forbidden_api"),
    # modules held as values: every public attribute of a module is reachable from there
    "module_passed_to_function": (module("return y", prelude="def reach(m):\n    return m.os\n"
                                                             "OS = reach(torch.cuda)\n"), "forbidden_api"),
    "module_in_tuple": (module("return y", prelude="PAIR = (torch.backends, 0)\nOS = PAIR[0].os\n"),
                        "forbidden_api"),
    "module_bound_by_loop": (module("return y", prelude="for NS in (torch.cuda,):\n    E = NS.os\n"),
                             "forbidden_api"),
    "module_as_lambda_default": (module("return y", prelude="L = lambda m=torch.cuda: m.importlib\n"),
                                 "forbidden_api"),
    "module_stored_on_self": (module("return y", init="self.spaces = [tl]"), "forbidden_api"),
    "module_alias_passed_on": (module("return y", prelude="C = torch.cuda\nE = list(map(len, [C]))\n"),
                               "forbidden_api"),
    "module_as_class_attribute": (module("return y", prelude="class Holder:\n    ns = torch.cuda\n"
                                                             "E = Holder.ns.os.environ\n"), "forbidden_api"),
    "module_alias_as_class_attribute": (module("return y", prelude="NS = torch.cuda\n",
                                               extra_class_body="    ns = NS\n"), "forbidden_api"),
    "wildcard_namespace_module": (module("return y", prelude="W = torch.nn.init.warnings.sys\n"),
                                  "forbidden_api"),
    "format_pattern_built_at_run_time": (module("s = ('{0._' + '_class_' + '_}').format(y)\n        return y"),
                                         "private_access"),
    # code that runs without being called by name
    "module_decorator": (module("return helper(y)", prelude="def deco(f):\n    return f\n\n"
                                                             "@deco\ndef helper(t):\n    return t\n"),
                         "hidden_code"),
    "default_argument_call": (module("return y", prelude="def helper(t, k=math.floor(2.5)):\n"
                                                         "    return t\n"), "hidden_code"),
    "class_body_call": (module("return y", extra_class_body="    table = dict(a=1)\n"), "hidden_code"),
    "metaclass_keyword": (module("return y", prelude="class Meta(nn.Module, metaclass=object):\n"
                                                     "    pass\n"), "hidden_code"),
    # forward rules reach what forward reaches indirectly
    "lambda_in_table": (module("return OPS[0](y)", prelude="OPS = [lambda t: t.clamp(min=0)]\n"),
                        "torch_compute"),
    "nested_def_stored_on_self": (module("return self.act(y)",
                                         init="def act(t):\n            return torch.relu(t)\n"
                                              "        self.act = act"), "torch_compute"),
    "method_stored_in_dict": (module("return self.table['a'](y)", init="self.table = {'a': self.helper}",
                                     extra_class_body="    def helper(self, t):\n"
                                                      "        return t.exp()\n"), "torch_compute"),
    "type_rebound_at_module_level": (module("return y", prelude="type = type\nG = type('G', (), {})\n"),
                                     "forbidden_builtin"),
    "match_class_pattern": (module("match copy_kernel:\n            case object(fn=f):\n"
                                   "                return y\n        return y"), "forbidden_api"),
    "for_target_patches_module": (module("return y", prelude="for triton.jit in [lambda f: f]:\n    pass\n"),
                                  "forbidden_api"),
    "kernel_cache_read": (module("c = copy_kernel.cache\n        return y"), "forbidden_api"),
    "setup_context_computes": (module("return Fn.apply(y)", prelude="""
class Fn(torch.autograd.Function):
    @staticmethod
    def forward(t):
        return t

    @staticmethod
    def setup_context(ctx, inputs, output):
        output.copy_(inputs[0].clamp(min=0))
"""), "torch_compute"),
    "protocol_method_never_named": (module("return y", prelude="""
class FakeCompiled:
    def run(self, *args):
        return torch.relu(args[0])
"""), "torch_compute"),
    "host_extraction": (module("v = [max(a, 0.0) for a in y.tolist()]\n        return y"), "host_extraction"),
    "item_in_forward": (module("s = y.sum().item()\n        return y"), "host_extraction"),
    "grid_object": (module("return y", prelude="class G:\n    def __init__(self, n):\n        self.n = n\n"
                                                "\ndef launch(x, y):\n"
                                                "    copy_kernel[G(x.numel())](x, y, x.numel(), BLOCK=8)\n"),
                    "unsafe_grid"),
    "grid_lambda_returns_object": (module("return y", prelude="def launch(x, y):\n"
                                                              "    copy_kernel[lambda m: x](x, y, 1, BLOCK=8)\n"),
                                   "unsafe_grid"),
    # values of a kind outside the vocabulary: their attributes are not name-resolved
    "module_returned_by_a_function": (module("return y", init="self.env = torch.get_device_module('cuda').os.environ"),
                                      "forbidden_api"),
    "importlib_of_a_returned_module": (
        module("return y", init="m = torch.get_device_module('cuda')\n        m.importlib.import_module('ctypes')"),
        "forbidden_api"),
    "storage_from_file": (module("return y", init="s = torch.zeros(1).untyped_storage().from_file('f', False, 8)"),
                          "forbidden_api"),
    "storage_type_imports_by_name": (module("return y", init="torch.zeros(1).untyped_storage().type('os.system')"),
                                     "forbidden_api"),
    "numpy_array_in_init": (module("return y", init="torch.zeros(2).numpy().tofile('f')"), "forbidden_api"),
    "tensor_method_value_storage": (module("return y", init="s = torch.Tensor.untyped_storage(torch.zeros(1))"),
                                    "forbidden_api"),
    "own_name_does_not_unlock": (module("return y", init="self.untyped_storage = 1\n        self.from_file = 2\n"
                                        "        t = torch.zeros(1)\n        t.untyped_storage().from_file('f', False, 8)"),
                                 "forbidden_api"),
    "kernel_object_reached_through_a_list": (module("return y", init="self.k = [copy_kernel][0].fn"),
                                             "forbidden_api"),
    "module_compile_method": (module("return y", init="self.act = nn.ReLU()\n        self.act.compile()"),
                              "forbidden_api"),
    "self_compile_method": (module("return y", init="self.compile()"), "forbidden_api"),
    "torch_file_writer_class": (module("return y", init="torch.PyTorchFileWriter('f').write_end_of_file()"),
                                "forbidden_api"),
    "torch_fork_thread": (module("return torch.wait(torch.fork(torch.empty_like, y))"), "forbidden_api"),
    "interpreter_handle_in_kernel": (module("return y", prelude="""
@triton.jit
def leak_kernel(x_ptr, n, BLOCK: tl.constexpr):
    v = tl.load(x_ptr + tl.arange(0, BLOCK))
    v.handle.data.tofile("f")
"""), "forbidden_api"),
}


@pytest.mark.parametrize("name", sorted(ESCAPES))
def test_escape_is_refused(name):
    code, flag = ESCAPES[name]
    report = static_check(code)
    assert flag in report.flags, (report.flags, report.errors)
    assert all(re.match(r"^(line \d+: |\()", e) for e in report.errors), report.errors


def test_values_of_known_kinds_keep_their_api():
    """Attributes of tensors, layers, configs, dtypes, containers, Triton values and the module's
    own objects stay allowed on values whose kind is not resolved."""
    code = module("""b = self.cfg.block
        info = torch.finfo(x.dtype).eps + torch.iinfo(torch.int32).max
        d = x.device.type, x.dtype.itemsize, x.shape[0], x.T.contiguous().stride(0)
        w = self.lin.weight.shape, self.lin.in_features, self.lin.scale_buf.shape
        keys = list({"a": 1}.items()) + " ".join(["a", "b"]).split()
        c = triton.Config({"BLOCK": 8}, num_warps=4).kwargs
        z = x.contiguous(memory_format=torch.contiguous_format), torch.strided, torch.float16, torch.inf
        return y""", prelude="""
class Cfg:
    def __init__(self):
        self.block = 8


@triton.jit
def typed_kernel(x_ptr, n, BLOCK: tl.constexpr):
    v = tl.load(x_ptr + tl.arange(0, BLOCK))
    w = v.to(tl.float32).sum(axis=0)
    z = x_ptr.dtype.element_ty
""", init="self.cfg = Cfg()\n        self.lin = nn.Linear(2, 2)\n"
                                  "        self.lin.register_buffer('scale_buf', torch.ones(2))")
    report = static_check(code)
    assert report.ok, report.errors


def test_refusals_name_the_construct_and_line():
    code = module("b = len.__self__\n        return y")
    line = next(i for i, text in enumerate(code.splitlines(), 1) if "len.__self__" in text)
    report = static_check(code)
    assert f"line {line}: attribute '__self__' of a builtin is not allowed" in report.errors
    report = static_check(module("return y", prelude="D = triton.runtime.driver\n"))
    assert any("triton.runtime.driver is not part of the allowed API" in e for e in report.errors)


HONEST = HEADER + '''
import itertools
from typing import Optional, Tuple
from triton.language.extra import libdevice

torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.allow_tf32 = True
_DEFAULT_BLOCK = 1024


@triton.autotune(configs=[triton.Config({"BLOCK": block}, num_warps=warps)
                          for block, warps in itertools.product([256, 512], [4, 8])], key=["n"])
@triton.heuristics({"EVEN": lambda args: args["n"] % args["BLOCK"] == 0})
@triton.jit
def gelu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    offs = tl.program_id(axis=0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    y = 0.5 * x * (1.0 + libdevice.erf(x * 0.7071067811865476)) + tl.math.exp(x) * 0.0
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=offs < n)


def init_weight(weight: torch.Tensor) -> None:
    nn.init.kaiming_uniform_(weight, a=math.sqrt(5))


class ModelNew(nn.Module):
    """Bias-free GELU."""

    def __init__(self, dim: int, eps: float = 1e-5, dtype=torch.float32):
        super(ModelNew, self).__init__()
        self.weight = nn.Parameter(torch.empty(dim, dim, dtype=dtype))
        self.register_buffer("scale", torch.ones(dim))
        self._block = _DEFAULT_BLOCK
        self.eps = eps
        init_weight(self.weight)
        self.reset_parameters()
        self.apply(self._init_linear)
        self.apply(lambda m: nn.init.zeros_(m.bias) if isinstance(m, nn.Linear) else None)

    def reset_parameters(self) -> None:
        nn.init.normal_(self.scale, std=0.02)
        fan_in, _ = nn.init._calculate_fan_in_and_fan_out(self.weight)
        bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
        nn.init.uniform_(self.scale, -bound, bound)

    def _init_linear(self, module):
        if isinstance(module, nn.Linear):
            nn.init.zeros_(module.bias)

    @property
    def block(self) -> int:
        return self._block

    @staticmethod
    def _grid(n: int, block: int) -> Tuple[int]:
        return (triton.cdiv(n, block),)

    def _launch(self, x: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        if out is None:
            out = torch.empty_like(x)
        n = x.numel()

        def grid(meta):
            return (triton.cdiv(n, meta["BLOCK"]),)

        gelu_kernel[grid](x, out, n)
        copy_kernel[self._grid(n, self.block)](x, out, n, BLOCK=self.block)
        copy_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]), 1, 1)](x, out, n, BLOCK=256)
        rows = (n,) if n < 4096 else (triton.cdiv(n, 2), 2)
        copy_kernel[rows](x, out, n, BLOCK=256)
        copy_kernel[tuple([triton.cdiv(n, 256)])](x, out, n, BLOCK=256)
        return out

    @torch.no_grad()
    def forward(self, input: torch.Tensor) -> torch.Tensor:
        assert input.is_contiguous(), f"expected contiguous input, got strides {input.stride()}"
        x = input.reshape(-1)
        if x.dtype not in (torch.float16, torch.float32):
            raise TypeError(f"unsupported dtype {x.dtype}")
        with torch.cuda.device(x.device):
            y = self._launch(x)
        shape = [int(s) for s in input.shape]
        return y.view(*shape)


def get_inputs():
    return [torch.randn(16, 1024)]


def get_init_inputs():
    return [1024]
'''


def test_honest_module_with_common_patterns_passes():
    report = static_check(HONEST)
    assert report.ok, report.errors
    assert report.kernel_names == ["copy_kernel", "gelu_kernel"]


def test_every_allow_list_flag_is_documented():
    assert {"forbidden_builtin", "private_access", "forbidden_api", "hidden_code", "unsafe_grid",
            "host_extraction"} <= set(FLAG_DESCRIPTIONS)


@pytest.mark.parametrize("name", [
    "torch.empty_like", "torch.nn.functional.relu", "torch.nn.init.kaiming_uniform_",
    "torch.nn.Parameter", "torch.autograd.Function", "torch.backends.cuda.matmul.allow_tf32",
    "triton.autotune", "triton.Config", "triton.language.extra.libdevice.erf",
    "triton.language.extra.cuda.libdevice.tanh", "triton.language.math.exp", "math.sqrt",
])
def test_public_kernel_api_is_allowed(name):
    assert policy.api_name_allowed(name)


@pytest.mark.parametrize("name", [
    "torch._C", "torch.ops.aten.relu", "torch.library", "torch.overrides", "torch.os.environ",
    "torch.utils.cpp_extension", "torch.cuda.Stream", "torch.nn.modules.module",
    "triton.runtime.driver", "triton.knobs", "triton.language.core", "triton.language.extra.pkgutil",
    "torch.compile", "torch.initial_seed", "torch.default_generator", "torch.get_rng_state",
    "triton.language.math.core", "triton.language.math.wraps", "triton.language.load.fn",
    "functools.wraps", "os.environ",
])
def test_internal_modules_are_not_api(name):
    assert not policy.api_name_allowed(name)


def test_allowed_imports_are_exact_modules():
    assert policy.import_allowed("triton.language.extra.cuda.libdevice")
    assert not policy.import_allowed("triton.runtime")
    assert not policy.import_allowed("triton.runtime.driver")
    assert not policy.import_allowed("torch.utils")


def test_triton_api_lists_name_no_module_of_the_installed_triton():
    """The listed tl/libdevice names are functions and dtypes here, never a module that could
    lead to the standard library."""
    import types

    tl = pytest.importorskip("triton.language")
    from triton.language.extra.cuda import libdevice

    for namespace, names in ((tl, triton_api.TRITON_LANGUAGE_API), (tl.math, triton_api.TRITON_MATH_API),
                             (libdevice, triton_api.TRITON_MATH_API)):
        for name in names:
            assert not isinstance(getattr(namespace, name, None), types.ModuleType), name


def test_module_aliases_and_attribute_chains_pass():
    """Naming a module to reach its functions, or aliasing it to a plain name, is how kernels are
    written; only holding a module as a value is refused."""
    code = module("return y", prelude=(
        "import torch.nn.functional as F\n"
        "FUNCTIONAL = torch.nn.functional\n"
        "try:\n    from triton.language.extra import libdevice\n"
        "except ImportError:\n    libdevice = tl.math\n"
        "@triton.jit\ndef erf_kernel(x_ptr, n, BLOCK: tl.constexpr):\n"
        "    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)\n"
        "    tl.store(x_ptr + offs, libdevice.erf(tl.load(x_ptr + offs, mask=offs < n)), mask=offs < n)\n"))
    report = static_check(code)
    assert report.ok, report.errors
    assert not policy.names_module("torch.nn.init.normal_")
    assert policy.names_module("torch.nn.init.warnings")
    assert not policy.api_name_allowed("torch.nn.init.warnings")
    assert policy.api_name_allowed("torch.nn.init.kaiming_uniform_")


def test_block_pointers_pass_the_static_check():
    """tl.make_block_ptr and tl.advance are the kernel language's block-pointer API (a GEMM walks K
    with advance); refusing advance was a false reject of such kernels."""
    code = module("return y", prelude=(
        "@triton.jit\ndef tile_kernel(x_ptr, n, BLOCK: tl.constexpr):\n"
        "    ptr = tl.make_block_ptr(x_ptr, shape=(n,), strides=(1,), offsets=(0,), block_shape=(BLOCK,), order=(0,))\n"
        "    ptr = tl.advance(ptr, (BLOCK,))\n"
        "    tl.store(ptr, tl.load(ptr, boundary_check=(0,)), boundary_check=(0,))\n"))
    report = static_check(code)
    assert report.ok, report.errors
