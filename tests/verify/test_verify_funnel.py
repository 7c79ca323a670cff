"""The staged funnel end to end: real extraction, static check, sandboxed workers, Triton interpreter.

One ``verify_batch`` call judges every candidate (in parallel workers) so the suite stays fast; the
tests below read its results.
"""
from __future__ import annotations

import textwrap

import pytest

from extensions.config import VerifierConfig
from extensions.verify import VerifyRequest, summarize_results, verify_batch, verify_candidate
from extensions.verify.api import verify_code_unscreened
from sandbox_support import PROBLEM as AFFINE_PROBLEM, affine_candidate
from project_paths import FIXTURES_DIR

# Outputs of ~1e-5: an all-zero answer is inside atol=1e-4 everywhere.
TINY_SCALE_PROBLEM = AFFINE_PROBLEM.replace("x * self.alpha + 1.0", "x * self.alpha").replace(
    "return [2.5]", "return [1e-5]")

SOFTMAX_PROBLEM = textwrap.dedent("""
    import torch
    import torch.nn as nn

    class Model(nn.Module):
        def __init__(self):
            super().__init__()

        def forward(self, x):
            return torch.softmax(x, dim=1)

    batch_size = 4
    dim = 50

    def get_inputs():
        return [torch.randn(batch_size, dim)]

    def get_init_inputs():
        return []
""")


SOFTMAX_CANDIDATE = textwrap.dedent("""
    import torch
    import torch.nn as nn
    import triton
    import triton.language as tl

    @triton.jit
    def softmax_kernel(x_ptr, y_ptr, n_cols, stride, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        offs = tl.arange(0, BLOCK)
        mask = offs < n_cols
        x = tl.load(x_ptr + row * stride + offs, mask=mask, other=-float("inf"))
        x = x - tl.max(x, axis=0)
        num = tl.exp(x)
        tl.store(y_ptr + row * stride + offs, num / tl.sum(num, axis=0), mask=mask)


    class ModelNew(nn.Module):
        def forward(self, x):
            x = x.contiguous()
            y = torch.empty_like(x)
            block = triton.next_power_of_2(x.shape[1])
            softmax_kernel[(x.shape[0],)](x, y, x.shape[1], x.stride(0), BLOCK=block)
            return y
""")

CORRECT = affine_candidate()
RESPONSE = "Here is the fused kernel.\n\n```python\n" + CORRECT + "\n```\n\nIt masks the tail."
# Same program but for a docstring, which a candidate can read at run time: judged on its own.
DOCSTRING_TWIN = CORRECT.replace("def forward(self, x):\n", "def forward(self, x):\n        \"\"\"Twin.\"\"\"\n", 1)

CASES = {
    "correct": (AFFINE_PROBLEM, CORRECT),
    "softmax": (SOFTMAX_PROBLEM, SOFTMAX_CANDIDATE),
    "duplicate_response": (AFFINE_PROBLEM, RESPONSE),
    "docstring_twin": (AFFINE_PROBLEM, DOCSTRING_TWIN),
    "syntax_error": (AFFINE_PROBLEM, CORRECT.replace("def forward(self, x):", "def forward(self, x)")),
    "no_code": (AFFINE_PROBLEM, "I cannot write this kernel."),
    "import_error": (AFFINE_PROBLEM, affine_candidate(extra_import="from math import no_such_builtin_xyz")),
    "wrong_shape": (AFFINE_PROBLEM, affine_candidate(ret="y[:, :-1]")),
    "wrong_values": (AFFINE_PROBLEM, affine_candidate(store="x * alpha")),
    "near_zero": (TINY_SCALE_PROBLEM, affine_candidate(store="x * 0.0")),
    "nan_output": (AFFINE_PROBLEM, affine_candidate(store="x * alpha + 1.0 + (x - x) / (x - x)")),
    "mutates_input": (AFFINE_PROBLEM, affine_candidate(prelude="tl.store(x_ptr + offs, x * 0.0, mask=mask)")),
    # Operators on tensors pass the static check; the runtime audit sees the ATen ops.
    "operator_fallback": (AFFINE_PROBLEM, affine_candidate(ret="x * self.alpha + 1.0")),
}


@pytest.fixture(scope="module")
def config() -> VerifierConfig:
    return VerifierConfig(device="cpu", timeout_s=90, workers=2, multi_input_num_tests=3)


@pytest.fixture(scope="module")
def results(config):
    requests = [VerifyRequest(problem, text, label=name) for name, (problem, text) in CASES.items()]
    judged = verify_batch(requests, config, progress=False)
    return {r.candidate: r for r in judged}


def test_batch_order_and_labels(results):
    assert list(results) == list(CASES)


def test_correct_kernels_pass_every_input_set(results):
    for name in ("correct", "softmax"):
        r = results[name]
        assert (r.correct, r.stage, r.reward, r.error, r.flags) == (True, "full", 0.7, None, []), r
        assert r.speedup is None and r.isolation in ("bwrap", "process")
        # tiny + base + shape/value variations + one set wider than the problem's own
        sets = r.details["input_sets"]
        assert len(sets) == 5 and sets[0] == "tiny" and sets[-1].startswith("wide_dim"), sets
        ran = r.details["sets_run"]  # every set; the ones between in an order of the candidate's own
        assert sorted(ran) == sorted(sets) and ran[:2] == sets[:2] and ran[-1] == sets[-1], ran
        assert all(n >= 1 for n in r.details["launches"])


def test_duplicates_are_judged_once(results):
    original, copy = results["correct"], results["duplicate_response"]
    assert not original.cached and copy.cached
    assert (copy.correct, copy.stage, copy.reward) == (True, "full", 0.7)


def test_docstring_twin_is_judged_on_its_own(results):
    assert DOCSTRING_TWIN != CORRECT and '"""Twin."""' in DOCSTRING_TWIN
    twin = results["docstring_twin"]
    assert not twin.cached and twin.correct


def test_unparsable_candidates_stop_before_any_process(results):
    syntax = results["syntax_error"]
    assert syntax.stage == "extract" and syntax.reward == 0.0 and syntax.isolation == "none"
    assert syntax.error.startswith("static:") and "\n" not in syntax.error
    no_code = results["no_code"]
    assert no_code.stage == "none" and no_code.error.startswith("extract:") and no_code.isolation == "none"


def test_import_error_is_a_compile_failure_with_the_candidate_line(results):
    r = results["import_error"]
    assert r.stage == "static" and r.reward == 0.0
    assert r.error.startswith("compile: exception: ImportError: cannot import name 'no_such_builtin_xyz'"), r.error
    code_lines = CASES["import_error"][1].lstrip("\n").splitlines()
    line = next(i for i, text in enumerate(code_lines, 1) if "no_such_builtin_xyz" in text)
    assert r.error.endswith(f"(candidate line {line})") and "\n" not in r.error and "/work" not in r.error


@pytest.mark.parametrize("name, reason", [
    ("wrong_shape", "shape (2, 39) != expected (2, 40)"),
    ("wrong_values", "values outside atol=0.0001 rtol=0.0001"),
    ("nan_output", "NaN/Inf values where the reference is finite"),
])
def test_wrong_outputs_stop_at_the_tiny_set(results, name, reason):
    r = results[name]
    assert (r.correct, r.stage, r.reward) == (False, "compile", 0.3)
    assert r.error.startswith("tiny: ") and reason in r.error, r.error


def test_near_zero_output_cannot_hide_under_atol(results):
    r = results["near_zero"]
    assert not r.correct and r.stage == "compile"
    assert "relative error 1 > 0.01" in r.error, r.error
    assert r.details["mismatch"] == "near_zero"


def test_cheats_caught_at_run_time_score_zero(results):
    mutated = results["mutates_input"]
    assert "mutated_inputs" in mutated.flags and mutated.reward == 0.0 and not mutated.correct
    assert "forward modified its inputs" in mutated.error
    fallback = results["operator_fallback"]
    assert "torch_compute" in fallback.flags and fallback.reward == 0.0 and not fallback.correct
    assert "aten::add.Tensor" in fallback.error and "aten::mul.Tensor" in fallback.error


def test_rejected_early_counts(results):
    summary = summarize_results(list(results.values()))
    assert summary["total"] == len(CASES) and summary["correct"] == 4 and summary["cached"] == 1
    assert summary["rejected_at"]["extract"] == 1  # no code
    assert summary["rejected_at"]["static"] == 1  # syntax error
    assert summary["rejected_at"]["compile"] == 1  # import error
    assert summary["rejected_at"]["tiny"] == 6
    assert summary["per_stage_reached"]["full"] == 4
    assert summary["flags"]["torch_compute"] == 1 and summary["flags"]["mutated_inputs"] == 1


def test_static_check_rejects_explicit_torch_math(config):
    code = affine_candidate(ret="torch.add(torch.mul(x, self.alpha), 1.0)")
    r = verify_candidate(AFFINE_PROBLEM, code, config, label="explicit")
    assert r.stage == "extract" and r.reward == 0.0 and r.isolation == "none"
    assert "torch_compute" in r.flags


def test_library_gemm_is_caught_at_run_time_and_allowed_only_by_policy():
    problem = textwrap.dedent("""
        import torch
        import torch.nn as nn

        class Model(nn.Module):
            def __init__(self, n):
                super().__init__()
                self.linear = nn.Linear(n, n, bias=False)

            def forward(self, x):
                return self.linear(x)

        batch_size = 2
        features = 8

        def get_inputs():
            return [torch.randn(batch_size, features)]

        def get_init_inputs():
            return [features]
    """)
    code = textwrap.dedent("""
        import torch
        import torch.nn as nn
        import triton
        import triton.language as tl

        @triton.jit
        def copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
            offs = tl.arange(0, BLOCK)
            mask = offs < n
            tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)

        class ModelNew(nn.Module):
            def __init__(self, n):
                super().__init__()
                self.linear = nn.Linear(n, n, bias=False)

            def forward(self, x):
                y = torch.empty_like(x)
                copy_kernel[(1,)](x, y, x.numel(), BLOCK=64)
                return self.linear(y)
    """)
    base = VerifierConfig(device="cpu", timeout_s=90, multi_input_num_tests=1)
    refused = verify_code_unscreened(problem, code, base, device="cpu")
    assert "library_gemm" in refused.flags and refused.reward == 0.0 and not refused.correct
    allowed_cfg = VerifierConfig(device="cpu", timeout_s=90, multi_input_num_tests=1, allow_library_gemm=True)
    allowed = verify_code_unscreened(problem, code, allowed_cfg, device="cpu")
    assert allowed.correct and allowed.reward == 0.7, allowed.error
    assert "library_gemm_allowed" in allowed.flags and allowed.allowed_library_calls


def test_timing_protocol_end_to_end_on_cpu(tmp_path):
    """The timing handshake (lease, worker timing, last-output check) on CPU tensors; the numbers
    mean nothing here, the protocol is what is tested. On CUDA the same path runs for real."""
    from extensions.verify.api import _DevicePool
    from extensions.verify.parent.judge import ProblemPreparer, judge_candidate

    config = VerifierConfig(device="cpu", timeout_s=120, multi_input_num_tests=3, multi_input_shape_variations=False,
                            timing_num_warmup=1, timing_num_trials=5, timing_budget_s=0.3, timing_max_remeasure=0)
    pool = _DevicePool("cpu", 1)
    prepared = ProblemPreparer(config, "cpu", str(tmp_path), pool).prepare(AFFINE_PROBLEM)
    result = judge_candidate(CORRECT, prepared, config, "cpu", pool, "process", str(tmp_path), "timed",
                             timing_on_cpu=True)
    assert result.correct and result.stage == "timing", result.error
    assert isinstance(result.speedup, float) and result.speedup > 0
    assert result.timing["speedup"] == result.speedup and "memoized_output" not in result.flags
    assert 0.7 < result.reward <= 1.0


RUNTIME_ONLY_CHEATS = {
    # name: (forward body after the decoy launch, extra module code, expected flag)
    "python_scalars": ("return torch.tensor([v * self.alpha + 1.0 for v in x.flatten().tolist()]).view(x.shape)",
                       "", "output_not_from_kernel"),
    "thread": ("box = []\n"
               "t = threading.Thread(target=lambda: box.append(x * self.alpha + 1.0))\n"
               "t.start()\n"
               "t.join()\n"
               "return box[0]", "import threading", "threads"),
    "subprocess": ("subprocess.run(['true'])\nreturn y", "import subprocess", "subprocess"),
    "numpy": ("return torch.from_numpy(x.numpy() * self.alpha + 1.0)", "", "numpy_compute"),
    "returns_input": ("return x", "", "output_aliases_input"),
    "inherits_model": ("return Model.forward(self, x)",
                       "class Model(nn.Module):\n    def forward(self, x):\n        return x * self.alpha + 1.0\n",
                       "inherits_reference"),
}


def runtime_cheat(body: str, extra: str, base: str = "nn.Module") -> str:
    forward = textwrap.indent(body, " " * 8)
    return textwrap.dedent(f"""
        import torch
        import torch.nn as nn
        import triton
        import triton.language as tl
    """) + extra + textwrap.dedent("""

        @triton.jit
        def affine_kernel(x_ptr, y_ptr, n, alpha, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) * alpha + 1.0, mask=mask)


        class ModelNew(BASE):
            def __init__(self, alpha):
                super().__init__()
                self.alpha = alpha

            def forward(self, x):
                y = torch.empty_like(x)
                affine_kernel[(triton.cdiv(x.numel(), 64),)](x, y, x.numel(), self.alpha, BLOCK=64)
    """).replace("BASE", base) + forward + "\n"


def test_runtime_audit_catches_what_only_runs(tmp_path):
    """Cheats judged from the compile stage on (as if the static check had missed them)."""
    from concurrent.futures import ThreadPoolExecutor

    from extensions.verify.api import _DevicePool
    from extensions.verify.parent.judge import ProblemPreparer, judge_candidate
    from extensions.verify.parent.sandbox import choose_isolation

    config = VerifierConfig(device="cpu", timeout_s=90, multi_input_num_tests=1)
    pool = _DevicePool("cpu", 2)
    prepared = ProblemPreparer(config, "cpu", str(tmp_path), pool).prepare(AFFINE_PROBLEM)
    isolation = choose_isolation("auto")

    def judge(item):
        name, (body, extra, _flag) = item
        base = "Model" if name == "inherits_model" else "nn.Module"
        return judge_candidate(runtime_cheat(body, extra, base), prepared, config, "cpu", pool, isolation,
                               str(tmp_path), name)

    with ThreadPoolExecutor(2) as executor:
        results = list(executor.map(judge, RUNTIME_ONLY_CHEATS.items()))
    for (name, (_body, _extra, flag)), result in zip(RUNTIME_ONLY_CHEATS.items(), results):
        assert flag in result.flags, (name, result.flags, result.error)
        assert not result.correct and result.reward == 0.0, name
    honest = judge(("honest", ("return y", "", None)))
    assert honest.correct and honest.flags == [], honest.error


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_available(), reason="needs a CUDA device")
def test_cuda_funnel_times_correct_kernels_and_catches_gpu_cheats():
    problem = AFFINE_PROBLEM.replace("batch_size = 4", "batch_size = 256").replace("dim = 40", "dim = 4096")
    config = VerifierConfig(device="cuda", timeout_s=300, multi_input_num_tests=3, timing_num_warmup=5,
                            timing_num_trials=20, timing_budget_s=1.0)
    side_stream = CORRECT.replace(
        "affine_kernel[(triton.cdiv(n, 64),)](x, y, n, self.alpha, BLOCK=64)",
        "stream = torch.cuda.Stream()\n"
        "        with torch.cuda.stream(stream):\n"
        "            affine_kernel[(triton.cdiv(n, 64),)](x, y, n, self.alpha, BLOCK=64)\n"
        "        torch.cuda.current_stream().wait_stream(stream)")
    results = verify_batch([VerifyRequest(problem, CORRECT, "correct"),
                            VerifyRequest(problem, affine_candidate(ret="x * self.alpha + 1.0"), "fallback")],
                           config, device="cuda", progress=False)
    correct, fallback = results
    assert correct.correct and correct.stage == "timing", (correct.error, correct.flags, correct.details)
    assert isinstance(correct.speedup, float) and correct.speedup > 0 and correct.timing
    assert 0.7 < correct.reward <= 1.0
    assert {"torch_compute", "non_triton_kernel"} <= set(fallback.flags) and fallback.reward == 0.0
    hidden = verify_code_unscreened(problem, side_stream, config, device="cuda")
    assert "side_stream" in hidden.flags and not hidden.correct, (hidden.flags, hidden.error)


CONV1D_PROBLEM = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv1d = nn.Conv1d(in_channels, out_channels, kernel_size, bias=False)

    def forward(self, x):
        return self.conv1d(x)

batch_size = 8
in_channels = 64
out_channels = 128
kernel_size = 3
length = 16384

def get_inputs():
    return [torch.randn(batch_size, in_channels, length)]

def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
"""


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_available(), reason="needs a CUDA device")
def test_cuda_convolution_is_judged_in_fp32_and_timed_at_the_references_settings():
    """cuDNN's convolutions default to TF32, five times the fp32 tolerance off: the reference runs
    with TF32 off, so a correct fp32 convolution passes. Its module's switches (cuDNN's TF32 back
    on, deterministic algorithms: a baseline twice as slow) are undone before timing."""
    solution = (FIXTURES_DIR / "candidates" / "kernelbench" / "l1_067_conv1d.py").read_text()
    switched = solution.replace("import triton.language as tl\n", "import triton.language as tl\n\n"
                                "torch.backends.cudnn.allow_tf32 = True\ntorch.backends.cudnn.deterministic = True\n")
    assert switched != solution
    config = VerifierConfig(device="cuda", timeout_s=300, timing_budget_s=1.0)
    plain, changed = verify_batch([VerifyRequest(CONV1D_PROBLEM, solution, "plain"),
                                   VerifyRequest(CONV1D_PROBLEM, switched, "switched")],
                                  config, device="cuda", progress=False)
    for result in (plain, changed):
        assert result.correct and result.stage == "timing", (result.error, result.flags)
    assert "backend_settings_reset" not in plain.timing.get("details", {})
    assert changed.timing["details"]["backend_settings_reset"] == ["cudnn.allow_tf32", "cudnn.deterministic"]


# -- pieces of the funnel, without processes ----------------------------------------------------

def test_size_constants_are_read_and_rewritten_in_the_source():
    from extensions.verify.common.problem_constants import find_size_constants, rewrite_constants

    source = "import torch\nN = 2048 * 2\nM: int = N // 4\nflag = True\nname = 'x'\nK = N + M  # derived\n"
    constants = {n: c.value for n, c in find_size_constants(source).items()}
    assert constants == {"N": 4096, "M": 1024, "K": 5120}
    rewritten = rewrite_constants(source, {"N": 64, "M": 16})
    assert "N = 64\nM: int = 16\n" in rewritten and "K = N + M  # derived" in rewritten
    namespace: dict = {}
    exec(rewritten.replace("import torch\n", ""), namespace)
    assert namespace["K"] == 80


def test_kernelbench_problems_shrink_under_the_cpu_cap(kernelbench_jsonl):
    import json

    from extensions.verify.common.problem_constants import rewrite_constants
    from extensions.verify.common.problem_sizes import meta_numel, shrink_to_cap

    rows = {}
    with open(kernelbench_jsonl) as fh:
        for line in fh:
            row = json.loads(line)
            if row["level"] == 1 and row["problem_id"] in (1, 19, 23, 95):
                rows[row["name"]] = row["code"]
    assert len(rows) == 4
    for name, code in rows.items():
        assert meta_numel(code) > 65536, name
        values, notes = shrink_to_cap(code, 65536)
        assert notes == [], (name, notes)
        assert meta_numel(rewrite_constants(code, values)) <= 65536, name


def test_nan_passes_only_where_the_reference_has_it():
    import torch

    from extensions.verify.common.compare import compare_outputs

    config = VerifierConfig()
    ref = torch.tensor([1.0, float("nan"), float("inf"), 2.0])
    assert compare_outputs(ref.clone(), ref, config) is None
    assert compare_outputs(torch.tensor([1.0, float("nan"), float("inf"), float("nan")]), ref,
                           config).reason == "nan_or_inf"
    assert compare_outputs(torch.tensor([1.0, 0.0, float("inf"), 2.0]), ref, config).reason == "nan_or_inf"
    assert compare_outputs(torch.tensor([1.0, float("nan"), float("-inf"), 2.0]), ref, config).reason == "nan_or_inf"
    assert compare_outputs(ref.double(), ref, config).reason == "dtype"
    assert compare_outputs((ref,), ref, config).reason == "structure"
    low = torch.tensor([1.0, 2.0], dtype=torch.float16)
    assert compare_outputs(low + 0.005, low, config) is None  # fp16 tolerance 1e-2
    # Inside atol everywhere, caught by the relative-error bound:
    small = torch.full((1000,), 2e-5)
    assert compare_outputs(torch.zeros(1000), small, config).reason == "near_zero"
    off = compare_outputs(small * 1.5, small, config)
    assert off.reason == "values" and "relative error 0.5 > 0.01" in off.message
    assert compare_outputs(small * (1 + 1e-5), small, config) is None


def test_comparison_in_slices_counts_every_position_of_a_large_output():
    """The comparison walks large outputs in float64 slices: a NaN, a wrong value or a scaled
    output anywhere (first slice, a slice boundary, the short last slice) is counted exactly."""
    import torch

    from extensions.verify.common import compare

    config = VerifierConfig()
    n = 2 * compare._CHUNK + 7
    ref = torch.randn(n, generator=torch.Generator().manual_seed(0))
    ref[compare._CHUNK + 3] = float("nan")  # the reference's own NaN, in the second slice
    assert compare.compare_outputs(ref.clone(), ref, config) is None
    for position in (0, compare._CHUNK - 1, compare._CHUNK, n - 1):
        wrong = ref.clone()
        wrong[position] += 1.0
        mismatch = compare.compare_outputs(wrong, ref, config)
        assert mismatch.reason == "values" and f"1 of {n - 1} values" in mismatch.message, position
        stray = ref.clone()
        stray[position] = float("inf")
        mismatch = compare.compare_outputs(stray, ref, config)
        assert mismatch.reason == "nan_or_inf" and mismatch.message.startswith("output: 1 NaN/Inf"), position
    # The relative error over all slices, as one float64 norm computes it:
    small = ref * 1e-6
    scaled = small * 1.02
    finite = torch.isfinite(small)
    direct = float((scaled[finite].double() - small[finite].double()).norm() / small[finite].double().norm())
    mismatch = compare.compare_outputs(scaled, small, config)
    assert mismatch.reason == "values" and f"relative error {direct:.3g} >" in mismatch.message
    zeros = torch.where(finite, torch.zeros_like(small), small)
    assert compare.compare_outputs(zeros, small, config).reason == "near_zero"


def test_atol_grows_only_on_sets_the_verifier_scaled_up():
    """Rounding noise at zero crossings of a x100 output passes there, and nowhere else."""
    import torch

    from extensions.verify.common.compare import compare_outputs

    config = VerifierConfig()
    ref = torch.linspace(-300.0, 300.0, 1001)
    noisy = ref + 5e-4 * torch.sign(torch.randn(1001))  # fp32 summation-order noise of a x100 GEMM
    assert compare_outputs(noisy, ref, config).reason == "values"
    assert compare_outputs(noisy, ref, config, atol_scale=100.0) is None
    # A real error is still an error at that scale, and scaling never tightens below 1.
    assert compare_outputs(ref + 0.5, ref, config, atol_scale=100.0).reason == "values"
    assert compare_outputs(noisy, ref, config, atol_scale=0.01).reason == "values"


def test_scaled_up_set_records_its_output_scale():
    from extensions.verify.reference.tolerances import rms as _rms

    import torch

    assert _rms(torch.full((4,), 3.0)) == 3.0
    assert _rms((torch.ones(2), torch.full((2,), 3.0))) == (5.0) ** 0.5
    assert _rms(torch.tensor([1, 2])) == 0.0  # integer outputs carry no rounding noise


def test_input_files_are_made_once_per_problem_from_the_parents_own_copy():
    """Candidates of one problem get byte-identical input files, made once (a second asker, also
    one that asks while the first is still hashing, gets the same payload); the payload refers to
    the parent's copy of the inputs instead of copying it, and only a set that had to be copied
    (a dtype written through safetensors) counts against the cache budget, given back when the
    problem is freed."""
    import gc
    import hashlib
    import threading

    import torch
    from safetensors.torch import load

    from extensions.verify.parent import candidate_run
    from extensions.verify.parent.reference_data import PreparedProblem

    before = candidate_run._payload_bytes[0]
    prepared = PreparedProblem(ok=True, inputs={"a": torch.arange(1000.0), "b": torch.ones(3, 4),
                                                "z": torch.ones(3, dtype=torch.complex64)})
    specs = [{"tensor": "a"}, {"tensor": "b"}]
    got = []

    def ask(problem):
        got.append(candidate_run._input_payload(problem, specs))

    askers = [threading.Thread(target=ask, args=(prepared,)) for _ in range(4)]
    for asker in askers:
        asker.start()
    for asker in askers:
        asker.join()
    first = got[0]
    assert all(payload is first for payload in got) and len(prepared.handover_cache) == 1
    data = b"".join(first[0])
    loaded = load(data)
    assert torch.equal(loaded["in0"], prepared.inputs["a"]) and torch.equal(loaded["in1"], prepared.inputs["b"])
    assert first[1] == hashlib.sha256(data).hexdigest()
    assert candidate_run._payload_bytes[0] == before  # views, not copies
    views = [part for part in first[0] if isinstance(part, memoryview)]
    assert any(torch.frombuffer(view, dtype=torch.uint8).data_ptr() == prepared.inputs["a"].data_ptr()
               for view in views)
    copied = candidate_run._input_payload(prepared, [{"tensor": "z"}])
    assert torch.equal(load(b"".join(copied[0]))["in0"], prepared.inputs["z"])
    assert candidate_run._payload_bytes[0] == before + len(copied[0][0])
    del prepared, first, copied, views
    got.clear()
    gc.collect()
    assert candidate_run._payload_bytes[0] == before




def test_tensor_files_are_safetensors_written_and_read_in_place(tmp_path):
    """The worker and the parent write tensor files straight from the tensors' memory and the
    worker reads handed files in place; both must stay plain safetensors files (any reader
    loads them) for every dtype a problem uses, with each tensor aligned to its element size."""
    import hashlib

    import torch
    from safetensors.torch import load, save

    from extensions.verify.sandboxed.handed_files import read_checked_buffer
    from extensions.verify.common.tensor_io import TensorIOError, save_tensors, tensor_bytes, tensors_in_buffer

    tensors = {"f32": torch.randn(3, 5), "f64": torch.randn(2).double(), "f16": torch.randn(7).half(),
               "bf16": torch.randn(2, 2).bfloat16(), "i64": torch.arange(3), "i8": torch.tensor([1, -2, 3], dtype=torch.int8),
               "u8": torch.tensor([255], dtype=torch.uint8), "bool": torch.tensor([True, False, True]),
               "scalar": torch.tensor(2.5), "empty": torch.empty(0, 4)}
    data = tensor_bytes(tensors)
    assert len(data) == len(save(tensors))
    for back in (load(data), tensors_in_buffer(bytearray(data))):
        assert set(back) == set(tensors)
        for name, tensor in tensors.items():
            assert back[name].dtype == tensor.dtype and back[name].shape == tensor.shape and torch.equal(back[name], tensor)
    in_place = tensors_in_buffer(buffer := bytearray(data))
    base = torch.frombuffer(buffer, dtype=torch.uint8).data_ptr()
    for tensor in in_place.values():
        if tensor.numel():
            assert (tensor.data_ptr() - base) % tensor.element_size() == 0
            assert base <= tensor.data_ptr() < base + len(buffer)  # a view, not a copy
    complex_file = save({"z": torch.ones(2, dtype=torch.complex64)})  # not written here: parsed by safetensors
    assert torch.equal(tensors_in_buffer(bytearray(complex_file))["z"], torch.ones(2, dtype=torch.complex64))
    with pytest.raises(TensorIOError):
        tensors_in_buffer(bytearray(b"\x10" + b"\x00" * 7 + b"not json"))
    path = tmp_path / "t.safetensors"
    save_tensors(str(path), tensors)
    written = path.read_bytes()
    assert written == data and torch.equal(load(written)["bf16"], tensors["bf16"])
    assert read_checked_buffer(str(path), hashlib.sha256(written).hexdigest()) == bytearray(written)


def test_a_sets_inputs_are_spaced_apart_by_nan_gaps_of_unknown_size():
    """Handed inputs are placed in one buffer with a gap of 512-byte blocks before and after each
    tensor, all bytes 0xFF (NaN): a read past the end of one input meets NaN, never the next input,
    and the distances differ from set to set. Each input still looks like a tensor of its own
    (storage offset 0, a storage of its own bytes): a kernel cannot tell that it is being judged."""
    import ctypes

    import torch

    from extensions.verify.sandboxed.handed_files import spaced_apart

    a, b = torch.randn(16, 300), torch.randn(16, 300)
    original = a.clone()
    values = [a, [b, (torch.arange(5), 7)], torch.tensor(2.5)]
    distances = set()
    for _ in range(8):
        placed = spaced_apart(values, "cpu")
        pa, pb = placed[0], placed[1][0]
        assert torch.equal(pa, a) and torch.equal(pb, b) and torch.equal(placed[1][1][0], torch.arange(5))
        assert placed[1][1][1] == 7 and isinstance(placed[1], list) and isinstance(placed[1][1], tuple)
        assert pa.data_ptr() % 64 == 0 and pb.data_ptr() % 64 == 0
        for placed_tensor in (pa, pb, placed[1][1][0], placed[2]):
            assert placed_tensor.storage_offset() == 0
            assert placed_tensor.untyped_storage().nbytes() == placed_tensor.numel() * placed_tensor.element_size()
        past_end = ctypes.string_at(pa.data_ptr() + pa.numel() * pa.element_size(), 512)
        assert past_end == b"\xff" * 512  # past the end of the first input: NaN
        distances.add(pb.data_ptr() - pa.data_ptr())
        pa.add_(1.0)  # the originals are untouched by what the candidate does to its copies
    assert torch.equal(a, original) and len(distances) > 1


def test_each_candidate_meets_the_varied_sets_in_an_order_of_its_own():
    """tiny and base first, wide last, the sets between in a secret order per candidate: a forward
    that counts its calls cannot tell which set it answers (the outliers were always the fifth)."""
    from extensions.verify.parent.candidate_run import run_order

    kinds = ["tiny", "base", "values", "shape", "values", "values", "seed", "wide"]
    sets = [{"name": f"set{i}", "kind": kind} for i, kind in enumerate(kinds)]
    orders = set()
    for _ in range(30):
        order = [s["name"] for s in run_order(sets)]
        assert order[:2] == ["set0", "set1"] and order[-1] == "set7"
        assert sorted(order) == sorted(s["name"] for s in sets)
        orders.add(tuple(order))
    assert len(orders) > 10  # 120 orders of the five between: 30 draws give many


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_available(), reason="needs a CUDA device")
def test_cuda_inputs_own_their_storage_and_work_as_fresh_tensors():
    """On the GPU too each handed input owns a storage at offset 0 (a slice of one buffer that keeps
    it alive), and works wherever a fresh tensor does: a Triton kernel reads it, a side stream may
    record it."""
    import torch
    import triton
    import triton.language as tl

    from extensions.verify.sandboxed.handed_files import spaced_apart

    @triton.jit
    def double_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out_ptr + offs, 2.0 * tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)

    a, b = torch.randn(1000, 33), torch.randn(7)
    pa, pb = spaced_apart([a, b], "cuda")
    for placed, original in ((pa, a), (pb, b)):
        assert placed.is_cuda and placed.storage_offset() == 0
        assert placed.untyped_storage().nbytes() == original.numel() * 4
        assert torch.equal(placed.cpu(), original)
    out = torch.empty_like(pa)
    double_kernel[(triton.cdiv(pa.numel(), 1024),)](pa, out, pa.numel(), BLOCK=1024)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        pa.record_stream(side)
        doubled_again = pa * 2.0
    torch.cuda.synchronize()
    assert torch.equal(out.cpu(), 2.0 * a) and torch.equal(doubled_again.cpu(), 2.0 * a)


def test_a_value_set_the_reference_cannot_answer_is_flagged(config):
    """A reference that refuses negative inputs leaves the sets with negatives out: the verdict
    still holds on the sets that ran and says, in its flags, that some did not."""
    refusing = AFFINE_PROBLEM.replace("def forward(self, x):",
                                      "def forward(self, x):\n        assert bool((x >= 0).all()), 'negative input'") \
        .replace("torch.randn(", "torch.rand(")
    assert refusing != AFFINE_PROBLEM and "assert bool" in refusing
    result = verify_candidate(refusing, affine_candidate(), config, label="refusing")
    assert result.correct, result.error
    assert "value_sets_skipped" in result.flags and result.reward > 0
    assert any("reference failed" in reason for reason in result.details["skipped_input_sets"])
    plain = verify_candidate(AFFINE_PROBLEM.replace("torch.randn(", "torch.rand("), affine_candidate(), config,
                             label="plain")
    assert plain.correct and "value_sets_skipped" not in plain.flags
