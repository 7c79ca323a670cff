"""Run an untrusted Python worker: scrubbed environment, own directory, timeout, bounded output.

Isolation levels (reported on every result as ``isolation``):

* ``bwrap`` (bubblewrap, when it works on this machine; probed once): the filesystem is read-only
  (``/`` bound read-only), home directories, ``/tmp``, ``/run``, ``/mnt`` and the project tree are
  hidden behind empty tmpfs mounts (the Python installation is bound back read-only), the only
  writable path is the sandbox directory (seen inside as ``/tmp/sandbox``), the project's
  ``extensions`` package is bound read-only at ``/tmp/code/extensions``; no network
  (``--unshare-net``), own PID/IPC/UTS namespaces, ``--die-with-parent``, ``--new-session``, a
  minimal ``/dev`` (plus ``/dev/nvidia*`` on CUDA) and a fresh ``/proc``.
* ``process``: a plain child process in its own session and working directory with the same
  scrubbed environment. Files the user can write stay writable and the network stays reachable;
  only the environment, the working directory, the timeout and the output bound protect.

In both cases the whole process group is killed on timeout, and stdout/stderr are drained in
chunks with at most ``max_output_bytes`` kept per stream, so a flood cannot block or exhaust memory.
"""
from __future__ import annotations

import functools
import glob
import os
import re
import signal
import site
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

PROJECT_ROOT = Path(__file__).resolve().parents[2]
INSIDE_SANDBOX_DIR = "/tmp/sandbox"
INSIDE_CODE_DIR = "/tmp/code"

# Environment the worker may see. Anything that looks like a credential is dropped even if listed.
_PASSED_ENV = ("PATH", "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH", "TRITON_LIBCUDA_PATH",
               "TRITON_PTXAS_PATH", "LANG", "LC_ALL", "TZ")
_SECRET_NAME = re.compile(r"(^AWS_|^HF_|^HUGGING|TOKEN|SECRET|KEY|PASSWORD|CREDENTIAL|^SSH_)", re.I)
# Directories hidden from the candidate under bwrap (credentials live in homes, /run, /tmp...).
_HIDDEN_DIRS = ("/root", "/home", "/tmp", "/var/tmp", "/run", "/mnt", "/media", "/srv")


def is_secret_name(name: str) -> bool:
    return bool(_SECRET_NAME.search(name))


def scrubbed_env(sandbox_home: str, device: str, gpu_index: Optional[int], pythonpath: str) -> dict[str, str]:
    env = {k: os.environ[k] for k in _PASSED_ENV if k in os.environ and not is_secret_name(k)}
    env.setdefault("PATH", "/usr/bin:/bin")
    env.update({
        "HOME": sandbox_home,
        "PYTHONPATH": pythonpath,
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONHASHSEED": "0",
        "TRITON_CACHE_DIR": os.path.join(sandbox_home, ".triton", "cache"),
        "TRITON_HOME": sandbox_home,
        "XDG_CACHE_HOME": os.path.join(sandbox_home, ".cache"),
        "TORCHINDUCTOR_CACHE_DIR": os.path.join(sandbox_home, ".inductor"),
        "MPLCONFIGDIR": os.path.join(sandbox_home, ".mpl"),
        "OMP_NUM_THREADS": "1",
    })
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
        env["CUDA_VISIBLE_DEVICES"] = ""
    else:
        env["CUDA_VISIBLE_DEVICES"] = "" if gpu_index is None else str(gpu_index)
    return env


def _python_paths() -> list[str]:
    """Directories the worker's Python needs (installation and site-packages), deduplicated."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable))}
    try:
        paths.update(site.getsitepackages())
        paths.add(site.getusersitepackages())
    except AttributeError:  # some virtualenvs ship an old site module
        pass
    project = str(PROJECT_ROOT)
    # Other sys.path entries (e.g. an editable install) are needed too, but nothing from the
    # project tree itself (tests, data, checkpoints) beyond a virtualenv living there.
    paths.update(p for p in sys.path if p and os.path.isabs(p)
                 and not os.path.realpath(p).startswith(project + os.sep))
    keep = []
    for path in sorted(paths):
        real = os.path.realpath(path)
        if not os.path.isdir(real) or real == project or real == "/":
            continue
        keep.append(real)
    return keep


def bwrap_command(argv: list[str], sandbox_dir: str, device: str,
                  ro_files: Optional[dict[str, str]] = None) -> list[str]:
    cmd = ["bwrap", "--ro-bind", "/", "/"]
    project = str(PROJECT_ROOT)
    hidden = [d for d in (*_HIDDEN_DIRS, project) if os.path.isdir(d)]
    for directory in hidden:
        cmd += ["--tmpfs", directory]
    for path in _python_paths():
        if any(path == h or path.startswith(h + "/") for h in hidden):
            cmd += ["--ro-bind", path, path]
    cmd += ["--ro-bind", str(PROJECT_ROOT / "extensions"), f"{INSIDE_CODE_DIR}/extensions",
            "--bind", sandbox_dir, INSIDE_SANDBOX_DIR,
            "--dev", "/dev", "--proc", "/proc"]
    for host_path, inside_path in (ro_files or {}).items():
        cmd += ["--ro-bind", host_path, inside_path]
    if device != "cpu":
        for node in sorted(glob.glob("/dev/nvidia*")):
            cmd += ["--dev-bind", node, node]
    cmd += ["--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
            "--die-with-parent", "--new-session", "--chdir", INSIDE_SANDBOX_DIR, "--"]
    return cmd + argv


_PROBES = {
    "cpu": "import os; print(os.getcwd())",
    # On CUDA the GPU must be usable inside the sandbox too (device nodes, driver libraries).
    "cuda": "import os, torch; torch.zeros(1, device='cuda').add_(1); torch.cuda.synchronize(); print(os.getcwd())",
}


@functools.lru_cache(maxsize=2)
def bwrap_works(device: str = "cpu") -> bool:
    """One probe per process and device: can bubblewrap start a Python with our mounts, no
    network and (on CUDA) a working GPU?"""
    import shutil
    import tempfile

    if shutil.which("bwrap") is None:
        return False
    probe_dir = tempfile.mkdtemp(prefix="verify-probe-")
    try:
        cmd = bwrap_command([sys.executable, "-c", _PROBES[device]], probe_dir, device)
        env = scrubbed_env(INSIDE_SANDBOX_DIR, device, 0 if device == "cuda" else None, INSIDE_CODE_DIR)
        done = subprocess.run(cmd, capture_output=True, timeout=120, env=env)
        return done.returncode == 0 and done.stdout.strip().endswith(INSIDE_SANDBOX_DIR.encode())
    except (OSError, subprocess.SubprocessError):
        return False
    finally:
        shutil.rmtree(probe_dir, ignore_errors=True)


def choose_isolation(requested: str, device: str = "cpu") -> str:
    """``auto`` -> bwrap when it works, else process. Asking for bwrap where it fails is an error."""
    if requested == "process":
        return "process"
    works = bwrap_works(device)
    if requested == "bwrap" and not works:
        raise RuntimeError("verifier.isolation=bwrap but bubblewrap cannot start a sandbox here")
    return "bwrap" if works else "process"


class _BoundedReader(threading.Thread):
    """Drains one pipe to EOF in chunks, keeping at most ``limit`` bytes (the head)."""

    def __init__(self, stream, limit: int):
        super().__init__(daemon=True)
        self.stream, self.limit = stream, limit
        self.kept = bytearray()
        self.total = 0

    def run(self) -> None:
        try:
            while True:
                chunk = self.stream.read1(65536) if hasattr(self.stream, "read1") else self.stream.read(65536)
                if not chunk:
                    break
                self.total += len(chunk)
                room = self.limit - len(self.kept)
                if room > 0:
                    self.kept += chunk[:room]
        except (OSError, ValueError):
            pass


@dataclass
class ProcessOutcome:
    returncode: Optional[int]
    timed_out: bool
    stdout: str
    stderr: str
    stdout_bytes: int  # total printed, of which at most max_output_bytes were kept
    stderr_bytes: int
    wall_s: float
    isolation: str
    notes: list[str] = field(default_factory=list)


class SandboxedProcess:
    """One worker process in a sandbox directory; the caller talks to it through files + stdin."""

    def __init__(self, argv: list[str], sandbox_dir: str, *, device: str, gpu_index: Optional[int],
                 isolation: str, max_output_bytes: int, ro_files: Optional[dict[str, str]] = None,
                 pythonpath: Optional[str] = None):
        self.sandbox_dir = sandbox_dir
        self.isolation = isolation
        self.max_output_bytes = max_output_bytes
        if isolation == "bwrap":
            env = scrubbed_env(INSIDE_SANDBOX_DIR, device, gpu_index, INSIDE_CODE_DIR)
            cmd = bwrap_command(argv, sandbox_dir, device, ro_files)
            cwd = None
        else:
            env = scrubbed_env(sandbox_dir, device, gpu_index, pythonpath or str(PROJECT_ROOT))
            cmd, cwd = argv, sandbox_dir
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            cmd, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, start_new_session=True, close_fds=True,
        )
        self._out = _BoundedReader(self.proc.stdout, max_output_bytes)
        self._err = _BoundedReader(self.proc.stderr, max_output_bytes)
        self._out.start()
        self._err.start()
        self.timed_out = False

    def path(self, name: str) -> str:
        return os.path.join(self.sandbox_dir, name)

    def send_line(self, line: str) -> None:
        try:
            self.proc.stdin.write(line.encode() + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass

    def wait_for_file(self, name: str, deadline: float) -> bool:
        """Wait until the worker wrote ``name`` (atomically) or exited or the deadline passed."""
        target = self.path(name)
        while True:
            if os.path.exists(target):
                return True
            if self.proc.poll() is not None:
                return os.path.exists(target)
            if time.monotonic() >= deadline:
                self.kill()
                self.timed_out = True
                return False
            time.sleep(0.02)

    def kill(self) -> None:
        """Kill the whole process group (the worker and anything it spawned)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def finish(self, deadline: float) -> ProcessOutcome:
        try:
            self.proc.stdin.close()
        except (OSError, ValueError):
            pass
        remaining = max(0.0, deadline - time.monotonic())
        try:
            self.proc.wait(timeout=remaining)
        except subprocess.TimeoutExpired:
            self.timed_out = True
        # Always sweep the group: a candidate may leave children behind after the worker exits.
        self.kill()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self._out.join(timeout=5)
        self._err.join(timeout=5)
        return ProcessOutcome(
            returncode=self.proc.returncode, timed_out=self.timed_out,
            stdout=self._out.kept.decode("utf-8", "replace"), stderr=self._err.kept.decode("utf-8", "replace"),
            stdout_bytes=self._out.total, stderr_bytes=self._err.total,
            wall_s=time.monotonic() - self.started, isolation=self.isolation,
        )
