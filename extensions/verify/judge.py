"""Judge one candidate that passed the static check: reference data, sandboxed worker, comparison.

``ProblemPreparer`` builds a problem's input sets and reference outputs once per batch in a
trusted reference process, from an input seed and value transforms drawn here per batch from the
OS's secure random source (``draw_secret``: sent on the reference's stdin, never written to a
file). The inputs stay in this process's memory. ``judge_candidate`` runs the candidate's worker in
the sandbox and hands it one input set at a time, each written into its directory just before its
``run`` (so nothing of the inputs exists while the candidate is imported and built); it compares
every output here in the parent (shape, dtype, tolerance, relative error, NaN/Inf, inputs
unchanged) and stops at the first failure; on CUDA, after every set passed, it asks the worker to
time the candidate while holding the GPU's lease.
"""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from .compare import compare_outputs, inputs_unchanged
from .launcher import WorkerLauncher, write_private
from .phases import PhaseClock, sanitize_phases
from .privileges import verifier_undumpable
from .redact import category_error, redact_line, safe_name, sanitize_data
from .result import STAGES, VerifyResult
from .reward import ADVISORY_FLAGS, CHEATING_FLAGS, compute_reward, is_cheating
from .sandbox import SandboxedProcess, isolation_warnings
from .tensor_io import TensorIOError, load_tensors, pack, tensor_bytes, unpack

_MAX_STATUS_BYTES = 1 << 20
__all__ = ["ProblemPreparer", "PreparedProblem", "WorkerLauncher", "judge_candidate"]
# Words in a worker's error that mean an allocation was refused by the memory cap.
_MEMORY_ERRORS = ("MemoryError", "not enough memory", "can't allocate memory", "Cannot allocate memory",
                  "std::bad_alloc")


def draw_secret() -> dict:
    """One batch's input seed and value-transform parameters, from the OS's secure random source.
    They reach the trusted reference process only; no candidate can replay its inputs."""
    rng = secrets.SystemRandom()
    scale = rng.uniform(3.0, 5.0)
    return {
        "input_seed": secrets.randbits(62),
        "transforms": {
            "signed": [scale, scale / 2 * rng.uniform(0.8, 1.2), rng.choice((-1.0, 1.0))],
            "scale_down": 10 ** rng.uniform(-3.5, -2.5),
            "scale_up": 10 ** rng.uniform(2.0, 3.0),
            "shift": rng.choice((-1.0, 1.0)) * rng.uniform(1.5, 3.5),
        },
    }


@dataclass
class PreparedProblem:
    ok: bool
    error: Optional[str] = None
    directory: str = ""
    source: str = ""  # the problem at the sizes used (shrunk on CPU)
    init: Any = None
    inits: list = field(default_factory=list)  # constructor arguments per init index (0: base)
    sets: list[dict] = field(default_factory=list)
    inputs: dict = field(default_factory=dict)  # in memory only: handed out one set at a time
    expected: dict = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    shrunk: bool = False  # the base sizes are below the problem's own (the element cap)
    seconds: float = 0.0  # the reference process's wall time (once per problem per batch)


# The C++ profiler the audit runs logs each start/stop on stderr; those lines never explain a failure.
_PROFILER_LOG_PREFIXES = ("USDT:", "STAGE:")


def _tail_line(text: str) -> str:
    """The last non-empty line of a worker's stderr that is not the profiler's own log, redacted
    (the candidate wrote it)."""
    lines = [line.strip() for line in text.strip().splitlines()
             if line.strip() and not line.startswith(_PROFILER_LOG_PREFIXES)]
    return redact_line(lines[-1]) if lines else ""


def fail(result: VerifyResult, stage: str, category: str, detail=None) -> None:
    """Record the first failure: ``<stage>: <category>[: <redacted detail>]``."""
    if result.error is None:
        result.error = category_error(stage, category, detail)
        result.error_category = category


def _exception_category(message) -> str:
    text = str(message)
    return "memory_limit" if any(word in text for word in _MEMORY_ERRORS) else "exception"


def _status_failure(result: VerifyResult, label: str, status: dict) -> None:
    """A worker's failed status: a file the parent wrote was altered (the sandbox failed, never
    the candidate's doing), the audit's verdict (its flags are already in ``result``), or the
    candidate's exception."""
    if status.get("sandbox_error"):
        fail(result, label, "sandbox", status.get("error"))
    elif is_cheating(result.flags):
        fail(result, label, "audit", status.get("error"))
    else:
        fail(result, label, _exception_category(status.get("error")), status.get("error"))


class ProblemPreparer:
    """Builds each problem once (thread-safe); failures are verdicts on the problem, not crashes."""

    def __init__(self, config, device: str, work_root: str, pool):
        self.config, self.device, self.work_root, self.pool = config, device, work_root, pool

    def prepare(self, problem_code: str) -> PreparedProblem:
        job_dir = tempfile.mkdtemp(prefix="problem-", dir=self.work_root)
        with open(os.path.join(job_dir, "problem.py"), "w") as fh:
            fh.write(problem_code)
        cfg = self.config
        cap = cfg.cpu_max_input_numel if self.device == "cpu" else cfg.cuda_max_input_numel
        job = {
            "device": self.device, "seed": cfg.seed, "max_input_numel": cap,
            "tiny_first": cfg.enable_staged_eval and cfg.staged_tiny_batch_first,
            "multi_input": cfg.enable_multi_input, "num_tests": cfg.multi_input_num_tests,
            "shape_variations": cfg.multi_input_shape_variations,
            "value_variations": cfg.multi_input_value_variations, "threads": 1,
        }
        with open(os.path.join(job_dir, "job.json"), "w") as fh:
            json.dump(job, fh)
        gpu = self.pool.next_gpu()
        started = time.monotonic()
        with self.pool.gate(gpu).shared():  # never while a candidate is timed on this GPU
            proc = SandboxedProcess(
                [sys.executable, "-m", "extensions.verify.reference_worker", job_dir], job_dir,
                device=self.device, gpu_index=gpu, isolation="process",
                max_output_bytes=cfg.max_output_bytes,
            )
            proc.send_line(json.dumps(draw_secret()))
            # The reference runs several input sets and variations: a few timeouts' worth.
            outcome = proc.finish(time.monotonic() + 3 * cfg.timeout_s)
        seconds = time.monotonic() - started
        prepared_path = os.path.join(job_dir, "prepared.json")
        if outcome.timed_out:
            return PreparedProblem(False, f"reference timed out after {3 * cfg.timeout_s:.0f}s")
        if outcome.returncode != 0 or not os.path.exists(prepared_path):
            return PreparedProblem(False, _tail_line(outcome.stderr) or f"reference exited {outcome.returncode}")
        with open(prepared_path) as fh:
            data = json.load(fh)
        prepared = PreparedProblem(
            True, directory=job_dir, source=data["problem_source"], init=data["init"],
            inits=data.get("inits") or [data["init"]], sets=data["sets"],
            inputs=_private_copy(load_tensors(os.path.join(job_dir, "inputs.safetensors"))),
            expected=_private_copy(load_tensors(os.path.join(job_dir, "expected.safetensors"))),
            skipped=data["skipped"], notes=data["notes"], shrunk=bool(data.get("shrunk")), seconds=seconds,
        )
        # Inputs and expected outputs live in the parent's memory only.
        shutil.rmtree(job_dir, ignore_errors=True)
        return prepared


def _memory_limit_mb(config, prepared: PreparedProblem) -> int:
    """The candidate's cap: ``memory_limit_mb`` plus twice the problem's own tensors (the worker
    holds the inputs and copies of its outputs on the host), so a large problem is not refused."""
    base = int(getattr(config, "memory_limit_mb", 0))
    if base <= 0:
        return 0
    return base + ((2 * (_bytes_of(prepared.inputs) + _bytes_of(prepared.expected))) >> 20)


def _private_copy(tensors: dict) -> dict:
    """Tensors in this process's own memory. safetensors may map the file instead, and a mapped
    page still follows the file until it is written: a process that rewrote the file would then
    change the parent's reference copy."""
    return {name: tensor.clone() for name, tensor in tensors.items()}


def _read_status(path: str) -> dict:
    if os.path.getsize(path) > _MAX_STATUS_BYTES:
        raise TensorIOError("worker status file too large")
    with open(path) as fh:
        data = json.load(fh)
    if not isinstance(data, dict):
        raise TensorIOError("worker status is not an object")
    return data


def _bytes_of(tensors: dict) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


_KNOWN_FLAGS = CHEATING_FLAGS | ADVISORY_FLAGS


def _add_flags(result: VerifyResult, flags) -> None:
    """Flags from a worker's status: only names the verifier knows pass (a status file is written
    in the candidate's process, so an unknown string could carry anything out)."""
    for flag in flags if isinstance(flags, list) else []:
        flag = flag if isinstance(flag, str) and flag in _KNOWN_FLAGS else "unrecognised_flag"
        if flag not in result.flags:
            result.flags.append(flag)


class _Run:
    """One candidate's worker process and the bookkeeping of its verdict."""

    def __init__(self, code: str, prepared: PreparedProblem, config, device: str, gpu: Optional[int],
                 proc: SandboxedProcess, result: VerifyResult, timing: bool):
        self.prepared, self.config, self.device, self.gpu = prepared, config, device, gpu
        self.result, self.proc = result, proc
        self.worker_phases: dict[str, float] = {}
        sandbox_dir = proc.sandbox_dir
        # Under process isolation other processes of this user could rewrite what is written here:
        # every file is hashed from the bytes written, the hashes go on the worker's private control
        # channel, and the worker uses only bytes it checked against them.
        candidate_sha = write_private(os.path.join(sandbox_dir, "candidate.py"), code.encode())
        if timing:
            problem_sha = write_private(os.path.join(sandbox_dir, "problem.py"), prepared.source.encode())
            timing = {"problem_file": "problem.py", "problem_sha256": problem_sha, "config": _plain_config(config)}
        else:
            timing = None
        init_tensors: dict[str, Any] = {}
        inits = [pack(unpack(spec, prepared.inputs), f"init{i}", init_tensors)
                 for i, spec in enumerate(prepared.inits)]
        init_sha = write_private(os.path.join(sandbox_dir, "init.safetensors"), tensor_bytes(init_tensors))
        job = {
            "device": device, "seed": config.seed, "inits": inits, "init_file": "init.safetensors",
            "sets": [self._set_job(s) for s in prepared.sets],
            "allow_library_gemm": config.allow_library_gemm, "timing": timing,
            "memory_limit_mb": _memory_limit_mb(config, prepared),
        }
        proc.memory_limit_kb = job["memory_limit_mb"] * 1024
        job_sha = write_private(os.path.join(sandbox_dir, "job.json.tmp"), json.dumps(job).encode())
        os.replace(os.path.join(sandbox_dir, "job.json.tmp"), os.path.join(sandbox_dir, "job.json"))
        proc.send_line(f"go {job_sha} {init_sha} {candidate_sha}")

    def _set_job(self, set_info: dict) -> dict:
        """What the worker learns of a set before its run: no values. On CUDA the base set runs
        twice (a kernel reading uninitialised memory gives two answers); on CPU the interpreter
        runs the programs of every set past the base in a shuffled order, so a kernel that relies
        on program order (a cross-program race) gives another answer."""
        kind = set_info["kind"]
        return {
            "name": set_info["name"], "timing": set_info["timing"], "init": int(set_info.get("init", 0)),
            "repeat": self.device != "cpu" and kind == "base",
            "shuffle_programs": self.device == "cpu" and kind not in ("tiny", "base"),
        }

    def hand_over_inputs(self, stem: str, values_specs: list, **fields) -> str:
        """Write the values of ``values_specs`` into the sandbox as ``stem``.safetensors plus
        ``stem``.json (their structure and ``fields``; written last, atomically). Returns the
        hashes of both ("<tensors> <json>"), for the command that announces them."""
        tensors: dict[str, Any] = {}
        packed = [pack(unpack(spec, self.prepared.inputs), f"in{i}", tensors)
                  for i, spec in enumerate(values_specs)]
        tensors_sha = write_private(self.proc.path(stem + ".safetensors"), tensor_bytes(tensors))
        tmp = self.proc.path(stem + ".json.tmp")
        json_sha = write_private(tmp, json.dumps({"values": packed, **fields}).encode())
        os.replace(tmp, self.proc.path(stem + ".json"))
        return f"{tensors_sha} {json_sha}"

    def wait(self, name: str, deadline: float, phase: str) -> Optional[dict]:
        """The worker's status file ``name``, or None with ``result.error`` saying why not."""
        if not self.proc.wait_for_file(name, deadline):
            if self.proc.memory_exceeded:
                fail(self.result, phase, "memory_limit",
                     f"more than {self.proc.memory_limit_kb >> 10} MB of host memory; killed")
                self.result.details["memory_exceeded"] = True
            elif self.proc.timed_out:
                fail(self.result, phase, "timeout", f"after {self.config.timeout_s:g}s")
                self.result.details["timed_out"] = True
            else:
                code = self.proc.poll()
                outcome = self.proc.finish(time.monotonic() + 5)
                last = _tail_line(outcome.stderr)
                fail(self.result, phase, "crashed", f"exit status {code}" + (f" ({last})" if last else ""))
            return None
        try:
            status = _read_status(self.proc.path(name))
        except (OSError, ValueError) as exc:
            fail(self.result, phase, "bad_output", f"unreadable worker status ({type(exc).__name__})")
            return None
        self.worker_phases = sanitize_phases(status.get("phase_s")) or self.worker_phases
        return status

    def judge_sets(self, deadline: float) -> bool:
        """Run every input set; True when all passed every check."""
        prepared, result, cfg = self.prepared, self.result, self.config
        staged = cfg.enable_staged_eval
        all_ok = True
        for index, set_info in enumerate(prepared.sets):
            phase = "tiny" if set_info["kind"] == "tiny" else "full"
            if set_info["kind"] == "wide":
                deadline = self._wide_set_deadline(deadline)
            hashes = self.hand_over_inputs(f"set_{index}.in", [set_info["inputs"]])
            self.proc.send_line(f"run {hashes}")
            status = self.wait(f"set_{index}.json", deadline, phase)
            if status is None:
                return False
            ok = self._check_set(index, set_info, status, phase)
            if not ok:
                all_ok = False
                if staged or is_cheating(result.flags) or result.error_category in ("timeout", "memory_limit"):
                    return False
            elif phase == "tiny" and all_ok:
                result.stage = "tiny"
        if all_ok:
            result.stage = "full"
            self._check_size_coverage()
        return all_ok

    def _wide_set_deadline(self, deadline: float) -> float:
        """On CPU the set above the cap gets a time budget of its own: were it skipped when the
        time left looked short, a candidate that handles only the first cap-many elements would
        pick its own verdict by being slow on the smaller sets."""
        if self.device != "cpu":
            return deadline
        return max(deadline, time.monotonic() + self.config.timeout_s)

    def _note_reduced_size(self, why: str) -> None:
        _add_flags(self.result, ["reduced_size"])
        self.result.details["reduced_size"] = why

    def _check_size_coverage(self) -> None:
        """On CPU the base sizes are shrunk to the cap: unless a set above the cap ran, the verdict
        holds at reduced size only, and the result says so."""
        if self.device != "cpu" or not self.prepared.shrunk or "reduced_size" in self.result.flags:
            return
        ran = set(self.result.details.get("sets_run", []))
        if not any(s.get("above_cap") for s in self.prepared.sets if s["name"] in ran):
            self._note_reduced_size("no input set above the CPU element cap could be built")

    def _check_set(self, index: int, set_info: dict, status: dict, phase: str) -> bool:
        result, cfg = self.result, self.config
        _add_flags(result, status.get("flags"))
        calls = status.get("library_calls")
        for call in calls if isinstance(calls, list) else []:
            call = safe_name(call)
            if call not in result.allowed_library_calls:
                result.allowed_library_calls.append(call)
        label = phase if set_info["name"] == phase else f"{phase} ({set_info['name']})"
        if not status.get("ok"):
            _status_failure(result, label, status)
            return False
        if is_cheating(result.flags):
            fail(result, label, "audit", _audit_summary(result.flags, status))
            return False
        expected_tensors_bytes = _bytes_of(self.prepared.expected) + _bytes_of(self.prepared.inputs)
        try:
            tensors = load_tensors(self.proc.path(f"set_{index}.safetensors"),
                                   max_bytes=4 * expected_tensors_bytes + (1 << 20))
            output = unpack(status["output"], tensors)
            inputs_after = unpack(status["inputs_after"], tensors)
        except (TensorIOError, KeyError, OSError) as exc:
            fail(result, label, "bad_output", f"unreadable output ({type(exc).__name__})")
            return False
        inputs_before = unpack(set_info["inputs"], self.prepared.inputs)
        if not inputs_unchanged(inputs_after, inputs_before):
            _add_flags(result, ["mutated_inputs"])
            fail(result, label, "mutated_inputs", "forward modified its inputs")
            return False
        expected = unpack(set_info["expected"], self.prepared.expected)
        mismatch = compare_outputs(output, expected, cfg, atol_scale=set_info.get("atol_scale", 1.0))
        if mismatch is not None:
            fail(result, label, "mismatch", mismatch.message)
            result.details.setdefault("mismatch", mismatch.reason)
            return False
        if "output_repeat" in status:
            try:
                again = unpack(status["output_repeat"], tensors)
            except (TensorIOError, KeyError) as exc:
                fail(result, label, "bad_output", f"unreadable second output ({type(exc).__name__})")
                return False
            mismatch = compare_outputs(again, expected, cfg, atol_scale=set_info.get("atol_scale", 1.0))
            if mismatch is not None:
                fail(result, label, "mismatch", f"a second run on the same inputs differs ({mismatch.message}); "
                     "uninitialised memory or a race?")
                result.details.setdefault("mismatch", "second_run")
                return False
        launches = status.get("launches")
        result.details.setdefault("launches", []).append(launches if isinstance(launches, int) else None)
        result.details.setdefault("sets_run", []).append(set_info["name"])
        return True

    def _hand_over_timing_inputs(self) -> str:
        indices = [i for i, s in enumerate(self.prepared.sets) if s["timing"]]
        return self.hand_over_inputs("timing.in", [self.prepared.sets[i]["inputs"] for i in indices],
                                     sets=indices)

    def time_candidate(self) -> None:
        result, cfg = self.result, self.config
        try:
            from extensions.timing import gpu_lease
        except Exception as exc:  # noqa: BLE001 - the timer is optional
            fail(result, "timing", "timing", f"timer unavailable: {type(exc).__name__}")
            self.proc.send_line("stop")
            return
        try:
            # The lease keeps other verifier processes on this machine off the GPU while timing.
            with gpu_lease(self.gpu if self.gpu is not None else 0, timeout_s=cfg.timeout_s):
                hashes = self._hand_over_timing_inputs()
                self.proc.send_line(f"time {hashes}")
                status = self.wait("timing.json", time.monotonic() + cfg.timeout_s, "timing")
        except TimeoutError as exc:
            fail(result, "timing", "timeout", str(exc))
            return
        if status is None:
            return
        if status.get("sandbox_error"):
            fail(result, "timing", "sandbox", status.get("error"))
            return
        if status.get("error"):
            fail(result, "timing", "timing", status["error"])
            return
        report = sanitize_data(status.get("report")) or {}
        result.timing = report
        _add_flags(result, report.get("flags"))
        speedup = report.get("speedup")
        if "last_output" in status:
            set_index = int(status.get("last_set", -1))
            try:
                tensors = load_tensors(self.proc.path("timing.safetensors"),
                                       max_bytes=4 * _bytes_of(self.prepared.expected) + (1 << 20))
                last = unpack(status["last_output"], tensors)
                timed_set = self.prepared.sets[set_index]
                expected = unpack(timed_set["expected"], self.prepared.expected)
                if compare_outputs(last, expected, cfg, atol_scale=timed_set.get("atol_scale", 1.0)) is not None:
                    _add_flags(result, ["memoized_output"])
                    fail(result, "timing", "mismatch", "the last timed call's output does not match the reference")
            except (TensorIOError, KeyError, IndexError, OSError, ValueError) as exc:
                _add_flags(result, ["memoized_output"])
                fail(result, "timing", "bad_output", f"last output unreadable ({type(exc).__name__})")
        if isinstance(speedup, (int, float)) and speedup == speedup and speedup > 0:
            result.speedup = float(speedup)
            if result.speedup > cfg.speedup_review_bound:
                _add_flags(result, ["speedup_review"])
            if not is_cheating(result.flags) and result.stage == "full":
                result.stage = "timing"


def _audit_summary(flags: list[str], status: dict) -> str:
    cheating = [f for f in flags if f in CHEATING_FLAGS]
    ops = status.get("disallowed_ops")
    ops = ops if isinstance(ops, list) else []
    text = ", ".join(cheating)
    if ops:
        text += f" (ops: {', '.join(safe_name(o) for o in ops[:4])})"
    return text


def _plain_config(config) -> dict:
    import dataclasses

    return dataclasses.asdict(config)


def _judge_correctness(run: _Run, result: VerifyResult, deadline: float) -> bool:
    compiled = run.wait("compile.json", deadline, "compile")
    if compiled is None:
        return False
    _add_flags(result, compiled.get("flags"))
    if not compiled.get("ok"):
        _status_failure(result, "compile", compiled)
        return False
    result.stage = "compile"
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
    result.details["input_sets"] = [s["name"] for s in prepared.sets]
    own_launcher = launcher is None
    if own_launcher:
        launcher = WorkerLauncher(config, device, isolation, work_root, total=1, prespawn=False)
    clock = PhaseClock()
    gpu = pool.acquire()
    run = None
    proc = None
    gate = pool.gate(gpu)
    # Without bubblewrap a candidate could read this process's environment through /proc.
    hidden = verifier_undumpable() if isolation == "process" else contextlib.nullcontext()
    hidden.__enter__()
    try:
        with gate.shared():  # other correctness runs may share this GPU; timing may not
            timing = (device == "cuda" and config.enable_calibrated_timing) or timing_on_cpu
            with clock.phase("take_worker"):
                proc = launcher.take(gpu)
            with clock.phase("hand_over_job"):
                run = _Run(code, prepared, config, device, gpu, proc, result, timing)
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
    if launcher.triton_seed is not None:
        result.details["triton_cache_seed"] = launcher.triton_seed.note
    result.correct = result.stage in ("full", "timing") and not is_cheating(result.flags)
    result.reward = compute_reward(result.stage, result.flags, result.speedup, config)
    return result
