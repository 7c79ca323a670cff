"""Casts and scalar reads through which PyTorch or Python does a task's math in allowed calls.

A cast of a floating tensor to an integer or bool dtype truncates or compares (``host_cast_compute``):
refused here where the module shows the tensor is its own (a kernel's output, a parameter), and at
run time by the audit where it is an input whose dtype only the problem knows. A few ``float()``/``int()``/``bool()`` reads of tensor elements stay under
the runtime audit's host-extraction limit and let Python finish a reduction (``host_extraction``).
Every spelling below must be refused; the honest forms next to them (shape and size reads, Python
attributes, float casts, widening an integer buffer the module allocated) must pass.
"""
from __future__ import annotations

import pytest

from extensions.verify.static.static_check import FLAG_DESCRIPTIONS, static_check

HEADER = """\
import math
import torch
import torch.nn as nn
import triton
import triton.language as tl

INDEX_DTYPE = torch.int32

@triton.jit
def copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


def launch_copy(src, dst):
    copy_kernel[(triton.cdiv(src.numel(), 1024),)](src, dst, src.numel(), BLOCK=1024)
    return dst
"""


def module(forward: str, extra_class_body: str = "", init: str = "self.scale = 2.0") -> str:
    """A candidate whose forward (of input ``x``) is ``forward``, after a kernel copied x into y."""
    return HEADER + f"""

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        {init}
{extra_class_body}
    def forward(self, x):
        y = launch_copy(x, torch.empty_like(x))
        {forward}
"""


CASTS = {
    "to_int64": "return launch_copy(y.to(torch.int64), torch.empty(y.shape, dtype=torch.int64))",
    "to_dtype_keyword": "z = y.to(dtype=torch.int32)\n        return launch_copy(z, torch.empty_like(z))",
    "to_device_and_dtype": "z = y.to(y.device, torch.long)\n        return launch_copy(z, torch.empty_like(z))",
    "to_aliased_dtype": "z = y.to(INDEX_DTYPE)\n        return launch_copy(z, torch.empty_like(z))",
    "to_python_int": "z = y.to(int)\n        return launch_copy(z, torch.empty_like(z))",
    "to_bool": "return launch_copy(y.to(torch.bool), torch.empty(y.shape, dtype=torch.bool))",
    "long": "z = y.long()\n        return launch_copy(z, torch.empty_like(z))",
    "int_then_float": "z = y.int().float()\n        return launch_copy(z, torch.empty_like(z))",
    "short": "z = y.short()\n        return launch_copy(z, torch.empty_like(z))",
    "byte": "z = y.byte()\n        return launch_copy(z, torch.empty_like(z))",
    "char": "z = y.char()\n        return launch_copy(z, torch.empty_like(z))",
    "bool": "z = y.bool()\n        return launch_copy(z, torch.empty_like(z))",
    "type_dtype": "z = y.type(torch.int64).to(y.dtype)\n        return launch_copy(z, torch.empty_like(z))",
    "type_string": "z = y.type('torch.LongTensor')\n        return launch_copy(z, torch.empty_like(z))",
    "tensor_class_method": "z = torch.Tensor.long(y)\n        return launch_copy(z, torch.empty_like(z))",
    "tensor_class_to": "z = torch.Tensor.to(y, torch.int64)\n        return launch_copy(z, torch.empty_like(z))",
    "to_other_integer_tensor": "idx = torch.empty(y.shape, dtype=torch.int64)\n"
                               "        return launch_copy(y.to(idx), idx)",
    "to_integer_tensor_dtype": "idx = torch.zeros(y.shape, dtype=torch.int64)\n"
                               "        return launch_copy(y.to(idx.dtype), idx)",
    "type_as_integer_tensor": "idx = torch.empty(y.shape, dtype=torch.int64)\n"
                              "        return launch_copy(y.type_as(idx), idx)",
    "copy_into_integer_buffer": "buf = torch.empty(y.shape, dtype=torch.long)\n        buf.copy_(y)\n"
                                "        return launch_copy(buf, torch.empty_like(buf))",
    "copy_into_integer_view": "buf = torch.empty_like(y, dtype=torch.int32)\n        flat = buf.view(-1)\n"
                              "        flat.copy_(y.view(-1))\n        return launch_copy(buf, torch.empty_like(buf))",
    "copy_into_fresh_integer_allocation": "z = torch.empty(y.shape, dtype=torch.int64).copy_(y)\n"
                                          "        return launch_copy(z, torch.empty_like(z))",
    "slice_assign_into_integer_buffer": "buf = y.new_empty(y.shape, dtype=torch.int64)\n        buf[...] = y\n"
                                        "        return launch_copy(buf, torch.empty_like(buf))",
    "as_tensor_with_integer_dtype": "z = torch.as_tensor(y, dtype=torch.int64)\n"
                                    "        return launch_copy(z, torch.empty_like(z))",
    "new_tensor_with_integer_dtype": "z = y.new_tensor(y, dtype=torch.bool)\n"
                                     "        return launch_copy(z, torch.empty_like(z))",
    "cast_in_helper_method": "return self.widen(y)",
    "dtype_in_literal_kwargs": "z = y.to(**{'dtype': torch.int64})\n        return launch_copy(z, torch.empty_like(z))",
    "bound_method_stored": "cast = y.long\n        z = cast()\n        return launch_copy(z, torch.empty_like(z))",
    "bound_to_stored": "cast = y.to\n        z = cast(torch.int64)\n        return launch_copy(z, torch.empty_like(z))",
    "tensor_class_method_mapped": "z = list(map(torch.Tensor.bool, [y]))[0]\n"
                                  "        return launch_copy(z, torch.empty_like(z))",
    "getattr_literal": "z = getattr(y, 'long')()\n        return launch_copy(z, torch.empty_like(z))",
    "tensor_class_to_partial": "import functools\n        cast = functools.partial(torch.Tensor.to, dtype=torch.int64)\n"
                               "        z = cast(y)\n        return launch_copy(z, torch.empty_like(z))",
    "copy_into_integer_buffer_attribute": "self.codes.copy_(y.view(-1)[:8])\n"
                                          "        return launch_copy(self.codes, torch.empty_like(self.codes))",
    "copy_into_registered_integer_buffer": "self.ids.copy_(y.view(-1)[:8])\n"
                                           "        return launch_copy(self.ids, torch.empty_like(self.ids))",
    "fill_integer_buffer_with_element": "buf = torch.zeros(1, dtype=torch.int64)\n        buf.fill_(y.view(-1)[0])\n"
                                        "        return launch_copy(buf, torch.empty_like(buf))",
    "full_with_integer_dtype": "z = torch.full((1,), y.view(-1)[0], dtype=torch.int64)\n"
                               "        return launch_copy(z, torch.empty_like(z))",
}
CAST_INIT = ("self.codes = torch.empty(8, dtype=torch.int64)\n"
             "        self.register_buffer('ids', torch.zeros(8, dtype=torch.long))")
CAST_HELPER = """
    def widen(self, t):
        z = t.long()
        return launch_copy(z, torch.empty_like(z))
"""

SCALAR_READS = {
    "float_of_element": "s = float(y[0]) + float(y[1])\n        return launch_copy(torch.full((1,), s), y[:1])",
    "int_of_element": "k = int(y[0])\n        return y[:k]",
    "bool_of_element": "return y if bool(y[0]) else x",
    "float_of_whole_tensor": "part = y[:1]\n        s = float(part)\n        return y * 0 + s",
    "float_of_parameter": "return y if float(self.w) > 0 else x",
    "float_of_tensor_attribute": "launch_copy(y.view(-1)[:2], self.partial)\n"
                                 "        return y * 0 + float(self.partial[0])",
    "float_through_view": "s = float(y.view(-1)[0])\n        return launch_copy(torch.full((1,), s), y[:1])",
    "float_of_loop_element": "s = 0.0\n        for v in y[:4]:\n            s += float(v)\n        return y",
    "float_of_listed_elements": "s = sum(float(v) for v in list(y[:4]))\n        return y",
    "float_in_helper_parameter": "return self.total(y)",
    "float_of_helper_result": "return float(self.partials(x)[0]) * y",
    "math_on_elements": "s = math.fsum(y[:4])\n        return y",
    "math_sqrt_of_element": "s = math.sqrt(y[0])\n        return y",
    "if_on_element": "if y[0]:\n            return y\n        return x",
    "while_on_element": "while y[0]:\n            break\n        return y",
    "and_on_element": "return y[0] and y",
    "not_of_element": "return x if not y[0] else y",
    "str_of_element": "s = str(y[0])\n        return y",
    "fstring_of_element": "s = f'{y[0]}'\n        return y",
    "round_of_element": "k = round(y[0])\n        return y",
    "str_format_method": "s = float('{:.9e}'.format(y[0]))\n        return y",
    "str_format_keyword": "s = '{v}'.format(v=y[0])\n        return y",
    "str_format_map": "s = '{v}'.format_map({'v': y[0]})\n        return y",
    "percent_format": "texts = ['%.9e' % v for v in y[:4]]\n        return y",
    "percent_format_tuple": "s = '%e %e' % (y[0], y[1])\n        return y",
    "percent_format_named": "fmt = '%.9e'\n        s = fmt % y[1]\n        return y",
    "map_float": "s = sum(map(float, y[:4]))\n        return y",
    "map_str": "s = list(map(str, y[:4]))\n        return y",
    "conversion_stored": "conv = float\n        s = conv(y[0])\n        return y",
    "sorted_key_float": "s = sorted(range(4), key=float)\n        return y",
    "max_of_elements": "m = max(y[:4])\n        return y",
    "sorted_elements": "m = sorted(y[:4])\n        return y",
    "any_of_elements": "return y if any(y[:4]) else x",
    "filter_of_elements": "kept = list(filter(None, y[:4]))\n        return y",
}
READ_HELPERS = """
    def total(self, partial):
        return float(partial[0]) + float(partial[1])

    def partials(self, t):
        out = torch.empty(2, device=t.device)
        launch_copy(t.view(-1)[:2], out)
        return out
"""

HONEST = {
    "shape_reads": "n = int(x.shape[0])\n        m = int(x.size(1)) if x.dim() > 1 else 1\n"
                   "        k = int(x.numel())\n        s = int(x.stride(0))\n        return y",
    "shape_loop": "outer = 1\n        for size in x.shape[:-1]:\n            outer *= int(size)\n"
                  "        return y",
    "shape_locals": "dims = x.shape\n        rows = int(dims[0])\n        sizes = list(x.size())\n"
                    "        cols = int(sizes[-1])\n        return y",
    "python_attribute": "scale = float(self.scale)\n        return launch_copy(y, torch.empty_like(y))",
    "cdiv_of_sizes": "grid = (triton.cdiv(int(x.numel()), 1024),)\n        return y",
    "len_and_dim": "if len(x.shape) == 2 and x.dim() == 2:\n            return y\n        return y",
    "float_casts": "h = x.half()\n        f = h.float()\n        b = x.to(torch.bfloat16).to(torch.float32)\n"
                   "        d = x.double().to(x.dtype)\n        return launch_copy(f, torch.empty_like(y)).to(x.dtype)",
    "to_device_and_float_dtype": "z = x.to(x.device, torch.float32)\n        w = x.to(dtype=y.dtype)\n"
                                 "        return launch_copy(z, torch.empty_like(w))",
    "widen_integer_buffer": "idx = torch.empty(x.shape, dtype=torch.int32, device=x.device)\n"
                            "        launch_copy(x, idx)\n        return idx.long()",
    "widen_aliased_integer_buffer": "idx = torch.empty(x.shape, dtype=INDEX_DTYPE)\n"
                                    "        launch_copy(x, idx)\n        return idx.to(torch.int64)",
    "integer_buffer_view_widened": "idx = x.new_empty(x.shape, dtype=torch.int32)\n        launch_copy(x, idx)\n"
                                   "        return idx.view(-1).to(torch.int64).view(x.shape)",
    "integer_from_helper_widened": "return self.indices(x).long()",
    "arange_index_widened": "pos = torch.arange(x.shape[0], device=x.device)\n        return pos.long()",
    "copy_between_integer_buffers": "a = torch.empty(x.shape, dtype=torch.int32)\n"
                                    "        b = torch.empty(x.shape, dtype=torch.int64)\n        b.copy_(a)\n"
                                    "        return y",
    "copy_into_float_buffer": "z = torch.empty(x.shape, dtype=torch.float32)\n        z.copy_(y)\n        return z",
    "none_checks": "bias = None\n        if bias is not None and not x.is_contiguous():\n            return y\n"
                   "        return y if x.is_cuda or x.numel() > 0 else x",
    "module_half": "if self.training:\n            return y\n        return y",
    "type_query": "kind = x.type()\n        return y",
    "constant_tensor": "t = torch.tensor([0, 1], dtype=torch.int64)\n        return y",
    "shape_tensor": "dims = torch.tensor(x.shape, dtype=torch.int64)\n        return y",
    "print_of_size": "print(f'{x.shape} {int(x.numel())}')\n        return y",
    "integer_attribute_widened": "launch_copy(x, self.codes)\n        return self.codes.long()",
    "scalar_attributes": "a = float(self.scale) * int(self.count)\n        return y",
    "type_tests_and_dtypes": "ok = isinstance(self.scale, (int, float)) and issubclass(bool, int)\n"
                             "        z = x.to(float)\n        w = torch.empty(2, dtype=float)\n"
                             "        return launch_copy(y, torch.empty_like(y))",
    "annotated_locals": "n: int = int(x.numel())\n        f: 'float' = 1.0\n        return self.annotated(y)",
    "format_of_sizes": "tag = '{}x{}'.format(x.shape[0], int(x.numel()))\n"
                       "        note = '%d rows' % x.shape[0]\n        return y",
    "max_of_sizes": "block = max(16, min(1024, x.numel()))\n        dims = sorted(x.shape)\n"
                    "        ok = all(d > 0 for d in x.shape)\n        return y",
    "dtype_names": "masks = torch.empty(x.shape, dtype=torch.bool)\n        ids = torch.zeros(4, dtype=torch.long)\n"
                   "        on_gpu = x.device.type == 'cuda'\n        return y",
}
HONEST_HELPERS = """
    def annotated(self, t: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return t
    def indices(self, t):
        out = torch.empty(t.shape, dtype=torch.int32, device=t.device)
        launch_copy(t, out)
        return out
"""


@pytest.mark.parametrize("name", sorted(CASTS))
def test_integer_cast_in_forward_is_refused(name):
    helper = CAST_HELPER if "self.widen" in CASTS[name] else ""
    report = static_check(module(CASTS[name], extra_class_body=helper, init=CAST_INIT))
    assert "host_cast_compute" in report.flags, (name, report.flags, report.errors)
    assert any("integer" in e or "cast" in e for e in report.errors), report.errors


def test_the_helper_cast_alone_is_refused():
    report = static_check(module("return self.widen(y)", extra_class_body=CAST_HELPER, init=CAST_INIT))
    assert "host_cast_compute" in report.flags, report.errors


@pytest.mark.parametrize("cast", ["x.long()", "x.to(torch.int32)", "x.view(-1).bool().view(x.shape)",
                                  "torch.as_tensor(x, dtype=torch.int8)"])
def test_casts_of_forward_inputs_are_left_to_the_runtime_audit(cast):
    """An input's dtype is the problem's: a bool mask made int8 or int64 ids narrowed are copies,
    a float input truncated is the task's math. Only the run can tell (the audit's
    ``host_cast_compute``, tests/fixtures/candidates/cheats/cast_*.py and
    kernelbench/rt_bool_mask_input_made_int8.py), so the static check leaves these alone."""
    report = static_check(module(f"z = {cast}\n        return launch_copy(z, torch.empty_like(z))"))
    assert "host_cast_compute" not in report.flags, report.errors


@pytest.mark.parametrize("name", sorted(SCALAR_READS))
def test_scalar_read_of_tensor_data_is_refused(name):
    init = ("self.scale = 2.0\n        self.w = nn.Parameter(torch.ones(1))\n"
            "        self.partial = torch.empty(2)")
    report = static_check(module(SCALAR_READS[name], extra_class_body=READ_HELPERS, init=init))
    assert "host_extraction" in report.flags, (name, report.flags, report.errors)


@pytest.mark.parametrize("name", sorted(HONEST))
def test_honest_metadata_reads_and_float_casts_pass(name):
    init = ("self.scale = 2.0\n        self.count = int(3)\n"
            "        self.codes = torch.empty(8, dtype=torch.int32)")
    report = static_check(module(HONEST[name], extra_class_body=HONEST_HELPERS, init=init))
    assert report.ok, (name, report.flags, report.errors)


def test_casts_in_init_stay_allowed():
    init = ("self.register_buffer('codes', torch.randn(4).long())\n"
            "        self.limit = int(torch.ones(1)[0])")
    assert static_check(module("return y", init=init)).ok


def test_flags_are_documented():
    assert {"host_cast_compute", "host_extraction"} <= set(FLAG_DESCRIPTIONS)
