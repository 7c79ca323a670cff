"""A pre-built Triton cache, owned by the verifier and copied into every candidate's private cache.

On CUDA, Triton compiles C modules with the host compiler the first time a process needs them: its
driver utilities (``cuda_utils``) and, in Triton versions that generate one per kernel signature, a
launcher stub. A candidate's worker gets a Triton cache of its own (a shared writable compile
cache could be poisoned by one candidate for the next), so each candidate paid for those builds
again: seconds per candidate, more than its own kernel's compilation.

``TritonCacheSeed.build`` runs once per batch, before any candidate: a trusted warm-up process
(``triton_warmup``, under the same isolation and environment as the workers, so Triton derives the
same cache keys) launches a few kernels of common signatures into a fresh cache. The parent keeps
the C modules of that cache (the ``.so`` files, nothing the warm-up's own kernels compiled) in its
memory and writes a copy into each candidate's private cache directory before the candidate starts
(``write_into``).

Why a copy and not a shared read-only layer: no byte of the seed is reachable by any candidate
except its own copy, in its own directory, which the parent removes with the candidate. A candidate
that rewrites its copy (say, replaces ``cuda_utils`` with its own code) changes what only it loads;
the next candidate gets a fresh copy from the parent's memory, which no candidate can write. The
warm-up's cache directory is never bound into a sandbox and is removed once read. The cost is a few
hundred kilobytes written per candidate.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time
from typing import Optional

from .sandbox import per_candidate_env, remove_tree, start_process

# Only host C modules are seeded: a compiled Triton kernel in a candidate's cache is the
# candidate's own business, and the seed must not decide which kernels a candidate's run reuses.
_SEEDED_SUFFIX = ".so"
_MAX_SEED_BYTES = 64 << 20


class TritonCacheSeed:
    """The C modules of a warm-up run's Triton cache: relative path -> bytes, in memory."""

    def __init__(self, files: dict[str, bytes], note: str = ""):
        self.files = dict(files)
        self.note = note

    @staticmethod
    def collect(cache_dir: str) -> dict[str, bytes]:
        """The C modules under a Triton cache directory (symbolic links are skipped)."""
        files: dict[str, bytes] = {}
        total = 0
        for directory, _dirs, names in os.walk(cache_dir):
            for name in sorted(names):
                path = os.path.join(directory, name)
                if not name.endswith(_SEEDED_SUFFIX) or os.path.islink(path) or not os.path.isfile(path):
                    continue
                with open(path, "rb") as fh:
                    data = fh.read()
                total += len(data)
                if total > _MAX_SEED_BYTES:
                    raise ValueError(f"the warm-up's Triton cache holds more than {_MAX_SEED_BYTES >> 20} MB of C modules")
                files[os.path.relpath(path, cache_dir)] = data
        return files

    @classmethod
    def build(cls, work_root: str, *, device: str, gpu_index: Optional[int], isolation: str,
              timeout_s: float, pythonpath: Optional[str] = None, on_start=None) -> "TritonCacheSeed":
        """Run the warm-up in a fresh directory under ``work_root`` and keep its cache's C modules.
        Never raises: an empty seed (``note`` says why) only means candidates build their own.
        ``on_start`` gets the warm-up's process as soon as it runs (so that it can be stopped)."""
        started = time.monotonic()
        work_dir = tempfile.mkdtemp(prefix="triton-seed-", dir=work_root)
        try:
            proc = start_process([sys.executable, "-m", "extensions.verify.reference.triton_warmup"], work_dir,
                                 device=device, gpu_index=gpu_index, isolation=isolation, pythonpath=pythonpath)
            if on_start is not None:
                on_start(proc)
            try:
                out, err = proc.communicate(timeout=timeout_s)
            except Exception:  # noqa: BLE001 - a timeout (or anything) leaves candidates to build their own
                proc.kill()
                proc.communicate()
                return cls({}, f"the Triton warm-up did not finish in {timeout_s:g}s")
            if proc.returncode != 0:
                last = err.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
                return cls({}, f"the Triton warm-up exited {proc.returncode}: {last[0][:160]}")
            files = cls.collect(cache_dir_of(work_dir))
            summary = _last_json_line(out)
            note = (f"{len(files)} C modules from {summary.get('kernels', '?')} warm-up kernels "
                    f"in {time.monotonic() - started:.1f}s")
            return cls(files, note)
        except (OSError, ValueError) as exc:
            return cls({}, f"the Triton warm-up failed: {type(exc).__name__}: {exc}")
        finally:
            remove_tree(work_dir)

    def write_into(self, cache_dir: str) -> int:
        """Copy the seed into a candidate's own Triton cache directory; returns the files written.
        A name that exists already (a module the worker built itself while it started, before any
        candidate code ran) is left alone, and never followed if it is a link."""
        written = 0
        for relative, data in self.files.items():
            target = os.path.join(cache_dir, relative)
            os.makedirs(os.path.dirname(target), mode=0o700, exist_ok=True)
            try:
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o700)
            except FileExistsError:
                continue
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            written += 1
        return written


class SeedBuild:
    """A ``TritonCacheSeed.build`` running in a thread of its own (``start``), begun as early as its
    isolation is known: a session starts it beside the sandbox probe and the first references
    (every candidate's worker waits for it before its candidate arrives); the launcher waits for it
    with ``result``. Made with a ``seed``, it is a build already done."""

    def __init__(self, *, isolation: str, pythonpath: Optional[str] = None, timeout_s: float = 0.0,
                 seed: Optional[TritonCacheSeed] = None):
        self.isolation, self.pythonpath, self.timeout_s = isolation, pythonpath, timeout_s
        self.seed = seed
        self._proc = None
        self._stopped = False
        self._lock = threading.Lock()
        self._done = threading.Event()
        if seed is not None:
            self._done.set()

    @classmethod
    def start(cls, work_root: str, *, device: str, gpu_index: Optional[int], isolation: str,
              timeout_s: float, pythonpath: Optional[str] = None) -> "SeedBuild":
        build = cls(isolation=isolation, pythonpath=pythonpath, timeout_s=timeout_s)
        threading.Thread(target=build._build, args=(work_root, device, gpu_index), daemon=True).start()
        return build

    def _build(self, work_root: str, device: str, gpu_index: Optional[int]) -> None:
        try:
            self.seed = TritonCacheSeed.build(work_root, device=device, gpu_index=gpu_index, isolation=self.isolation,
                                              timeout_s=self.timeout_s, pythonpath=self.pythonpath,
                                              on_start=self._started)
        except Exception as exc:  # noqa: BLE001 - its directory went with a closing session: no seed
            self.seed = TritonCacheSeed({}, f"the Triton warm-up failed: {type(exc).__name__}: {exc}")
        finally:
            self._done.set()
        if not self.seed.files and not self._stopped:
            print(f"verifier: no pre-built Triton cache ({self.seed.note}); each candidate builds its own",
                  file=sys.stderr)

    def result(self) -> Optional[TritonCacheSeed]:
        """The seed once built (None if the build outlived its time limit and a margin)."""
        self._done.wait(timeout=self.timeout_s + 30)
        return self.seed

    def _started(self, proc) -> None:
        with self._lock:
            self._proc = proc
            stopped = self._stopped
        if stopped:
            _kill_group(proc)

    def stop(self) -> None:
        """End a warm-up still running (its session is closing) and wait for its thread."""
        with self._lock:
            self._stopped = True
            proc = self._proc
        if proc is not None and proc.poll() is None:
            _kill_group(proc)
        self._done.wait(timeout=30)


def _kill_group(proc) -> None:
    """Kill the warm-up and whatever it started (it leads a process group of its own)."""
    try:
        os.killpg(proc.pid, 9)
    except (ProcessLookupError, PermissionError):
        pass


def cache_dir_of(home: str) -> str:
    """The Triton cache directory of a worker whose own directory is ``home`` (host path)."""
    return per_candidate_env(home)["TRITON_CACHE_DIR"]


def _last_json_line(data: bytes) -> dict:
    for line in reversed(data.decode(errors="replace").strip().splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        return value if isinstance(value, dict) else {}
    return {}
