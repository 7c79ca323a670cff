"""Correct kernels whose outputs differ from the reference's by its own rounding, not by a mistake.

A comparison in fp16: the reference rounds ``x * y`` to fp16 before comparing it with ``z``; a
correct kernel compares in fp32, where the product of two fp16 numbers is exact. Where ``z`` is the
product rounded down, the two take different branches, and the output there is off by a whole
branch. The problem plants such elements (one in every fourth row); the ambiguous-element detector
must mark them: where the fp16 reference is off the fp64 model, and where inputs moved by a few
fp16 ulps flip a branch (fp32-sized moves are rounded away).

Each kernel is judged by the real verifier in the interpreter, with a wrong kernel as the control.
"""
from __future__ import annotations

import textwrap

import pytest
import torch

from extensions.config import VerifierConfig
from extensions.verify.common.compare import ambiguous_bound, ambiguous_limit, compare_outputs, tolerances
from extensions.verify.common.tensor_io import unpack
from extensions.verify.parent.reference_data import draw_secret, reference_job
from extensions.verify.reference.ambiguity import perturbation
from extensions.verify.reference.builder import ReferenceBuilder
from sandbox_support import judge_cases

FP16_BRANCH = textwrap.dedent('''
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Model(nn.Module):
        def forward(self, x, y, z, a, b):
            return F.silu(torch.where(x * y > z, a, b))

    batch_size = 16
    dim = 512

    def get_inputs():
        x, y, z, a, b = (torch.randn(batch_size, dim).half() for _ in range(5))
        # In every fourth row, z is the product rounded to fp16 at the first element where fp16
        # rounded it down (about one element in 2,000, as often as such ties met an inductor
        # kernel): the reference's product equals z there, the exact one exceeds it.
        rounded_down = x.float() * y.float() > (x * y).float()
        planted = torch.zeros(batch_size, dim, dtype=torch.bool)
        rows = torch.arange(0, batch_size, 4)
        planted[rows, rounded_down[rows].int().argmax(dim=1)] = True
        z = torch.where(planted & rounded_down, x * y, z)
        return [x, y, z, a, b]

    def get_init_inputs():
        return []
''')


def _branch_kernel(condition: str) -> str:
    return textwrap.dedent('''
        import torch
        import torch.nn as nn
        import triton
        import triton.language as tl


        @triton.jit
        def branch_kernel(x_ptr, y_ptr, z_ptr, a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            y = tl.load(y_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            z = tl.load(z_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            a = tl.load(a_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            b = tl.load(b_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            v = tl.where(CONDITION, a, b)
            out = v / (1.0 + tl.exp(-v))
            tl.store(out_ptr + offs, out.to(tl.float16), mask=mask)


        class ModelNew(nn.Module):
            def forward(self, x, y, z, a, b):
                x, y, z, a, b = (t.contiguous() for t in (x, y, z, a, b))
                out = torch.empty_like(x)
                n = x.numel()
                branch_kernel[(triton.cdiv(n, 1024),)](x, y, z, a, b, out, n, BLOCK=1024)
                return out
    ''').replace("CONDITION", condition)


BRANCH_IN_FP32 = _branch_kernel("x * y > z")
# The threshold moved by 1%: the other branch on far more elements than rounding explains.
BRANCH_SHIFTED = _branch_kernel("x * y > z * 1.01")

BF16_BRANCH = textwrap.dedent('''
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Model(nn.Module):
        def forward(self, x, y):
            a = torch.log1p(torch.abs(x))
            h = F.hardtanh(y, -1.22, 1.22)
            return torch.where(a > h, a, h * 0.63)

    # The shape of the synthesized problem that met this, twice the rows (a cap of one at 1e-3).
    batch_size = 600
    dim = 2

    def get_inputs():
        x, y = torch.randn(batch_size, dim, dtype=torch.bfloat16), torch.randn(batch_size, dim, dtype=torch.bfloat16)
        # Twelve elements where y is log1p(|x|) rounded to bf16: the reference's two sides are
        # equal there, an fp32 kernel's are not (about half of them take the other branch).
        y[::50, 0] = torch.log1p(torch.abs(x[::50, 0]))
        return [x, y]

    def get_init_inputs():
        return []
''')


def _bf16_kernel(factor: str) -> str:
    return textwrap.dedent('''
        import torch
        import torch.nn as nn
        import triton
        import triton.language as tl


        @triton.jit
        def where_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            y = tl.load(y_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            a = tl.log(1.0 + tl.abs(x))
            h = tl.minimum(tl.maximum(y, -1.22), 1.22)
            out = tl.where(a > h * FACTOR, a, h * 0.63)
            tl.store(out_ptr + offs, out.to(tl.bfloat16), mask=mask)


        class ModelNew(nn.Module):
            def forward(self, x, y):
                x, y = x.contiguous(), y.contiguous()
                out = torch.empty_like(x)
                n = x.numel()
                where_kernel[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
                return out
    ''').replace("FACTOR", factor)


# bf16 ties are common: 2 of 600 elements of one set differed so on an inductor kernel.
BF16_IN_FP32 = _bf16_kernel("1.0")
# The threshold moved by 10%: the other branch on percents of the elements.
BF16_SHIFTED = _bf16_kernel("1.1")

def _fp16_problem(forward_args: str, body: str) -> str:
    return textwrap.dedent(f'''
        import torch
        import torch.nn as nn

        class Model(nn.Module):
            def forward(self, {forward_args}):
                return {body}

        batch_size = 16
        dim = 512

        def get_inputs():
            return [torch.randn(batch_size, dim).half() for _ in range({forward_args.count(",") + 1})]

        def get_init_inputs():
            return []
    ''')


def _elementwise_kernel(names: list[str], expression: str, out_dtype: str, store: str = "out") -> str:
    """A Triton kernel that loads ``names`` (fp16) as fp32 and stores ``out = expression``."""
    loads = "\n".join(f"    {n} = tl.load({n}_ptr + offs, mask=mask, other=0.0).to(tl.float32)" for n in names)
    pointers, arguments = ", ".join(f"{n}_ptr" for n in names), ", ".join(names)
    return (
        "import torch\nimport torch.nn as nn\nimport triton\nimport triton.language as tl\n\n\n"
        "@triton.jit\n"
        f"def elementwise_kernel({pointers}, out_ptr, n, BLOCK: tl.constexpr):\n"
        "    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)\n"
        "    mask = offs < n\n"
        f"{loads}\n"
        f"    out = {expression}\n"
        f"    tl.store(out_ptr + offs, {store}, mask=mask)\n\n\n"
        "class ModelNew(nn.Module):\n"
        f"    def forward(self, {arguments}):\n"
        f"        {arguments}, = ({', '.join(f'{n}.contiguous()' for n in names)},)\n"
        f"        out = torch.empty({names[0]}.shape, dtype={out_dtype}, device={names[0]}.device)\n"
        f"        n = {names[0]}.numel()\n"
        f"        elementwise_kernel[(triton.cdiv(n, 1024),)]({arguments}, out, n, BLOCK=1024)\n"
        "        return out\n")


# An fp16 comparison returned as bool: the fp64 model's answers mark the ties an integer output has.
BOOL_COMPARISON = _fp16_problem("x, y, z", "x * y > z")
BOOL_TIES = FP16_BRANCH.replace("def forward(self, x, y, z, a, b):", "def forward(self, x, y, z, a, b):\n        return x * y > z")
BOOL_IN_FP32 = _elementwise_kernel(["x", "y", "z"], "x * y > z", "torch.bool")
BOOL_SHIFTED = _elementwise_kernel(["x", "y", "z"], "x * y > z + 0.05", "torch.bool")
# An fp16 floor returned as integers: the reference floors the product rounded to fp16, an fp32
# kernel the exact one; they differ wherever rounding crosses a multiple of 1/16, 15 to 47 elements
# of the 8,192 here in 200 draws, more than the integer share (1e-3, 8) but ties of fp16 all the
# same, within fp16's share (81).
FLOOR_TO_LONG = _fp16_problem("x, y", "torch.floor(x * y * 16.0).long()")
FLOOR_IN_FP32 = _elementwise_kernel(["x", "y"], "tl.floor(x * y * 16.0).to(tl.int64)", "torch.int64")
# Floored a quarter step lower: off by one on about a quarter of the elements.
FLOOR_OFF = _elementwise_kernel(["x", "y"], "tl.floor(x * y * 16.0 - 0.25).to(tl.int64)", "torch.int64")
# A product of fp16 inputs scaled down by 1e-3 lies among fp16's subnormals, where the reference
# strays from the product by percents: such a set is kept only where the reference is exact.
PRODUCT = _fp16_problem("x, y", "x * y * 3.0")
PRODUCT_IN_FP32 = _elementwise_kernel(["x", "y"], "x * y * 3.0", "torch.float16", "out.to(tl.float16)")
PRODUCT_OFF = _elementwise_kernel(["x", "y"], "x * y * 3.1", "torch.float16", "out.to(tl.float16)")

JOB = {**reference_job(VerifierConfig(), "cpu"), "seed": 0, "tiny_first": True, "num_tests": 3,
       "shape_variations": False}


def _base_set(source: str) -> tuple[ReferenceBuilder, dict]:
    builder = ReferenceBuilder(source, JOB, draw_secret())
    builder.build()
    (chosen,) = [s for s in builder.sets if s["name"] == "base"]
    return builder, chosen


def test_low_precision_perturbations_follow_the_dtype():
    """fp32 keeps its magnitudes; fp16 and bf16 move by whole ulps of their own, and an fp32 input
    whose steps are decided in fp16 moves by fp16's."""
    assert perturbation(0, torch.float32) == 1e-5 and perturbation(2, torch.float64) == 1e-6
    assert perturbation(0, torch.float16) == 4 * 2.0 ** -10 and perturbation(2, torch.bfloat16) == 2.0 ** -7
    assert perturbation(1, torch.float32, torch.float16) == 2 * 2.0 ** -10
    assert ambiguous_limit(4096, torch.float16) == 40 and ambiguous_limit(4096, torch.float32) == 4
    # An integer or fp32 output of steps decided in fp16 has fp16's share of ties.
    assert ambiguous_limit(4096, torch.int64, coarse=True) == 40 == ambiguous_bound(4096)


def test_the_integer_answers_of_an_fp16_floor_are_marked_within_the_low_precision_share():
    builder, chosen = _base_set(FLOOR_TO_LONG)
    x, y = unpack(chosen["inputs"], builder.tensors)
    expected = unpack(chosen["expected"], builder.expected)
    wider = torch.floor(x.float() * y.float() * 16.0).long()
    differing = int((wider != expected).sum())
    # More ties than the integer share allows (the reject this covers), fewer than fp16's.
    assert ambiguous_limit(expected.numel(), expected.dtype) < differing <= ambiguous_limit(expected.numel(), coarse=True)
    index, values = unpack(chosen["ambiguous"], builder.expected)
    assert set((wider != expected).reshape(-1).nonzero().reshape(-1).tolist()) <= set(index.tolist())
    assert compare_outputs(wider, expected, VerifierConfig(), ambiguous=(index, values)) is None
    assert compare_outputs(wider + 1, expected, VerifierConfig(), ambiguous=(index, values)) is not None


def test_the_fp16_branch_flips_are_marked_and_few():
    builder, chosen = _base_set(FP16_BRANCH)
    x, y, z, a, b = unpack(chosen["inputs"], builder.tensors)
    expected = unpack(chosen["expected"], builder.expected)
    fp32 = torch.nn.functional.silu(torch.where(x.float() * y.float() > z.float(), a.float(), b.float())).half()
    config = VerifierConfig()
    assert compare_outputs(fp32, expected, config) is not None  # the comparison alone rejects it
    index, values = unpack(chosen["ambiguous"], builder.expected)
    assert index.numel() <= ambiguous_limit(expected.numel(), expected.dtype)
    # Every element the comparison would reject is marked; a flip between two values of the
    # branch within the element's tolerance (atol + rtol |ref|) needs no mark.
    atol, rtol = tolerances("float16", config)
    differing = ((fp32.float() - expected.float()).abs() > atol + rtol * expected.float().abs()).reshape(-1)
    assert differing.any()
    assert set(differing.nonzero().reshape(-1).tolist()) <= set(index.tolist())
    assert compare_outputs(fp32, expected, config, ambiguous=(index, values)) is None


def test_a_subnormal_fp16_set_is_kept_only_where_its_reference_is_exact():
    """Scaled down by 10^-3.5, a product of fp16 inputs lies among the subnormals; the reference
    strays from it by percents there, so the set is skipped unless it is exact."""
    secret = draw_secret()
    secret["transforms"]["scale_down"] = 10 ** -3.5
    builder = ReferenceBuilder(PRODUCT, {**JOB, "num_tests": 5}, secret)
    builder.build()
    scaled = [s for s in builder.sets if s["name"].startswith("scale_down")]
    for chosen in scaled:
        x, y = unpack(chosen["inputs"], builder.tensors)
        wider = (x.double() * y.double() * 3.0).half()
        assert compare_outputs(wider, unpack(chosen["expected"], builder.expected), VerifierConfig()) is None
    assert scaled or any("scale_down" in str(skip) for skip in builder.skipped_sets)


def test_the_bool_answers_of_fp16_ties_are_marked():
    builder, chosen = _base_set(BOOL_TIES)
    x, y, z, *_ = unpack(chosen["inputs"], builder.tensors)
    expected = unpack(chosen["expected"], builder.expected)
    wider = x.float() * y.float() > z.float()
    assert bool((wider != expected).any())  # the planted ties
    assert compare_outputs(wider, expected, VerifierConfig(), ambiguous=unpack(chosen["ambiguous"], builder.expected)) is None

# A residual added and taken away in bf16: the reference rounds x + y to bf16 (y four times x's
# size) before taking y away, so it is up to half an ulp of the sum off x, more than the tolerance
# where x is small (44 of 1,024 elements of the tiny set); a kernel that keeps fp32 between the
# steps, as torch inductor's do, returns x itself. The reference's own distance from its fp64 run
# is each element's slack.
RESIDUAL_BF16 = textwrap.dedent('''
    import torch
    import torch.nn as nn

    class Model(nn.Module):
        def forward(self, x, y):
            return (x + y) - y

    batch_size = 16
    dim = 512

    def get_inputs():
        return [torch.randn(batch_size, dim, dtype=torch.bfloat16), 4 * torch.randn(batch_size, dim, dtype=torch.bfloat16)]

    def get_init_inputs():
        return []
''')
RESIDUAL_IN_FP32 = _elementwise_kernel(["x", "y"], "(x + y) - y", "torch.bfloat16", "out.to(tl.bfloat16)")
RESIDUAL_OFF = _elementwise_kernel(["x", "y"], "x + 0.02", "torch.bfloat16", "out.to(tl.bfloat16)")
# Twice the reference's own distance from the exact value, on its other side (the exact value is x):
# within a slack as wide on either side of the reference, outside the stretch to the exact value.
RESIDUAL_MIRRORED = _elementwise_kernel(
    ["x", "y"], "2.0 * ((x + y).to(tl.bfloat16).to(tl.float32) - y).to(tl.bfloat16).to(tl.float32) - x",
    "torch.bfloat16", "out.to(tl.bfloat16)")
# The reference off by over 1% in norm: the relative-error check measures from the exact value too.
RESIDUAL_BF16_WIDE = RESIDUAL_BF16.replace("4 * torch.randn", "8 * torch.randn")
EXPM1_BF16 = RESIDUAL_BF16.replace("return (x + y) - y", "return torch.exp(x) - 1.0").replace(
    "return [torch.randn(batch_size, dim, dtype=torch.bfloat16), 4 * torch.randn(batch_size, dim, dtype=torch.bfloat16)]",
    "return [torch.randn(batch_size, dim, dtype=torch.bfloat16)]").replace("def forward(self, x, y):", "def forward(self, x):")
EXPM1_IN_FP32 = _elementwise_kernel(["x"], "tl.exp(x) - 1.0", "torch.bfloat16", "out.to(tl.bfloat16)")
EXPM1_OFF = _elementwise_kernel(["x"], "tl.exp(x) - 1.02", "torch.bfloat16", "out.to(tl.bfloat16)")
# fp16 steps before an fp32 output: judged at fp32's tolerance, measured from the exact value too.
FP16_INTO_FP32 = _fp16_problem("x, y", "torch.sigmoid(x * y + x).float()")
FP16_INTO_FP32_IN_FP32 = _elementwise_kernel(["x", "y"], "tl.sigmoid(x * y + x)", "torch.float32")
FP16_INTO_FP32_OFF = _elementwise_kernel(["x", "y"], "tl.sigmoid(x * y + x * 1.01)", "torch.float32")
# A constant taken from the input's dtype: the fp64 run computes another function (x * y - 1e-13),
# not the same one more exactly; the step toward it is cut to what rounding can move (a kernel
# dropping the constant was accepted, in fp16 and as an fp32 output).
FINFO_CONSTANT = _fp16_problem("x, y", "(x * y).float() - 512 * torch.finfo(x.dtype).eps")
FINFO_CONSTANT_FP16 = _fp16_problem("x, y", "x * y - 512 * torch.finfo(x.dtype).eps")
FINFO_DROPPED = _elementwise_kernel(["x", "y"], "x * y", "torch.float32")
FINFO_DROPPED_FP16 = _elementwise_kernel(["x", "y"], "x * y", "torch.float16", "out.to(tl.float16)")
FINFO_KEPT_FP16 = _elementwise_kernel(["x", "y"], "x * y - 0.5", "torch.float16", "out.to(tl.float16)")


@pytest.fixture(scope="module")
def verdicts(verify_device, verify_isolation):
    cases = {"branch_in_fp32": (FP16_BRANCH, BRANCH_IN_FP32), "branch_shifted": (FP16_BRANCH, BRANCH_SHIFTED),
             "bf16_in_fp32": (BF16_BRANCH, BF16_IN_FP32), "bf16_shifted": (BF16_BRANCH, BF16_SHIFTED),
             "bool_in_fp32": (BOOL_COMPARISON, BOOL_IN_FP32), "bool_shifted": (BOOL_COMPARISON, BOOL_SHIFTED),
             "product_in_fp32": (PRODUCT, PRODUCT_IN_FP32), "product_off": (PRODUCT, PRODUCT_OFF),
             "floor_in_fp32": (FLOOR_TO_LONG, FLOOR_IN_FP32), "floor_off": (FLOOR_TO_LONG, FLOOR_OFF),
             "residual_in_fp32": (RESIDUAL_BF16, RESIDUAL_IN_FP32), "residual_off": (RESIDUAL_BF16, RESIDUAL_OFF),
             "residual_mirrored": (RESIDUAL_BF16, RESIDUAL_MIRRORED),
             "wide_residual_in_fp32": (RESIDUAL_BF16_WIDE, RESIDUAL_IN_FP32),
             "expm1_in_fp32": (EXPM1_BF16, EXPM1_IN_FP32), "expm1_off": (EXPM1_BF16, EXPM1_OFF),
             "fp16_into_fp32_in_fp32": (FP16_INTO_FP32, FP16_INTO_FP32_IN_FP32),
             "fp16_into_fp32_off": (FP16_INTO_FP32, FP16_INTO_FP32_OFF),
             "finfo_dropped": (FINFO_CONSTANT, FINFO_DROPPED), "finfo_dropped_fp16": (FINFO_CONSTANT_FP16, FINFO_DROPPED_FP16),
             "finfo_kept_fp16": (FINFO_CONSTANT_FP16, FINFO_KEPT_FP16)}
    return judge_cases(cases, verify_device, verify_isolation, multi_input_num_tests=3)


@pytest.mark.parametrize("name", ["branch_in_fp32", "bf16_in_fp32", "bool_in_fp32", "product_in_fp32", "floor_in_fp32",
                                  "residual_in_fp32", "wide_residual_in_fp32", "expm1_in_fp32",
                                  "fp16_into_fp32_in_fp32", "finfo_kept_fp16"])
def test_correct_kernels_within_the_references_rounding_are_accepted(verdicts, verify_device, name):
    result = verdicts[name]
    assert result.correct and result.stage == ("full" if verify_device == "cpu" else "timing"), result.error


@pytest.mark.parametrize("name", ["branch_shifted", "bf16_shifted", "bool_shifted", "product_off", "floor_off",
                                  "residual_off", "residual_mirrored", "expm1_off", "fp16_into_fp32_off",
                                  "finfo_dropped", "finfo_dropped_fp16"])
def test_wrong_kernels_of_the_same_problems_are_rejected(verdicts, name):
    result = verdicts[name]
    assert not result.correct and result.error_category == "mismatch", (name, result.error)


def test_a_timed_calls_disagreement_at_the_references_rounding_goes_to_the_parent():
    """On a GPU the timer checks timed calls against the reference run beside the candidate, which
    has the eager bf16 rounding and no slack: a kernel nearer the exact value disagrees with it at a
    share of elements. The worker puts such a disagreement to the parent (which knows each element's
    slack) rather than calling it a mismatch, for fp16/bf16 outputs only; in fp32 a disagreement that
    wide is no rounding of the reference's."""
    from extensions.verify.common.compare import disagreeing_elements

    torch.manual_seed(0)
    x, y = torch.randn(16, 512, dtype=torch.bfloat16), 4 * torch.randn(16, 512, dtype=torch.bfloat16)
    reference = (x + y) - y
    accurate = ((x.float() + y.float()) - y.float()).to(torch.bfloat16)
    places = disagreeing_elements(accurate, reference, VerifierConfig())
    assert places is not None and 0 < places[0].numel() < reference.numel() // 8
    assert compare_outputs(accurate, reference, VerifierConfig()) is not None  # without the slack, a mismatch
    as_fp32 = reference.float() + (accurate.float() - reference.float()) * 1e-2 / 1e-4  # the same share, in fp32
    assert disagreeing_elements(as_fp32, reference.float(), VerifierConfig()) is None


def test_the_step_to_the_exact_value_covers_the_references_distance_in_its_own_dtype():
    """The step is stored beside the set in the output's dtype (half of fp32 beside a large bf16
    output); rounded to it, it must still reach the exact value from the reference, on its side."""
    from extensions.verify.reference.tolerances import toward_exact

    torch.manual_seed(1)
    for dtype in (torch.bfloat16, torch.float16):
        x, y = torch.randn(4096, dtype=dtype), 4 * torch.randn(4096, dtype=dtype)
        reference, exact = (x + y) - y, (x.double() + y.double()) - y.double()
        step = toward_exact(reference, exact, 1e-2, 1e-2)
        assert step is not None and step.dtype == dtype
        needed = exact - reference.double()
        assert bool((step.double() * needed.sign() >= needed.abs()).all())
        assert bool(((step.double() * needed) >= 0).all())
    same = torch.randn(4096, dtype=torch.bfloat16)
    assert toward_exact(same, same.double(), 1e-2, 1e-2) is None  # an exact reference: no step


def test_the_comparison_measures_from_the_stretch_between_reference_and_exact_value():
    """Element-wise and in the relative norm: an answer between the reference and the exact
    value is no error, one on the reference's other side is measured from the reference."""
    from extensions.verify.reference.tolerances import toward_exact

    torch.manual_seed(2)
    x, y = torch.randn(16, 512, dtype=torch.bfloat16), 8 * torch.randn(16, 512, dtype=torch.bfloat16)
    reference, exact = (x + y) - y, x.double()
    step = toward_exact(reference, exact, 1e-2, 1e-2)
    config = VerifierConfig()
    assert compare_outputs(x, reference, config) is not None  # the exact answer, without the step
    assert compare_outputs(x, reference, config, toward=step) is None
    halfway = ((reference.double() + exact) / 2).to(torch.bfloat16)
    assert compare_outputs(halfway, reference, config, toward=step) is None
    mirrored = (2 * reference.double() - exact).to(torch.bfloat16)
    mismatch = compare_outputs(mirrored, reference, config, toward=step)
    assert mismatch is not None and mismatch.reason == "values", mismatch
    assert compare_outputs(torch.zeros_like(reference), reference, config, toward=step) is not None


def test_a_timed_call_nearer_the_exact_value_is_judged_whole_by_the_parent():
    """On a GPU the timer checks timed calls against the eager bf16 reference run beside the
    candidate, which knows nothing of the exact value. A kernel keeping fp32 between steps
    disagrees with it at more elements than are localised on a large output, and by more than 1%
    in norm where the reference cancels: such an output goes to the parent whole, once per set
    while it repeats, and the parent judges it as it judged the set."""
    from types import SimpleNamespace

    from extensions.timing import measure_speedup
    from extensions.verify.common.compare import disagreeing_elements
    from extensions.verify.common.tensor_io import pack
    from extensions.verify.parent.candidate_run import CandidateRun
    from extensions.verify.reference.tolerances import toward_exact

    class Reference(torch.nn.Module):
        def forward(self, a, b):
            return (a + b) - b

    class Accurate(torch.nn.Module):
        def forward(self, a, b):
            return ((a.float() + b.float()) - b.float()).to(torch.bfloat16)

    torch.manual_seed(3)
    x, y = torch.randn(512, 512, dtype=torch.bfloat16), 8 * torch.randn(512, 512, dtype=torch.bfloat16)
    reference = Reference()(x, y)
    config = VerifierConfig(timing_mode="counts", timing_num_warmup=1, timing_num_trials=8, timing_max_remeasure=0,
                            timing_output_checks=8, timing_bootstrap_samples=50)
    assert disagreeing_elements(Accurate()(x, y), reference, config) is None  # too wide to localise
    sets = [[x.clone(), y.clone()] for _ in range(2)]
    report = measure_speedup(Reference(), Accurate(), sets, config, compare_outputs=compare_outputs,
                             localise_outputs=disagreeing_elements)
    assert "output_mismatch_during_timing" not in report.flags, report.flags
    assert 1 <= len(report.whole_mismatches) <= len(sets)

    atol, rtol = tolerances("bfloat16", config)
    expected_tensors: dict = {}
    chosen = {"expected": pack(reference, "s0.out", expected_tensors), "atol_scale": 1.0,
              "toward": pack(toward_exact(reference, x.double(), atol, rtol), "s0.toward", expected_tensors)}
    run = SimpleNamespace(prepared=SimpleNamespace(sets=[chosen], expected=expected_tensors), config=config)

    def judged(outputs) -> bool:
        tensors: dict = {}
        entries = [{"set": 0, "output": pack(output, f"whole{n}", tensors)} for n, output in enumerate(outputs)]
        return CandidateRun._whole_outputs_right(run, entries, tensors)

    assert judged([output for _, output in report.whole_mismatches])
    assert not judged([(2 * reference.double() - x.double()).to(torch.bfloat16)])  # beyond the reference
    assert not judged([torch.zeros_like(reference)])
    assert not judged([reference.float()])  # another dtype

