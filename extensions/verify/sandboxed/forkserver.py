"""A sandboxed fork server: import torch and Triton once, fork a fresh child per candidate.

    python -m extensions.verify.sandboxed.forkserver --events-fd N [--warm-profiler]   (started by ``fork_servers.ForkServer``)

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
import sys
from typing import Optional

from ..common import proctree
from ..common.privileges import set_dumpable
from ..common.sandbox_env import per_candidate_env


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
        from ..common.phases import PhaseClock
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
        from . import worker  # noqa: F401 - imported once here, so that no forked child imports it
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


if __name__ == "__main__":
    main()
