"""Evaluation metrics, statistics and input readers, on synthetic verdict records."""
import itertools
import json
import math
from fractions import Fraction

import pytest

from extensions.evaluation.inputs import InputError, load_tasks, read_generations
from extensions.evaluation.metrics import FUNNEL_STAGES, compute_metrics, recompute_metrics
from extensions.evaluation.records import EvalTask, SampleRecord, TaskRecord
from extensions.evaluation.runner import (EvalSettings, VerificationOutcome, build_report, pending_tasks,
                                          reference_failure)
from extensions.evaluation.stats import allowed_ks, geometric_mean, pass_at_k
from extensions.config import VerifierConfig
from extensions.verify.result import STAGES, VerifyResult


def brute_force_pass_at_k(n, c, k):
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", range(1, 9))
def test_pass_at_k_matches_enumeration_of_all_subsets(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(brute_force_pass_at_k(n, c, k), abs=1e-12)


def test_pass_at_k_is_stable_for_large_n():
    n, c, k = 1000, 3, 100
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    assert pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-12)
    assert pass_at_k(200, 0, 50) == 0.0 and pass_at_k(200, 200, 50) == 1.0


def test_pass_at_k_rejects_impossible_arguments():
    with pytest.raises(ValueError, match="pass@5"):
        pass_at_k(3, 1, 5)
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)
    assert allowed_ks(1) == [1] and allowed_ks(10) == [1, 5, 10] and allowed_ks(4) == [1]


def test_geometric_mean():
    assert geometric_mean([1.0, 4.0]) == pytest.approx(2.0)
    assert geometric_mean([2.0, 8.0, 0.5]) == pytest.approx(2.0)  # (2 * 8 * 0.5) ** (1/3)
    assert geometric_mean([]) is None
    with pytest.raises(ValueError, match="positive"):
        geometric_mean([1.0, 0.0])


def test_funnel_stages_follow_the_verifier():
    assert FUNNEL_STAGES == STAGES


def sample(i, stage, correct=False, speedup=None, flags=(), reward=0.0):
    return SampleRecord(sample=i, stage=stage, correct=correct, reward=reward, speedup=speedup, flags=list(flags))


def timed_tasks():
    return [
        TaskRecord("a", 1, "a", [sample(0, "timing", True, 2.0, reward=1.0), sample(1, "timing", True, 1.2, reward=0.79),
                                 sample(2, "compile", flags=["torch_op"]), sample(3, "none")]),
        TaskRecord("b", 2, "b", [sample(0, "timing", True, 0.8, reward=0.82), sample(1, "static"),
                                 sample(2, "extract"), sample(3, "full", flags=["torch_op", "zeros"])]),
    ]


def test_metrics_with_timing():
    m = compute_metrics(timed_tasks(), timing_available=True)
    assert m["num_samples"] == 8 and m["num_correct"] == 3
    assert m["correct_rate"] == pytest.approx(100 * 3 / 8)
    assert m["valid_rate"] == pytest.approx(100 * 6 / 8)  # everything but "none" and "extract"
    assert m["compiled_rate"] == pytest.approx(100 * 5 / 8)
    assert m["fast_1"] == pytest.approx(100 * 2 / 8)  # 2.0 and 1.2; 0.8 is correct but slower
    assert m["fast_1.5"] == pytest.approx(100 * 1 / 8)
    assert m["geomean_speedup"] == pytest.approx((2.0 * 1.2 * 0.8) ** (1 / 3))
    assert m["pass@1"] == pytest.approx((50 + 25) / 2)
    assert "pass@5" not in m  # 4 samples per task
    assert m["stage_counts"]["timing"] == 3 and m["reached_counts"]["static"] == 6
    assert m["flag_counts"] == {"torch_op": 2, "zeros": 1}
    level2 = m["per_level"]["2"]
    assert level2["num_tasks"] == 1 and level2["correct_rate"] == pytest.approx(25.0)
    assert level2["fast_1"] == 0.0 and level2["geomean_speedup"] == pytest.approx(0.8)
    assert m["per_level"]["1"]["pass@1"] == pytest.approx(50.0)


def test_fast_p_is_null_with_a_reason_without_timing():
    tasks = [TaskRecord("a", 1, "a", [sample(0, "full", True), sample(1, "none")])]
    m = compute_metrics(tasks, timing_available=False, no_timing_reason="no timing on cpu")
    assert m["fast_1"] is None and m["fast_1.5"] is None and m["fast_p_note"] == "no timing on cpu"
    assert m["geomean_speedup"] is None and m["geomean_speedup_note"] == "no timing on cpu"
    assert m["correct_rate"] == 50.0


def test_pass_at_k_uses_the_smallest_sample_count():
    tasks = [TaskRecord("a", 1, "a", [sample(i, "full", i < 3) for i in range(10)]),
             TaskRecord("b", 1, "b", [sample(i, "full", i == 0) for i in range(12)])]
    m = compute_metrics(tasks, timing_available=False)
    assert sorted(k for k in m if k.startswith("pass@")) == ["pass@1", "pass@10", "pass@5"]
    assert m["pass@5"] == pytest.approx(100 * (pass_at_k(10, 3, 5) + pass_at_k(12, 1, 5)) / 2)


def test_report_metrics_are_recomputed_exactly_from_its_records(tmp_path):
    outcome = VerificationOutcome(records=timed_tasks())
    report = build_report(name="x", model_path="m", tasks_file=tmp_path / "t.jsonl", generations_file=tmp_path / "g",
                          generations_header=None, device="cuda", verifier_cfg=VerifierConfig(), outcome=outcome,
                          input_issues=[], config_source=None)
    stored = json.loads(json.dumps(report))
    assert recompute_metrics(stored) == stored["metrics"]
    cpu = build_report(name="x", model_path="m", tasks_file=tmp_path / "t.jsonl", generations_file=tmp_path / "g",
                       generations_header=None, device="cpu", verifier_cfg=VerifierConfig(),
                       outcome=VerificationOutcome(records=[TaskRecord("a", 1, "a", [sample(0, "full", True)])]),
                       input_issues=["bad line"], config_source=None)
    stored = json.loads(json.dumps(cpu))
    assert stored["metrics"]["fast_1"] is None and "interpreter" in stored["metrics"]["fast_p_note"]
    assert recompute_metrics(stored) == stored["metrics"]
    assert stored["complete"] is False  # an input row was skipped
    stored["tasks"][0]["samples"][0]["correct"] = False  # a tampered record no longer matches
    assert recompute_metrics(stored) != stored["metrics"]


def test_reference_failure_is_read_from_the_verdict():
    broken = VerifyResult("c", stage="static", error="problem: RuntimeError: boom", details={"problem_error": True})
    assert reference_failure(broken) == "RuntimeError: boom"
    assert reference_failure(VerifyResult("c", stage="compile", error="candidate raised")) is None


def write_lines(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return path


def test_generations_reader_reports_bad_rows_with_line_numbers(tmp_path):
    path = write_lines(tmp_path / "g.jsonl", [
        json.dumps({"header": {"model_path": "m"}}),
        json.dumps({"task_id": "a", "response": "x"}),
        "{not json",
        json.dumps({"response": "orphan"}),
        json.dumps({"task_id": "a", "response": "   "}),
        json.dumps({"task_id": "b", "response": None}),
        json.dumps({"task_id": 7, "sample": 3, "response": 12}),
        "[1, 2]",
    ])
    gens = read_generations(path)
    assert gens.header == {"model_path": "m"}
    assert [(r.task_id, r.sample, r.problem) for r in gens.rows] == [
        ("a", 0, None), ("a", 1, "empty response"), ("b", 0, "no response in the generations row"),
        ("7", 3, "response is int, not text")]
    assert any(i.startswith("g.jsonl:3: malformed JSON") for i in gens.issues)
    assert any(i.startswith("g.jsonl:4:") and "task_id" in i for i in gens.issues)
    assert any(i.startswith("g.jsonl:8:") for i in gens.issues)
    assert len(gens.issues) == 3


def test_tasks_reader_filters_and_reports(tmp_path):
    path = write_lines(tmp_path / "t.jsonl", [
        json.dumps({"task_id": "a", "level": 1, "name": "A", "code": "class Model: pass"}),
        json.dumps({"task_id": "b", "level": 2, "code": "class Model: pass"}),
        json.dumps({"task_id": "a", "level": 1, "code": "dup"}),
        json.dumps({"task_id": "c", "level": 1, "code": ""}),
        json.dumps({"task_id": "d", "level": 1, "code": "class Model: pass"}),
    ])
    tasks, issues = load_tasks(path, levels=[1])
    assert [t.task_id for t in tasks] == ["a", "d"] and len(issues) == 2
    tasks, _ = load_tasks(path, num_tasks=2)
    assert [t.task_id for t in tasks] == ["a", "b"]
    with pytest.raises(InputError, match="no usable task"):
        load_tasks(path, levels=[3])
    with pytest.raises(InputError, match="not found"):
        load_tasks(tmp_path / "missing.jsonl")


def test_saved_generations_are_reused_and_partial_tasks_regenerated(tmp_path):
    tasks = [EvalTask(t, 1, t, "code") for t in ("a", "b", "c")]
    settings = EvalSettings(samples_per_task=2, temperature=0.7)
    path = tmp_path / "generations_m.jsonl"
    messages = []
    assert [t.task_id for t in pending_tasks(path, tasks, "model", settings, log=messages.append)] == ["a", "b", "c"]
    with open(path, "a") as handle:  # "a" complete, "b" half written when the run died
        for row in ({"task_id": "a", "sample": 0, "response": "r0"}, {"task_id": "a", "sample": 1, "response": "r1"},
                    {"task_id": "b", "sample": 0, "response": "r0"}):
            handle.write(json.dumps(row) + "\n")
        handle.write('{"task_id": "b", "sam')
    assert [t.task_id for t in pending_tasks(path, tasks, "model", settings, log=messages.append)] == ["b", "c"]
    saved = read_generations(path)
    assert saved.issues == [] and [(r.task_id, r.sample) for r in saved.rows] == [("a", 0), ("a", 1)]
    assert saved.header["sampling"]["temperature"] == 0.7 and saved.header["model_path"] == "model"
    # other settings: the old file is kept aside, everything is generated anew
    other = EvalSettings(samples_per_task=2, temperature=0.7, seed=99)
    assert len(pending_tasks(path, tasks, "model", other, log=messages.append)) == 3
    assert (tmp_path / "generations_m.jsonl.old").is_file() and read_generations(path).rows == []
