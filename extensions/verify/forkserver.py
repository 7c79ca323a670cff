"""A sandboxed fork server: import torch and Triton once, fork a fresh child per candidate.

    python -m extensions.verify.forkserver --events-fd N [--warm-profiler]   (started by ``ForkServer``)

Starting Python and importing torch and Triton is most of a candidate's cost. The server does it
once, inside the same sandbox a fresh worker would get (bubblewrap or the explicit process
isolation), without initialising CUDA (CUDA does not survive ``fork``; the server checks before
every fork), and then serves one candidate at a time:

    parent -> server (stdin, JSON lines)      {"op": "fork", "dir": D}  {"op": "send", "line": L}
    server -> parent (events fd, JSON lines)  {"event": "ready"|"started"|"exited", ...}

Each child gets its own directory (only the current candidate's exists in the server's writable
directory: the parent removes it, and kills whatever the child left, before the next fork), a new
session, its own ``HOME``/``TMPDIR``/Triton cache, the memory cap (``startup.limit_memory``) and the
usual worker protocol on a private pipe. Children are forked from a server that never ran candidate
code, so none can see what an earlier candidate changed in memory; the server is not dumpable, so a
child cannot trace it or open its descriptors, and a child that kills it only ends its own verdict
(the parent starts a new server). A child runs as the server's user, so it can still change
what the kernel lets one process of a user change in another: stop it (SIGSTOP), lower its resource
limits (``prlimit``), its priority or its CPU set, all of which later children would inherit. The
server compares those attributes with the ones it had when it became ready before every fork and
exits instead of forking from a changed process; the parent replaces a server that is stopped or
that does not answer a fork. The parent reads the memory of the child's whole tree and kills
it from outside (``proctree``), so neither depends on the server's cooperation.
"""
from __future__ import annotations

import argparse
import json
import os
import select
import subprocess
import sys
import threading
import time
import uuid
from typing import Optional

from . import proctree
from .candidate_watch import CandidateWatch
from .privileges import set_dumpable
from .sandbox import (INSIDE_WORK_DIR, BoundedReader, ProcessOutcome, per_candidate_env,
                      start_process)


# -- the server (inside the sandbox) --------------------------------------------------------------

def inherited_attributes() -> tuple:
    """What a forked child inherits from the server that another process of the same user can
    change from outside: resource limits, scheduling priority, CPU affinity."""
    import resource

    limits = tuple((name, resource.getrlimit(getattr(resource, name)))
                   for name in sorted(dir(resource)) if name.startswith("RLIMIT_"))
    affinity = tuple(sorted(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else ()
    return limits, os.getpriority(os.PRIO_PROCESS, 0), affinity


class _Server:
    def __init__(self, events_fd: int, device: str):
        self.device = device
        # Commands arrive on a private copy of stdin; fd 0 becomes /dev/null for the children.
        self.control_fd = os.dup(0)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        self.events = os.fdopen(events_fd, "w", buffering=1)
        self.child: Optional[int] = None
        self.child_pipe: Optional[int] = None
        self.attributes: Optional[tuple] = None  # inherited_attributes() when the server became ready

    def emit(self, **event) -> None:
        self.events.write(json.dumps(event) + "\n")

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.child:
                self.child = None
                self._close_pipe()
                self.emit(event="exited", status=os.waitstatus_to_exitcode(status))

    def _close_pipe(self) -> None:
        if self.child_pipe is not None:
            try:
                os.close(self.child_pipe)
            except OSError:
                pass
            self.child_pipe = None

    def fork(self, directory: str) -> None:
        import torch

        if self.child is not None:
            self.emit(event="error", message="a candidate is still running")
            return
        if torch.cuda.is_initialized():  # forked CUDA state is unusable: refuse rather than corrupt
            self.emit(event="error", message="CUDA was initialised in the fork server")
            return
        if inherited_attributes() != self.attributes:
            # An earlier child lowered a limit or the priority: every later child would inherit it.
            self.emit(event="error", message="the fork server's limits or priority were changed")
            os._exit(3)
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the candidate's process
            try:
                os.close(write_end)
                os.close(self.control_fd)
                os.close(self.events.fileno())
                self._become_candidate(directory, read_end, self.device)
            finally:
                os._exit(0)
        os.close(read_end)
        self.child, self.child_pipe = pid, write_end
        self.emit(event="started", pid=pid)

    @staticmethod
    def _become_candidate(directory: str, control_fd: int, device: str) -> None:
        from .phases import PhaseClock
        from .startup import warm_up_cuda
        from .worker import serve

        os.setsid()
        proctree.die_with_parent()
        os.chdir(directory)
        os.umask(0o077)
        os.environ.update(per_candidate_env(directory))
        clock = PhaseClock()
        if device != "cpu":
            # Trusted start-up while the child waits for its candidate (its directory is its own:
            # nothing else runs in this server's sandbox until it is given one).
            warm_up_cuda(clock)
        serve(os.fdopen(control_fd, "r"), clock)
        sys.stdout.flush()
        sys.stderr.flush()

    def send(self, line: str) -> None:
        if self.child_pipe is None:
            return
        try:
            os.write(self.child_pipe, line.encode() + b"\n")
        except OSError:
            self._close_pipe()

    def run(self, warm_profiler: bool) -> None:
        from .audit import warm_up_profiler
        from .startup import preload

        proctree.become_subreaper()  # orphans of a candidate come back here to be reaped
        proctree.die_with_parent()  # no server outlives a verifier that crashed (process isolation)
        set_dumpable(False)  # a child cannot trace this server or open its /proc files
        preload()
        if warm_profiler:  # CPU only: the children inherit a started Kineto (CUDA must stay untouched)
            warm_up_profiler()
        self.attributes = inherited_attributes()
        self.emit(event="ready", pid=os.getpid())
        pending = b""
        while True:
            ready, _, _ = select.select([self.control_fd], [], [], 0.05)
            self.reap()
            if not ready:
                continue
            data = os.read(self.control_fd, 65536)
            if not data:
                return
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                self.handle(line)

    def handle(self, line: bytes) -> None:
        try:
            command = json.loads(line)
        except ValueError:
            return
        op = command.get("op") if isinstance(command, dict) else None
        if op == "fork":
            self.fork(str(command["dir"]))
        elif op == "send":
            self.send(str(command["line"]))
        elif op == "close":
            self._close_pipe()


def main() -> None:
    parser = argparse.ArgumentParser(description="verifier fork server (started by the verifier)")
    parser.add_argument("--events-fd", type=int, required=True)
    parser.add_argument("--warm-profiler", action="store_true")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    _Server(args.events_fd, args.device).run(args.warm_profiler)
    os._exit(0)


# -- the parent's side --------------------------------------------------------------------------------

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
        argv = [sys.executable, "-m", "extensions.verify.forkserver", "--events-fd", str(write_end),
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


if __name__ == "__main__":
    main()
