"""Every pair the data stage keeps passes the verifier that gives the reward.

``verify_pairs`` judges each pair's solution against its own task with ``extensions.verify`` (on
CUDA where a GPU is visible, else in the Triton interpreter; timing off: a pair is training data,
not a reward) and returns one ``PairVerdict`` per pair. Verdicts are cached by content: the key is
the task, the solution, the device, the verifier settings that decide a verdict and a digest of the
verifier's own code, so a re-run (or another run on the same machine) judges nothing twice and a
changed verifier, or stricter settings, judges everything again. The
cache is a JSON-lines file (``$KERNEL_RL_VERIFY_CACHE``, else ``~/.cache/kernel-rl/verified_pairs.jsonl``),
appended under a lock; a line cut short by a dying machine is ignored.
"""
from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import sys
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Optional, Sequence

from ..config import VerifierConfig
from ..runtime.io import read_jsonl
from .kernelbook import KernelBookPair

CACHE_ENV = "KERNEL_RL_VERIFY_CACHE"


@dataclass
class PairVerdict:
    correct: bool
    stage: str
    flags: list[str] = field(default_factory=list)
    error: Optional[str] = None
    device: str = "cpu"
    isolation: str = "none"
    reduced_size: bool = False  # CPU: judged below the problem's own sizes (docs/verifier.md)
    cached: bool = False


def cache_path() -> Path:
    return Path(os.environ.get(CACHE_ENV) or "~/.cache/kernel-rl/verified_pairs.jsonl").expanduser()


@lru_cache(maxsize=1)
def verifier_digest() -> str:
    """sha256 of the verifier's and the timer's source: a new verifier re-judges every pair."""
    library = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for folder in ("verify", "timing"):
        for path in sorted((library / folder).rglob("*.py")):
            digest.update(path.relative_to(library).as_posix().encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


# How verification is scheduled, not what it checks: these do not enter a verdict's key.
_SCHEDULING_KEYS = ("workers", "fork_server", "fork_servers_per_slot", "prespawn_workers", "prebuilt_triton_cache",
                    "reference_server", "reference_processes")


def _timing_only(key: str) -> bool:
    """Settings that only the timer and the reward read: a pair is judged with timing off, so the
    synthesizer's verdicts serve a run whose timing budget or reward table differs."""
    return key.startswith("timing_") or key in ("speedup_review_bound", "reward_weights")


def verdict_key(pair: KernelBookPair, device: str, verifier_cfg: VerifierConfig) -> str:
    """The task, the solution, where and under which checks it was judged, and the verifier's code:
    a verdict under the smoke config's three input sets is no verdict under the default's five."""
    checks = {k: v for k, v in dataclasses.asdict(verifier_cfg).items()
              if k not in _SCHEDULING_KEYS and not _timing_only(k)}
    text = json.dumps([pair.task_code, pair.solution_code, device, checks, verifier_digest()], sort_keys=True)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _read_cache(path: Path) -> dict[str, PairVerdict]:
    verdicts: dict[str, PairVerdict] = {}
    if not path.is_file():
        return verdicts
    for _, row in read_jsonl(path):  # a line cut by a dying machine is skipped: that pair is verified again
        try:
            key = row.pop("key")
            verdicts[key] = PairVerdict(**{k: v for k, v in row.items() if k != "cached"})
        except (KeyError, TypeError):
            continue
    return verdicts


def _append_cache(path: Path, entries: dict[str, PairVerdict], *, warn: bool = True) -> bool:
    """Append ``entries``; False (said on stderr when ``warn``) when the cache cannot be written."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            for key, verdict in entries.items():
                row = {"key": key, **dataclasses.asdict(verdict)}
                row.pop("cached")
                handle.write(json.dumps(row) + "\n")
            handle.flush()
        return True
    except OSError as exc:
        # An unwritable cache costs a re-verification next time, never the run; said once.
        if warn:
            print(f"warning: verdict cache {path} cannot be written ({exc.strerror or exc}); the next run verifies "
                  f"these pairs again (set {CACHE_ENV} to a writable file)", file=sys.stderr, flush=True)
        return False


class PairVerification:
    """``verify_pairs`` for pairs that arrive over time (the synthesizer's captures): a cached
    verdict is answered at once, the rest are judged in one verifier session, and each new
    verdict is cached as soon as it is known (a machine that dies keeps what it judged)."""

    def __init__(self, verifier_cfg: VerifierConfig, *, progress: bool = False, expected: int = 0,
                 cache: Optional[Path] = None):
        from ..verify.api import resolve_device

        self.device = resolve_device(None, verifier_cfg)
        self.config = dataclasses.replace(verifier_cfg, enable_calibrated_timing=False)
        self.cache = cache or cache_path()
        self.known = _read_cache(self.cache)
        self._progress, self._expected = progress, expected
        self._session = None
        self._lock = threading.Lock()
        self._cache_failed = False  # said once, not once per pair

    def _open_session(self):
        if self._session is None:  # a run whose pairs are all cached starts no process
            from ..verify import VerifierSession

            self._session = VerifierSession(self.config, device=self.device, progress=self._progress,
                                            expected=self._expected)
        return self._session

    def slots(self) -> int:
        """The session's worker slots (opens it: the caller is about to verify)."""
        return self._open_session().pool.size

    def submit_many(self, pairs: Sequence[KernelBookPair]) -> "list[Future[PairVerdict]]":
        from ..verify import VerifyRequest

        futures: list[Future] = [Future() for _ in pairs]
        keys = [verdict_key(pair, self.device, self.config) for pair in pairs]
        todo = []
        for index, key in enumerate(keys):
            if key in self.known:
                futures[index].set_result(dataclasses.replace(self.known[key], cached=True))
            else:
                todo.append(index)
        if not todo:
            return futures
        requests = [VerifyRequest(pairs[i].task_code, pairs[i].solution_code, label=pairs[i].uuid) for i in todo]
        for index, judged in zip(todo, self._open_session().submit_many(requests)):
            judged.add_done_callback(self._answer(keys[index], futures[index]))
        return futures

    def _answer(self, key: str, future: Future):
        def finished(judged: Future) -> None:
            if judged.cancelled():
                future.cancel()
                return
            if judged.exception() is not None:
                future.set_exception(judged.exception())
                return
            result = judged.result()
            verdict = PairVerdict(
                correct=bool(result.correct), stage=result.stage, flags=sorted(set(result.flags)),
                error=(result.error or None) and result.error[:300], device=self.device, isolation=result.isolation,
                reduced_size="reduced_size" in result.flags)
            self.known[key] = verdict
            with self._lock:
                warn = not self._cache_failed
                self._cache_failed |= not _append_cache(self.cache, {key: verdict}, warn=warn)
            future.set_result(verdict)

        return finished

    def close(self, *, stop: bool = False) -> None:
        if self._session is not None:
            self._session.close(stop=stop)

    def __enter__(self) -> "PairVerification":
        return self

    def __exit__(self, kind, value, traceback) -> None:
        self.close(stop=kind is not None)


def verify_pairs(pairs: Sequence[KernelBookPair], verifier_cfg: VerifierConfig, *, progress: bool = True,
                 cache: Optional[Path] = None) -> list[PairVerdict]:
    """One verdict per pair, in order; cached verdicts are reused and new ones cached."""
    with PairVerification(verifier_cfg, progress=progress, expected=len(pairs), cache=cache) as verification:
        futures = verification.submit_many(pairs)
        return [future.result() for future in futures]


def summarize(verdicts: Sequence[PairVerdict]) -> dict:
    """The report's ``verification`` section: what was judged, where, and why pairs failed."""
    failed_stage: dict[str, int] = {}
    failed_flag: dict[str, int] = {}
    for verdict in verdicts:
        if verdict.correct:
            continue
        failed_stage[verdict.stage] = failed_stage.get(verdict.stage, 0) + 1
        for flag in verdict.flags:
            failed_flag[flag] = failed_flag.get(flag, 0) + 1
    return {
        "pairs": len(verdicts),
        "passed": sum(v.correct for v in verdicts),
        "failed": sum(not v.correct for v in verdicts),
        "cached": sum(v.cached for v in verdicts),
        "devices": sorted({v.device for v in verdicts}),
        "isolation": sorted({v.isolation for v in verdicts}),
        "reduced_size": sum(v.reduced_size for v in verdicts if v.correct),
        "failed_by_stage": dict(sorted(failed_stage.items())),
        "failed_by_flag": dict(sorted(failed_flag.items())),
    }
