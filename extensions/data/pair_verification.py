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
                    "reference_server")


def verdict_key(pair: KernelBookPair, device: str, verifier_cfg: VerifierConfig) -> str:
    """The task, the solution, where and under which checks it was judged, and the verifier's code:
    a verdict under the smoke config's three input sets is no verdict under the default's five."""
    checks = {k: v for k, v in dataclasses.asdict(verifier_cfg).items() if k not in _SCHEDULING_KEYS}
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


def _append_cache(path: Path, entries: dict[str, PairVerdict]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            for key, verdict in entries.items():
                row = {"key": key, **dataclasses.asdict(verdict)}
                row.pop("cached")
                handle.write(json.dumps(row) + "\n")
            handle.flush()
    except OSError as exc:
        # An unwritable cache costs a re-verification next time, never the run; said once.
        print(f"warning: verdict cache {path} cannot be written ({exc.strerror or exc}); the next run verifies "
              f"these {len(entries)} pair(s) again (set {CACHE_ENV} to a writable file)", file=sys.stderr, flush=True)


def verify_pairs(pairs: Sequence[KernelBookPair], verifier_cfg: VerifierConfig, *, progress: bool = True,
                 cache: Optional[Path] = None) -> list[PairVerdict]:
    """One verdict per pair, in order; cached verdicts are reused and new ones cached."""
    from ..verify import VerifyRequest, verify_batch
    from ..verify.api import resolve_device

    device = resolve_device(None, verifier_cfg)
    config = dataclasses.replace(verifier_cfg, enable_calibrated_timing=False)
    cache = cache or cache_path()
    known = _read_cache(cache)
    keys = [verdict_key(pair, device, config) for pair in pairs]
    todo = [i for i, key in enumerate(keys) if key not in known]
    fresh: dict[str, PairVerdict] = {}
    if todo:
        requests = [VerifyRequest(pairs[i].task_code, pairs[i].solution_code, label=pairs[i].uuid) for i in todo]
        for index, result in zip(todo, verify_batch(requests, config, device=device, progress=progress)):
            fresh[keys[index]] = PairVerdict(
                correct=bool(result.correct), stage=result.stage, flags=sorted(set(result.flags)),
                error=(result.error or None) and result.error[:300], device=device, isolation=result.isolation,
                reduced_size="reduced_size" in result.flags)
        _append_cache(cache, fresh)
    verdicts = []
    for key in keys:
        if key in fresh:
            verdicts.append(fresh[key])
        else:
            verdicts.append(dataclasses.replace(known[key], cached=True))
    return verdicts


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
