"""How many training processes run_pipeline.sh starts: one per visible GPU (CUDA_VISIBLE_DEVICES
first, then `nvidia-smi -L`), and one in all when model.device_map shards a single model. A fake
nvidia-smi on PATH stands in for the driver."""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from extensions.pipeline.launcher import gpus_from_cuda_visible_devices

from fake_stages import stage_env, write_config, write_fake_stages
from s3_testing import PROJECT_ROOT

FOUR_GPUS = "\n".join(f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i}a2b3c4d-0000-0000-0000-00000000000{i})"
                      for i in range(4))


@pytest.mark.parametrize("value, count", [
    ("0,1,2", 3), ("3", 1), ("", 0), ("0,-1,2", 1), ("-1", 0), (" 1, 2 ", 2),
    ("GPU-8f6c3a1e-1b2c-4d5e-8f90-123456789abc,GPU-0a1b2c3d-4e5f-6789-abcd-ef0123456789", 2),
    ("MIG-0a1b2c3d-4e5f-6789-abcd-ef0123456789", 1), ("0,bogus,1", 1),
])
def test_cuda_visible_devices_counts_like_cuda(value, count):
    assert gpus_from_cuda_visible_devices(value) == count


def env_with_fake_nvidia_smi(tmp_path: Path, base: dict, cuda_visible=None) -> dict:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "nvidia-smi"
    fake.write_text(f"#!/bin/sh\ncat <<'LIST'\n{FOUR_GPUS}\nLIST\n")
    fake.chmod(0o755)
    env = {k: v for k, v in base.items() if k not in ("CUDA_VISIBLE_DEVICES", "KERNEL_RL_TRAIN_LAUNCHER")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    if cuda_visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = cuda_visible
    return env


def launcher(tmp_path: Path, env: dict, *sets: str) -> list[str]:
    config = write_config(tmp_path / "run.yaml", tmp_path / "run")
    command = [sys.executable, str(PROJECT_ROOT / "resume_training.py"), "--config", str(config), "--print-state"]
    for item in sets:
        command += ["--set", item]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    line = next(line for line in result.stdout.splitlines() if line.startswith("TRAIN_LAUNCHER="))
    return shlex.split(shlex.split(line.split("=", 1)[1])[0])


@pytest.mark.parametrize("cuda_visible, sets, processes", [
    (None, (), 4),  # every GPU nvidia-smi lists
    ("1,3", (), 2),  # only those CUDA_VISIBLE_DEVICES exposes
    ("2", (), 1),
    ("", (), 1),  # none visible: the plain interpreter
    (None, ("model.device_map=auto",), 1),  # one process shards the model over all four
])
def test_training_processes_follow_visible_gpus_and_device_map(tmp_path, cuda_visible, sets, processes):
    env = env_with_fake_nvidia_smi(tmp_path, {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}, cuda_visible)
    command = launcher(tmp_path, env, *sets)
    if processes == 1:
        assert command == [sys.executable]
    else:
        assert command[1:4] == ["-m", "accelerate.commands.launch", "--num_processes"], command
        assert command[4] == str(processes)


def test_pipeline_with_device_map_auto_starts_one_training_process(tmp_path):
    env = env_with_fake_nvidia_smi(tmp_path, stage_env(write_fake_stages(tmp_path / "scripts")))
    config = write_config(tmp_path / "run.yaml", tmp_path / "run")
    result = subprocess.run(["bash", str(PROJECT_ROOT / "run_pipeline.sh"), "--config", str(config),
                             "--set", "model.device_map=auto", "--set", "rl.num_rounds=1"],
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    training = [line for line in result.stdout.splitlines() if "train_integrated.py --stage" in line]
    assert len(training) == 2 and not any("accelerate" in line for line in training), training


def test_help_is_the_usage_text_and_nothing_else():
    result = subprocess.run(["bash", str(PROJECT_ROOT / "run_pipeline.sh"), "--help"],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0
    lines = result.stdout.rstrip("\n").splitlines()
    assert lines[0].startswith("The whole pipeline")
    assert "CUDA_VISIBLE_DEVICES" in result.stdout
    script_lines = {line.strip() for line in (PROJECT_ROOT / "run_pipeline.sh").read_text().splitlines()
                    if line.strip() and not line.lstrip().startswith("#")}
    assert not any(line.strip() in script_lines for line in lines), lines[-3:]
