"""Every entry point answers a bad start with one line and its documented exit status, before any
work and without a traceback (extensions/runtime/entry_point.py: 2 for a missing input, 74 for a path that
cannot be written)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from project_paths import FIXTURES_DIR, PROJECT_ROOT

UNWRITABLE = Path("/sys/kernel-rl-cannot-write-here")  # EPERM even for root


def _run(*command: str, cwd: Path = PROJECT_ROOT) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KERNEL_RL_BUCKET", "AWS_"))}
    return subprocess.run([sys.executable, *command], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={**env, "HF_HUB_OFFLINE": "1"})


def _with_sft_data(root: Path) -> Path:
    processed = root / "data" / "processed"
    processed.mkdir(parents=True)
    row = {"uuid": "a", "level": 1, "prompt": [{"role": "user", "content": "task"}], "completion": "answer"}
    (processed / "sft_train.jsonl").write_text(json.dumps(row) + "\n")
    return root


def _eval_tasks(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    code = (FIXTURES_DIR / "eval" / "tasks" / "relu.py").read_text()
    tasks = root / "tasks.jsonl"
    tasks.write_text(json.dumps({"task_id": "relu", "level": 1, "code": code}) + "\n")
    return tasks


def _tiny_model(root: Path) -> Path:
    from extensions.models.tiny import save_tiny_model

    return save_tiny_model(root / "model")


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
    "train sft with a hub id that is not cached, offline": (
        lambda tmp: ["train_integrated.py", "--smoke", "--stage", "sft", "--set", f"run.root={_with_sft_data(tmp / 'r')}",
                     "--set", "model.name_or_path=Qwen/Qwen2.5-Coder-0.5B-Instruc", "--set", "model.gguf_file=null"],
        2, "HF_HUB_OFFLINE is set"),
    "evaluate a hub id that is not cached, offline": (
        lambda tmp: ["evaluate.py", "--smoke", "--model_path", "Qwen/NoSuchModel", "--tasks", str(_eval_tasks(tmp)),
                     "--output_dir", str(tmp / "out"), "--set", "prompt.mode=plain", "--no-progress"],
        3, "HF_HUB_OFFLINE is set"),
    "evaluate into an unwritable output directory": (
        lambda tmp: ["evaluate.py", "--smoke", "--model_path", str(_tiny_model(tmp)), "--tasks", str(_eval_tasks(tmp)),
                     "--output_dir", str(UNWRITABLE / "out"), "--set", "prompt.mode=plain", "--no-progress"],
        74, str(UNWRITABLE)),
    "restore into an unwritable run root": (
        lambda tmp: ["checkpoint_manager.py", "--action", "restore", "--smoke", "--bucket", "b", "--local-dir",
                     str(UNWRITABLE)],
        74, str(UNWRITABLE)),
    "resume in an unwritable run root": (
        lambda tmp: ["resume_training.py", "--smoke", "--set", f"run.root={UNWRITABLE}"],
        74, str(UNWRITABLE)),
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
        f"{prog}:   " for prog in ("train_integrated", "prepare_data", "checkpoint_manager", "evaluate",
                                    "resume_training")))]
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


class _HubStandIn:
    """A hub on 127.0.0.1 that knows no model: every request answers 404 RepoNotFound."""

    def __enter__(self):
        import http.server
        import threading

        class NotFound(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(404)
                self.send_header("X-Error-Code", "RepoNotFound")
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b'{"error": "Repository not found"}')

            do_HEAD = do_GET

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("hub", ["unreachable", "no such model"])
def test_a_model_the_hub_cannot_give_is_one_line_without_retries(hub, tmp_path):
    """Online, a typo in the model id or an unreachable hub made transformers retry for ~50 s and end
    in a 128-line OSError; one metadata request now tells which, and the stage stops in one line."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KERNEL_RL_BUCKET", "AWS_", "HF_HUB_OFFLINE",
                                                                     "TRANSFORMERS_OFFLINE"))}
    command = [sys.executable, "train_integrated.py", "--smoke", "--stage", "sft", "--set",
               f"run.root={_with_sft_data(tmp_path / 'r')}", "--set", "model.name_or_path=Qwen/Qwen2.5-Coder-0.5B-Instruc",
               "--set", "model.gguf_file=null", "--no-progress"]
    hub_cache = {"HF_HUB_CACHE": str(tmp_path / "hub-cache")}  # nothing cached: the request must be made
    if hub == "unreachable":
        result = subprocess.run(command, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300,
                                env={**env, **hub_cache, "HF_ENDPOINT": f"http://127.0.0.1:{_closed_port()}"})
        expected = "cannot be reached"
    else:
        with _HubStandIn() as endpoint:
            result = subprocess.run(command, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300,
                                    env={**env, **hub_cache, "HF_ENDPOINT": endpoint})
        expected = "is not on the hub"
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if expected in line]
    assert len(errors) == 1 and "Qwen/Qwen2.5-Coder-0.5B-Instruc" in errors[0], result.stderr[-2000:]
