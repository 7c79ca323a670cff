"""The parent's side of a fork server (``sandboxed/forkserver.py``): start one, fork a child per
candidate, watch and kill that child from outside.

The server itself runs inside the sandbox; this module only talks to it (JSON lines on its stdin,
events on a pipe) and reads its process tree through ``/proc`` (``proctree``), so neither the
memory cap nor the kill depends on the server's cooperation.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from typing import Optional

from ..common import proctree
from ..common.sandbox_env import INSIDE_WORK_DIR
from .candidate_watch import CandidateWatch
from .sandbox import BoundedReader, ProcessOutcome, start_process


class _EpochReader(BoundedReader):
    """A bounded reader whose kept head and byte count restart with each candidate."""

    def reset(self) -> None:
        self.kept = bytearray()
        self.total = 0


class ForkServer:
    """One fork server process (one per worker slot), serving one candidate at a time."""

    def __init__(self, *, device: str, gpu_index: Optional[int], isolation: str, work_dir: str,
                 max_output_bytes: int, memory_limit_kb: int, ro_binds: Optional[dict[str, str]] = None,
                 pythonpath: Optional[str] = None):
        self.device, self.gpu_index, self.isolation = device, gpu_index, isolation
        self.work_dir = work_dir  # host path; the candidates' directories are made inside it
        self.memory_limit_kb = memory_limit_kb
        read_end, write_end = os.pipe()
        argv = [sys.executable, "-m", "extensions.verify.sandboxed.forkserver", "--events-fd", str(write_end),
                "--device", device]
        if device == "cpu":
            argv.append("--warm-profiler")
        # In every process of this server's sandbox (its environment is inherited): what a candidate
        # started and moved out of the server's tree (a helper that outlived the server under
        # process isolation, re-parented to init) is still found by it.
        self._marker = uuid.uuid4().hex
        self.proc = start_process(argv, work_dir, device=device, gpu_index=gpu_index, isolation=isolation,
                                  ro_binds=ro_binds, pythonpath=pythonpath, pass_fds=(write_end,),
                                  marker=self._marker)
        os.close(write_end)
        self._events = os.fdopen(read_end, "r")
        self._cond = threading.Condition()
        self._state: dict = {"ready": False, "server_pid": None, "child": None, "exit": None, "dead": False}
        self._out = _EpochReader(self.proc.stdout, max_output_bytes)
        self._err = _EpochReader(self.proc.stderr, max_output_bytes)
        self._out.start()
        self._err.start()
        self._host_pid: Optional[int] = None
        # The child forked ahead of its candidate (``WorkerLauncher``), and whether forking it is done.
        self.next_worker: Optional["ForkedWorker"] = None
        self.prefork_done = threading.Event()
        self.forked_ahead = False  # counted among the launcher's children forked ahead
        threading.Thread(target=self._read_events, daemon=True).start()

    def _read_events(self) -> None:
        for line in self._events:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            with self._cond:
                kind = event.get("event")
                if kind == "ready":
                    self._state.update(ready=True, server_pid=event.get("pid"))
                elif kind == "started":
                    self._state.update(child=event.get("pid"), exit=None)
                elif kind == "exited":
                    self._state.update(exit=event.get("status"))
                elif kind == "error":
                    self._state.update(exit=-1, error=event.get("message"))
                self._cond.notify_all()
        with self._cond:
            self._state["dead"] = True
            self._cond.notify_all()

    @property
    def alive(self) -> bool:
        return not self._state["dead"] and self.proc.poll() is None

    def wait_ready(self, timeout: float) -> bool:
        with self._cond:
            self._cond.wait_for(lambda: self._state["ready"] or self._state["dead"], timeout)
            return self._state["ready"] and not self._state["dead"]

    def host_pid(self) -> Optional[int]:
        """The server's pid as this process sees it (under bwrap it sits below bwrap's own)."""
        if self._host_pid is None:
            inside = self._state["server_pid"]
            for pid in [self.proc.pid] + proctree.descendants(self.proc.pid):
                if self.isolation != "bwrap" or proctree.namespace_pid(pid) == inside:
                    self._host_pid = pid
                    break
        return self._host_pid

    def command(self, **command) -> None:
        try:
            self.proc.stdin.write((json.dumps(command) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass

    def fork(self, directory: str, inside_directory: str) -> "ForkedWorker":
        with self._cond:
            self._state.update(child=None, exit=None)
        self._out.reset()
        self._err.reset()
        worker = ForkedWorker(self, directory)
        worker.baseline_kb = proctree.resident_kb([self.host_pid()] if self.host_pid() else [])
        self.command(op="fork", dir=inside_directory)
        with self._cond:
            self._cond.wait_for(lambda: self._state["child"] is not None or self._state["exit"] is not None
                                or self._state["dead"], 30)
        if not self.forked() and self.alive:
            self.close()  # stopped or hung: this worker reads as dead and the server is replaced
        return worker

    def stopped(self) -> bool:
        """The server was stopped (a child may send it SIGSTOP): it would never fork again."""
        server = self.host_pid()
        return server is not None and proctree.is_stopped(server)

    def forked(self) -> bool:
        """Whether the last fork command started a child."""
        with self._cond:
            return self._state["child"] is not None

    def candidate_pids(self) -> list[int]:
        server = self.host_pid()
        return proctree.descendants(server) if server else []

    def settled(self, timeout: float = 2.0) -> bool:
        """True once nothing but zombies (about to be reaped) is left below the server."""
        server = self.host_pid()
        deadline = time.monotonic() + timeout
        while server is not None:
            if not proctree.live_descendants(server):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return False

    def kill_candidate(self) -> None:
        server = self.host_pid()
        if server is None or not self.alive:
            self.close()
            return
        proctree.kill_tree(server, include_root=False)
        proctree.kill_marked(self._marker, keep=self._sandbox_chain(server))

    def _sandbox_chain(self, server: int) -> set[int]:
        """The server and the processes between it and ours (bubblewrap's own): not the candidate's."""
        chain, pid = {server}, server
        while pid not in (self.proc.pid, None, 0, 1):
            pid = proctree.parent_of(pid)
            chain.add(pid)
        return chain | {self.proc.pid}

    def exit_status(self) -> Optional[int]:
        with self._cond:
            if self._state["exit"] is not None:
                return self._state["exit"]
            if self._state["dead"] or self.proc.poll() is not None:
                return -9
            return None

    def wait_exit(self, timeout: float) -> Optional[int]:
        with self._cond:
            self._cond.wait_for(lambda: self._state["exit"] is not None or self._state["dead"], timeout)
        return self.exit_status()

    def output(self) -> tuple[bytes, int, bytes, int]:
        return bytes(self._out.kept), self._out.total, bytes(self._err.kept), self._err.total

    def close(self, wait: bool = True) -> None:
        """Kill the server and everything below it; ``wait=False`` leaves the wait for its exit to
        ``wait_closed`` (a child with a CUDA context takes a second or more to go: servers closed
        together wait for theirs at the same time)."""
        try:
            self.proc.stdin.close()
        except (OSError, ValueError):
            pass
        proctree.kill_tree(self.proc.pid)
        proctree.kill_marked(self._marker)
        if wait:
            self.wait_closed()

    def wait_closed(self, timeout: float = 10) -> None:
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass


class ForkedWorker(CandidateWatch):
    """One candidate's child of a fork server; the same interface as ``SandboxedProcess``."""

    def __init__(self, server: ForkServer, sandbox_dir: str):
        self.server = server
        self.sandbox_dir = sandbox_dir
        self.isolation = server.isolation
        self.timed_out = False
        self.memory_exceeded = False
        self.baseline_kb = 0
        self.memory_limit_kb = server.memory_limit_kb
        self.started = time.monotonic()
        self._closed = False

    def path(self, name: str) -> str:
        return os.path.join(self.sandbox_dir, name)

    def poll(self) -> Optional[int]:
        if not self.stopped_server and self.server.alive and self.server.stopped():
            # A stopped server relays no command and reports no exit, so waiting on it would only
            # end at the time limit (and twice more in finish and release): the candidate stopped
            # it, and both go at once.
            self.stopped_server = True
            self.server.close()
        return self.server.exit_status()

    def send_line(self, line: str) -> None:
        self.server.command(op="send", line=line)

    def mark_baseline(self) -> None:
        """The baseline is taken at fork time: what the child shares with the server."""

    def watched_pids(self) -> list[int]:
        return self.server.candidate_pids()

    def kill(self) -> None:
        self.server.kill_candidate()

    def finish(self, deadline: float) -> ProcessOutcome:
        if not self._closed:
            self._closed = True
            self.server.command(op="close")
        status = self.server.wait_exit(max(0.0, deadline - time.monotonic()))
        if status is None:
            self.timed_out = True
        # Always sweep: nothing the candidate started may outlive its verdict.
        self.kill()
        status = self.server.wait_exit(10)
        out, out_total, err, err_total = self.server.output()
        return ProcessOutcome(
            returncode=status, timed_out=self.timed_out,
            stdout=out.decode("utf-8", "replace"), stderr=err.decode("utf-8", "replace"),
            stdout_bytes=out_total, stderr_bytes=err_total, wall_s=time.monotonic() - self.started,
            isolation=self.isolation, memory_exceeded=self.memory_exceeded,
        )


def inside_path(isolation: str, host_work_dir: str, host_path: str) -> str:
    """Where ``host_path`` (inside the server's work directory) appears to the server."""
    if isolation != "bwrap":
        return host_path
    return os.path.join(INSIDE_WORK_DIR, os.path.relpath(host_path, host_work_dir))
