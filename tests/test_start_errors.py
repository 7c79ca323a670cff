"""Every entry point answers a bad start with one line and its documented exit status, before any
work and without a traceback (extensions/entry_point.py: 2 for a missing input, 74 for a path that
cannot be written)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[1]
UNWRITABLE = Path("/sys/kernel-rl-cannot-write-here")  # EPERM even for root


def _run(*command: str, cwd: Path = PROJECT) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KERNEL_RL_BUCKET", "AWS_"))}
    return subprocess.run([sys.executable, *command], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={**env, "HF_HUB_OFFLINE": "1"})


def _with_sft_data(root: Path) -> Path:
    processed = root / "data" / "processed"
    processed.mkdir(parents=True)
    row = {"uuid": "a", "level": 1, "prompt": [{"role": "user", "content": "task"}], "completion": "answer"}
    (processed / "sft_train.jsonl").write_text(json.dumps(row) + "\n")
    return root


CASES = {
    "train sft without prepared data": (
        lambda tmp: ["train_integrated.py", "--smoke", "--stage", "sft", "--set", f"run.root={tmp / 'empty'}"],
        2, "prepare_data.py"),
    "train rl without prepared tasks": (
        lambda tmp: ["train_integrated.py", "--smoke", "--stage", "rl", "--set", f"run.root={tmp / 'empty'}",
                     "--set", "rl.init=base"],
        2, "rl_tasks"),
    "train sft with a model path that does not exist": (
        lambda tmp: ["train_integrated.py", "--smoke", "--stage", "sft", "--set", f"run.root={_with_sft_data(tmp / 'r')}",
                     "--set", "model.name_or_path=/no/such/model"],
        2, "/no/such/model"),
    "train with an unwritable run root": (
        lambda tmp: ["train_integrated.py", "--smoke", "--stage", "sft", "--set", f"run.root={UNWRITABLE}"],
        74, str(UNWRITABLE)),
    "prepare into an unwritable output directory": (
        lambda tmp: ["prepare_data.py", "--smoke", "--out", str(UNWRITABLE / "processed"), "--set",
                     "data.verify_pairs=false"],
        74, str(UNWRITABLE)),
    "prepare from a source file that does not exist": (
        lambda tmp: ["prepare_data.py", "--smoke", "--kernelbook", str(tmp / "missing.jsonl"), "--out", str(tmp / "o")],
        2, "missing.jsonl"),
    "sync without a bucket": (
        lambda tmp: ["checkpoint_manager.py", "--action", "sync", "--smoke", "--local-dir", str(tmp / "r")],
        2, "needs a bucket"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_start_is_one_line_with_its_exit_status(case, tmp_path):
    build, status, named = CASES[case]
    if UNWRITABLE.parent.exists() and os.access(UNWRITABLE.parent, os.W_OK) and "unwritable" in case:
        try:
            UNWRITABLE.mkdir()
            UNWRITABLE.rmdir()
            pytest.skip("this machine lets us write under /sys")
        except OSError:
            pass
    result = _run(*build(tmp_path))
    output = result.stdout + result.stderr
    assert result.returncode == status, output[-2000:]
    assert "Traceback" not in output
    errors = [line for line in result.stderr.splitlines() if named in line and not line.startswith(tuple(
        f"{prog}:   " for prog in ("train_integrated", "prepare_data", "checkpoint_manager")))]
    assert len(errors) == 1, result.stderr[-2000:]


@pytest.mark.parametrize("command", [
    ["prepare_data.py", "--smoke", "--no-progress", "--max-samples", "3", "--print-config"],
    ["train_integrated.py", "--smoke", "--no_progress", "--print-config"],
    ["evaluate.py", "--smoke", "--model-path", "x", "--num-tasks", "1", "--print-config"],
    ["checkpoint_manager.py", "--action", "list", "--smoke", "--local_dir", "somewhere", "--print-config"],
])
def test_flags_take_either_spelling(command):
    result = _run(*command)
    assert result.returncode == 0, result.stderr[-1500:]
    assert "unrecognized arguments" not in result.stderr
