"""The run summary's account of RL: candidates per verifier stage from the candidate logs and
optimizer steps from the metrics log, in the pipeline's summary and in compare.md."""
from __future__ import annotations

import subprocess
import sys

from extensions.evaluation.compare import render_markdown
from extensions.runtime.paths import RunPaths
from extensions.runtime.activity import rl_activity
from extensions.training.candidates import CandidateLog
from extensions.training.metrics import MetricsLogger

from fake_stages import stage_env, write_config, write_fake_stages
from s3_testing import PROJECT_ROOT


def verdict(task: str, index: int, stage: str, correct: bool = False) -> dict:
    result = {"candidate": f"{task}-{index}", "correct": correct, "stage": stage, "reward": 0.7 if correct else 0.0,
              "error": None, "flags": [], "speedup": None}
    return {"type": "verdict", "task_id": task, "sample_index": index, "sha1": f"{task}{index}", "result": result}


def write_rl_logs(paths: RunPaths) -> None:
    round0 = CandidateLog(paths.rl_candidates_log(0))
    round0.append([{"type": "round", "round": 0, "task_ids": ["a"], "policy": "p0"},
                   verdict("a", 0, "none"), verdict("a", 1, "static"), verdict("a", 2, "compile"),
                   verdict("a", 3, "full", correct=True)])
    round0.append([verdict("a", 3, "full", correct=True)])  # logged again by a resumed round: counts once
    round1 = CandidateLog(paths.rl_candidates_log(1))
    round1.append([{"type": "round", "round": 1, "task_ids": ["b"], "policy": "p1"},
                   verdict("b", 0, "tiny"), verdict("b", 1, "extract")])
    with open(round1.path, "a") as handle:
        handle.write('{"type": "verdict", "task_id": "b", "sam')  # a crash mid-write
    metrics = MetricsLogger.for_stage(paths, "rl", report_to=[])
    for step in (0, 1):
        metrics.log(step, {"round": 0, "loss": 1.0})
    metrics.log(1, {"round": 0, "loss": 1.0})  # replayed after a resume
    metrics.log(0, {"round": 0, "reward_mean": 0.2}, kind="round")
    metrics.log(1, {"round": 1, "reward_mean": 0.0}, kind="round")  # round 1: nothing kept, no step
    metrics.close()


def test_activity_counts_each_candidate_and_step_once(tmp_path):
    paths = RunPaths(tmp_path / "run")
    write_rl_logs(paths)
    activity = rl_activity(paths)
    assert activity.rounds_logged == 2 and activity.candidates_judged == 6 and activity.correct == 1
    assert activity.reached == {"extract": 5, "static": 4, "compile": 3, "tiny": 2, "full": 1, "timing": 0}
    assert activity.optimizer_steps == 2 and activity.rounds_with_updates == 1
    assert activity.damaged_lines == 1
    lines = activity.describe()
    assert lines[0].startswith("RL candidates: 6 judged in 2 round(s); passed extract 5, static 4, compile 3")
    assert lines[1] == "RL updates: 2 optimizer step(s) in 1 round(s)"


def test_a_run_without_updates_says_so(tmp_path):
    paths = RunPaths(tmp_path / "run")
    CandidateLog(paths.rl_candidates_log(0)).append([{"type": "round", "round": 0}, verdict("a", 0, "static")])
    text = "\n".join(rl_activity(paths).describe())
    assert "no candidate reached the sandbox" in text and "no RL update happened" in text
    assert rl_activity(RunPaths(tmp_path / "empty")).describe() == ["RL: no candidate log yet (RL has not run)"]


def test_compare_report_and_pipeline_summary_show_the_activity(tmp_path):
    paths = RunPaths(tmp_path / "run")
    write_rl_logs(paths)
    comparison = {"models": {}, "model_order": [], "paired_tasks": 0, "task_counts_differ": False,
                  "differences": [], "skipped_models": [], "rl_activity": rl_activity(paths).to_json()}
    markdown = render_markdown(comparison)
    assert "## What RL did" in markdown and "- RL updates: 2 optimizer step(s) in 1 round(s)" in markdown

    config = write_config(tmp_path / "run.yaml", paths.root)
    result = subprocess.run(["bash", str(PROJECT_ROOT / "run_pipeline.sh"), "--config", str(config)],
                            env=stage_env(write_fake_stages(tmp_path / "scripts")), capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    summary = result.stdout.split("======== summary", 1)[1]
    assert "RL candidates: 6 judged in 2 round(s)" in summary and "RL updates: 2 optimizer step(s)" in summary
