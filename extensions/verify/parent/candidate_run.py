"""One candidate's run in its sandboxed worker, after the job is handed over.

``CandidateRun`` hands the worker one input set at a time, each written into its directory just
before its ``run`` (so nothing of the inputs exists while the candidate is imported and built); it
compares every output here in the parent (shape, dtype, tolerance, relative error, NaN/Inf, inputs
unchanged) and stops at the first failure; on CUDA, after every set passed, it asks the worker to
time the candidate.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import threading
import time
import weakref
from concurrent.futures import Future
from typing import Any, Optional

from extensions.timing.schedule import LOCALISED_MAX, WHOLE_PER_SET
from extensions.timing.tensors import flatten_tensors, with_elements

from ..common.compare import compare_outputs, inputs_unchanged, localised_bound
from ..common.judged_context import describe as describe_context
from ..common.phases import PhaseClock, sanitize_phases
from ..common.precision import TF32_HINT, dots_at_tf32
from ..common.tensor_io import (TensorIOError, load_tensors, pack, stored_reaches, tensor_bytes, tensor_parts,
                               unpack)
from ..result import VerifyResult
from ..reward import is_cheating
from .launcher import write_private
from .redact import safe_name, sanitize_data
from .reference_data import PreparedProblem
from .sandbox import SandboxedProcess
from .verdict import add_flags, audit_summary, fail, read_status, status_failure, tail_line


def _memory_limit_mb(config, prepared: PreparedProblem, timing: bool) -> int:
    """The candidate's cap: ``memory_limit_mb`` plus what the worker itself holds on the host for
    this problem: one set at a time, its inputs and outputs three times over (the handed file, the
    inputs read back after forward, the outputs and, on CUDA, the second run's), the timing sets'
    inputs and the timed outputs the timer may keep for the parent (``WHOLE_PER_SET`` per set),
    and the reference's and the candidate's parameters (built on the host, then moved).
    Not every set at once: a candidate allocating 6 GB on the host passed on CUDA when the cap
    grew with the whole batch of sets."""
    base = int(getattr(config, "memory_limit_mb", 0))
    if base <= 0:
        return 0
    largest = max((_spec_bytes(s["inputs"], prepared.inputs) + _spec_bytes(s["expected"], prepared.expected)
                   for s in prepared.sets), default=0)
    timed = 0
    if timing:
        indices, specs = _timing_inputs(prepared)
        timed = (sum(_spec_bytes(spec, prepared.inputs) for spec in specs)
                 + WHOLE_PER_SET * sum(_spec_bytes(prepared.sets[i]["expected"], prepared.expected) for i in indices))
    return base + ((3 * largest + timed + 2 * prepared.model_bytes) >> 20)


def _spec_bytes(spec: Any, tensors: dict) -> int:
    return sum(t.numel() * t.element_size() for t in flatten_tensors(unpack(spec, tensors, layouts=True)))


def _bytes_of(tensors: dict) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def _slack(set_info: dict, expected: dict) -> Any:
    """The set's per-element rounding slack (``reference_worker``), or None where it has none."""
    return unpack(set_info["slack"], expected) if "slack" in set_info else None


def _toward(set_info: dict, expected: dict) -> Any:
    """The set's per-element step to the exact value (``tolerances.toward_exact``), or None."""
    return unpack(set_info["toward"], expected) if "toward" in set_info else None


def _ambiguous(set_info: dict, expected: dict) -> Any:
    """The set's ambiguous output elements and the values the reference gave there
    (``reference.ambiguity``), or None where it has none."""
    return unpack(set_info["ambiguous"], expected) if "ambiguous" in set_info else None


class CandidateRun:
    """One candidate's worker process and the bookkeeping of its verdict."""

    def __init__(self, code: str, prepared: PreparedProblem, config, device: str, gpu: Optional[int],
                 proc: SandboxedProcess, result: VerifyResult, timing: bool,
                 clock: Optional[PhaseClock] = None, gate=None):
        self.prepared, self.config, self.device, self.gpu = prepared, config, device, gpu
        self.code = code
        self.gate = gate  # the GPU's readers/writer gate (``device_pool.GpuGate``); None: no other user
        self.result, self.proc = result, proc
        self.clock = clock or PhaseClock()  # the parent's side of each set, for the phase table
        self.worker_phases: dict[str, float] = {}
        self.sets = run_order(prepared.sets)
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
        inits = [pack(unpack(spec, prepared.inputs), f"init{i}", init_tensors, copy=False)
                 for i, spec in enumerate(prepared.inits)]
        init_sha = write_private(os.path.join(sandbox_dir, "init.safetensors"), tensor_bytes(init_tensors))
        job = {
            "device": device, "seed": config.seed, "inits": inits, "init_file": "init.safetensors",
            "sets": [self._set_job(s) for s in self.sets],
            "allow_library_gemm": config.allow_library_gemm, "timing": timing,
            "memory_limit_mb": _memory_limit_mb(config, prepared, timing is not None),
            "param_noise": {"seed": prepared.param_seed, "keys": prepared.param_keys},
        }
        proc.memory_limit_kb = job["memory_limit_mb"] * 1024
        job_sha = write_private(os.path.join(sandbox_dir, "job.json.tmp"), json.dumps(job).encode())
        os.replace(os.path.join(sandbox_dir, "job.json.tmp"), os.path.join(sandbox_dir, "job.json"))
        proc.send_line(f"go {job_sha} {init_sha} {candidate_sha}")

    def _set_job(self, set_info: dict) -> dict:
        """What the worker learns of a set before its run: no values. On CUDA the base set runs
        twice (a kernel reading uninitialised memory gives two answers); on CPU the interpreter
        runs the programs of every set past the base in a shuffled order, so a kernel that relies
        on program order (a cross-program race) gives another answer. ``context``: the module mode
        and grad mode the set is called in (``judged_context``), the reference's for that set."""
        kind = set_info["kind"]
        return {
            "name": set_info["name"], "timing": set_info["timing"], "init": int(set_info.get("init", 0)),
            "repeat": self.device != "cpu" and kind == "base",
            "shuffle_programs": self.device == "cpu" and kind not in ("tiny", "base"),
            "context": set_info.get("context"),
        }

    def gpu_shared(self):
        """Held while the worker uses the GPU for correctness (shared with other such runs)."""
        return self.gate.shared() if self.gate is not None else contextlib.nullcontext()

    def hand_over_inputs(self, stem: str, values_specs: list, **fields) -> str:
        """Write the values of ``values_specs`` into the sandbox as ``stem``.safetensors plus
        ``stem``.json (their structure and ``fields``; written last, atomically). Returns the
        hashes of both ("<tensors> <json>"), for the command that announces them."""
        parts, tensors_sha, packed = _input_payload(self.prepared, values_specs)
        with open(self.proc.path(stem + ".safetensors"), "wb") as fh:
            for part in parts:
                fh.write(part)
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
                starved = f" (and {self.proc.starved_s:.0f}s waiting for a CPU)" if self.proc.starved_s >= 1 else ""
                fail(self.result, phase, "timeout", f"after {self.config.timeout_s:g}s{starved}")
                self.result.details["timed_out"] = True
                self.result.details["starved_s"] = round(self.proc.starved_s, 1)
            elif self.proc.stopped_server:
                self.proc.finish(time.monotonic() + 5)
                fail(self.result, phase, "crashed", "stopped the process it was forked from")
            else:
                code = self.proc.poll()
                outcome = self.proc.finish(time.monotonic() + 5)
                last = tail_line(outcome.stderr)
                fail(self.result, phase, "crashed", f"exit status {code}" + (f" ({last})" if last else ""))
            return None
        try:
            status = read_status(self.proc.path(name))
        except (OSError, ValueError) as exc:
            fail(self.result, phase, "bad_output", f"unreadable worker status ({type(exc).__name__})")
            return None
        self.worker_phases = sanitize_phases(status.get("phase_s")) or self.worker_phases
        return status

    def judge_sets(self, deadline: float) -> bool:
        """Run every input set; True when all passed every check."""
        result, cfg = self.result, self.config
        staged = cfg.enable_staged_eval
        all_ok = True
        for index, set_info in enumerate(self.sets):
            phase = "tiny" if set_info["kind"] == "tiny" else "full"
            if set_info["kind"] == "wide":
                deadline = self._wide_set_deadline(deadline)
            with self.clock.phase("sets.hand_over_inputs"):
                hashes = self.hand_over_inputs(f"set_{index}.in", [set_info["inputs"]])
            with self.clock.phase("sets.wait_worker"), self.gpu_shared():
                self.proc.send_line(f"run {hashes}")
                status = self.wait(f"set_{index}.json", deadline, phase)
            if status is None:
                return False
            with self.clock.phase("sets.check_output"):
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

    def _note_gpu_only(self, status: dict) -> None:
        """CPU: the interpreter refuses some constructs a GPU compiles (``tl.inline_asm_elementwise``:
        PTX): the failure is the interpreter's, and the result says that only a GPU can judge it."""
        if self.device == "cpu" and "not supported in interpreter mode" in str(status.get("error") or ""):
            add_flags(self.result, ["needs_gpu"])
            self.result.details["needs_gpu"] = "the Triton interpreter refused a construct a GPU compiles"

    def _note_reduced_size(self, why: str) -> None:
        add_flags(self.result, ["reduced_size"])
        self.result.details["reduced_size"] = why

    def _check_size_coverage(self) -> None:
        """On CPU the base sizes are shrunk to the cap: unless a set at the problem's own size ran,
        the verdict holds at reduced size only, and the result says so. A set above the cap is
        not enough: a kernel that writes only the first 2^18 elements is right on every set below
        that, and no CPU set of a KernelBench problem comes near its billion elements."""
        if self.device != "cpu" or not self.prepared.shrunk or "reduced_size" in self.result.flags:
            return
        names_run = set(self.result.details.get("sets_run", []))
        ran = [s for s in self.prepared.sets if s["name"] in names_run]
        if not any(s.get("above_cap") for s in ran):
            self._note_reduced_size("no input set above the CPU element cap could be built")
            return
        largest, own = max(int(s.get("numel", 0)) for s in ran), self.prepared.problem_numel
        if largest < own:
            self._note_reduced_size(f"the largest set run has {largest} input elements, the problem {own}: "
                                    "a kernel wrong only past that size is not seen on CPU")

    def _localised_mismatches_explained(self, localised: list, tensors: dict) -> bool:
        """Whether each timed call the worker found off the reference at a few elements only
        (``timing``'s localised mismatches) is right by the set's verified answer: its elements
        there, put into the expected output, pass the full comparison with the set's ambiguous
        elements, where any value the reference itself gave is accepted. Elsewhere it agreed with
        the reference run beside it."""
        if not isinstance(localised, list) or len(localised) > LOCALISED_MAX:
            return False
        expected_tensors = self.prepared.expected
        for entry in localised:
            try:
                timed_set = self.prepared.sets[int(entry["set"])]
                expected = unpack(timed_set["expected"], expected_tensors)
                rebuilt = _with_elements(expected, unpack(entry["places"], tensors))
            except (TensorIOError, KeyError, IndexError, TypeError, ValueError):
                return False
            if compare_outputs(rebuilt, expected, self.config, atol_scale=timed_set.get("atol_scale", 1.0),
                               slack=_slack(timed_set, expected_tensors), toward=_toward(timed_set, expected_tensors),
                               ambiguous=_ambiguous(timed_set, expected_tensors)) is not None:
                return False
        return True

    def _whole_outputs_right(self, whole: list, tensors: dict) -> bool:
        """Whether each timed call's output that the worker found off the reference run beside it
        beyond a few elements is right by the set's verified answer, judged as the set was."""
        if not isinstance(whole, list) or len(whole) > WHOLE_PER_SET * len(self.prepared.sets):
            return False
        for entry in whole:
            try:
                timed_set = self.prepared.sets[int(entry["set"])]
                expected = unpack(timed_set["expected"], self.prepared.expected)
                output = unpack(entry["output"], tensors)
            except (TensorIOError, KeyError, IndexError, TypeError, ValueError):
                return False
            if compare_outputs(output, expected, self.config, atol_scale=timed_set.get("atol_scale", 1.0),
                               slack=_slack(timed_set, self.prepared.expected),
                               toward=_toward(timed_set, self.prepared.expected),
                               ambiguous=_ambiguous(timed_set, self.prepared.expected)) is not None:
                return False
        return True

    def _reaches_unchanged(self, set_info: dict, status: dict, tensors: dict) -> bool:
        """Whether every sliced or expanded input's stretch of storage, the memory between its
        elements included, is bitwise as it was handed: a write there is a write into the
        caller's tensor (the rest of a matrix a slice was cut from, another input sharing it)."""
        after = status.get("inputs_reach_after")
        if not isinstance(after, dict):
            return False
        try:
            for position, key in enumerate(stored_reaches(set_info["inputs"])):
                if key is None:
                    continue
                if str(position) not in after:
                    return False
                if not inputs_unchanged(unpack(after[str(position)], tensors), self.prepared.inputs[key]):
                    return False
        except (TensorIOError, KeyError):
            return False
        return True

    def _check_set(self, index: int, set_info: dict, status: dict, phase: str) -> bool:
        result, cfg = self.result, self.config
        add_flags(result, status.get("flags"))
        calls = status.get("library_calls")
        for call in calls if isinstance(calls, list) else []:
            call = safe_name(call)
            if call not in result.allowed_library_calls:
                result.allowed_library_calls.append(call)
        named = [part for part in (set_info["name"] if set_info["name"] != phase else "",
                                   describe_context(set_info.get("context"))) if part]
        label = f"{phase} ({', '.join(named)})" if named else phase
        if not status.get("ok"):
            status_failure(result, label, status)
            self._note_gpu_only(status)
            return False
        if is_cheating(result.flags):
            fail(result, label, "audit", audit_summary(result.flags, status))
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
        inputs_before = unpack(set_info["inputs"], self.prepared.inputs, layouts=True)
        if (not inputs_unchanged(inputs_after, inputs_before) or not self._reaches_unchanged(set_info, status, tensors)
                or status.get("wrote_beside_inputs")):
            add_flags(result, ["mutated_inputs"])
            fail(result, label, "mutated_inputs", "forward modified its inputs")
            return False
        expected = unpack(set_info["expected"], self.prepared.expected)
        slack = _slack(set_info, self.prepared.expected)
        toward = _toward(set_info, self.prepared.expected)
        ambiguous = _ambiguous(set_info, self.prepared.expected)
        mismatch = compare_outputs(output, expected, cfg, atol_scale=set_info.get("atol_scale", 1.0), slack=slack,
                                   ambiguous=ambiguous, toward=toward)
        if mismatch is not None:
            tf32 = mismatch.reason == "values" and self._dots_at_tf32(expected)
            fail(result, label, "mismatch", (TF32_HINT if tf32 else "") + mismatch.message)
            result.details.setdefault("mismatch", mismatch.reason)
            return False
        if "output_repeat" in status:
            try:
                again = unpack(status["output_repeat"], tensors)
            except (TensorIOError, KeyError) as exc:
                fail(result, label, "bad_output", f"unreadable second output ({type(exc).__name__})")
                return False
            mismatch = compare_outputs(again, expected, cfg, atol_scale=set_info.get("atol_scale", 1.0), slack=slack,
                                       ambiguous=ambiguous, toward=toward)
            if mismatch is not None:
                fail(result, label, "mismatch", f"a second run on the same inputs differs ({mismatch.message}); "
                     "uninitialised memory or a race?")
                result.details.setdefault("mismatch", "second_run")
                return False
        launches = status.get("launches")
        result.details.setdefault("launches", []).append(launches if isinstance(launches, int) else None)
        result.details.setdefault("sets_run", []).append(set_info["name"])
        return True

    def _dots_at_tf32(self, expected: Any) -> bool:
        """An fp32 output, and the candidate's ``tl.dot`` at its default TF32 (``precision``)."""
        import torch

        return (any(t.dtype == torch.float32 for t in flatten_tensors(expected))
                and dots_at_tf32(self.code))

    def _hand_over_timing_inputs(self) -> str:
        indices, specs = _timing_inputs(self.prepared)
        return self.hand_over_inputs("timing.in", specs, sets=indices)

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
        add_flags(result, report.get("flags"))
        speedup = report.get("speedup")
        localised = status.get("localised") or []
        whole = status.get("whole") or []
        tensors = None
        if "last_output" in status or localised or whole:
            try:
                tensors = load_tensors(self.proc.path("timing.safetensors"),
                                       max_bytes=4 * _bytes_of(self.prepared.expected) + (1 << 20))
            except (TensorIOError, OSError) as exc:
                add_flags(result, ["memoized_output"])
                fail(result, "timing", "bad_output", f"timed outputs unreadable ({type(exc).__name__})")
        if "last_output" in status and tensors is not None:
            set_index = int(status.get("last_set", -1))
            try:
                last = unpack(status["last_output"], tensors)
                timed_set = self.prepared.sets[set_index]
                expected = unpack(timed_set["expected"], self.prepared.expected)
                if compare_outputs(last, expected, cfg, atol_scale=timed_set.get("atol_scale", 1.0),
                                   slack=_slack(timed_set, self.prepared.expected),
                                   toward=_toward(timed_set, self.prepared.expected),
                                   ambiguous=_ambiguous(timed_set, self.prepared.expected)) is not None:
                    add_flags(result, ["memoized_output"])
                    fail(result, "timing", "mismatch", "the last timed call's output does not match the reference")
            except (TensorIOError, KeyError, IndexError, OSError, ValueError) as exc:
                add_flags(result, ["memoized_output"])
                fail(result, "timing", "bad_output", f"last output unreadable ({type(exc).__name__})")
        if ((localised and tensors is not None and not self._localised_mismatches_explained(localised, tensors))
                or (whole and tensors is not None and not self._whole_outputs_right(whole, tensors))):
            add_flags(result, ["output_mismatch_during_timing"])
            fail(result, "timing", "mismatch",
                 "a timed call's output differs from the reference where the reference is not in doubt")
        if isinstance(speedup, (int, float)) and speedup == speedup and speedup > 0:
            result.speedup = float(speedup)
            if result.speedup > cfg.speedup_review_bound:
                add_flags(result, ["speedup_review"])
            if not is_cheating(result.flags) and result.stage == "full":
                result.stage = "timing"


def _with_elements(expected: Any, places: Any) -> Any:
    """``expected`` with, per tensor, the elements at ``places``' flat indices set to its values
    (``timing.tensors.with_elements``), once the worker's places are checked to fit it; raises
    ValueError where they do not."""
    import torch

    outputs = flatten_tensors(expected)
    if not isinstance(places, (list, tuple)) or len(places) != len(outputs):
        raise ValueError("localised places do not match the output")
    for tensor, place in zip(outputs, places):
        if place is None:
            continue
        if not isinstance(place, (list, tuple)) or len(place) != 2:
            raise ValueError("malformed localised place")
        index, values = place
        if (index.dtype != torch.int64 or index.dim() != 1 or values.shape != index.shape
                or values.dtype != tensor.dtype or index.numel() > localised_bound(tensor.numel(), tensor.dtype)
                or (index.numel() and (int(index.min()) < 0 or int(index.max()) >= tensor.numel()))):
            raise ValueError("localised place out of bounds")
    return with_elements(expected, list(places))


# Every candidate of a problem gets the same input files: their bytes and SHA-256 are made once per
# batch, not once per candidate (hashing alone is about 0.1 s per 100 MB set). A payload is the
# safetensors header plus views of the parent's own copy of the inputs, which nothing writes to, so
# keeping it costs no memory; only a set that had to be serialized as a copy (a dtype the direct
# writer does not handle) counts against a budget, past which it is serialized per candidate.
# Nothing is written to a shared file: another process of the user could rewrite it, and honest
# siblings would be rejected.
_PAYLOAD_BUDGET_BYTES = 2 << 30
_payload_lock = threading.Lock()
_payload_bytes = [0]


def _input_payload(prepared: PreparedProblem, values_specs: list) -> tuple[list, str, list]:
    """The safetensors file of ``values_specs`` as a list of buffers, its SHA-256 and the packed
    structure. Made once per problem and key: a second asker waits for the first one's."""
    key = json.dumps(values_specs, sort_keys=True)
    with _payload_lock:
        pending = prepared.handover_cache.get(key)
        owner = pending is None
        if owner:
            pending = prepared.handover_cache[key] = Future()
    if not owner:
        return pending.result()
    try:
        payload = _build_payload(prepared, values_specs)
    except BaseException as exc:
        with _payload_lock:
            prepared.handover_cache.pop(key, None)
        pending.set_exception(exc)
        raise
    parts = payload[0]
    copied = len(parts[0]) if len(parts) == 1 else 0  # one part: serialized as a copy (``tensor_parts``)
    with _payload_lock:
        if _payload_bytes[0] + copied > _PAYLOAD_BUDGET_BYTES:
            prepared.handover_cache.pop(key, None)  # those waiting get it; later askers make their own
        elif copied:
            if not prepared.handover_copied:  # the budget is given back when the problem is freed
                weakref.finalize(prepared, _release_payloads, prepared.handover_copied)
            prepared.handover_copied.append(copied)
            _payload_bytes[0] += copied
    pending.set_result(payload)
    return payload


def _build_payload(prepared: PreparedProblem, values_specs: list) -> tuple[list, str, list]:
    tensors: dict[str, Any] = {}
    # Views of the parent's own copy: no second copy first.
    packed = [pack(unpack(spec, prepared.inputs, layouts=True), f"in{i}", tensors, copy=False, layouts=True)
              for i, spec in enumerate(values_specs)]
    parts = tensor_parts(tensors)
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part)
    return parts, digest.hexdigest(), packed


def run_order(sets: list[dict]) -> list[dict]:
    """The order one candidate meets the sets in: ``tiny`` and ``base`` first (staged evaluation
    stops early on them), ``wide`` last (on CPU it has a time budget of its own), the others
    shuffled per candidate from the OS's random source. In a fixed order a forward that counts its
    calls knows which set it is answering (the one with large outliers is the fifth) and can be
    exact there only."""
    first = [s for s in sets if s["kind"] in ("tiny", "base")]
    last = [s for s in sets if s["kind"] == "wide"]
    middle = [s for s in sets if s["kind"] not in ("tiny", "base", "wide")]
    secrets.SystemRandom().shuffle(middle)
    return first + middle + last


def _release_payloads(copied: list) -> None:
    with _payload_lock:
        _payload_bytes[0] -= sum(copied)


def _timing_inputs(prepared: PreparedProblem) -> tuple[list[int], list]:
    """The sets the timer rotates through: their indices and their inputs' specs."""
    indices = [i for i, s in enumerate(prepared.sets) if s["timing"]]
    return indices, [prepared.sets[i]["inputs"] for i in indices]


def stage_handover(prepared: PreparedProblem, timing: bool) -> None:
    """Make every payload of ``prepared`` in the order candidates ask for them (each set's inputs,
    then the timing sets'), ahead of the candidates: started when the problem's reference data is
    ready, so the first candidate does not make them itself while it waits for its worker."""
    try:
        for set_info in prepared.sets:
            _input_payload(prepared, [set_info["inputs"]])
        if timing:
            _input_payload(prepared, _timing_inputs(prepared)[1])
    except Exception:  # noqa: BLE001 - a candidate that asks again gets the error in its verdict
        pass


def _plain_config(config) -> dict:
    """The config's flat settings, all the timer reads (the reward table stays in the parent)."""
    import dataclasses

    return {key: value for key, value in dataclasses.asdict(config).items() if not isinstance(value, dict)}
