"""The overlapped RL round under data parallelism (two CPU ranks, gloo on loopback): each rank
streams its own share to a verifier session of its own, and the ranks still agree at every stop
check where their shares differ in size (three tasks, one a chunk: two chunks on rank 0, one on
rank 1), gather every candidate and finish the round."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter

import pytest

from extensions.runtime.paths import RunPaths
from project_paths import TESTS_DIR

HELPER = TESTS_DIR / "rl_synthetic.py"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from extensions.models.tiny import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny_model"))


def test_ranks_with_uneven_shares_stream_their_verdicts_and_finish_together(tmp_path, model_dir):
    from s3_testing import free_port

    root, calls = tmp_path / "ddp", tmp_path / "calls.jsonl"
    args = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
            "--master_port", str(free_port()), str(HELPER), str(root), str(model_dir)]
    for item in ("rl.algorithm=grpo", "rl.num_rounds=1", "rl.tasks_per_round=3", "rl.samples_per_task=2",
                 "rl.generation_batch_size=2", "rl.per_device_batch_size=2"):
        args += ["--set", item]
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "RL_SYNTHETIC_STREAMING": "1", "RL_SYNTHETIC_CALLS": str(calls)}
    # A group of its own: ranks that hang at a collective are killed with their launcher.
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 0, out + err
    assert out.count("outcome finished") == 2, out
    paths = RunPaths(root)
    header, *records = [json.loads(line) for line in paths.rl_candidates_log(1).read_text().splitlines()]
    samples = [(r["task_id"], r["sample_index"]) for r in records if r["type"] == "sample"]
    verdicts = [(r["task_id"], r["sample_index"]) for r in records if r["type"] == "verdict"]
    assert len(header["task_ids"]) == 3 and Counter(samples) == Counter(verdicts) == Counter(set(samples))
    assert len(samples) == 6
    judged = [tuple(row["key"]) for row in map(json.loads, calls.read_text().splitlines()) if row["call"] == "judge"]
    assert sorted(judged) == sorted(samples)  # every candidate judged once, by its own rank's session
    round_row = json.loads((paths.rl_round(1) / "round_metrics.json").read_text())
    assert round_row["candidates"] == 6 and "waiting_s" in round_row["seconds"]
