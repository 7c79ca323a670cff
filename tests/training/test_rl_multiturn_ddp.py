"""Multi-turn RL under data parallelism (two CPU ranks, gloo on loopback): one rank's trajectories
are all solved in turn 1 while the other's refine for three turns; both ranks still agree at every
stop check, gather every turn and train on all of them."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from extensions.runtime.paths import RunPaths
from project_paths import TESTS_DIR

HELPER = TESTS_DIR / "rl_synthetic.py"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from extensions.models.tiny import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny_model"))


def test_ranks_with_different_turn_counts_finish_the_round_together(tmp_path, model_dir):
    from s3_testing import free_port

    root = tmp_path / "ddp"
    args = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
            "--master_port", str(free_port()), str(HELPER), str(root), str(model_dir)]
    for item in ("rl.algorithm=rloo", "rl.num_rounds=1", "rl.max_turns=3", "rl.samples_per_task=4"):
        args += ["--set", item]
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "RL_SYNTHETIC_SOLVING_RANK": "0"}
    done = subprocess.run(args, capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    paths = RunPaths(root)
    header, *records = [json.loads(line) for line in paths.rl_candidates_log(1).read_text().splitlines()]
    turns_by_task: dict[str, set[int]] = {}
    for record in records:
        if record["type"] == "sample":
            turns_by_task.setdefault(record["task_id"], set()).add(record["turn"])
    rank_zero, rank_one = header["task_ids"][0::2], header["task_ids"][1::2]
    assert all(turns_by_task[t] == {1} for t in rank_zero) and all(turns_by_task[t] == {1, 2, 3} for t in rank_one)
    round_row = json.loads((paths.rl_round(1) / "round_metrics.json").read_text())
    assert round_row["candidates"] == 2 * 4 * 1 + 2 * 4 * 3
    assert round_row["multiturn"]["success_rate"] == 0.5 and round_row["multiturn"]["average_turns_used"] == 2.0
    assert round_row["train_steps"] >= 1
