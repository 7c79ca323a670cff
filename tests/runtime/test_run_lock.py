"""One process per run directory: real processes hold, share, lose and take over the run lock."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from extensions.runtime.paths import RunPaths
from extensions.runtime.run_lock import ENV_TOKEN, EXIT_LOCKED, Holder, RunLock, RunLockHeld, lock_status, read_holder

from fake_stages import stage_env, write_config, write_fake_stages
from s3_testing import PROJECT_ROOT

HOLD = """
import sys, time
from pathlib import Path
from extensions.runtime.run_lock import RunLock
lock = RunLock(Path(sys.argv[1])).acquire()
print("held", flush=True)
time.sleep(float(sys.argv[2]))
"""


def hold_in_child(path: Path, seconds: float = 60, env=None) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(path), str(seconds)], stdout=subprocess.PIPE, text=True,
                            cwd=PROJECT_ROOT, env=env or {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)})
    assert proc.stdout.readline().strip() == "held"
    return proc


@pytest.fixture(autouse=True)
def no_inherited_token(monkeypatch):
    monkeypatch.delenv(ENV_TOKEN, raising=False)
    for name in ("RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)


def test_second_process_is_refused_with_the_holder_named_and_the_lock_is_freed_on_exit(tmp_path):
    path = tmp_path / ".run.lock"
    holder = hold_in_child(path, seconds=60)
    try:
        with pytest.raises(RunLockHeld) as refused:
            RunLock(path).acquire()
        assert f"pid {holder.pid} on {socket.gethostname()}" in str(refused.value)
        assert lock_status(path).startswith(f"run lock: held by pid {holder.pid}")
    finally:
        holder.terminate()  # SIGTERM: the default handler kills without running atexit
        holder.wait(10)
    assert "stale" in lock_status(path)
    with RunLock(path) as lock:  # the dead holder's lock is taken over
        assert lock.owned and read_holder(path).pid == os.getpid()
    assert not path.exists()

    finisher = hold_in_child(path, seconds=0)
    finisher.wait(10)
    assert not path.exists()  # a normal exit releases it


def test_a_reused_pid_does_not_keep_a_lock(tmp_path):
    path = tmp_path / ".run.lock"
    me = Holder.for_pid(os.getpid())
    reused = Holder(me.pid, me.hostname, "another-boot:123", "an earlier process", time.time() - 60)
    path.write_text(json.dumps(reused.__dict__))
    if me.start_time is None:
        pytest.skip("no /proc: process start times unknown")
    assert reused.alive() is False
    assert RunLock(path).acquire().owned


def test_a_lock_of_another_host_is_respected(tmp_path):
    path = tmp_path / ".run.lock"
    path.write_text(json.dumps(Holder(4242, "some-other-host", None, "train_integrated.py", time.time()).__dict__))
    with pytest.raises(RunLockHeld, match="on another host; if that process is gone, delete"):
        RunLock(path).acquire()


def test_children_share_their_parents_lock_and_other_ranks_do_not_take_it(tmp_path, monkeypatch):
    path = tmp_path / ".run.lock"
    parent = RunLock(path).acquire()
    try:
        env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
        assert env[ENV_TOKEN] == parent.holder.token
        child = subprocess.run([sys.executable, "-c", HOLD, str(path), "0"], env=env, capture_output=True, text=True,
                               cwd=PROJECT_ROOT, timeout=60)
        assert child.returncode == 0 and child.stdout.strip() == "held", child.stderr
        assert read_holder(path).pid == os.getpid()  # the child neither took nor released it
        env.pop(ENV_TOKEN)
        stranger = subprocess.run([sys.executable, "-c", HOLD, str(path), "0"], env=env, capture_output=True,
                                  text=True, cwd=PROJECT_ROOT, timeout=60)
        assert stranger.returncode != 0 and "RunLockHeld" in stranger.stderr
        monkeypatch.delenv(ENV_TOKEN)
        monkeypatch.setenv("RANK", "1")
        assert RunLock(path).acquire().shared
    finally:
        parent.release()
    assert not path.exists()


def test_entry_points_stop_with_the_holder_and_dry_run_reports_it(tmp_path):
    config = write_config(tmp_path / "run.yaml", tmp_path / "run")
    paths = RunPaths(tmp_path / "run")
    paths.root.mkdir(parents=True)
    holder = hold_in_child(paths.run_lock)
    try:
        env = {k: v for k, v in os.environ.items() if k != ENV_TOKEN}
        for script, args in (("train_integrated.py", ["--stage", "sft"]), ("evaluate.py", ["--compare"]),
                             ("prepare_data.py", [])):
            result = subprocess.run([sys.executable, str(PROJECT_ROOT / script), "--config", str(config), *args],
                                    capture_output=True, text=True, timeout=300, cwd=PROJECT_ROOT, env=env)
            assert result.returncode == EXIT_LOCKED, script + result.stdout + result.stderr
            assert f"is in use by pid {holder.pid}" in result.stderr and "Traceback" not in result.stderr
        dry = subprocess.run([sys.executable, str(PROJECT_ROOT / "resume_training.py"), "--config", str(config),
                              "--dry-run"], capture_output=True, text=True, timeout=300, cwd=PROJECT_ROOT, env=env)
        assert dry.returncode == 0, dry.stderr
        assert f"run lock: held by pid {holder.pid}" in dry.stdout
    finally:
        holder.kill()
        holder.wait(10)


def test_second_pipeline_in_the_same_run_stops_and_the_first_finishes(tmp_path):
    scripts = write_fake_stages(tmp_path / "scripts")
    config = write_config(tmp_path / "run.yaml", tmp_path / "run")
    paths = RunPaths(tmp_path / "run")
    env = {**stage_env(scripts), "FAKE_STEP_S": "0.3"}
    env.pop(ENV_TOKEN, None)
    first = subprocess.Popen(["bash", str(PROJECT_ROOT / "run_pipeline.sh"), "--config", str(config)], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.time() + 120
        while not (paths.stage_dir("sft").is_dir() and paths.run_lock.is_file()) and time.time() < deadline:
            time.sleep(0.1)
        second = subprocess.run(["bash", str(PROJECT_ROOT / "run_pipeline.sh"), "--config", str(config)], env=env,
                                capture_output=True, text=True, timeout=120)
        assert second.returncode == EXIT_LOCKED, second.stdout + second.stderr
        assert f"pid {first.pid}" in second.stderr and "run_pipeline.sh" in second.stderr
        output, _ = first.communicate(timeout=300)
        assert first.returncode == 0, output  # its own stages shared its lock
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    assert not paths.run_lock.exists()
