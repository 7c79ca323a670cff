"""One process at a time per run directory.

Training, evaluation, data preparation, restores and the pipeline take ``RunLock`` on the run's
``.run.lock`` before they write anything. The lock file names its holder (pid, host, the process's
start time, command); it is removed on any normal exit. A lock whose holder is gone (same host, pid
dead or reused by another process) is stale and taken over; a lock held by a live process, or by
another host, stops the newcomer with a message naming the holder.

Children share their parent's lock: the holder exports ``KERNEL_RL_RUN_LOCK`` (its token), and a
process that finds the lock held by the token in its environment goes on without taking it, so
``run_pipeline.sh`` and ``resume_training.py`` do not deadlock with their own stages. Under
``accelerate launch`` only rank 0 takes the lock; the other ranks belong to the same job.

    python -m extensions.runtime.run_lock acquire RUN_ROOT --pid PID   # for a shell script: prints the token
    python -m extensions.runtime.run_lock release RUN_ROOT --token TOKEN
    python -m extensions.runtime.run_lock status RUN_ROOT
"""
from __future__ import annotations

import argparse
import atexit
import json
import os
import socket
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

ENV_TOKEN = "KERNEL_RL_RUN_LOCK"
EXIT_LOCKED = 73  # another live process holds the run


class RunLockHeld(RuntimeError):
    """The run directory is in use by another process (the message names it)."""


def process_start_time(pid: int) -> Optional[str]:
    """When ``pid`` started (clock ticks after boot, with the boot id), to tell a reused pid apart."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return f"{boot}:{fields[19]}"  # field 22 of stat: starttime


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(frozen=True)
class Holder:
    pid: int
    hostname: str
    start_time: Optional[str]
    command: str
    since_unix: float

    @property
    def token(self) -> str:
        return f"{self.hostname}:{self.pid}:{self.start_time}"

    @classmethod
    def for_pid(cls, pid: int, command: Optional[str] = None) -> "Holder":
        if command is None:
            try:
                command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                command = " ".join(sys.argv) if pid == os.getpid() else f"pid {pid}"
        return cls(pid, socket.gethostname(), process_start_time(pid), command or f"pid {pid}", time.time())

    def alive(self) -> Optional[bool]:
        """True/False on this host; None when the holder is on another host (cannot be checked)."""
        if self.hostname != socket.gethostname():
            return None
        if not pid_alive(self.pid):
            return False
        current = process_start_time(self.pid)
        return current is None or self.start_time is None or current == self.start_time

    def describe(self) -> str:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since_unix))
        return f"pid {self.pid} on {self.hostname} since {since} ({self.command})"


def read_holder(path: Path) -> Optional[Holder]:
    try:
        data = json.loads(Path(path).read_text())
        return Holder(int(data["pid"]), str(data["hostname"]), data.get("start_time"), str(data.get("command", "")),
                      float(data.get("since_unix", 0)))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def lock_status(path: Path) -> str:
    """One line for ``resume_training.py --dry-run``: free, held (by whom) or stale."""
    holder = read_holder(path)
    if holder is None:
        return "run lock: free" if not Path(path).exists() else f"run lock: {path} exists but is unreadable"
    alive = holder.alive()
    if alive is False:
        return f"run lock: stale (its holder {holder.describe()} is gone); the next run takes it over"
    where = "" if alive else " (on another host; cannot check whether it still runs)"
    return f"run lock: held by {holder.describe()}{where}"


def is_secondary_rank() -> bool:
    """A data-parallel process other than rank 0 (accelerate/torchrun set RANK, LOCAL_RANK)."""
    for name in ("RANK", "LOCAL_RANK"):
        value = os.environ.get(name)
        if value is not None and value.strip().isdigit():
            return int(value) != 0
    return False


class RunLock:
    """``with RunLock(paths.run_lock):`` or ``acquire()``/``release()``; released at exit."""

    def __init__(self, path: Path, holder: Optional[Holder] = None):
        self.path = Path(path)
        self.holder = holder or Holder.for_pid(os.getpid())
        self.owned = False
        self.shared = False

    def acquire(self) -> "RunLock":
        if is_secondary_rank():
            self.shared = True
            return self
        inherited = os.environ.get(ENV_TOKEN)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(50):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                current = read_holder(self.path)
                if current is None:  # being written right now, or garbage left by a crash mid-write
                    if time.time() - self._mtime() > 5:
                        self._take_over()
                    else:
                        time.sleep(0.1)
                    continue
                if inherited and current.token == inherited and current.alive() is not False:
                    if current.pid == os.getpid():  # a holder that exec'd this program: ours to release
                        self.holder, self.owned = current, True
                        atexit.register(self.release)
                    else:
                        self.shared = True  # a parent (pipeline, resume) holds it for us
                    return self
                if current.alive() is False:
                    print(f"run lock: taking over a stale lock of {current.describe()}", file=sys.stderr, flush=True)
                    self._take_over()
                    continue
                raise RunLockHeld(self._held_message(current))
            with os.fdopen(fd, "w") as handle:
                json.dump(asdict(self.holder), handle)
                handle.flush()
                os.fsync(handle.fileno())
            self.owned = True
            os.environ[ENV_TOKEN] = self.holder.token
            atexit.register(self.release)
            return self
        raise RunLockHeld(f"could not take the run lock {self.path} (it keeps changing hands)")

    def _mtime(self) -> float:
        try:
            return self.path.stat().st_mtime
        except FileNotFoundError:
            return time.time()

    def _take_over(self) -> None:
        # Rename first: of two processes taking over the same stale lock, only one rename succeeds.
        aside = self.path.with_name(f"{self.path.name}.stale-{os.getpid()}")
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return
        aside.unlink(missing_ok=True)

    def _held_message(self, current: Holder) -> str:
        alive = current.alive()
        tail = ("wait for it to finish or stop it" if alive else
                f"on another host; if that process is gone, delete {self.path}")
        return f"run directory {self.path.parent} is in use by {current.describe()}: {tail}"

    def release(self) -> None:
        if not self.owned:
            return
        current = read_holder(self.path)
        if current is not None and current.token == self.holder.token:
            self.path.unlink(missing_ok=True)
        self.owned = False
        if os.environ.get(ENV_TOKEN) == self.holder.token:
            del os.environ[ENV_TOKEN]

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def lock_run(paths) -> RunLock:
    """Take the run lock of ``paths`` (a RunPaths) for this process, creating the run root."""
    paths.root.mkdir(parents=True, exist_ok=True)
    return RunLock(paths.run_lock).acquire()


def _main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m extensions.runtime.run_lock", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("acquire", "release", "status"))
    parser.add_argument("run_root", type=Path)
    parser.add_argument("--pid", type=int, help="acquire: hold the lock for this process (default: the parent)")
    parser.add_argument("--token", help="release: only if the lock still holds this token")
    args = parser.parse_args(argv)
    from .paths import RunPaths

    path = RunPaths(args.run_root.expanduser().resolve()).run_lock
    if args.action == "status":
        print(lock_status(path))
        return 0
    if args.action == "release":
        current = read_holder(path)
        if current is not None and (args.token is None or current.token == args.token):
            path.unlink(missing_ok=True)
        return 0
    args.run_root.mkdir(parents=True, exist_ok=True)
    lock = RunLock(path, Holder.for_pid(args.pid or os.getppid()))
    try:
        lock.acquire()
    except RunLockHeld as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_LOCKED
    lock.owned = False  # held for the other process: leaving this helper must not release it
    print(lock.holder.token if not lock.shared else os.environ[ENV_TOKEN])
    return 0


if __name__ == "__main__":
    sys.exit(_main())
