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
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Optional, Sequence

from .parent.device_pool import DevicePool, VerifierUnavailable, default_cuda_slots  # noqa: F401
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


# -- the session and the batch ------------------------------------------------------------------

class VerifierSession:
    """Candidates judged as they arrive: ``submit`` screens them at once and returns futures of
    their verdicts, while the worker slots, fork servers and kept reference processes stay up
    between submissions until ``close`` (a ``with`` block closes it; an exception in the block
    stops what is queued and kills what runs, so no sandbox outlives it).

    ``verify_batch`` is one session for one list. A long producer (the RL sampler, the
    synthesizer) keeps one session open and submits each batch as soon as it exists, so sampling
    and verification overlap and no batch pays the start-up again. ``expected`` is how many
    candidates are likely to need a worker (it sizes how far ahead workers are started; more may
    come). A problem's reference data is kept while one of its candidates is still waiting or
    running, and dropped after (a later candidate of it gets a fresh build)."""

    def __init__(self, config=None, *, device: Optional[str] = None, progress: bool = False, expected: int = 0):
        from .parent.judge import ProblemPreparer

        self.config = _verifier_config(config)
        self.device = resolve_device(device, self.config)
        # The sandbox probe (on CUDA a Python that imports torch and starts CUDA inside bubblewrap:
        # seconds, once per session) runs while the first candidates are screened and their
        # references start.
        self._setup = ThreadPoolExecutor(max_workers=1)
        self._isolation = self._setup.submit(_isolation, self.config.isolation, self.device)
        try:
            self.pool = DevicePool(self.device, self.config.workers)
        except VerifierUnavailable as exc:
            self._setup.shutdown(wait=False)
            raise VerifierError(str(exc)) from None
        self.expected = max(0, int(expected))
        self.work_root = tempfile.mkdtemp(prefix="verify-")
        os.chmod(work_root := self.work_root, 0o700)
        self.preparer = ProblemPreparer(self.config, self.device, work_root, self.pool,
                                        reuse_processes=self.config.reference_server)
        # Every problem's reference starts at once (trusted, in a process of its own: they need no
        # sandbox, so they do not wait for the probe) and each candidate starts as soon as its own
        # problem is ready (references need no worker slot: they are trusted and short).
        references = _preparing_threads(self.device, self.pool, self.config.reference_processes)
        self._preparing = ThreadPoolExecutor(max_workers=references)
        # A problem's reference is built when it comes within the read-ahead (or a worker slot wants
        # it): its inputs and outputs stay in memory until its last candidate is judged, so a batch of
        # thousands of problems must not build them all at once.
        self._read_ahead = max(2 * self.pool.size, references)
        # One judging thread per problem of the read-ahead, not per worker slot: a thread waits for
        # its problem's reference before it takes a slot (``judge_candidate``), so a reference that
        # takes long (a floor's ambiguity runs: 40 s) holds up its own candidates, not a slot.
        self._judging = ThreadPoolExecutor(max_workers=self._read_ahead)
        self._lock = threading.Lock()
        self._launcher: Optional[Future] = None
        self._launcher_total = 0
        self._seed_build = None  # the pre-built Triton cache's warm-up (CUDA)
        self._runs = 0  # candidates handed to a worker slot so far
        self._submitted = 0
        self._first: dict[tuple[str, str], Future] = {}  # identical source for one problem: judged once
        self._problems: dict[str, Optional[Future]] = {}  # None: not started
        self._unstarted: dict[str, str] = {}  # problem -> its code, in the order they came
        self._held = 0  # problems whose reference is being built or kept
        self._waiting: dict[str, int] = {}  # a problem's candidates not yet judged
        self._closed = False
        self._stopping = False  # close(stop=True): verdicts still arriving are not verdicts
        self._progress = progress
        self._bar = None

    # -- submitting ----------------------------------------------------------------------------

    def submit(self, request: VerifyRequest) -> "Future[VerifyResult]":
        return self.submit_many([request])[0]

    def submit_many(self, requests: Sequence[VerifyRequest]) -> "list[Future[VerifyResult]]":
        """Screen ``requests`` now (extraction and the static check), start the rest; one future per
        request, in order. Labels default to ``candidate_<n>``, n counting this session's requests."""
        with self._lock:
            if self._closed:
                raise VerifierError("the verifier session is closed")
            first_index = self._submitted
            self._submitted += len(requests)
        screened = [screen(first_index + i, r, self.config) for i, r in enumerate(requests)]
        futures: list[Future] = []
        runs: list[tuple[_Screened, Future]] = []
        with self._lock:
            for item, request in zip(screened, requests):
                if item.result is not None:
                    futures.append(self._done(item.result))
                elif item.key in self._first:
                    futures.append(self._copy_of(self._first[item.key], item.label))
                else:
                    future: Future = Future()
                    self._first[item.key] = future
                    futures.append(future)
                    runs.append((item, future))
                    problem = item.key[0]
                    self._waiting[problem] = self._waiting.get(problem, 0) + 1
                    if problem not in self._problems:
                        self._problems[problem] = None
                        self._unstarted[problem] = request.problem_code
            self._start_references()
            if runs:
                self._runs += len(runs)
                self._start_launcher()
                if self._bar is None and self._progress:
                    self._bar = _progress(len(runs), True)
                elif self._bar is not None:
                    self._bar.total += len(runs)
                    self._bar.refresh()
        for item, future in runs:
            self._judging.submit(self._judge_into, item, future)
        return futures

    def _done(self, result: VerifyResult) -> Future:
        result.reward = reward_of(result, self.config.reward_weights)
        future: Future = Future()
        future.set_result(result)
        return future

    def _copy_of(self, original: Future, label: str) -> Future:
        """The verdict of an identical earlier candidate, under this one's label."""
        copy: Future = Future()

        def finished(done: Future) -> None:
            if done.cancelled():
                copy.cancel()
            elif done.exception() is not None:
                copy.set_exception(done.exception())
            else:
                result = VerifyResult.from_dict(json.loads(json.dumps(done.result().to_dict())))
                copy.set_result(replace(result, candidate=label, cached=True, reward=done.result().reward))

        original.add_done_callback(finished)
        return copy

    # -- the work ------------------------------------------------------------------------------

    def _prepare(self, problem_code: str):
        from .parent.candidate_run import stage_handover

        problem = self.preparer.prepare(problem_code)
        if problem.ok:  # the input files every candidate gets, made while the first ones start
            timing = self.device == "cuda" and self.config.enable_calibrated_timing
            threading.Thread(target=stage_handover, args=(problem, timing), daemon=True).start()
        return problem

    def _start_references(self) -> None:
        """Start building references, in the order their problems came, up to the read-ahead
        (under ``_lock``)."""
        while self._unstarted and self._held < self._read_ahead:
            self._start_reference(next(iter(self._unstarted)))

    def _start_reference(self, problem: str) -> None:
        self._problems[problem] = self._preparing.submit(self._prepare, self._unstarted.pop(problem))
        self._held += 1

    def _reference(self, problem: str):
        """The problem's reference data; a judging thread that reaches a problem beyond the read-ahead
        starts it (so no thread waits on a read-ahead held by problems queued behind it)."""
        with self._lock:
            if self._problems[problem] is None:
                self._start_reference(problem)
            prepared = self._problems[problem]
        return prepared.result()

    @property
    def references_held(self) -> int:
        """Problems whose reference data is being built or kept in memory now."""
        with self._lock:
            return self._held

    def _start_launcher(self) -> None:
        """Fork servers start with the first candidate that needs one (under ``_lock``), so their
        imports overlap the reference data's preparation; later candidates beyond the first count
        are announced to the launcher."""
        wanted = max(self.expected, self._runs)
        if self._launcher is None:
            self._launcher_total = wanted
            self._seed_build = self._start_triton_seed()
            self._launcher = self._setup.submit(self._make_launcher, wanted, self._seed_build)
        elif self._runs > self._launcher_total:
            more, self._launcher_total = self._runs - self._launcher_total, self._runs
            self._launcher.add_done_callback(lambda f: f.exception() is None and f.result().expect(more))

    def _start_triton_seed(self):
        """On CUDA, the pre-built Triton cache's warm-up, started now rather than after the sandbox
        probe: the isolation it runs under follows from the config alone (``choose_isolation``
        never falls back), and the warm-up, not the probe, is what the first candidates wait for.
        Where the probe then fails, the session fails with it and the seed is never used."""
        from .parent.sandbox import private_code_copy
        from .parent.triton_cache import SeedBuild

        if self.device != "cuda" or not self.config.prebuilt_triton_cache:
            return None
        isolation = "process" if self.config.isolation == "process" else "bwrap"
        pythonpath = private_code_copy(self.work_root) if isolation == "process" else None
        first_gpu = next((g for g in self.pool.slots if g is not None), 0)
        return SeedBuild.start(self.work_root, device=self.device, gpu_index=first_gpu, isolation=isolation,
                               timeout_s=max(60.0, self.config.timeout_s), pythonpath=pythonpath)

    def _make_launcher(self, total: int, seed_build=None):
        from .parent.judge import WorkerLauncher

        try:
            isolation = self._isolation.result()
        except BaseException:
            self.preparer.abort()  # no sandbox: the error now, not after the references
            raise
        # Starting the next worker early only pays where cores are left over (and on GPUs).
        prespawn = self.config.prespawn_workers and (
            self.device == "cuda" or (os.cpu_count() or 1) > 2 * self.pool.size)
        return WorkerLauncher(self.config, self.device, isolation, self.work_root, total, prespawn,
                              slots=self.pool.slots, seed_build=seed_build)

    def _judge_into(self, item: _Screened, future: Future) -> None:
        if not future.set_running_or_notify_cancel():
            self._problem_done(item.key[0])
            return
        try:
            launcher = self._launcher.result()  # no sandbox: VerifierError, not a verdict
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on the verdict
            future.set_exception(exc)
            self._problem_done(item.key[0])
            return
        try:
            result = self._judge(item, launcher)
        finally:
            self._problem_done(item.key[0])
        if self._stopping:  # judged while its worker and reference were being killed: no verdict
            future.set_exception(VerifierError("the verifier session was stopped before this verdict"))
        else:
            future.set_result(result)

    def _judge(self, item: _Screened, launcher) -> VerifyResult:
        from .parent.judge import judge_candidate

        try:
            result = judge_candidate(item.code, self._reference(item.key[0]), self.config, self.device,
                                     self.pool, launcher.isolation, self.work_root, item.label, launcher=launcher)
        except Exception as exc:  # noqa: BLE001 - one candidate never ends the session
            from .parent.redact import category_error

            result = VerifyResult(item.label, stage="static", isolation=launcher.isolation,
                                  error=category_error("compile", "sandbox", f"{type(exc).__name__}: {exc}"),
                                  error_category="sandbox")
        _merge_screen(result, item, self.config)
        result.reward = reward_of(result, self.config.reward_weights)
        if self._bar is not None:
            self._bar.update(1)
        return result

    def _problem_done(self, problem: str) -> None:
        """One candidate of ``problem`` is judged; after its last, its reference data goes."""
        with self._lock:
            self._waiting[problem] -= 1
            if self._waiting[problem] > 0:
                return
            del self._waiting[problem]
            prepared = self._problems.pop(problem, None)
            self._unstarted.pop(problem, None)
            if prepared is not None:
                self._held -= 1
                if not self._closed:
                    self._start_references()
        if prepared is not None and prepared.done() and not prepared.cancelled() and prepared.exception() is None:
            directory = getattr(prepared.result(), "directory", None)
            if directory:
                remove_tree(directory)

    @contextmanager
    def device_in_use(self):
        """The caller's own work is on the session's GPUs (the RL sampler decoding in this
        process): candidates' correctness runs go on beside it, while a timing run, which must
        have its GPU alone, waits until the block ends; the block first waits for the timing runs
        already running or queued. On CPU nothing is timed: no gate, no wait."""
        gates = [self.pool.gate(gpu) for gpu in sorted({g for g in self.pool.slots if g is not None})]
        with ExitStack() as held:
            for gate in gates:
                held.enter_context(gate.host())
            yield

    # -- the end -------------------------------------------------------------------------------

    def isolation(self) -> str:
        """The isolation candidates run under (waits for the probe; VerifierError if none)."""
        return self._isolation.result()

    def close(self, *, stop: bool = False) -> None:
        """Wait for every submitted candidate (``stop``: cancel the queued ones and kill the running
        ones instead; their futures are cancelled or raise ``VerifierError``, never a verdict made
        while the processes were killed), then end every process and remove every file."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._stopping = stop
        try:
            if stop:  # what waits is dropped first, then what runs is killed
                self._judging.shutdown(wait=False, cancel_futures=True)
                self._preparing.shutdown(wait=False, cancel_futures=True)
                self.preparer.abort()
                if self._launcher is not None and self._launcher.done() and self._launcher.exception() is None:
                    self._launcher.result().close()
            self._judging.shutdown(wait=True)
            self._preparing.shutdown(wait=True)
            for future in self._first.values():  # stopped before it started: nobody waits forever
                future.cancel()
            if self._launcher is not None:
                try:
                    self._launcher.result().close()
                except BaseException:  # noqa: BLE001 - no launcher was made: nothing to close
                    pass
            self.preparer.close()
            self._setup.shutdown(wait=True)
            if self._seed_build is not None:
                self._seed_build.stop()
        finally:
            if self._bar is not None:
                self._bar.close()
            remove_tree(self.work_root)

    def __enter__(self) -> "VerifierSession":
        return self

    def __exit__(self, kind, value, traceback) -> None:
        self.close(stop=kind is not None)


def verify_batch(requests: Sequence[VerifyRequest], config=None, *, device: Optional[str] = None,
                 progress: bool = True) -> list[VerifyResult]:
    """Judge every request; results in the same order. See the module docstring."""
    requests = list(requests)
    with VerifierSession(config, device=device, progress=progress) as session:
        futures = session.submit_many(requests)
        session.isolation()  # no sandbox is an error for the whole batch, as it is for a session
        return [future.result() for future in futures]


def _preparing_threads(device: str, pool: DevicePool, configured: int = 0) -> int:
    """How many reference processes run at once (``verifier.reference_processes``; 0: as many as
    the worker slots on CPU, where they share the cores; on CUDA half the slots, at least two). On
    one GPU each process is one more CUDA context in the GPU's time slices: a reference that took
    1 s alone took 18 s beside three others and 39 s beside seven; two processes let one problem
    with a long reference (a floor's ambiguity runs, 50 s) hold up the rest (docs/benchmarks.md)."""
    if configured > 0:
        return configured
    return max(1, pool.size if device == "cpu" else max(2, pool.size // 2))


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
    pool = DevicePool(device, 1)
    work_root = tempfile.mkdtemp(prefix="verify-")
    try:
        prepared = ProblemPreparer(config, device, work_root, pool).prepare(problem_code)
        result = judge_candidate(code, prepared, config, device, pool, isolation, work_root, label)
    finally:
        remove_tree(work_root)
    result.reward = reward_of(result, config.reward_weights)
    return result


_DevicePool = DevicePool  # the name the tests' helpers use
