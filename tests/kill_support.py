"""Killing a run at a chosen moment, and reading the logs it left: the resume tests' shared tools."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable, Optional


def kill_when(args: list[str], ready: Callable[[], bool], env: Optional[dict] = None, timeout: float = 240.0) -> None:
    """Start ``args`` in its own process group and SIGKILL the group as soon as ``ready()`` holds."""
    proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        end = time.time() + timeout
        while time.time() < end and proc.poll() is None and not ready():
            time.sleep(0.005)
        assert proc.poll() is None, "the run ended before it could be killed"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def json_records(path: Path) -> list[dict]:
    """The JSON lines of ``path``, skipping a line torn by a kill."""
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return rows
