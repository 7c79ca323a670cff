"""Reward of a verdict: stage ladder, speedup bonus, cheating zeroes, advisory flags do not."""
from __future__ import annotations

import dataclasses

import pytest

from extensions.config import VerifierConfig
from extensions.verify import summarize_results
from extensions.verify.result import VerifyResult
from extensions.verify.reward import ADVISORY_FLAGS, CHEATING_FLAGS, compute_reward, is_cheating
from project_paths import PROJECT_ROOT

CFG = VerifierConfig().reward_weights


@pytest.mark.parametrize("stage, expected", [
    ("none", 0.0), ("extract", 0.0), ("static", 0.0), ("compile", 0.3), ("tiny", 0.5), ("full", 0.7),
])
def test_stage_ladder(stage, expected):
    assert compute_reward(stage, [], None, CFG) == pytest.approx(expected)


@pytest.mark.parametrize("speedup, expected", [
    (0.5, 0.7 + 0.3 * 0.25), (1.0, 0.85), (2.0, 1.0), (8.0, 1.0), (None, 0.7), (float("nan"), 0.7), (0.0, 0.7),
])
def test_speedup_bonus_saturates(speedup, expected):
    assert compute_reward("timing", [], speedup, CFG) == pytest.approx(expected)


@pytest.mark.parametrize("flag", sorted(CHEATING_FLAGS))
def test_every_cheating_flag_zeroes_the_reward(flag):
    assert is_cheating([flag])
    for stage in ("compile", "tiny", "full"):
        assert compute_reward(stage, [flag], None, CFG) == 0.0
    assert compute_reward("timing", ["timing_unstable", flag], 3.0, CFG) == 0.0


def test_advisory_flags_do_not_zero():
    assert not CHEATING_FLAGS & ADVISORY_FLAGS
    assert not is_cheating(ADVISORY_FLAGS)
    assert compute_reward("full", ["library_gemm_allowed", "timing_unstable"], None, CFG) == 0.7
    assert compute_reward("timing", ["timing_unstable"], 1.0, CFG) == pytest.approx(0.85)


def test_speedup_review_caps_at_full_correct():
    assert compute_reward("timing", ["speedup_review"], 50.0, CFG) == pytest.approx(0.7)


def test_reward_values_come_from_the_config():
    cfg = dataclasses.replace(CFG, compile=0.1, full=0.6, speed=0.4, speedup_saturation=4.0)
    assert compute_reward("compile", [], None, cfg) == pytest.approx(0.1)
    assert compute_reward("timing", [], 2.0, cfg) == pytest.approx(0.6 + 0.4 * 0.5)


def test_the_old_reward_keys_fill_the_one_table(capsys):
    from extensions.config import load_config

    cfg = load_config(None, ["verifier.reward_static_fail=0.05", "verifier.reward_compiled=0.1",
                             "verifier.reward_full_correct=0.6", "verifier.reward_speed_weight=0.4",
                             "verifier.reward_speedup_saturation=4.0"])
    table = cfg.verifier.reward_weights
    assert (table.none, table.extract, table.static) == (0.05, 0.05, 0.05)
    assert compute_reward("compile", [], None, table) == pytest.approx(0.1)
    assert compute_reward("timing", [], 2.0, table) == pytest.approx(0.6 + 0.4 * 0.5)
    warnings = capsys.readouterr().err.splitlines()
    assert len(warnings) == 5 and all("deprecated" in line for line in warnings)
    assert "config: verifier.reward_compiled is deprecated; set verifier.reward_weights.compile instead" in warnings


def test_summary_counts_where_candidates_were_rejected():
    results = [
        VerifyResult("a", stage="none"),
        VerifyResult("b", stage="extract", flags=["torch_compute"]),
        VerifyResult("c", stage="static"),
        VerifyResult("d", stage="compile", flags=["torch_compute"]),
        VerifyResult("e", stage="full", correct=True),
        VerifyResult("f", stage="full", correct=True, cached=True),
        VerifyResult("g", stage="timing", correct=True, speedup=1.3),
        VerifyResult("h", stage="full", flags=["memoized_output"]),
    ]
    summary = summarize_results(results)
    assert summary["total"] == 8 and summary["correct"] == 3 and summary["cached"] == 1
    assert summary["rejected_at"] == {"extract": 1, "static": 1, "compile": 1, "tiny": 1, "full": 0, "timing": 1}
    assert summary["per_stage_reached"] == {"none": 8, "extract": 7, "static": 6, "compile": 5, "tiny": 4,
                                            "full": 4, "timing": 1}
    assert summary["flags"] == {"memoized_output": 1, "torch_compute": 2}


def _flags_raised_in(path) -> set[str]:
    """String literals appended to (or listed into) a ``flags`` list in a source file, and the
    values of its ``FLAG_*`` constants."""
    import ast

    raised = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id.startswith("FLAG_") and isinstance(node.value, ast.Constant)):
            raised.add(node.value.value)
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "append"
                and "flags" in ast.unparse(node.func.value) and node.args
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            raised.add(node.args[0].value)
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("add_flags") and len(node.args) > 1:
            listed = node.args[1]
            if isinstance(listed, ast.List):
                raised |= {e.value for e in listed.elts if isinstance(e, ast.Constant)}
    return raised


def test_every_flag_the_verifier_raises_reaches_the_verdict_by_name():
    """A worker's flags pass into a verdict only by known name (anything else is reported as
    ``unrecognised_flag``): every flag the audit, the worker, the judge or the timer raises must be
    known, or a caught cheat would lose its name."""
    from extensions.verify.parent.verdict import add_flags

    root = PROJECT_ROOT / "extensions"
    sources = [root / "verify" / name
               for name in ("sandboxed/audit.py", "sandboxed/worker.py", "parent/judge.py", "parent/candidate_run.py",
                            "parent/verdict.py")]
    sources += sorted((root / "timing").glob("*.py"))
    raised = set().union(*(_flags_raised_in(path) for path in sources))
    assert {"host_compute", "decoy_kernel", "audit_tampered", "reduced_size", "timer_patched"} <= raised
    result = VerifyResult("c")
    add_flags(result, sorted(raised))
    assert "unrecognised_flag" not in result.flags and set(result.flags) == raised
