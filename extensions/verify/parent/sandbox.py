"""Run untrusted Python: a hermetic bubblewrap sandbox, or, when asked for, a plain process.

Isolation levels (``verifier.isolation``; every result says which one was in force):

* ``bwrap`` (``auto`` means bwrap and fails loudly where it cannot start): nothing of the host is
  visible but what a worker needs, all read-only: ``/usr`` (and the ``/bin``, ``/lib*``, ``/sbin``
  links into it), a few ``/etc`` files the dynamic loader and compiler use, the Python installation
  (prefixes, site-packages; a virtual environment wherever it lives, ``/tmp`` included), the
  verifier's own ``extensions`` package at ``/sandbox/code``; on CUDA the GPU device nodes, ``/sys`` and the CUDA library directories. The
  only writable path is the worker's own directory at ``/sandbox/work`` (also ``HOME``, ``TMPDIR``
  and the Triton cache). The root, ``/dev`` and everything else are read-only; no network, own
  PID/IPC/UTS/cgroup namespaces, all capabilities dropped, ``--die-with-parent``.
* ``process``: a plain child process, only when the config asks for it explicitly. Scrubbed
  environment, private directory, timeout, memory cap, whole-tree kill, imports from a copy of
  the verifier code; but no filesystem or network isolation: every result carries a warning.

Every worker has its output drained in bounded chunks, a wall-clock timeout and a memory cap
(``memory.py``); on exit or timeout its whole process tree is killed (``proctree.kill_tree``).
"""
from __future__ import annotations

import functools
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ..common import proctree
from ..common.sandbox_env import INSIDE_CODE_DIR, INSIDE_WORK_DIR, per_candidate_env
from .candidate_watch import CandidateWatch

PROJECT_ROOT = Path(__file__).resolve().parents[3]
SANDBOX_MARKER_VAR = "VERIFY_SANDBOX_ID"

PROCESS_ISOLATION_WARNING = ("isolation=process: the candidate ran without an OS sandbox (it could read "
                             "files and reach the network as this user); set verifier.isolation: bwrap")

# Environment the worker may see. Anything that looks like a credential is dropped even if listed.
_PASSED_ENV = ("PATH", "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH", "TRITON_LIBCUDA_PATH",
               "TRITON_PTXAS_PATH", "LANG", "LC_ALL", "TZ")
_SECRET_NAME = re.compile(r"(^AWS_|^HF_|^HUGGING|TOKEN|SECRET|KEY|PASSWORD|CREDENTIAL|^SSH_)", re.I)
# /etc entries the loader (ld.so.cache), the C compiler Triton uses on CUDA (alternatives) and
# ldconfig need. Nothing else of /etc is visible.
_ETC_ENTRIES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "localtime")
_TOP_LEVEL_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")


class SandboxUnavailable(RuntimeError):
    """The isolation the config asks for cannot run on this machine."""


def is_secret_name(name: str) -> bool:
    return bool(_SECRET_NAME.search(name))


def scrubbed_env(home: str, device: str, gpu_index: Optional[int], pythonpath: str,
                 marker: Optional[str] = None) -> dict[str, str]:
    env = {k: os.environ[k] for k in _PASSED_ENV if k in os.environ and not is_secret_name(k)}
    env.setdefault("PATH", "/usr/bin:/bin")
    env.update(per_candidate_env(home))
    env.update({
        "PYTHONPATH": pythonpath,
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONHASHSEED": "0",
        "PYTHONSAFEPATH": "1",  # the working directory (the candidate's) is not on sys.path
        "OMP_NUM_THREADS": "1",
        SANDBOX_MARKER_VAR: marker or uuid.uuid4().hex,
    })
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
        env["CUDA_VISIBLE_DEVICES"] = ""
    else:
        env["CUDA_VISIBLE_DEVICES"] = "" if gpu_index is None else str(gpu_index)
        env["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"  # is_available() must not initialise CUDA
    return env


# -- what bubblewrap binds ------------------------------------------------------------------------

def _is_ancestor_or_same(path: str, other: str) -> bool:
    return other == path or other.startswith(path.rstrip("/") + "/")


def python_paths() -> list[str]:
    """Directories the worker's Python needs: its prefixes (a virtual environment and the
    installation it was made from) and site directories, as real paths, deduplicated."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
             os.path.dirname(os.path.realpath(sys.executable))}
    try:
        import site

        paths.update(site.getsitepackages())
        paths.add(site.getusersitepackages())
    except AttributeError:  # some virtualenvs ship an old site module
        pass
    paths.update(p for p in sys.path if p and os.path.isabs(p)
                 and ("site-packages" in p or "dist-packages" in p))
    project = str(PROJECT_ROOT)
    keep = set()
    for path in paths:
        real = os.path.realpath(path)
        # Never an ancestor of the checkout (that would show it all) and never "/".
        if not os.path.isdir(real) or _is_ancestor_or_same(real, project) or real == "/":
            continue
        keep.add(real)
    # Drop paths inside another kept path: one bind covers them.
    return sorted(p for p in keep if not any(q != p and _is_ancestor_or_same(q, p) for q in keep))


def _cuda_library_dirs() -> list[str]:
    dirs = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    dirs += [os.environ[k] for k in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(k)]
    for key in ("TRITON_LIBCUDA_PATH", "TRITON_PTXAS_PATH"):
        if os.environ.get(key):
            dirs.append(os.path.dirname(os.environ[key]) if os.path.isfile(os.environ[key]) else os.environ[key])
    return [os.path.realpath(d) for d in dirs if os.path.isdir(d) and os.path.realpath(d) != "/"]


def _system_args() -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for name in _TOP_LEVEL_LINKS:
        path = f"/{name}"
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for name in _ETC_ENTRIES:
        path = f"/etc/{name}"
        if os.path.lexists(path):
            args += ["--ro-bind-try", path, path]
    return args


def bwrap_command(argv: list[str], work_dir: str, device: str,
                  ro_binds: Optional[dict[str, str]] = None) -> list[str]:
    """The bubblewrap command line running ``argv`` with ``work_dir`` writable at
    ``INSIDE_WORK_DIR`` and ``ro_binds`` (host -> inside) read-only; see the module docstring."""
    cmd = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
           *_system_args()]
    bound = ["/usr"]
    extra = python_paths() + (_cuda_library_dirs() if device != "cpu" else [])
    for path in extra:
        if not any(_is_ancestor_or_same(b, path) for b in bound):
            cmd += ["--ro-bind", path, path]
            bound.append(path)
    cmd += ["--ro-bind", str(PROJECT_ROOT / "extensions"), f"{INSIDE_CODE_DIR}/extensions"]
    for host_path, inside_path in (ro_binds or {}).items():
        cmd += ["--ro-bind", host_path, inside_path]
    cmd += ["--bind", work_dir, INSIDE_WORK_DIR, "--proc", "/proc", "--dev", "/dev"]
    if device != "cpu":
        cmd += ["--ro-bind", "/sys", "/sys"]
        for node in sorted(glob.glob("/dev/nvidia*")):
            cmd += ["--dev-bind", node, node]
    cmd += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", INSIDE_WORK_DIR, "--"]
    return cmd + argv


_PROBES = {
    "cpu": "import os; print(os.getcwd())",
    # On CUDA the GPU must be usable inside the sandbox too (device nodes, driver libraries).
    "cuda": "import os, torch; torch.zeros(1, device='cuda').add_(1); torch.cuda.synchronize(); print(os.getcwd())",
}


@functools.lru_cache(maxsize=2)
def bwrap_problem(device: str = "cpu") -> Optional[str]:
    """None when bubblewrap starts a Python with our mounts (and, on CUDA, a working GPU) here;
    otherwise why not. Probed once per process and device."""
    if shutil.which("bwrap") is None:
        return "the bwrap executable (package bubblewrap) is not installed"
    probe_dir = tempfile.mkdtemp(prefix="verify-probe-")
    try:
        cmd = bwrap_command([sys.executable, "-c", _PROBES[device]], probe_dir, device)
        env = scrubbed_env(INSIDE_WORK_DIR, device, 0 if device == "cuda" else None, INSIDE_CODE_DIR)
        done = subprocess.run(cmd, capture_output=True, timeout=120, env=env)
        if done.returncode == 0 and done.stdout.strip().endswith(INSIDE_WORK_DIR.encode()):
            return None
        last = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        return f"bwrap exited with status {done.returncode}: {last[0][:200]}"
    except (OSError, subprocess.SubprocessError) as exc:
        return f"bwrap could not run: {type(exc).__name__}: {exc}"
    finally:
        shutil.rmtree(probe_dir, ignore_errors=True)


def bwrap_works(device: str = "cpu") -> bool:
    return bwrap_problem(device) is None


def choose_isolation(requested: str, device: str = "cpu") -> str:
    """``process`` only when asked for by name; ``auto`` and ``bwrap`` need a working bubblewrap
    and raise ``SandboxUnavailable`` (saying why and what to do) where it cannot start."""
    if requested == "process":
        return "process"
    if requested not in ("auto", "bwrap"):
        raise SandboxUnavailable(f"unknown verifier.isolation {requested!r}; use auto, bwrap or process")
    problem = bwrap_problem(device)
    if problem is not None:
        raise SandboxUnavailable(
            f"verifier.isolation={requested} needs bubblewrap, which cannot start a sandbox here ({problem}). "
            "Install bubblewrap (setup.sh does) or, on a disposable machine, set verifier.isolation: process "
            "to run candidates without an OS sandbox.")
    return "bwrap"


def isolation_warnings(isolation: str) -> list[str]:
    return [PROCESS_ISOLATION_WARNING] if isolation == "process" else []


def private_code_copy(root: str) -> str:
    """A copy of the verifier package under ``root`` for process isolation, so that a candidate
    writing into what its worker imports cannot touch the checkout. Returns the PYTHONPATH entry."""
    target = os.path.join(root, "code")
    if not os.path.isdir(os.path.join(target, "extensions")):
        shutil.copytree(PROJECT_ROOT / "extensions", os.path.join(target, "extensions"),
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        for directory, _dirs, files in os.walk(target):
            for name in files:
                os.chmod(os.path.join(directory, name), 0o444)
            os.chmod(directory, 0o555)
    return target


def remove_tree(path: str) -> None:
    """``shutil.rmtree`` that also removes read-only copies made by ``private_code_copy``."""
    def make_writable(func, target, _exc):
        try:
            os.chmod(os.path.dirname(target), 0o700)
            os.chmod(target, 0o700)
            func(target)
        except OSError:
            pass

    if os.path.islink(path) or (os.path.lexists(path) and not os.path.isdir(path)):
        try:
            os.unlink(path)
        except OSError:
            pass
        return
    shutil.rmtree(path, onerror=make_writable)


# -- one sandboxed process --------------------------------------------------------------------------

class BoundedReader(threading.Thread):
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
    memory_exceeded: bool = False
    notes: list[str] = field(default_factory=list)


def start_process(argv: list[str], work_dir: str, *, device: str, gpu_index: Optional[int], isolation: str,
                  ro_binds: Optional[dict[str, str]] = None, pythonpath: Optional[str] = None,
                  pass_fds: tuple = (), marker: Optional[str] = None) -> subprocess.Popen:
    """Start ``argv`` under ``isolation`` with ``work_dir`` as its private writable directory."""
    if isolation == "bwrap":
        env = scrubbed_env(INSIDE_WORK_DIR, device, gpu_index, INSIDE_CODE_DIR, marker)
        cmd, cwd = bwrap_command(argv, work_dir, device, ro_binds), None
    else:
        env = scrubbed_env(work_dir, device, gpu_index, pythonpath or str(PROJECT_ROOT), marker)
        cmd, cwd = argv, work_dir
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True, close_fds=True,
                            pass_fds=pass_fds)


class SandboxedProcess(CandidateWatch):
    """One fresh worker process; the caller talks to it through files in ``sandbox_dir`` and lines
    on its stdin. ``memory_limit_kb`` caps the resident memory its tree gains after
    ``mark_baseline`` (checked while waiting; the tree is killed above it)."""

    def __init__(self, argv: list[str], sandbox_dir: str, *, device: str, gpu_index: Optional[int],
                 isolation: str, max_output_bytes: int, ro_files: Optional[dict[str, str]] = None,
                 pythonpath: Optional[str] = None, memory_limit_kb: int = 0):
        self.sandbox_dir = sandbox_dir
        self.isolation = isolation
        self.max_output_bytes = max_output_bytes
        self.memory_limit_kb = memory_limit_kb
        self.memory_exceeded = False
        self.timed_out = False
        self.baseline_kb = 0
        self._marker = uuid.uuid4().hex
        self.started = time.monotonic()
        self.proc = start_process(argv, sandbox_dir, device=device, gpu_index=gpu_index, isolation=isolation,
                                  ro_binds=ro_files, pythonpath=pythonpath, marker=self._marker)
        self._out = BoundedReader(self.proc.stdout, max_output_bytes)
        self._err = BoundedReader(self.proc.stderr, max_output_bytes)
        self._out.start()
        self._err.start()

    def path(self, name: str) -> str:
        return os.path.join(self.sandbox_dir, name)

    def poll(self) -> Optional[int]:
        return self.proc.poll()

    def send_line(self, line: str) -> None:
        try:
            self.proc.stdin.write(line.encode() + b"\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass

    def mark_baseline(self) -> None:
        """What the worker holds before the candidate runs (interpreter, torch, Triton)."""
        self.baseline_kb = proctree.resident_kb(self.watched_pids())

    def watched_pids(self) -> list[int]:
        return proctree.descendants(self.proc.pid)

    def kill(self) -> None:
        """Kill the whole tree: the worker and anything it spawned, wherever it moved to."""
        proctree.kill_tree(self.proc.pid)
        proctree.kill_marked(self._marker)

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
        # Always sweep: a candidate may leave processes behind after the worker exits.
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
            memory_exceeded=self.memory_exceeded,
        )
