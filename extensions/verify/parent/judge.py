"""Judge one candidate that passed the static check: reference data, sandboxed worker, comparison.

The problem's reference data comes from ``reference_data`` (built once per batch); the candidate
runs in a worker taken from the launcher and is driven set by set by ``candidate_run``; this module
holds the verdict's outline: the GPU's gate (correctness runs share it, timing holds it alone), the
stages in order, and the verdict's reward under the one reward table (``reward.reward_of``; the API
computes it again once the static check's flags are merged in).
"""
from __future__ import annotations

import contextlib
import re
import time
from typing import Optional

from ..common.phases import PhaseClock
from ..common.privileges import verifier_undumpable
from ..result import STAGES, VerifyResult
from ..reward import CHEATING_FLAGS, is_cheating, reward_of
from .candidate_run import CandidateRun
from .launcher import WorkerLauncher
from .redact import redact_line
from .reference_data import PreparedProblem, ProblemPreparer, draw_secret
from .sandbox import isolation_warnings
from .verdict import add_flags, fail, status_failure

__all__ = ["ProblemPreparer", "PreparedProblem", "WorkerLauncher", "draw_secret", "judge_candidate"]


_PAIRING_KEY = re.compile(r"^[0-9]{1,12}:-?[0-9.e+-]{1,32}$")
_PAIRING_HOW = {"names", "order", "names+order", "unpaired", "names+unpaired", "order+unpaired",
                "names+order+unpaired"}


def _param_pairing(details) -> dict:
    """How the worker paired tied constant-initialised parameters (``param_noise``), kept only
    where key and value have the forms it writes: the worker's files are the candidate's to
    overwrite, so nothing else of them reaches the caller."""
    if not isinstance(details, dict) or not isinstance(details.get("param_pairing"), dict):
        return {}
    items = list(details["param_pairing"].items())[:8]
    return {k: v for k, v in items if isinstance(k, str) and _PAIRING_KEY.match(k) and v in _PAIRING_HOW}


def _judge_correctness(run: CandidateRun, result: VerifyResult, deadline: float) -> bool:
    with run.gpu_shared():
        compiled = run.wait("compile.json", deadline, "compile")
    if compiled is None:
        return False
    add_flags(result, compiled.get("flags"))
    if not compiled.get("ok"):
        status_failure(result, "compile", compiled)
        return False
    result.stage = "compile"
    pairing = _param_pairing(compiled.get("details"))
    if pairing:
        result.details["param_pairing"] = pairing
    if is_cheating(result.flags):
        fail(result, "compile", "audit", ", ".join(f for f in result.flags if f in CHEATING_FLAGS))
        return False
    return run.judge_sets(deadline)


def judge_candidate(code: str, prepared: PreparedProblem, config, device: str, pool, isolation: str,
                    work_root: str, label: str, *, timing_on_cpu: bool = False,
                    launcher: Optional[WorkerLauncher] = None) -> VerifyResult:
    """The verdict on ``code`` from the compile stage on. ``timing_on_cpu`` runs the timing
    protocol on CPU tensors (meaningless numbers; for testing the protocol without a GPU)."""
    result = VerifyResult(label, stage="static", isolation="none")
    if not prepared.ok:
        # The old "problem: <line>" form stays: callers tell problem failures apart by it.
        result.error, result.error_category = f"problem: {redact_line(prepared.error)}", "problem"
        result.details["problem_error"] = True
        return result
    result.isolation = isolation
    result.warnings.extend(isolation_warnings(isolation))
    if prepared.skipped:
        result.details["skipped_input_sets"] = prepared.skipped
    if prepared.unanswered:
        # A set the reference could not give an answer on is a check that did not run: said in the
        # flags, not only in the details (the verdict holds on the sets that ran).
        add_flags(result, ["value_sets_skipped"])
    result.details["input_sets"] = [s["name"] for s in prepared.sets]
    own_launcher = launcher is None
    if own_launcher:
        launcher = WorkerLauncher(config, device, isolation, work_root, total=1, prespawn=False)
    clock = PhaseClock()
    began = time.monotonic()
    gpu = pool.acquire()
    run = None
    proc = None
    gate = pool.gate(gpu)
    # Without bubblewrap a candidate could read this process's environment through /proc.
    hidden = verifier_undumpable() if isolation == "process" else contextlib.nullcontext()
    hidden.__enter__()
    try:
        timing = (device == "cuda" and config.enable_calibrated_timing) or timing_on_cpu
        with clock.phase("take_worker"):
            proc = launcher.take(gpu)
        with clock.phase("hand_over_job"):
            # Other correctness runs may share this GPU, timing may not: the gate is held while the
            # worker builds the candidate and while it runs each input set, so a timing run waits
            # for the set in flight, not for a whole candidate's sets and their comparisons.
            run = CandidateRun(code, prepared, config, device, gpu, proc, result, timing, clock, gate=gate)
        deadline = time.monotonic() + config.timeout_s
        with clock.phase("correctness"):
            passed = _judge_correctness(run, result, deadline)
        wants_timing = timing and (
            passed or (result.passed("compile") and not config.staged_skip_timing_on_failure))
        if wants_timing and not is_cheating(result.flags) and run.proc.poll() is None:
            asked = time.monotonic()
            with gate.exclusive():
                clock.add("timing_wait_gpu", time.monotonic() - asked)
                with clock.phase("timing"):
                    run.time_candidate()
        with clock.phase("finish"):
            run.proc.send_line("stop")
            outcome = run.proc.finish(time.monotonic() + 10)
        result.details["output_bytes"] = {"stdout": outcome.stdout_bytes, "stderr": outcome.stderr_bytes}
        if outcome.memory_exceeded and result.error_category != "memory_limit":
            result.stage = min(result.stage, "compile", key=lambda s: STAGES.index(s))
            result.error, result.error_category = None, None
            fail(result, "full", "memory_limit", f"more than {proc.memory_limit_kb >> 10} MB of host memory; killed")
    finally:
        if proc is not None:
            with clock.phase("release_worker"):
                launcher.release(proc, gpu)
        hidden.__exit__(None, None, None)
        pool.release(gpu)
        if own_launcher:
            launcher.close()
    result.details["phase_s"] = {"parent": clock.as_dict(), "worker": run.worker_phases if run else {}}
    result.details["problem_prepare_s"] = round(prepared.seconds, 3)
    result.details["problem_prepare_phases"] = prepared.phases
    # When this candidate waited for a slot and when it was done, in seconds since the batch's
    # workers started: the batch's critical path, for the throughput benchmark.
    result.details["batch_span_s"] = [round(began - launcher.created, 3), round(time.monotonic() - launcher.created, 3)]
    if launcher.triton_seed is not None:
        result.details["triton_cache_seed"] = launcher.triton_seed.note
    result.correct = result.stage in ("full", "timing") and not is_cheating(result.flags)
    result.reward = reward_of(result, config.reward_weights)
    return result
