"""Where each candidate's worker comes from: a child of a sandboxed fork server (the default), or
a fresh sandboxed process per candidate (``verifier.fork_server: false``).

Either way a worker judges exactly one candidate in a directory nobody else is given:

* ``bwrap``: one fork server per worker slot, each in its own bubblewrap sandbox whose only
  writable directory is the slot's; the candidate's directory is made inside it, and removed (with
  every process the candidate left) before the slot's next candidate is forked.
* ``process``: each candidate gets its own private root (``mkdtemp``, mode 0700) outside the
  batch's directory. Workers import the verifier from a copy, never from the checkout.

On CUDA every candidate's private Triton cache starts as a copy of the verifier's pre-built one
(``triton_cache``: Triton's C modules, built once per batch by a trusted warm-up before any
candidate runs), so no candidate pays for the host C compiler runs its predecessors already made,
and none can write what another loads.

No input file is shared between candidates: the judge writes each candidate's job, init inputs and
(just before each run) one set's inputs into its directory from the parent's memory, hashes each
from the bytes written (``write_private``) and sends the hashes on the worker's private control
channel, so a file another process rewrote is refused instead of used.
"""
from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import threading
import time
from typing import Optional

from .fork_servers import ForkServer, inside_path
from .sandbox import SandboxedProcess, private_code_copy, remove_tree
from .triton_cache import SeedBuild, TritonCacheSeed, cache_dir_of


def write_private(path: str, data: bytes) -> str:
    """Write ``data`` to ``path``; its SHA-256, computed from what was written (not read back, which
    another process could have changed meanwhile)."""
    with open(path, "wb") as fh:
        fh.write(data)
    return hashlib.sha256(data).hexdigest()


# Fork servers per worker slot when the config leaves it to the device. On CUDA a child's start-up
# (CUDA context, CUPTI) takes seconds, so each slot has two servers: one runs a candidate while the
# other's next child warms up.
SERVERS_PER_SLOT = {"cuda": 2, "cpu": 1}


class WorkerLauncher:
    """Hands out one fresh worker per candidate (``take``) and takes it back (``release``)."""

    def __init__(self, config, device: str, isolation: str, work_root: str, total: int, prespawn: bool,
                 slots: Optional[list[Optional[int]]] = None, seed_build: Optional[SeedBuild] = None):
        self.config, self.device, self.isolation, self.work_root = config, device, isolation, work_root
        self.created = time.monotonic()
        self.use_fork_server = bool(getattr(config, "fork_server", True))
        self.prespawn = prespawn and not self.use_fork_server
        self.pythonpath = private_code_copy(work_root) if isolation == "process" else None
        self.memory_limit_kb = max(0, int(getattr(config, "memory_limit_mb", 0))) * 1024
        self._to_start = total
        self._ahead = 0  # children forked (or being forked) ahead that no candidate has taken yet
        self._spawning = 0  # fresh workers being started ahead (``prespawn``), not yet spares
        self._spares: dict[Optional[int], list[SandboxedProcess]] = {}
        self._idle: dict[Optional[int], list[ForkServer]] = {}
        self._servers: list[ForkServer] = []
        self._lock = threading.Lock()
        self._closed = False  # no worker is started after ``close`` (a stopped session's waiting threads)
        self._dirs: set[str] = set()
        self._seed_build: Optional[SeedBuild] = None
        self._own_seed_build = False
        if device == "cuda" and getattr(config, "prebuilt_triton_cache", True) and total > 0:
            if seed_build is not None and (seed_build.isolation, seed_build.pythonpath) == (isolation, self.pythonpath):
                self._seed_build = seed_build  # the session's, started before the sandbox probe ended
            else:  # built while the fork servers import and the reference data is prepared
                self._own_seed_build = True
                first_gpu = next((g for g in (slots or []) if g is not None), 0)
                self._seed_build = SeedBuild.start(work_root, device=device, gpu_index=first_gpu, isolation=isolation,
                                                   timeout_s=max(60.0, config.timeout_s), pythonpath=self.pythonpath)
        if self.use_fork_server:
            per_slot = int(getattr(config, "fork_servers_per_slot", 0)) or SERVERS_PER_SLOT.get(device, 1)
            for gpu in [g for g in (slots or []) for _ in range(per_slot)][: max(0, total)]:
                server = self._start_server(gpu)
                self._idle.setdefault(gpu, []).append(server)
                self._count_ahead(server)
                threading.Thread(target=self._prefork, args=(server,), daemon=True).start()

    # -- the pre-built Triton cache ----------------------------------------------------------------

    @property
    def triton_seed(self) -> Optional[TritonCacheSeed]:
        """The pre-built Triton cache once built (None while building, or on CPU)."""
        return self._seed_build.seed if self._seed_build is not None else None

    def use_seed(self, seed: TritonCacheSeed) -> None:
        """Seed every later candidate's Triton cache with ``seed`` instead of a warm-up's."""
        self._seed_build = SeedBuild(isolation=self.isolation, pythonpath=self.pythonpath, seed=seed)

    def _seed(self, directory: str) -> None:
        """Copy the pre-built Triton cache into a candidate directory's private cache (before its
        candidate arrives; modules its still trusted process built itself are kept)."""
        seed = self._seed_build.result() if self._seed_build is not None else None
        if seed is not None and seed.files:
            seed.write_into(cache_dir_of(directory))

    # -- directories -----------------------------------------------------------------------------

    def candidate_dir(self, server: Optional[ForkServer] = None, seed: bool = True) -> str:
        if self.isolation == "process":
            directory = tempfile.mkdtemp(prefix="verify-cand-")  # a private root, not under the batch's
        else:
            parent = server.work_dir if server is not None else self.work_root
            directory = tempfile.mkdtemp(prefix="cand-", dir=parent)
        with self._lock:
            self._dirs.add(directory)
        if seed:
            self._seed(directory)
        return directory

    def _remove_dir(self, directory: str) -> None:
        """Remove a candidate's directory; one that another live candidate refilled meanwhile (process
        isolation) stays listed and is removed again when the batch closes."""
        remove_tree(directory)
        if not os.path.lexists(directory):
            with self._lock:
                self._dirs.discard(directory)

    # -- workers ---------------------------------------------------------------------------------

    def _start_server(self, gpu: Optional[int]) -> ForkServer:
        slot_dir = tempfile.mkdtemp(prefix="slot-", dir=self.work_root)
        server = ForkServer(device=self.device, gpu_index=gpu, isolation=self.isolation, work_dir=slot_dir,
                            max_output_bytes=self.config.max_output_bytes, memory_limit_kb=self.memory_limit_kb,
                            pythonpath=self.pythonpath)
        with self._lock:
            closed = self._closed
            if not closed:
                self._servers.append(server)
        if closed:
            server.close()
            raise RuntimeError("the verifier's workers were closed")
        return server

    def _spawn(self, gpu: Optional[int]) -> SandboxedProcess:
        return SandboxedProcess(
            [sys.executable, "-m", "extensions.verify.sandboxed.worker"], self.candidate_dir(),
            device=self.device, gpu_index=gpu, isolation=self.isolation,
            max_output_bytes=self.config.max_output_bytes, pythonpath=self.pythonpath, memory_limit_kb=self.memory_limit_kb)

    def _count_ahead(self, server: ForkServer) -> None:
        with self._lock:
            self._ahead += 1
            server.forked_ahead = True

    def _taken_ahead(self, server: ForkServer) -> None:
        with self._lock:
            if server.forked_ahead:
                server.forked_ahead = False
                self._ahead -= 1

    def _prefork(self, server: ForkServer) -> None:
        """Fork the server's next child now, in a fresh directory of its own: it starts CUDA and
        the profiler while the slot's other server runs a candidate. Nothing else runs in this
        server's sandbox meanwhile (its previous candidate is dead and the directory wiped)."""
        try:
            if server.wait_ready(max(60.0, self.config.timeout_s)):
                # Seeded when a candidate is handed over: the child's warm-up does not wait for it.
                directory = self.candidate_dir(server, seed=False)
                server.next_worker = server.fork(directory, inside_path(self.isolation, server.work_dir, directory))
        except Exception:  # noqa: BLE001 - take() forks on demand instead
            server.next_worker = None
        finally:
            server.prefork_done.set()

    def _take_server(self, gpu: Optional[int]) -> ForkServer:
        with self._lock:
            idle = self._idle.get(gpu) or []
            server = idle.pop(0) if idle else None  # the longest idle: its child has warmed up longest
        if server is not None and (not server.alive or server.stopped()):
            self._taken_ahead(server)
            server.close()
            server = None
        if server is None:  # none left for this slot (one died): a new one, forked on demand
            server = self._start_server(gpu)
            server.prefork_done.set()
        if not server.wait_ready(max(60.0, self.config.timeout_s)):
            server.close()
            raise RuntimeError("the verifier's fork server did not start")
        return server

    def _take_forked(self, gpu: Optional[int]):
        """The next server's child forked ahead (warm), or one forked now."""
        for _attempt in range(3):
            server = self._take_server(gpu)
            server.prefork_done.wait(max(60.0, self.config.timeout_s))
            self._taken_ahead(server)
            worker, server.next_worker = server.next_worker, None
            if worker is None:
                directory = self.candidate_dir(server)
                worker = server.fork(directory, inside_path(self.isolation, server.work_dir, directory))
                if worker.poll() is None:
                    return worker
            elif worker.poll() is None:
                self._seed(worker.sandbox_dir)
                worker.started = time.monotonic()
                return worker
            self.release(worker, gpu, reuse=False)  # the warm child died: clean up, fork another
        raise RuntimeError("the verifier's fork server lost three children before their candidates")

    def expect(self, more: int) -> None:
        """``more`` candidates beyond the count the launcher was made for (a session's later
        submissions): servers going back idle fork children ahead for them."""
        with self._lock:
            self._to_start += max(0, more)

    def take(self, gpu: Optional[int]):
        """A worker for one candidate: a forked child (fork server) or a fresh process."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the verifier's workers were closed")
            self._to_start -= 1
        if self.use_fork_server:
            return self._take_forked(gpu)
        with self._lock:
            spares = self._spares.get(gpu) or []
            proc = spares.pop() if spares else None
        if proc is not None and proc.poll() is not None:  # died while waiting
            self.discard(proc)
            proc = None
        proc = proc or self._spawn(gpu)
        if self.prespawn:
            with self._lock:
                waiting = sum(len(v) for v in self._spares.values())
                wanted = self._to_start - waiting - self._spawning > 0
                if wanted:
                    self._spawning += 1
            if wanted:
                spare = None
                try:
                    spare = self._spawn(gpu)  # outside the lock: making its directory takes it too
                finally:
                    with self._lock:
                        self._spawning -= 1
                        if spare is not None and not self._closed:
                            self._spares.setdefault(gpu, []).append(spare)
                            spare = None
                    if spare is not None:  # the launcher closed meanwhile
                        self.discard(spare)
        return proc

    def release(self, proc, gpu: Optional[int], reuse: bool = True) -> None:
        """After the verdict: kill what is left of the candidate, remove its directory, and give
        its fork server back for the slot's next candidate (whose child it forks at once)."""
        proc.kill()
        server = getattr(proc, "server", None)
        if server is not None:
            server.wait_exit(10)
            # Something survived the kill, or the candidate stopped its server: not reused.
            if not server.settled() or server.stopped():
                server.close()
        self._remove_dir(proc.sandbox_dir)
        if server is not None:
            # The whole slot directory was writable: nothing may wait there for the next candidate.
            for name in os.listdir(server.work_dir):
                remove_tree(os.path.join(server.work_dir, name))
        if server is not None and server.alive:
            server.prefork_done.clear()
            with self._lock:
                # Only as many children ahead as candidates are left to take one: a child forked
                # for nobody starts CUDA for nothing, and takes seconds to go when the batch ends.
                more = reuse and self._to_start > self._ahead
                self._idle.setdefault(gpu, []).append(server)
            if more:
                self._count_ahead(server)
                self._prefork(server)
            else:
                server.prefork_done.set()

    def discard(self, proc: SandboxedProcess) -> None:
        proc.kill()
        proc.finish(time.monotonic() + 5)
        self._remove_dir(proc.sandbox_dir)

    def close(self) -> None:
        if self._own_seed_build:
            self._seed_build.stop()
        with self._lock:
            self._closed = True
            spares = [p for procs in self._spares.values() for p in procs]
            self._spares.clear()
            servers, self._servers = self._servers, []
            self._idle.clear()
        for proc in spares:
            self.discard(proc)
        for server in servers:
            server.close(wait=False)
        for server in servers:
            server.wait_closed()
        # Every candidate is dead now: nothing can refill a directory any more.
        with self._lock:
            left = list(self._dirs)
        for directory in left:
            self._remove_dir(directory)
