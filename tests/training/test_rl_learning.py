"""The RL loop learns, and resumes exactly: a synthetic reward (vowels in the sampled text, see
``rl_synthetic``) drives the real round loop on a 2-layer random Qwen2; GRPO, RLOO and Best-of-N
must raise the mean reward well above its start. A run SIGKILLed in the middle of a round, then
rerun, ends with exactly the adapter of a run that was never interrupted."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from extensions.runtime.paths import RunPaths
from kill_support import kill_when
from rl_synthetic import judge_nothing, round_rewards, synthetic_config, vowel_reward
from project_paths import TESTS_DIR

HELPER = TESTS_DIR / "rl_synthetic.py"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from extensions.models.tiny import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny_model"))


@pytest.mark.parametrize("algorithm, overrides", [
    ("grpo", ["rl.learning_rate=0.02"]),
    ("rloo", ["rl.learning_rate=0.02"]),
    ("best_of_n", ["rl.learning_rate=0.01", "rl.epochs_per_round=2", "rl.top_k=1"]),
])
def test_policy_learns_a_synthetic_reward(tmp_path, model_dir, algorithm, overrides):
    from extensions.training.rl import run_rl

    cfg = synthetic_config(tmp_path, model_dir, [f"rl.algorithm={algorithm}", "rl.num_rounds=8", *overrides])
    assert run_rl(cfg, progress=False, verify_fn=judge_nothing, score_fn=vowel_reward).status == "finished"
    rewards = round_rewards(cfg)
    steps = [json.loads(line).get("train_steps") for line in RunPaths.from_config(cfg).metrics_log("rl").read_text().splitlines()
             if json.loads(line)["kind"] == "round"]
    if algorithm != "best_of_n":
        assert 20 <= sum(steps) <= 50, steps
    start, end = rewards[0], sum(rewards[-3:]) / 3
    assert end >= start + 0.2, f"{algorithm}: mean reward per round {rewards}"
    _assert_round_metrics(cfg, policy_gradient=algorithm != "best_of_n")


def _assert_round_metrics(cfg, *, policy_gradient: bool) -> None:
    paths = RunPaths.from_config(cfg)
    rows = [json.loads(line) for line in paths.metrics_log("rl").read_text().splitlines()]
    last = [row for row in rows if row["kind"] == "round"][-1]
    assert last["reward_min"] <= last["reward_mean"] <= last["reward_max"]
    assert set(last["reward_mean_by_level"]) == set(last["correct_rate_by_level"]) == {"1"}
    assert 0.0 <= last["zero_spread_share"] <= 1.0 and last["groups"] == cfg.rl.tasks_per_round
    assert last["rollout_tokens"] > 0 and last["rollout_tokens_per_s"] > 0 and last["train_tokens_per_s"] > 0
    assert set(last["seconds"]) >= {"sampling_s", "verifying_s", "training_s", "checkpoint_s", "round_s"}
    if policy_gradient:
        assert sum(last["advantage_histogram"]["counts"]) == cfg.rl.tasks_per_round * cfg.rl.samples_per_task
        assert 0.0 <= last["clip_fraction"] <= 1.0 and last["approx_kl"] >= 0.0 and last["entropy"] > 0.0
        assert any(paths.tensorboard("rl").rglob("events*"))


# -- exact resume after SIGKILL ---------------------------------------------------------------------------
def _runner(root: Path, model_dir: Path, overrides) -> list[str]:
    args = [sys.executable, str(HELPER), str(root), str(model_dir)]
    for item in overrides:
        args += ["--set", item]
    return args


def _log_lines(path: Path, kind: str) -> int:
    if not path.is_file():
        return 0
    return sum(f'"type": "{kind}"' in line for line in path.read_text().splitlines())


def _round_steps_logged(paths: RunPaths, round_index: int) -> int:
    path = paths.metrics_log("rl")
    if not path.is_file():
        return 0
    lines = path.read_text().splitlines()
    return sum(f'"step": {round_index}0000' in line and '"kind": "step"' in line for line in lines)





def _adapter_tensors(directory: Path):
    from safetensors.torch import load_file

    return load_file(str(directory / "adapter_model.safetensors"))


def test_sigkill_mid_round_resumes_to_the_uninterrupted_adapter(tmp_path, model_dir):
    import torch

    # Round 2 samples in four chunks of one task, so a kill can land between chunks.
    overrides = ["rl.algorithm=grpo", "rl.num_rounds=2", "rl.generation_batch_size=8", "rl.learning_rate=0.02",
                 "rl.ppo_epochs=2"]
    reference = tmp_path / "reference"
    done = subprocess.run(_runner(reference, model_dir, overrides), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr

    killed = RunPaths(tmp_path / "killed")
    round_log = killed.rl_candidates_log(2)
    args = _runner(killed.root, model_dir, overrides)
    # 1. killed while round 2 is sampling: some of its samples are logged, not all
    kill_when(args, lambda: _log_lines(round_log, "sample") >= 8)
    assert 8 <= _log_lines(round_log, "sample") < 32 and not (killed.rl_round(2) / "manifest.json").exists()
    # 2. killed again in round 2's update, after its first optimizer step, before its checkpoint
    kill_when(args, lambda: _round_steps_logged(killed, 2) >= 1)
    assert _log_lines(round_log, "verdict") == 32 and not (killed.rl_round(2) / "manifest.json").exists()
    # 3. the rerun finishes the round from the log and the round-1 checkpoint
    done = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr

    expected, resumed = _adapter_tensors(RunPaths(reference).final("rl")), _adapter_tensors(killed.final("rl"))
    assert expected.keys() == resumed.keys()
    moved = _adapter_tensors(RunPaths(reference).rl_round(1))
    assert any(not torch.equal(expected[k], moved[k]) for k in expected)  # round 2 did train
    for key in expected:
        assert torch.equal(expected[key], resumed[key]), key
    reference_samples = [line for line in RunPaths(reference).rl_candidates_log(2).read_text().splitlines() if '"sample"' in line]
    resumed_samples = {line for line in round_log.read_text().splitlines() if '"sample"' in line}
    assert set(reference_samples) <= resumed_samples  # chunks sampled again gave the same tokens
    meta = json.loads((killed.rl_round(2) / "meta.json").read_text())
    assert meta["algorithm"] == "grpo" and meta["optimizer_state"] == "optimizer.pt"
    assert (killed.rl_round(2) / "optimizer.pt").is_file()


def test_two_process_data_parallel_round(tmp_path, model_dir):
    """Two CPU ranks (gloo on loopback): each samples half the tasks, both train on all rollouts,
    and every optimizer step holds both ranks' shares."""
    from s3_testing import free_port

    root = tmp_path / "ddp"
    args = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
            "--master_port", str(free_port()), *_runner(root, model_dir, ["rl.algorithm=rloo", "rl.num_rounds=1"])[1:]]
    done = subprocess.run(args, capture_output=True, text=True, timeout=300, env={**os.environ, "ACCELERATE_USE_CPU": "true"})
    assert done.returncode == 0, done.stdout + done.stderr
    paths = RunPaths(root)
    rows = [json.loads(line) for line in paths.metrics_log("rl").read_text().splitlines()]
    steps = [row for row in rows if row["kind"] == "step"]
    (round_row,) = [row for row in rows if row["kind"] == "round"]
    assert round_row["candidates"] == 32 and round_row["train_steps"] == len(steps) >= 1
    assert sum(step["sequences"] for step in steps) == round_row["trained_samples"]
    assert all(step["sequences"] > 8 for step in steps)  # 8 per rank and step: both ranks trained
    assert json.loads((paths.rl_round(1) / "meta.json").read_text())["world_size"] == 2
    header = json.loads(paths.rl_candidates_log(1).read_text().splitlines()[0])
    assert len(header["task_ids"]) == 4
