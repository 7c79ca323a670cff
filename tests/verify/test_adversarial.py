"""The adversarial suite: every cheat in tests/fixtures/candidates/cheats/ and every wrong kernel in
.../wrong/ must be rejected by the verifier's public API.

Each fixture's header says what it tries and what the verifier must answer (see candidate_catalog.py):
cheats are rejected with reward 0 and the expected flag; wrong kernels are rejected
(correct=False) no later than the stated stage, and the honest ones (flag=none) are not called
cheats. The batch runs with secrets in the environment; no result may contain them.
One ``verify_batch`` call judges the whole suite on CPU (Triton interpreter).
"""
from __future__ import annotations

import json

import pytest

import candidate_catalog as catalog


CHEATS = catalog.load_folder("cheats", require_expectation=True)
WRONG = catalog.load_folder("wrong", require_expectation=True)
CHEAT_NAMES = [c.name for c in CHEATS]
WRONG_NAMES = [w.name for w in WRONG]
ALL_LABELS = [f"cheats/{n}" for n in CHEAT_NAMES] + [f"wrong/{n}" for n in WRONG_NAMES]

# Open holes in the verifier that a fixture demonstrates: the test is a strict xfail, so it turns
# into a failure (and this entry must go) as soon as the verifier catches the trick.
# Cheats the verifier is known to accept, each a strict xfail so the entry must go once it is caught.
KNOWN_GAPS: dict[str, str] = {}
CHEAT_PARAMS = [
    pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=f"known verifier gap: {KNOWN_GAPS[name]}"))
    if name in KNOWN_GAPS else name
    for name in CHEAT_NAMES
]

# Planted in the parent's environment for the whole batch; the candidate's sandbox must not see them.
SECRETS = {
    "AWS_SECRET_ACCESS_KEY": "adversarial-suite-aws-secret-5f2c81",
    "AWS_ACCESS_KEY_ID": "AKIAADVERSARIALSUITE7",
    "HF_TOKEN": "hf_adversarial_suite_token_0d93ab",
}


def _stage_rank(stage: str) -> int:
    from extensions.verify.result import STAGES

    return STAGES.index(stage)


@pytest.fixture(scope="module")
def verifier_config(verify_isolation):
    from extensions.config import VerifierConfig

    return VerifierConfig(isolation=verify_isolation)


@pytest.fixture(scope="module")
def suite_results(kernelbench_jsonl, verifier_config, verify_device):
    from extensions.verify import VerifyRequest, verify_batch

    files = CHEATS + WRONG
    problems = catalog.load_problems(kernelbench_jsonl, {f.problem_key for f in files})
    requests = [VerifyRequest(problems[f.problem_key]["code"], f.text, label=label)
                for f, label in zip(files, ALL_LABELS)]
    environment = pytest.MonkeyPatch()
    for name, value in SECRETS.items():
        environment.setenv(name, value)
    try:
        results = verify_batch(requests, verifier_config, device=verify_device, progress=False)
    finally:
        environment.undo()
    assert [r.candidate for r in results] == ALL_LABELS, "verify_batch must keep request order"
    return dict(zip(ALL_LABELS, results))


def _check_flags(spec: str, accepted: frozenset[str], flags: list[str], label: str) -> None:
    if spec == "unchecked":
        return
    if spec == "none":
        assert flags == [], f"{label}: honest wrong kernel called a cheat: {flags}"
    elif spec == "any":
        assert flags, f"{label}: rejected without any flag naming the trick"
    else:
        assert accepted & set(flags), f"{label}: expected one of {sorted(accepted)}, got {flags}"


def _describe(result) -> str:
    return f"stage={result.stage} correct={result.correct} reward={result.reward} flags={result.flags} error={result.error}"


def test_suite_headers_are_complete():
    from extensions.verify.result import STAGES

    files = CHEATS + WRONG
    assert len(files) >= 21
    assert len({f.trick for f in files}) == len(files), "every fixture is a distinct trick"
    assert sum(1 for w in WRONG if w.expect_flags == "none") >= 3, "at least 3 honest wrong kernels"
    for f in files:
        assert f.expect_max_stage in STAGES, f"{f.name}: unknown stage {f.expect_max_stage}"
        assert f.expect_max_stage not in ("full", "timing"), f"{f.name}: a rejected file cannot pass 'full'"
    for cheat in CHEATS:
        assert cheat.expect_flags not in ("none", "unchecked"), f"{cheat.name}: a cheat must be flagged"


@pytest.mark.parametrize("name", CHEAT_PARAMS)
def test_cheat_is_rejected(name, suite_results):
    cheat = CHEATS[CHEAT_NAMES.index(name)]
    result = suite_results[f"cheats/{name}"]
    assert not result.correct, f"{name} ({cheat.trick}) was accepted: {_describe(result)}"
    assert result.reward == 0.0, f"{name}: cheat earned reward: {_describe(result)}"
    assert _stage_rank(result.stage) <= _stage_rank(cheat.expect_max_stage), \
        f"{name}: caught later than stage {cheat.expect_max_stage}: {_describe(result)}"
    _check_flags(cheat.expect_flags, cheat.accepted_flags(), result.flags, name)


@pytest.mark.parametrize("name", WRONG_NAMES)
def test_wrong_kernel_is_rejected(name, suite_results, verifier_config):
    wrong = WRONG[WRONG_NAMES.index(name)]
    result = suite_results[f"wrong/{name}"]
    assert not result.correct, f"{name} ({wrong.trick}) was accepted: {_describe(result)}"
    assert result.reward < verifier_config.reward_weights.full
    assert _stage_rank(result.stage) <= _stage_rank(wrong.expect_max_stage), \
        f"{name}: passed beyond stage {wrong.expect_max_stage}: {_describe(result)}"
    _check_flags(wrong.expect_flags, wrong.accepted_flags(), result.flags, name)


@pytest.mark.parametrize("label", ALL_LABELS)
def test_result_holds_no_secret(label, suite_results):
    serialised = json.dumps(suite_results[label].to_dict(), default=str)
    for name, value in SECRETS.items():
        assert value not in serialised, f"{label}: the value of {name} leaked into the result"


def test_summary_counts_the_suite(suite_results):
    from extensions.verify import summarize_results

    summary = summarize_results(list(suite_results.values()))
    assert summary["total"] == len(ALL_LABELS)
    accepted = {label for label, result in suite_results.items() if result.correct}
    assert accepted <= {f"cheats/{name}" for name in KNOWN_GAPS}, f"accepted: {sorted(accepted)}"
    assert summary["correct"] == len(accepted)
    assert sum(summary["flags"].values()) >= len(CHEATS)


def test_a_tf32_gemm_is_told_how_to_multiply_in_fp32(suite_results):
    """A GEMM at tl.dot's default TF32 is wrong for an fp32 problem; its error says what to pass."""
    result = suite_results["wrong/rt_gemm_tf32_products.py"]
    assert result.error_category == "mismatch" and 'input_precision="ieee"' in result.error, _describe(result)
    honest = suite_results["wrong/rt_gemm_no_kn_masks.py"]  # IEEE products, wrong masks: no such advice
    assert "TF32" not in (honest.error or ""), _describe(honest)
