"""A multi-turn RL round SIGKILLed in its second turn resumes without sampling or judging a logged
turn again: the rerun's sampler and judge see exactly what the candidate log was missing."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from extensions.runtime.paths import RunPaths
from kill_support import json_records, kill_when
from project_paths import TESTS_DIR

HELPER = TESTS_DIR / "rl_synthetic.py"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from extensions.models.tiny import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny_model"))





def _turn_keys(records: list[dict], kind: str) -> list[tuple]:
    return [(r["task_id"], r["sample_index"], r["turn"]) for r in records if r.get("type") == kind]


def test_sigkilled_round_resumes_without_sampling_or_judging_a_logged_turn(tmp_path, model_dir):
    paths = RunPaths(tmp_path / "run")
    log_path = paths.rl_candidates_log(1)
    calls = tmp_path / "calls.jsonl"
    args = [sys.executable, str(HELPER), str(paths.root), str(model_dir)]
    for item in ("rl.num_rounds=1", "rl.max_turns=3", "rl.tasks_per_round=2", "rl.samples_per_task=4",
                 "rl.generation_batch_size=2", "rl.verify_chunk_size=2", "rl.algorithm=grpo"):
        args += ["--set", item]
    env = {**os.environ, "RL_SYNTHETIC_CALLS": str(calls)}

    def in_turn_two() -> bool:
        return log_path.is_file() and '"turn": 2' in log_path.read_text()

    kill_when(args, in_turn_two, env=env)
    before = json_records(log_path)
    sampled_before, judged_before = set(_turn_keys(before, "sample")), set(_turn_keys(before, "verdict"))
    assert len({k for k in judged_before if k[2] == 1}) == 8  # turn 1 was finished, turn 2 begun
    assert not (paths.rl_round(1) / "manifest.json").exists()
    calls.unlink()

    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "reusing" in done.stdout
    after = json_records(log_path)
    new = after[len(before):]
    new_samples, new_verdicts = _turn_keys(new, "sample"), _turn_keys(new, "verdict")
    assert new_samples and not set(new_samples) & sampled_before and not set(new_verdicts) & judged_before
    resumed_calls = [json.loads(line) for line in calls.read_text().splitlines()]
    judged_now = [tuple(c["key"]) for c in resumed_calls if c["call"] == "judge"]
    assert sorted(judged_now) == sorted(new_verdicts)  # the judge saw exactly what was not yet logged
    assert sum(c["sequences"] for c in resumed_calls if c["call"] == "sample") == len(new_samples)
    # the round is whole: 2 tasks x 4 trajectories x 3 turns (the synthetic judge never says correct)
    everything = _turn_keys(after, "sample")
    assert len(set(everything)) == len(everything) == 24 and len(set(_turn_keys(after, "verdict"))) == 24
    metrics = json.loads((paths.rl_round(1) / "round_metrics.json").read_text())
    assert metrics["multiturn"]["average_turns_used"] == 3.0 and metrics["candidates"] == 24
