"""Comparison of evaluation reports: paired bootstrap intervals, markdown, PNG, skipped models."""
import json
import random
import subprocess
import sys

import pytest

from extensions.config import VerifierConfig
from extensions.evaluation.compare import (compare_reports, funnel_title, per_task_scores, render_markdown,
                                           write_comparison)
from extensions.evaluation.records import SampleRecord, TaskRecord
from extensions.evaluation.runner import VerificationOutcome, build_report
from extensions.evaluation.stats import paired_bootstrap


def synthetic_report(name, correct_probability, *, num_tasks=40, samples=2, device="cpu", seed=0, speedup=1.3):
    rng = random.Random(seed)
    records = []
    for t in range(num_tasks):
        record = TaskRecord(f"task{t}", 1 + t % 2, f"task{t}")
        for s in range(samples):
            correct = rng.random() < correct_probability
            stage = ("timing" if device == "cuda" else "full") if correct else rng.choice(["none", "static", "compile"])
            record.samples.append(SampleRecord(
                sample=s, stage=stage, correct=correct, reward=0.7 if correct else 0.0,
                speedup=speedup * rng.uniform(0.5, 2.0) if correct and device == "cuda" else None))
        records.append(record)
    report = build_report(name=name, model_path=f"models/{name}", tasks_file="tasks.jsonl", generations_file="g.jsonl",
                          generations_header=None, device=device, verifier_cfg=VerifierConfig(),
                          outcome=VerificationOutcome(records=records), input_issues=[], config_source=None)
    return json.loads(json.dumps(report))


def test_bootstrap_identical_is_not_significant_and_large_difference_is():
    same = paired_bootstrap([0.0] * 30, 1000, seed=1)
    assert (same.low, same.high, same.significant) == (0.0, 0.0, False)
    noisy = paired_bootstrap([1.0, -1.0] * 20, 1000, seed=1)
    assert noisy.low < 0 < noisy.high and not noisy.significant
    big = paired_bootstrap([50.0, 100.0, 0.0, 100.0] * 10, 1000, seed=1)
    assert big.significant and big.low > 0 and big.mean == pytest.approx(62.5)
    assert paired_bootstrap([3.0, 5.0, 9.0], 500, seed=7) == paired_bootstrap([3.0, 5.0, 9.0], 500, seed=7)
    assert paired_bootstrap([5.0], 100).low is None and paired_bootstrap([], 100).num_tasks == 0


def test_comparison_of_identical_models_is_not_significant():
    base = synthetic_report("base", 0.3)
    comparison = compare_reports({"base": base, "copy": base}, bootstrap_samples=500, seed=3)
    correct = [d for d in comparison["differences"] if d["metric"] == "correct_rate"]
    assert len(correct) == 1 and correct[0]["mean"] == 0.0 and not correct[0]["significant"]
    assert "not significant (CI contains 0)" in render_markdown(comparison)


def test_comparison_tables_and_plot(tmp_path):
    reports = {"base": synthetic_report("base", 0.1, seed=1), "sft": synthetic_report("sft", 0.15, seed=2),
               "rl": synthetic_report("rl", 0.9, seed=3)}
    comparison = compare_reports(reports, bootstrap_samples=500, seed=3,
                                 skipped_models=[{"name": "extra", "model_path": "x", "reason": "checkpoint not found: x"}])
    by_pair = {(d["baseline"], d["candidate"], d["metric"]): d for d in comparison["differences"]}
    rl_vs_base = by_pair[("base", "rl", "correct_rate")]
    expected = (sum(per_task_scores(reports["rl"], "correct_rate").values())
                - sum(per_task_scores(reports["base"], "correct_rate").values())) / 40
    assert rl_vs_base["mean"] == pytest.approx(expected)
    assert rl_vs_base["mean"] == pytest.approx(reports["rl"]["metrics"]["correct_rate"] - reports["base"]["metrics"]["correct_rate"])
    assert rl_vs_base["significant"] and rl_vs_base["low"] > 0
    assert not any(d["metric"] == "fast_1" for d in comparison["differences"])  # no timing on cpu
    paths = {"json_path": tmp_path / "compare.json", "md_path": tmp_path / "compare.md", "png_path": tmp_path / "compare.png"}
    write_comparison(comparison, reports, **paths)
    md = paths["md_path"].read_text()
    assert md.count("\n| base |") == 1 and "| rl |" in md and "| rl − base | correct % |" in md and "**yes**" in md
    assert "checkpoint not found: x" in md and "n/a" in md
    assert json.loads(paths["json_path"].read_text())["paired_tasks"] == 40
    assert paths["png_path"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # no timing on CPU: the funnel alone, no empty speedup panel; the title says what n is
    assert _png_width(paths["png_path"]) < 1000
    assert "n=80 samples over 40 tasks per model" in funnel_title(list(reports), reports)


def test_comparison_with_timing_plots_speedups(tmp_path):
    reports = {"sft": synthetic_report("sft", 0.5, device="cuda", seed=4),
               "rl": synthetic_report("rl", 0.6, device="cuda", seed=5, speedup=2.0)}
    comparison = compare_reports(reports, bootstrap_samples=300, seed=3)
    assert any(d["metric"] == "fast_1" for d in comparison["differences"])
    assert comparison["models"]["rl"]["fast_1"] is not None and comparison["models"]["rl"]["geomean_speedup"] > 0
    write_comparison(comparison, reports, json_path=tmp_path / "c.json", md_path=tmp_path / "c.md",
                     png_path=tmp_path / "c.png")
    assert (tmp_path / "c.png").stat().st_size > 10_000
    assert _png_width(tmp_path / "c.png") > 1200  # the funnel and the speedup panel


def _png_width(path) -> int:
    return int.from_bytes(path.read_bytes()[16:20], "big")


def test_compare_cli_reports_missing_checkpoints_and_exits_3(tmp_path, project_root):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"task_id": "t", "level": 1, "name": "t", "code": "class Model: pass"}) + "\n")
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "evaluate.py", "--compare", "--smoke", "--set", f"run.root={tmp_path / 'run'}",
         "--set", "prompt.mode=plain",
         "--tasks", str(tasks), "--base", str(tmp_path / "no-base"), "--output_dir", str(out)],
        cwd=project_root, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 3, proc.stdout + proc.stderr
    comparison = json.loads((out / "compare.json").read_text())
    assert [s["name"] for s in comparison["skipped_models"]] == ["base", "sft", "rl"]
    assert "checkpoints/sft/final" in comparison["skipped_models"][1]["reason"]
    assert "Skipped models" in (out / "compare.md").read_text()
    assert "[rl] skipped: checkpoint not found" in proc.stdout


def test_usage_errors_exit_2(tmp_path, project_root):
    def run(*args):
        return subprocess.run([sys.executable, "evaluate.py", *args], cwd=project_root, capture_output=True,
                              text=True, timeout=120)
    both = run("--compare", "--model_path", "x", "--smoke")
    assert both.returncode == 2 and "exactly one" in both.stderr
    no_name = run("--from_generations", str(tmp_path / "g.jsonl"), "--smoke")
    assert no_name.returncode == 2 and "--name" in no_name.stderr
    missing = run("--from_generations", str(tmp_path / "g.jsonl"), "--tasks", str(tmp_path / "t.jsonl"),
                  "--name", "x", "--smoke")
    assert missing.returncode == 2 and "not found" in missing.stderr
