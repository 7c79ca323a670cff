"""The verifier's public API: ``verify_candidate``, ``verify_batch``, ``summarize_results``.

The funnel, stopping at the first failure (``enable_staged_eval``):

    extract -> static -> compile -> tiny -> full -> timing (CUDA)

Extraction and the static check run here in the parent (cheap, no process), so unparsable and
cheating candidates cost nothing. Identical candidate source for the same problem is judged once.
Each problem's input sets and reference outputs are built once per batch by a trusted reference
process (``reference_worker``); each surviving candidate then runs in its own sandboxed worker
process (``worker``), which receives inputs, never expected outputs. The parent compares. Each
result's ``reward`` is computed last, from its verdict, under ``verifier.reward_weights`` (``reward``).
"""
from __future__ import annotations

import hashlib
import inspect
import json
import os
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Optional, Sequence

from .parent.sandbox import remove_tree
from .result import STAGES, VerifyResult
from .reward import is_cheating, reward_of


@dataclass
class VerifyRequest:
    problem_code: str  # KernelBench-style source: class Model, get_inputs, get_init_inputs
    candidate_text: str  # plain Python or a raw model response
    label: str = ""  # copied into VerifyResult.candidate


class VerifierError(RuntimeError):
    """The verifier itself cannot run (not a verdict on a candidate)."""


def _verifier_config(config):
    from ..config import VerifierConfig

    if config is None:
        return VerifierConfig()
    return getattr(config, "verifier", config)  # a whole PipelineConfig is accepted too


def resolve_device(device: Optional[str], config) -> str:
    device = device or config.device
    if device == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda"):
        raise VerifierError(f"unknown device {device!r}; use cpu, cuda or auto")
    return device


def _isolation(requested: str, device: str) -> str:
    from .parent.sandbox import SandboxUnavailable, choose_isolation

    try:
        return choose_isolation(requested, device)
    except SandboxUnavailable as exc:
        raise VerifierError(str(exc)) from None


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


# -- stage 1+2: extract and static check, in the parent ---------------------------------------

@dataclass
class _Screened:
    index: int
    label: str
    code: Optional[str] = None
    key: Optional[tuple[str, str]] = None
    result: Optional[VerifyResult] = None  # set when rejected here
    static_flags: list[str] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)


def _call_static_check(code: str, config):
    from .static.static_check import static_check

    params = inspect.signature(static_check).parameters
    kwargs = {}
    if "allow_library_gemm" in params:
        kwargs["allow_library_gemm"] = config.allow_library_gemm
    if "config" in params:
        kwargs["config"] = config
    return static_check(code, **kwargs)


def screen(index: int, request: VerifyRequest, config) -> _Screened:
    from .static.extract import extract_code

    label = request.label or f"candidate_{index}"
    item = _Screened(index, label)
    extraction = extract_code(request.candidate_text)
    item.notes["extraction"] = {"method": extraction.method, "candidates_seen": extraction.candidates_seen}
    if extraction.code is None:
        item.result = VerifyResult(label, stage="none",
                                   error=f"extract: {extraction.error or 'no code found'}",
                                   details=dict(item.notes))
        return item
    try:
        report = _call_static_check(extraction.code, config)
    except Exception as exc:  # noqa: BLE001 - a checker crash must not end the batch
        report = None
        static_error = f"static check crashed: {type(exc).__name__}: {str(exc)[:120]}"
    flags = list(getattr(report, "flags", []) or [])
    if report is None or not report.ok:
        error = static_error if report is None else "; ".join(report.errors[:2]) or "static check failed"
        item.result = VerifyResult(label, stage="extract", flags=flags,
                                   error=f"static: {error}"[:300], details=dict(item.notes))
        return item
    item.code = extraction.code
    item.static_flags = flags
    item.notes["static"] = {"kernel_names": list(getattr(report, "kernel_names", []) or []),
                            "allowed_library_calls": list(getattr(report, "allowed_library_calls", []) or [])}
    # The exact source, docstrings and comments included: a candidate can read its own text at run
    # time, so two sources that differ only there are two programs.
    item.key = (_sha(request.problem_code), _sha(extraction.code))
    return item


# -- the device pool ----------------------------------------------------------------------------

def default_cuda_slots(gpus: int, cores: int, gpu_memory_gb: float) -> int:
    """Worker slots on CUDA when ``verifier.workers`` is 0: one per two CPU cores and one per 10 GB
    of the smallest GPU's memory (each slot's workers hold CUDA contexts beside whatever else the
    GPU holds, the policy model during RL), two to eight per GPU. On one H100 with 16 cores, with
    each batch's references kept in their processes, a data-like batch (96 pairs, timing off) ran
    at 77 candidates/min with 4 slots, 102 with 8 and 69 with 16 (the slots' CUDA start-ups contend
    for the cores); an evaluation-like batch with timing at 14 with 2 slots and 22 with 8
    (``bench/verifier_throughput.py``)."""
    per_gpu_by_memory = int(gpu_memory_gb // 10)
    return max(2 * gpus, min(8 * gpus, cores // 2, per_gpu_by_memory * gpus))


class _DevicePool:
    """Worker slots. On CUDA each slot is bound to a GPU (round robin) and several workers may share
    a GPU for correctness; timing is serialised per GPU by ``extensions.timing.gpu_lease``."""

    def __init__(self, device: str, workers: int):
        self.device = device
        self._free: list[Optional[int]]
        if device == "cuda":
            import torch

            count = torch.cuda.device_count()
            if count == 0:
                raise VerifierError("device cuda requested but no CUDA device is visible")
            if workers > 0:
                slots = workers
            else:
                smallest = min(torch.cuda.get_device_properties(i).total_memory for i in range(count))
                slots = default_cuda_slots(count, os.cpu_count() or 2, smallest / 1e9)
            self._free = [i % count for i in range(slots)]
        else:
            slots = workers if workers > 0 else max(1, os.cpu_count() or 1)
            self._free = [None] * slots
        self.size = len(self._free)
        self.slots = list(self._free)
        self._turn = -1
        self._cond = threading.Condition()
        self.gates = {index: _GpuGate() for index in set(self._free) if index is not None}

    def gate(self, index: Optional[int]) -> "_GpuGate":
        return self.gates.get(index) or _NO_GATE

    def next_gpu(self) -> Optional[int]:
        """A GPU for work that takes no worker slot (round robin over the slots' GPUs)."""
        with self._cond:
            self._turn += 1
            return self.slots[self._turn % len(self.slots)]

    def acquire(self) -> Optional[int]:
        with self._cond:
            while not self._free:
                self._cond.wait()
            return self._free.pop(0)

    def release(self, index: Optional[int]) -> None:
        with self._cond:
            self._free.append(index)
            self._cond.notify()


class _GpuGate:
    """Per-GPU readers/writer gate in this process: correctness runs share the GPU, a timing run
    has it alone (writers first, so timing never starves)."""

    def __init__(self):
        self._cond = threading.Condition()
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0

    @contextmanager
    def shared(self):
        with self._cond:
            while self._writer or self._writers_waiting:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    @contextmanager
    def exclusive(self):
        with self._cond:
            self._writers_waiting += 1
            while self._writer or self._readers:
                self._cond.wait()
            self._writers_waiting -= 1
            self._writer = True
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                self._cond.notify_all()


_NO_GATE = _GpuGate()


# -- the batch ----------------------------------------------------------------------------------

def verify_batch(requests: Sequence[VerifyRequest], config=None, *, device: Optional[str] = None,
                 progress: bool = True) -> list[VerifyResult]:
    """Judge every request; results in the same order. See the module docstring."""
    from .parent.candidate_run import stage_handover
    from .parent.judge import ProblemPreparer, WorkerLauncher, judge_candidate

    config = _verifier_config(config)
    device = resolve_device(device, config)
    # The sandbox probe (on CUDA a Python that imports torch and starts CUDA inside bubblewrap:
    # seconds, once per process) runs while the batch is screened and the references start.
    probing = ThreadPoolExecutor(max_workers=1)
    isolation_probe = probing.submit(_isolation, config.isolation, device)
    probing.shutdown(wait=False)
    requests = list(requests)
    screened = [screen(i, r, config) for i, r in enumerate(requests)]
    first_of: dict[tuple[str, str], int] = {}
    to_run: list[_Screened] = []
    for item in screened:
        if item.result is None:
            if item.key in first_of:
                continue
            first_of[item.key] = item.index
            to_run.append(item)

    pool = _DevicePool(device, config.workers)
    work_root = tempfile.mkdtemp(prefix="verify-")
    os.chmod(work_root, 0o700)
    judged: dict[int, VerifyResult] = {}
    bar = _progress(len(to_run), progress)
    try:
        problems = {item.key[0]: requests[item.index].problem_code for item in to_run}
        preparer = ProblemPreparer(config, device, work_root, pool, reuse_processes=config.reference_server)
        # Starting the next worker early only pays where cores are left over (and on GPUs).
        prespawn = config.prespawn_workers and (device == "cuda" or (os.cpu_count() or 1) > 2 * pool.size)
        # Every problem's reference starts at once (trusted, in a process of its own: they need no
        # sandbox, so they do not wait for the probe) and each candidate starts as soon as its own
        # problem is ready (references need no worker slot: they are trusted and short).
        with ThreadPoolExecutor(max_workers=_preparing_threads(device, pool, len(problems))) as preparing:
            timing = device == "cuda" and config.enable_calibrated_timing

            def prepare(code: str):
                problem = preparer.prepare(code)
                if problem.ok:  # the input files every candidate gets, made while the first ones start
                    threading.Thread(target=stage_handover, args=(problem, timing), daemon=True).start()
                return problem

            prepared = {key: preparing.submit(prepare, code) for key, code in problems.items()}
            try:
                isolation = isolation_probe.result()
            except BaseException:
                preparer.abort()  # no sandbox: the error now, not after the references
                raise
            # Fork servers start now, so their imports overlap the reference data's preparation.
            launcher = WorkerLauncher(config, device, isolation, work_root, len(to_run), prespawn, slots=pool.slots)

            def judge(item: _Screened) -> VerifyResult:
                try:
                    result = judge_candidate(item.code, prepared[item.key[0]].result(), config, device, pool,
                                             isolation, work_root, item.label, launcher=launcher)
                except Exception as exc:  # noqa: BLE001 - one candidate never ends the batch
                    from .parent.redact import category_error

                    result = VerifyResult(item.label, stage="static", isolation=isolation,
                                          error=category_error("compile", "sandbox", f"{type(exc).__name__}: {exc}"),
                                          error_category="sandbox")
                _merge_screen(result, item, config)
                if bar is not None:
                    bar.update(1)
                return result

            try:
                with ThreadPoolExecutor(max_workers=pool.size) as executor:
                    for item, result in zip(to_run, executor.map(judge, to_run)):
                        judged[item.index] = result
            finally:
                launcher.close()
                preparer.close()
    finally:
        if bar is not None:
            bar.close()
        remove_tree(work_root)

    results: list[VerifyResult] = []
    for item in screened:
        if item.result is not None:
            results.append(item.result)
        elif item.index in judged:
            results.append(judged[item.index])
        else:
            original = judged[first_of[item.key]]
            copy = VerifyResult.from_dict(json.loads(json.dumps(original.to_dict())))
            results.append(replace(copy, candidate=item.label, cached=True))
    for result in results:  # the verdict is complete: its reward, under the one reward table
        result.reward = reward_of(result, config.reward_weights)
    return results


def _preparing_threads(device: str, pool: "_DevicePool", problems: int) -> int:
    """How many reference processes run at once: on CPU no more than the worker slots (they share
    the cores); on CUDA up to half the cores, since a reference mostly imports and starts CUDA."""
    limit = pool.size if device == "cpu" else max(pool.size, (os.cpu_count() or 2) // 2)
    return max(1, min(problems, limit))


def _merge_screen(result: VerifyResult, item: _Screened, config) -> None:
    for flag in item.static_flags:
        if flag not in result.flags:
            result.flags.append(flag)
    result.details = {**item.notes, **result.details}
    if is_cheating(result.flags):
        result.correct = False


def _progress(total: int, enabled: bool):
    if not enabled or total == 0:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc="verify", unit="cand", file=sys.stderr, leave=False)


def verify_candidate(problem_code: str, candidate_text: str, config=None, *, label: str = "candidate",
                     device: Optional[str] = None) -> VerifyResult:
    return verify_batch([VerifyRequest(problem_code, candidate_text, label)], config, device=device,
                        progress=False)[0]


def summarize_results(results: Sequence[VerifyResult]) -> dict:
    """Counts per stage: how many reached each stage, where the rest were rejected, flags seen."""
    per_stage = {stage: 0 for stage in STAGES}
    rejected = {stage: 0 for stage in STAGES[1:]}
    flags: dict[str, int] = {}
    order = list(STAGES)
    for result in results:
        reached = order.index(result.stage) if result.stage in order else 0
        for stage in STAGES[: reached + 1]:
            per_stage[stage] += 1
        if not result.correct and reached + 1 < len(order):
            rejected[order[reached + 1]] += 1  # rejected at the first stage it did not pass
        for flag in result.flags:
            flags[flag] = flags.get(flag, 0) + 1
    return {
        "total": len(results),
        "correct": sum(1 for r in results if r.correct),
        "cached": sum(1 for r in results if r.cached),
        "per_stage_reached": per_stage,
        "rejected_at": rejected,
        "flags": dict(sorted(flags.items())),
    }


def verify_code_unscreened(problem_code: str, code: str, config=None, *, label: str = "candidate",
                           device: Optional[str] = None, isolation: Optional[str] = None) -> VerifyResult:
    """Judge ``code`` from the compile stage on, skipping extraction and the static check.

    For tests of the sandbox and the runtime audit (code the static check would already reject
    must still be caught at run time) and for re-judging code that already passed the screen.
    """
    from .parent.judge import ProblemPreparer, judge_candidate

    config = _verifier_config(config)
    device = resolve_device(device, config)
    isolation = _isolation(isolation or config.isolation, device)
    pool = _DevicePool(device, 1)
    work_root = tempfile.mkdtemp(prefix="verify-")
    try:
        prepared = ProblemPreparer(config, device, work_root, pool).prepare(problem_code)
        result = judge_candidate(code, prepared, config, device, pool, isolation, work_root, label)
    finally:
        remove_tree(work_root)
    result.reward = reward_of(result, config.reward_weights)
    return result
