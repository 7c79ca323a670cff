"""Feedback text from real verifier results: each case is judged by the real funnel (extraction,
static check, sandboxed worker, Triton interpreter) and the feedback read from its verdict."""
from __future__ import annotations

import pytest

from extensions.config import VerifierConfig
from extensions.prompting.feedback import CATEGORIES, MAX_ERROR_CHARS, build_feedback, clean_error_line, feedback_text
from extensions.verify import VerifyRequest, verify_batch
from extensions.verify.result import VerifyResult
from sandbox_support import PROBLEM as AFFINE_PROBLEM, affine_candidate

CORRECT = affine_candidate()
SECRET = "AKIA_FEEDBACK_TEST_SECRET"

RUNTIME_ERROR = CORRECT.replace("(x, y, n, self.alpha, BLOCK=64)", "(x, y, n, BLOCK=64)")
SYNTAX_ERROR = CORRECT.replace("mask = offs < n", "mask = offs < n)")
# Prints a secret and writes a file, then fails: neither may reach the model.
LEAKY_WRONG = affine_candidate(store="x * alpha").replace(
    "y = torch.empty_like(x)", f"print('{SECRET}')\n        y = torch.empty_like(x)")

# name: (candidate, category, phrase in the error line, input set that failed, (passed, total));
# ALL stands for every input set the verifier planned for the problem.
ALL = "all"
CASES = {
    "correct": (CORRECT, "correct", None, None, (ALL, ALL)),
    "no_code": ("I would write a kernel but I am not sure how.", "no_code", "ModelNew", None, None),
    "torch_math": (affine_candidate(ret="torch.add(torch.mul(x, self.alpha), 1.0)"), "policy_violation",
                   None, None, None),
    "syntax": (SYNTAX_ERROR, "syntax_error", "no parseable code", None, None),
    "import_error": (affine_candidate(extra_import="from math import no_such_builtin_xyz"),
                     "compile_error", "cannot import name 'no_such_builtin_xyz'", None, None),
    "runtime_error": (RUNTIME_ERROR, "runtime_error", "", "tiny", (0, ALL)),
    "wrong_shape": (affine_candidate(ret="y[:, :-1]"), "wrong_output", "shape (2, 39) != expected (2, 40)",
                    "tiny", (0, ALL)),
    "nan_output": (affine_candidate(store="x * alpha + 1.0 + (x - x) / (x - x)"), "wrong_output",
                   "NaN/Inf", "tiny", (0, ALL)),
    "wrong_values": (LEAKY_WRONG, "numerical_mismatch", "values outside atol", "tiny", (0, ALL)),
    "operator_fallback": (affine_candidate(ret="x * self.alpha + 1.0"), "policy_violation",
                          "torch_compute", "tiny", (0, ALL)),
}


@pytest.fixture(scope="module")
def results() -> dict[str, VerifyResult]:
    config = VerifierConfig(device="cpu", timeout_s=90, workers=2, multi_input_num_tests=3)
    requests = [VerifyRequest(AFFINE_PROBLEM, code, label=name) for name, (code, *_rest) in CASES.items()]
    return {r.candidate: r for r in verify_batch(requests, config, progress=False)}


@pytest.mark.parametrize("name", list(CASES))
def test_feedback_names_category_error_and_progress(results, name):
    _code, category, phrase, input_set, counts = CASES[name]
    result = results[name]
    feedback = build_feedback(result)
    assert feedback.category == category, (name, result.stage, result.error, result.flags)
    text = feedback.text()
    assert text.startswith(f"Verifier result: {category.replace('_', ' ')}.")
    assert CATEGORIES[category][1] in text  # the category's guidance
    if phrase is not None:
        assert feedback.error_line and phrase in feedback.error_line, feedback.error_line
        assert feedback.error_line in text
    assert feedback.input_set == input_set
    if counts is None:
        assert feedback.tests_total is None and "Input sets passed" not in text
    else:
        planned = len(result.details["input_sets"])
        counts = tuple(planned if c == ALL else c for c in counts)
        assert (feedback.tests_passed, feedback.tests_total) == counts
        assert f"Input sets passed: {counts[0]} of {counts[1]}." in text
    # The stage prefix is structure, not content: it is said in words, not echoed.
    assert not (feedback.error_line or "").startswith(("tiny:", "static:", "compile:", "extract:"))


def test_numerical_mismatch_says_where_and_how_much(results):
    text = feedback_text(results["wrong_values"])
    # The verifier's error line leads with its redaction category, then the comparison's own words.
    assert "Key error (input set tiny): " in text
    assert "80 of 80 values outside atol=0.0001 rtol=0.0001" in text
    assert "max abs diff 1" in text


def test_candidate_output_never_reaches_the_feedback(results):
    result = results["wrong_values"]
    assert SECRET not in feedback_text(result)
    for verdict in results.values():
        assert SECRET not in feedback_text(verdict)
        assert "/tmp/" not in feedback_text(verdict) and "/work/" not in feedback_text(verdict)


def test_timing_result_is_reported_for_a_timed_kernel(tmp_path):
    from extensions.verify.api import _DevicePool
    from extensions.verify.parent.judge import ProblemPreparer, judge_candidate

    config = VerifierConfig(device="cpu", timeout_s=120, multi_input_num_tests=1,
                            multi_input_shape_variations=False, timing_num_warmup=1, timing_num_trials=5,
                            timing_budget_s=0.3, timing_max_remeasure=0)
    pool = _DevicePool("cpu", 1)
    prepared = ProblemPreparer(config, "cpu", str(tmp_path), pool).prepare(AFFINE_PROBLEM)
    result = judge_candidate(CORRECT, prepared, config, "cpu", pool, "process", str(tmp_path), "timed",
                             timing_on_cpu=True)
    assert result.correct and result.speedup, result.error
    text = feedback_text(result)
    assert f"Timing: {result.speedup:.2f}x the PyTorch reference" in text
    assert ("faster than" in text) == (result.speedup >= 1.0)


def test_untimed_correct_kernel_says_timing_was_not_measured(results):
    assert "Timing: not measured on this device." in feedback_text(results["correct"])


def test_error_line_is_one_capped_line_without_absolute_paths():
    long_error = "tiny: RuntimeError: " + "x" * 1000 + "\nsecond line with /home/user/.aws/credentials"
    line = clean_error_line(long_error)
    assert "\n" not in line and len(line) == MAX_ERROR_CHARS and line.endswith("...")
    assert clean_error_line("compile: cannot open /srv/sandbox/job-1/candidate.py") == \
        "compile: cannot open candidate.py"
    assert clean_error_line(None) is None and clean_error_line("  \n ") is None


def test_problem_errors_do_not_blame_the_kernel():
    result = VerifyResult("c", stage="static", error="problem: reference timed out after 90s",
                          details={"problem_error": True})
    feedback = build_feedback(result)
    assert feedback.category == "problem_error" and "not a fault of your kernel" in feedback.text()
