"""Inductor's dialects -> the verifier's clean dialect (extensions/data/canonical/).

The fixtures under tests/fixtures/kernelbook_real/ are real inductor output: ``inductor_async.jsonl``
as torch 2.11 wrote it on an H100 (kernels inside ``async_compile.triton`` strings, ``.run`` launches),
``inductor_kernelbook.jsonl`` the same captures in the form KernelBook ships (top-level kernels,
``grid(n)`` launches, ``empty_strided_cuda``).
"""
from __future__ import annotations

import ast
import re
import json

import pytest

from extensions.data.canonical import CanonicalizeError, LaunchConfig, canonicalize, detect_dialect
from extensions.data.canonical.kernel_rules import HELPER_SOURCES
from extensions.verify.static.static_check import static_check
from project_paths import FIXTURES_DIR

FIXTURES = FIXTURES_DIR / "kernelbook_real"
PRIVATE = ("torch._inductor", "torch._C", "triton_helpers", "tl_math", "triton_heuristics", "async_compile",
           "empty_strided_cuda", "assert_size_stride", "get_raw_stream", "_DeviceGuard", "stream=")


def _rows(name: str) -> list[dict]:
    return [json.loads(line) for line in (FIXTURES / name).read_text().splitlines()]


ROWS = [(name, row) for name in ("inductor_kernelbook.jsonl", "inductor_async.jsonl") for row in _rows(name)]


@pytest.mark.parametrize("source,row", ROWS, ids=[row["uuid"] for _, row in ROWS])
def test_real_inductor_rows_become_clean_and_pass_the_static_policy(source, row):
    expected = "inductor_async" if source == "inductor_async.jsonl" else "inductor_kernelbook"
    assert detect_dialect(row["triton_code"]) == expected
    assert not static_check(row["triton_code"]).ok  # the row as shipped is rejected by the policy
    if "extern_kernels." in row["triton_code"]:
        with pytest.raises(CanonicalizeError) as info:
            canonicalize(row["triton_code"])
        assert info.value.reason == "library_kernel_call"
        return
    canonical = canonicalize(row["triton_code"])
    assert canonical.dialect == expected
    for word in PRIVATE:
        assert word not in canonical.code, word
    report = static_check(canonical.code.replace(f"class {row['entry_point']}New", "class ModelNew"))
    assert report.ok, report.errors
    again = canonicalize(canonical.code)  # idempotent: the clean dialect is left as it is
    assert again.dialect == "clean" and again.code == canonical.code


def test_both_dialects_are_covered_by_several_fixtures():
    kinds = [source for source, _ in ROWS]
    assert kinds.count("inductor_kernelbook.jsonl") >= 6 and kinds.count("inductor_async.jsonl") >= 15


ASYNC_TEMPLATE = '''
import torch
from torch._inductor.async_compile import AsyncCompile
from torch._C import _cuda_getCurrentRawStream as get_raw_stream
assert_size_stride = torch._C._dynamo.guards.assert_size_stride
empty_strided_cuda = torch._C._dynamo.guards._empty_strided_cuda
reinterpret_tensor = torch._C._dynamo.guards._reinterpret_tensor
async_compile = AsyncCompile()

k0 = async_compile.triton('k0', """
import triton
import triton.language as tl
from torch._inductor.runtime import triton_helpers, triton_heuristics
from torch._inductor.runtime.triton_helpers import libdevice, math as tl_math

@triton_heuristics.pointwise(size_hints={'x': 16, 'y': 16}, inductor_meta={'grid_type': 'GRID'}, filename=__file__)
@triton.jit
def k0(in_ptr0, out_ptr0, ynumel, xnumel, YBLOCK : tl.constexpr, XBLOCK : tl.constexpr):
    x = tl.load(in_ptr0 + tl.arange(0, XBLOCK))
    tl.store(out_ptr0 + tl.arange(0, XBLOCK), HELPER(x, x))
""", device_str='cuda')

async_compile.wait(globals())
del async_compile

class Runner:
    def call(self, args):
        arg0_1, = args
        args.clear()
        assert_size_stride(arg0_1, (16, 16), (16, 1))
        with torch.cuda._DeviceGuard(0):
            torch.cuda.set_device(0)
            buf0 = empty_strided_cuda((16, 16), (16, 1), torch.float32)
            stream0 = get_raw_stream(0)
            k0.run(arg0_1, buf0, 16, 16, stream=stream0)
            del arg0_1
            buf1 = empty_strided_cuda((256, ), (1, ), torch.float32)
        return (reinterpret_tensor(buf0, (256, ), (1, ), 0), )

runner = Runner()
call = runner.call
'''


def _async(grid_type="Grid2D", helper="triton_helpers.maximum"):
    return ASYNC_TEMPLATE.replace("GRID", grid_type).replace("HELPER", helper)


def test_async_launch_gets_a_grid_block_sizes_and_the_device_of_its_first_input():
    canonical = canonicalize(_async(), {"k0": LaunchConfig({"XBLOCK": 16, "YBLOCK": 4}, num_warps=2, num_stages=1)})
    tree = ast.parse(canonical.code)
    call = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "call")
    text = ast.unparse(call)
    assert "k0[1, 4](arg0_1, buf0, 16, 16, YBLOCK=4, XBLOCK=16, num_warps=2, num_stages=1)" in text.replace("(1, 4)", "1, 4")
    # the device is bound before the input is released, so the later allocation still has it
    lines = text.splitlines()
    assert lines.index("    out_device = arg0_1.device") < next(i for i, l in enumerate(lines) if "del arg0_1" in l)
    assert text.count("device=out_device") == 2
    assert "buf0.as_strided((256,), (1,), 0)" in text
    assert {"allocation", "launch", "reinterpret_tensor", "device_guard", "streams", "size_asserts"} <= set(canonical.rules)


def test_without_recorded_configs_a_correct_default_is_used():
    canonical = canonicalize(_async())
    assert "YBLOCK=32, XBLOCK=32" in canonical.code


def test_helpers_become_local_jit_functions_and_math_namespaces_public():
    canonical = canonicalize(_async(helper="triton_helpers.max2(x, 0) + tl_math.abs(x) + libdevice.erf"))
    assert "def _inductor_maximum(" in canonical.code and "def _inductor_max2(" in canonical.code
    assert "tl.abs(x)" in canonical.code
    assert "from triton.language.extra import libdevice" in canonical.code
    assert canonical.code.index("def _inductor_maximum(") < canonical.code.index("def _inductor_max2(")


@pytest.mark.parametrize("text,reason", [
    (_async(grid_type="SplitScanGrid"), "unsupported_grid:SplitScanGrid"),
    (_async(helper="triton_helpers.exclusive_scan_decoupled_lookback"), "unsupported_helper:exclusive_scan_decoupled_lookback"),
    (_async().replace("buf1 = empty_strided_cuda((256, ), (1, ), torch.float32)",
                      "extern_kernels.mm(arg0_1, arg0_1, out=buf0)"), "library_kernel_call"),
    (_async().replace("k0.run(arg0_1, buf0, 16, 16, stream=stream0)", "k0.run(arg0_1, buf0, 16, stream=stream0)"),
     "launch_arity"),
])
def test_rows_that_cannot_be_rewritten_name_their_reason(text, reason):
    with pytest.raises(CanonicalizeError) as info:
        canonicalize(text)
    assert info.value.reason == reason


def test_every_helper_definition_parses_and_names_itself():
    for name, (needs, source) in HELPER_SOURCES.items():
        tree = ast.parse(source)
        assert [f.name for f in tree.body] == [f"_inductor_{name}"]
        assert all(dependency in HELPER_SOURCES for dependency in needs)


def test_helper_semantics_match_torch_in_the_interpreter(tmp_path):
    """NaN-propagating max, floor division and remainder of negatives, and the Welford merge, run
    as Triton in the interpreter against torch."""
    import subprocess
    import sys
    import textwrap

    names = ["maximum", "max2", "div_floor_integer", "remainder_integer", "welford_combine"]
    from extensions.data.canonical.kernel_rules import helper_definitions
    import ast as _ast

    helpers = "\n\n".join(_ast.unparse(node) for node in helper_definitions(names))
    script = tmp_path / "helpers_check.py"
    script.write_text("import torch\nimport triton\nimport triton.language as tl\n\n" + helpers + textwrap.dedent('''

        @triton.jit
        def check(a_ptr, b_ptr, c_ptr, i_ptr, j_ptr, out_max, out_rowmax, out_div, out_rem, out_mean, out_m2, N: tl.constexpr):
            offs = tl.arange(0, N)
            a = tl.load(a_ptr + offs)
            b = tl.load(b_ptr + offs)
            tl.store(out_max + offs, _inductor_maximum(a, b))
            tl.store(out_rowmax, _inductor_max2(tl.reshape(a, (1, N)), 1).sum())
            i = tl.load(i_ptr + offs)
            j = tl.load(j_ptr + offs)
            tl.store(out_div + offs, _inductor_div_floor_integer(i, j))
            tl.store(out_rem + offs, _inductor_remainder_integer(i, j))
            half = N // 2
            c = tl.load(c_ptr + offs)
            first = tl.where(offs < half, c, 0.0)
            second = tl.where(offs >= half, c, 0.0)
            m1 = tl.sum(first) / half
            m2 = tl.sum(second) / half
            s1 = tl.sum(tl.where(offs < half, (c - m1) * (c - m1), 0.0))
            s2 = tl.sum(tl.where(offs >= half, (c - m2) * (c - m2), 0.0))
            mean, m2_total, w = _inductor_welford_combine(m1, s1, half * 1.0, m2, s2, half * 1.0)
            tl.store(out_mean, mean)
            tl.store(out_m2, m2_total)

        N = 16
        a = torch.randn(N); b = torch.randn(N); a[3] = float("nan"); b[5] = float("nan")
        i = torch.tensor([7, -7, 7, -7] * 4, dtype=torch.int32); j = torch.tensor([2, 2, -2, -2] * 4, dtype=torch.int32)
        outs = [torch.empty(N), torch.empty(1), torch.empty(N, dtype=torch.int32), torch.empty(N, dtype=torch.int32),
                torch.empty(1), torch.empty(1)]
        c = torch.randn(N)
        check[(1,)](a, b, c, i, j, *outs, N=N)
        assert torch.equal(torch.isnan(outs[0]), torch.isnan(torch.maximum(a, b)))
        assert torch.allclose(outs[0].nan_to_num(), torch.maximum(a, b).nan_to_num())
        assert torch.isnan(outs[1]).all()  # a holds a NaN: the row's max is NaN, as torch.amax
        assert torch.equal(outs[2], torch.div(i, j, rounding_mode="floor"))
        assert torch.equal(outs[3], torch.remainder(i, j))
        assert torch.allclose(outs[4], c.mean().reshape(1), atol=1e-5)
        assert torch.allclose(outs[5], ((c - c.mean()) ** 2).sum().reshape(1), atol=1e-4)
        print("ok")
    '''))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                            env={**__import__("os").environ, "TRITON_INTERPRET": "1"})
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr[-2000:]


def _forward(code: str) -> ast.FunctionDef:
    tree = ast.parse(code)
    return next(item for node in tree.body if isinstance(node, ast.ClassDef) for item in node.body
                if isinstance(item, ast.FunctionDef) and item.name == "forward")


DYNAMIC = [row for row in _rows("inductor_async.jsonl") if ".size(" in row["triton_code"].split("class ModelNew")[-1]
           and "extern_kernels." not in row["triton_code"]]


@pytest.mark.parametrize("row", DYNAMIC[:6], ids=[row["uuid"] for row in DYNAMIC[:6]])
def test_forward_names_its_tensors_once_and_reads_sizes_from_them(row):
    """Inductor's module hands a list to ``call`` (sizes first: ``call([x.size(0), x.size(1), x])``)
    and ``call`` unpacks it by position; trained on that, a model gets the list and the unpacking
    out of step in most answers that compile. The canonical form has no ``call``: ``forward`` binds
    each tensor once, reads each size from the tensor it belongs to, and launches the kernels."""
    canonical = canonicalize(row["triton_code"])
    assert {"sizes_from_tensors", "wrapper_in_forward", "one_name_per_value"} <= set(canonical.rules)
    tree = ast.parse(canonical.code)
    assert not any(isinstance(n, ast.FunctionDef) and n.name == "call" for n in tree.body)
    assert "args" not in canonical.code.split("class ModelNew")[-1]
    forward = _forward(canonical.code)
    parameters = {a.arg for a in forward.args.args}
    body = [ast.unparse(s) for s in forward.body]
    # one name per value: no renaming, no del; each size read straight from forward's own tensor
    assert not any(re.fullmatch(r"\w+ = \w+", line) or line.startswith("del ") for line in body), body
    sizes = [line for line in body if ".size(" in line]
    assert sizes and all(line.split(" = ")[1].split(".")[0] in parameters for line in sizes), body
    assert any("[" in line and "](" in line for line in body)  # the launch is in forward
    assert body[-1].startswith("return buf")
    again = canonicalize(canonical.code)
    assert again.code == canonical.code and not again.rules


EARLIER_FORM = """\
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def scale_kernel(in_ptr0, out_ptr0, xnumel, XBLOCK: tl.constexpr):
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:]
    xmask = xindex < xnumel
    tmp0 = tl.load(in_ptr0 + xindex, xmask)
    tl.store(out_ptr0 + xindex, tmp0 * 2.0, xmask)


def call(args):
    arg0_1, arg1_1, arg2_1 = args
    args.clear()
    buf0 = torch.empty_strided((arg0_1, arg1_1), (arg1_1, 1), dtype=torch.float32, device=arg2_1.device)
    xnumel = arg0_1 * arg1_1
    scale_kernel[triton.cdiv(xnumel, 128),](arg2_1, buf0, xnumel, XBLOCK=128)
    del arg2_1
    return (buf0,)


class ModelNew(nn.Module):

    def forward(self, x):
        return call([x.size(0), x.size(1), x])[0]
"""


def test_pairs_written_in_an_earlier_form_get_the_same_wrapper():
    """Clean code in either earlier form (sizes handed to ``call``, or tensors only) is rewritten
    to the same ``forward``, so training never mixes the forms."""
    rewritten = canonicalize(EARLIER_FORM)
    assert detect_dialect(EARLIER_FORM) == "clean"
    assert rewritten.rules == ["sizes_from_tensors", "wrapper_in_forward", "one_name_per_value"]
    assert [ast.unparse(s) for s in _forward(rewritten.code).body][:2] == ["arg0_1 = x.size(0)", "arg1_1 = x.size(1)"]
    tensors_only = EARLIER_FORM.replace("arg0_1, arg1_1, arg2_1 = args", "arg2_1, = args\n    arg0_1 = "
                                        "arg2_1.size(0)\n    arg1_1 = arg2_1.size(1)").replace(
        "call([x.size(0), x.size(1), x])", "call([x])")
    assert canonicalize(tensors_only).code == rewritten.code
    assert canonicalize(tensors_only).rules == ["wrapper_in_forward", "one_name_per_value"]
    # the size of something the wrapper is not handed stays an argument (bound in forward)
    other = canonicalize(EARLIER_FORM.replace("x.size(0), x.size(1), x", "other.size(0), x.size(1), x"))
    assert other.rules == ["wrapper_in_forward", "one_name_per_value"]
    assert "arg0_1 = other.size(0)" in [ast.unparse(s) for s in _forward(other.code).body]


@pytest.mark.parametrize("change", ["two_call_sites", "forward_does_more", "name_clash", "args_used"])
def test_a_wrapper_the_rule_cannot_move_stays_as_it_is(change):
    """``call`` stays where moving its body could change what runs: a second caller, a forward that
    does more than return one output, a body name that is also one of forward's, ``args`` read
    after the unpacking."""
    source = EARLIER_FORM.replace("call([x.size(0), x.size(1), x])", "call([x])").replace(
        "arg0_1, arg1_1, arg2_1 = args", "arg2_1, = args\n    arg0_1 = arg2_1.size(0)\n    arg1_1 = arg2_1.size(1)")
    source = {
        "two_call_sites": source + "\n\ndef twice(x):\n    return call([x])[0]\n",
        "forward_does_more": source.replace("return call([x])[0]", "x = x * 1\n        return call([x])[0]"),
        "name_clash": source.replace("def forward(self, x):", "def forward(self, buf0):").replace(
            "call([x])", "call([buf0])"),
        "args_used": source.replace("del arg2_1", "del arg2_1\n    print(len(args))"),
    }[change]
    canonical = canonicalize(source)
    assert "wrapper_in_forward" not in canonical.rules
    assert any(isinstance(n, ast.FunctionDef) and n.name == "call" for n in ast.parse(canonical.code).body)


def test_the_wrapper_in_forward_is_judged_correct_by_the_verifier(tmp_path):
    """The rewrites keep the kernel's meaning: the verifier's CLI accepts the pair on CPU with the
    wrapper in ``forward`` (a broadcast across a size read from its tensor)."""
    import subprocess
    import sys

    from project_paths import PROJECT_ROOT

    row = next(r for r in DYNAMIC if "maximum" in r["python_code"] and "x, y" in r["python_code"])
    problem, candidate = tmp_path / "problem.py", tmp_path / "candidate.py"
    problem.write_text(row["python_code"])
    candidate.write_text(canonicalize(row["triton_code"]).code)
    result = subprocess.run([sys.executable, "-m", "extensions.verify", "--problem", str(problem), "--candidate",
                             str(candidate), "--device", "cpu", "--json", "--timeout", "120"],
                            cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=600)
    verdict = json.loads(result.stdout.splitlines()[0])
    assert verdict["correct"] is True, verdict


RENAMED_FORWARD = """
class ModelNew(nn.Module):
    def forward(self, x, y):
        arg3_1 = x
        arg4_1 = y
        arg0_1 = arg3_1.size(0)
        out_device = arg3_1.device
        s33 = arg0_1
        buf0 = torch.empty_strided((s33,), (1,), dtype=torch.float32, device=out_device)
        kernel[triton.cdiv(s33, 128),](arg3_1, arg4_1, buf0, s33, XBLOCK=128)
        del arg3_1
        del arg4_1
        return buf0
"""


def test_forward_keeps_one_name_per_value():
    """Inductor's renamings (input -> ``argN_M``, size -> ``argN_M`` -> symbol) and its ``del``s are
    folded: the launch reads forward's own tensors and the size goes by the name the launch uses."""
    from extensions.data.canonical.name_rules import fold_names

    module = ast.parse(RENAMED_FORWARD)
    assert fold_names(module)
    assert [ast.unparse(s) for s in _forward(ast.unparse(module)).body] == [
        "s33 = x.size(0)", "out_device = x.device",
        "buf0 = torch.empty_strided((s33,), (1,), dtype=torch.float32, device=out_device)",
        "kernel[triton.cdiv(s33, 128),](x, y, buf0, s33, XBLOCK=128)", "return buf0"]
    assert not fold_names(module)  # a second pass finds nothing


@pytest.mark.parametrize("change", ["rebound", "parameter_rebound", "nested_scope", "read_twice"])
def test_a_renaming_that_carries_meaning_stays(change):
    """A name bound twice, a parameter given a new value, and code with nested scopes keep their
    renamings; a size read by two statements keeps its first name and the renaming's readers use it."""
    from extensions.data.canonical.name_rules import fold_names

    source = {
        "rebound": RENAMED_FORWARD.replace("        del arg3_1\n", "        arg3_1 = buf0\n"),
        "parameter_rebound": RENAMED_FORWARD.replace("arg4_1 = y", "y = x"),
        "nested_scope": RENAMED_FORWARD.replace("del arg4_1", "scale = (lambda v: v)(2)"),
        "read_twice": RENAMED_FORWARD.replace("out_device = arg3_1.device", "out_device = arg3_1.device\n"
                                              "        half = arg0_1 // 2"),
    }[change]
    module = ast.parse(source)
    fold_names(module)
    body = [ast.unparse(s) for s in _forward(ast.unparse(module)).body]
    if change == "rebound":
        assert "arg3_1 = x" in body and "arg3_1 = buf0" in body
    elif change == "parameter_rebound":
        assert "y = x" in body
    elif change == "nested_scope":
        assert body == [ast.unparse(s) for s in _forward(source).body]
    else:
        assert "arg0_1 = x.size(0)" in body and "half = arg0_1 // 2" in body
        assert "buf0 = torch.empty_strided((arg0_1,), (1,), dtype=torch.float32, device=out_device)" in body


UNREAD_KERNEL = """
import triton
import triton.language as tl


@triton.jit
def kernel(in_ptr0, out_ptr0, xnumel, r0_numel, XBLOCK: tl.constexpr, R0_BLOCK: tl.constexpr):
    rnumel = r0_numel
    RBLOCK: tl.constexpr = R0_BLOCK
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]
    xmask = xindex < xnumel
    r0_base = tl.arange(0, R0_BLOCK)[None, :]
    rbase = r0_base
    acc = tl.zeros([XBLOCK, R0_BLOCK], tl.float32)
    count = 0
    for r0_offset in tl.range(0, r0_numel, R0_BLOCK):
        r0_index = r0_offset + r0_base
        rindex = r0_index
        unused_load = tl.load(in_ptr0 + r0_index, r0_index < r0_numel, other=0.0)
        old = tl.atomic_add(out_ptr0, 0.0)
        count += 1
        acc += tl.load(in_ptr0 + xindex * r0_numel + r0_index, xmask & (r0_index < r0_numel), other=0.0)
    tl.store(out_ptr0 + xindex, tl.sum(acc, 1)[:, None], xmask)
"""


def test_kernels_lose_the_names_nothing_reads():
    """Inductor's template names that a kernel never reads go, chains of them included; what has
    an effect stays (an atomic whose result is unread, a counter only incremented)."""
    from extensions.data.canonical.dead_rules import drop_unread_names

    module = ast.parse(UNREAD_KERNEL)
    assert drop_unread_names(module)
    code = ast.unparse(module)
    for gone in ("rnumel =", "RBLOCK", "rbase =", "rindex =", "unused_load ="):
        assert gone not in code, gone
    for kept in ("old = tl.atomic_add", "count = 0", "count += 1", "r0_base = tl.arange", "acc +="):
        assert kept in code, kept
    assert not drop_unread_names(module)
