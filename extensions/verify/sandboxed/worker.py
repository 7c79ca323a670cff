"""Sandboxed candidate worker: import the candidate, run its forward on the given inputs, report.

    python -m extensions.verify.sandboxed.worker       (cwd: the sandbox directory)

Reads ``job.json`` and the init inputs, deletes both, and only then imports the candidate: the
candidate never sees the job, and no input exists yet while it is imported and built. It never
holds expected outputs: it writes the candidate's outputs (and the inputs as they were after the
call) as safetensors plus a JSON status, and the trusted parent compares. The parent drives it
through a private copy of stdin, one line per step, so evaluation stops at the first failure:

    parent: "go <job> <init> <candidate>" -> worker: reads job.json, init.safetensors, candidate.py
    worker: compile.json
    parent: writes set_<i>.in.*, "run <tensors> <json>" -> worker: set_<i>.safetensors + set_<i>.json
                                                                             (repeat per input set)
    parent: writes timing.in.*, "time <tensors> <json>" -> worker: timing.json (+ timing.safetensors)
    parent: "stop" -> worker exits

Each ``<...>`` is the SHA-256 of a file the parent wrote, from the bytes it wrote. The worker reads
each file once, checks it and uses only the checked bytes (the candidate is imported from them), so
a file another process rewrote meanwhile (possible under process isolation) is refused: a status
with ``sandbox_error``, a failure of the sandbox, never blamed on the candidate being judged.

The runtime audit (``audit.py``) and, on CPU, the interpreter's missing pieces
(``interpreter_compat.py``) are installed before the candidate is imported; importing and building
``ModelNew`` are audited too. After the model is built the RNG is reseeded from the OS, so forward
cannot replay the verifier's draws. Before every status file is written, the worker's own code is
checked against the snapshot taken before the candidate was imported (``integrity.py``).
"""
from __future__ import annotations

import contextlib
import importlib.machinery
import importlib.util
import json
import os
import re
import sys
import traceback
from typing import Any

from .handed_files import (CANDIDATE_FILE, AlteredFile, fill_gaps, gaps_intact, into_previous_tensors, read_checked,
                           read_job, take_handed)

_PATHS = re.compile(r"(?:/[\w.\-+@]+)+/")
# Every module of these packages that runs in the candidate's process is in the integrity snapshot.
_COVERED_PACKAGES = ("extensions.verify.sandboxed.", "extensions.verify.common.", "extensions.verify.static.")


def short_error(exc: BaseException, candidate_file: str = CANDIDATE_FILE) -> str:
    """``Type: message (candidate line N)``: one line, no traceback, no directories."""
    line = None
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, SyntaxError) and str(current.filename or "").endswith(candidate_file):
            line = current.lineno
        for frame, lineno in traceback.walk_tb(current.__traceback__):
            if frame.f_code.co_filename.endswith(candidate_file):
                line = lineno
        current = current.__cause__ or current.__context__
    text = str(exc).strip()
    if isinstance(exc, SyntaxError):
        text = exc.msg or text
    first = text.splitlines()[0] if text else ""
    first = _PATHS.sub("", first)[:200]
    message = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return message + (f" (candidate line {line})" if line else "")


def _write_json(name: str, data: dict) -> None:
    tmp = name + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(data, fh)
    os.replace(tmp, name)


def _storages(value: Any) -> set[int]:
    """Storage addresses of the tensors in ``value``, which holds the harness's plain aliases only
    (``plain_output``, ``module_tensors``): nothing of the candidate's is called here."""
    import torch

    from extensions.timing.tensors import flatten_tensors

    return {t.untyped_storage().data_ptr() for t in flatten_tensors(value)
            if isinstance(t, torch.Tensor) and t.numel() > 0}


class _VerifiedSource(importlib.machinery.SourceFileLoader):
    """Loads the candidate from bytes already checked against the parent's hash, so a file swapped
    on disk after the check is never what runs."""

    def __init__(self, fullname: str, path: str, source: bytes):
        super().__init__(fullname, path)
        self.source = source

    def get_data(self, path):
        return self.source if path == self.path else super().get_data(path)


def _load_spec(source: bytes):
    import linecache

    # Triton reads a kernel's source through linecache (inspect.getsource): give it the same bytes.
    text = source.decode("utf-8", "replace")
    linecache.cache[CANDIDATE_FILE] = (len(text), None, text.splitlines(True), CANDIDATE_FILE)
    loader = _VerifiedSource("candidate", CANDIDATE_FILE, source)
    return importlib.util.spec_from_file_location("candidate", CANDIDATE_FILE, loader=loader)


def import_candidate(source: bytes):
    """``ModelNew`` from the candidate's checked bytes, and the flags its class earns."""
    import torch

    spec = _load_spec(source)
    module = importlib.util.module_from_spec(spec)
    sys.modules["candidate"] = module
    spec.loader.exec_module(module)
    model_cls = getattr(module, "ModelNew", None)
    if model_cls is None:
        raise NameError("the candidate defines no class ModelNew")
    if not (isinstance(model_cls, type) and issubclass(model_cls, torch.nn.Module)):
        raise TypeError("ModelNew is not an nn.Module subclass")
    flags = []
    if any(cls.__name__ == "Model" or cls.__module__ == "problem" for cls in model_cls.__mro__[1:]):
        flags.append("inherits_reference")
    return model_cls, flags


def build_model(model_cls, init: list, seed: int, device: str):
    """``ModelNew(*init)`` right after the construction seed, as the reference was built; the RNG
    is then reseeded from the OS so that nothing after construction can replay a known draw."""
    import torch

    torch.manual_seed(seed)
    model = model_cls(*init)
    if device != "cpu":
        model = model.to(device)
    torch.manual_seed(int.from_bytes(os.urandom(8), "little"))
    return model


HELD_OUTPUT_BYTES = 256 * 2**20  # earlier outputs held to tell a reused buffer from a fresh one


class Models:
    """The candidate's models, one per constructor-argument set, each built (audited) when first
    needed."""

    def __init__(self, model_cls, inits: list, seed: int, device: str, audit, param_noise: dict):
        self.model_cls, self.inits, self.seed, self.device, self.audit = model_cls, inits, seed, device, audit
        self.param_noise = param_noise
        self.pairing: dict[str, str] = {}  # per tied key of the first model: how it was paired
        self._built: dict[int, Any] = {}
        # Earlier sets' outputs, held as a user holds results: their storage cannot be handed out
        # again by the allocator, so a later output in the same storage is a buffer the module
        # reuses, which overwrites what the caller still holds.
        self._held: dict[int, list] = {}
        self._held_bytes = 0

    def reuses_output(self, index: int, output) -> bool:
        """Whether ``output`` (a plain alias) lies in the storage of an earlier output of model
        ``index``; then hold it too, while the held outputs stay under HELD_OUTPUT_BYTES."""
        held = self._held.setdefault(index, [])
        reused = bool(_storages(output) & _storages(held))
        nbytes = _nbytes(output)
        if self._held_bytes + nbytes <= HELD_OUTPUT_BYTES:
            held.append(output)
            self._held_bytes += nbytes
        return reused

    def add_parameter_noise(self, model, index: int, reference: bool) -> None:
        """The noise the reference's constant-initialised parameters were given (param_noise.py),
        on ``model`` built from constructor-argument set ``index``."""
        from ..common.param_noise import apply_parameter_noise

        keys = self.param_noise.get("keys") or []
        apply_parameter_noise(model, int(self.param_noise.get("seed", 0)), keys[index] if index < len(keys) else [],
                              reference=reference, report=self.pairing if index == 0 else None)

    def get(self, index: int):
        """(model, construction flags); raises what the constructor raised."""
        if index in self._built:
            return self._built[index], []
        with self.audit.construction() as report:
            model = build_model(self.model_cls, self.inits[index], self.seed, self.device)
        self.add_parameter_noise(model, index, reference=False)
        self._built[index] = model
        return model, list(report.flags)


def _nbytes(value: Any) -> int:
    """Bytes of the tensors in ``value`` (a plain alias, like ``_storages``'s)."""
    from extensions.timing.tensors import flatten_tensors

    return sum(t.numel() * t.element_size() for t in flatten_tensors(value))


def _poison_allocator(output) -> None:
    """Fill freed CUDA memory with NaN so a second run that reads memory it never wrote sees it."""
    import torch

    nbytes = _nbytes(output)
    if nbytes:
        torch.full((nbytes // 4 + 1,), float("nan"), device="cuda").sum()
        torch.cuda.synchronize()


def run_set(models: "Models", index: int, set_spec: dict, inputs: list, device: str, audit,
            interpreter=None, autotune=None) -> dict:
    """Run forward on one input set under the audit. What it returned, the inputs after the call
    and the model's weights are read afterwards only through plain aliases of torch's own tensor
    types (``plain_output``, ``module_tensors``): a method the candidate gave a tensor or a module
    never runs outside the audited call. The call is made in the set's context (``judged_context``:
    eval mode, grad on), as the reference's was."""
    import torch

    from extensions.timing.tensors import ForeignTensorType, held_elsewhere, plain_output

    from extensions.timing.tensors import flatten_tensors, stored_stretch

    from ..common.judged_context import judged_context
    from ..common.model_tensors import module_tensors
    from ..common.tensor_io import TensorIOError, pack, save_tensors, stored_spans

    status: dict[str, Any] = {"ok": False}
    try:
        model, flags = models.get(int(set_spec.get("init", 0)))
    except BaseException as exc:  # noqa: BLE001 - the constructor at other sizes failed
        status["error"] = "constructor: " + short_error(exc)
        return status
    if flags:
        status.update({"flags": flags, "error": "constructor: runtime audit"})
        return status
    if interpreter is not None:  # CPU: this set's program order and autotune configs
        interpreter.start_set(index, bool(set_spec.get("shuffle_programs")))
    elif autotune is not None:  # CUDA: this set's autotune configs
        autotune.start_set(index)
    repeat = None
    context = set_spec.get("context")
    # How much of its storage each sliced or expanded input reaches, as handed (inputs sharing a
    # storage: the stretch they share): after the call the whole stretch is read back, so a write
    # between a slice's elements, or into another input's view, is seen as a write to it.
    reaches = [(position, span) for position, span in enumerate(stored_spans(flatten_tensors(inputs)))
               if span is not None]
    # The memory around the inputs: all-ones bytes on even sets, the neighbouring input's values
    # on odd ones (neither is then a sign of being judged); checked after the call.
    gaps = fill_gaps(inputs, data_like=index % 2 == 1)
    try:
        fresh = interpreter.fresh.during() if interpreter is not None else contextlib.nullcontext()
        # The mode switch runs inside the audited call: a module's property it reaches is audited.
        with audit.forward() as report, judged_context(model, context, inputs), fresh:
            output = model(*inputs)
        if device != "cpu":
            torch.cuda.synchronize()
        output = plain_output(output)
        flags = list(report.flags)
        if set_spec.get("repeat"):
            _poison_allocator(output)
            with torch.no_grad(), audit.forward() as again:
                repeat = model(*inputs)
            torch.cuda.synchronize()
            repeat = plain_output(repeat)
            flags += [f for f in again.flags if f not in flags]
        inputs_after = plain_output(list(inputs), "input")
        weights = module_tensors(model)
    except ForeignTensorType as exc:
        status["error"] = f"forward returned or holds a tensor the verifier cannot read: {exc}"
        status["flags"] = list(report.flags)
        return status
    except BaseException as exc:  # noqa: BLE001 - SystemExit from the candidate included
        status["error"] = short_error(exc)
        return status
    finally:
        if interpreter is not None:
            interpreter.order.shuffled = False
    if not gaps_intact(gaps):
        status["wrote_beside_inputs"] = True
    input_storages = _storages(inputs_after)
    output_storages = _storages(output)
    if output_storages & input_storages:
        flags.append("output_aliases_input")
    if output_storages - report.kernel_storages:
        flags.append("output_not_from_kernel")
    weight_storages = _storages(weights)
    if output_storages & weight_storages:
        flags.append("output_aliases_weight")
    # Held by the model after the call (checked before the harness holds it too): a buffer it
    # returns again later, however many calls away, which earlier sets' outputs alone see only
    # when it comes back within the calls a check makes.
    kept = held_elsewhere(output, input_storages | weight_storages)
    if models.reuses_output(int(set_spec.get("init", 0)), output) or kept:
        flags.append("output_reused")
    out_tensors: dict[str, Any] = {}
    try:
        out_spec = pack(output, "out", out_tensors)
        in_spec = pack(inputs_after, "in", out_tensors)
        after = flatten_tensors(inputs_after)
        status["inputs_reach_after"] = {
            str(position): pack(stored_stretch(after[position], span), f"reach.{position}", out_tensors)
            for position, span in reaches}
        if repeat is not None:
            status["output_repeat"] = pack(repeat, "again", out_tensors)
    except TensorIOError as exc:
        status["error"] = f"forward returned something that is not tensors: {exc}"
        status["flags"] = flags
        return status
    save_tensors(f"set_{index}.safetensors", out_tensors)
    status.update({
        "ok": True, "output": out_spec, "inputs_after": in_spec, "flags": flags,
        "launches": report.launches, "kernels": sorted(report.kernel_names),
        "disallowed_ops": report.disallowed_ops[:20], "library_calls": report.library_calls,
        "details": report.details,
    })
    return status


def run_timing(job: dict, models: "Models", device: str, hashes: list[str], backend: dict) -> dict:
    """Time the candidate against the reference on the handed timing inputs (``hashes``: those
    files'; the problem file's is in the job), with the backend switches at ``backend`` (taken
    before the candidate's import: the baseline is timed at the reference's own numerics)."""
    import torch

    from ...config.sections import VerifierConfig
    from ..common.compare import compare_outputs, disagreeing_elements
    from ..common.precision import restore
    from ..common.problem_sizes import load_problem
    from ..common.tensor_io import pack, save_tensors

    try:
        from extensions.timing import measure_speedup
    except Exception as exc:  # noqa: BLE001 - the timer is optional
        return {"error": f"timing unavailable: {type(exc).__name__}: {str(exc)[:120]}"}
    try:
        input_sets, handed = take_handed("timing.in", device, hashes)
        timing = job["timing"]
        problem = load_problem(read_checked(timing["problem_file"], timing["problem_sha256"]).decode())
        torch.manual_seed(int(job["seed"]))
        reference = problem.Model(*models.inits[0]).to(device)
        models.add_parameter_noise(reference, 0, reference=True)
        model, _flags = models.get(0)
        indices = [int(i) for i in handed["sets"]]
        config = VerifierConfig(**job["timing"]["config"])
        reset = restore(backend)
        report = measure_speedup(reference, model, input_sets, config, compare_outputs=compare_outputs,
                                 localise_outputs=disagreeing_elements)
        data = report.to_dict()
        if reset:
            data.setdefault("details", {})["backend_settings_reset"] = reset
        result = {"report": json.loads(json.dumps(data, default=str))}
        last = getattr(report, "last_output", None)
        last_index = getattr(report, "last_input_index", None)
        out_tensors: dict[str, Any] = {}
        if last is not None and last_index is not None:
            result["last_output"] = pack(last, "last", out_tensors)
            result["last_set"] = indices[int(last_index)]
        # Disagreements at a few elements: the parent, which knows where the reference itself is
        # unsure, accepts them there alone.
        result["localised"] = [{"set": indices[int(index)], "places": pack(finding, f"localised{n}", out_tensors)}
                               for n, (index, finding) in enumerate(report.localised_mismatches)]
        # Wider disagreements go whole, judged as the set was (the step toward the exact value
        # of a low-precision reference, its slack, its ambiguous elements: the parent's alone).
        result["whole"] = [{"set": indices[int(index)], "output": pack(output, f"whole{n}", out_tensors)}
                           for n, (index, output) in enumerate(report.whole_mismatches)]
        if out_tensors:
            save_tensors("timing.safetensors", out_tensors)
        return result
    except AlteredFile as exc:
        return _sandbox_failure(exc)
    except BaseException as exc:  # noqa: BLE001
        return {"error": "timing failed: " + short_error(exc)}


def _sandbox_failure(exc: AlteredFile) -> dict:
    return {"ok": False, "sandbox_error": True, "error": str(exc)}


class _Verdicts:
    """Writes status files, each after checking that the worker's code and the audit's hooks are
    as they were before the candidate was imported, with the worker's phase seconds so far."""

    def __init__(self, snapshot, audit, clock):
        self.snapshot, self.audit, self.clock = snapshot, audit, clock

    def write(self, name: str, status: dict) -> None:
        status["phase_s"] = self.clock.as_dict()
        changed = self.snapshot.changes()
        if changed or not self.audit.hooks_intact():
            flags = status.setdefault("flags", [])
            if isinstance(flags, list) and "audit_tampered" not in flags:
                flags.append("audit_tampered")
            status["ok"] = False
            status.pop("sandbox_error", None)
            status["error"] = "runtime audit: the worker's code was changed"
            status.setdefault("details", {})["changed_code"] = changed[:10]
        _write_json(name, status)


def _snapshot(device: str):
    """The code a verdict depends on: this worker, the audit, the comparison, the tensor writer, the
    policy, ``json`` (the status writer), every other module of the sandbox side and the shared
    modules loaded by now (start-up, the fork server, privileges, ...) and, on CUDA, the timer
    (imported now so that it is covered)."""
    import json as json_module
    import json.encoder

    from extensions.timing import tensors as output_tensors

    from ..common import compare, judged_context, model_tensors, param_noise, precision, tensor_io
    from ..static import policy, triton_api, value_api
    from . import audit, handed_files, integrity, interpreter_compat
    from .integrity import CodeSnapshot

    modules = [sys.modules[__name__], audit, compare, handed_files, integrity, interpreter_compat, judged_context,
               model_tensors, param_noise, policy, precision, tensor_io, output_tensors, triton_api, value_api,
               json_module, json.encoder]
    for prefix in _COVERED_PACKAGES:
        modules += [module for name, module in sorted(sys.modules.items())
                    if name.startswith(prefix) and module is not None]
    if device != "cpu":
        try:
            from extensions.timing import measure, runners, schedule, stats, tensors
        except Exception:  # noqa: BLE001 - the timer is optional; run_timing reports its absence
            pass
        else:
            modules += [measure, runners, schedule, stats, tensors]
    unique = {id(module): module for module in modules}
    return CodeSnapshot(unique.values())


def serve(control, clock=None) -> None:
    """Judge one candidate in the current directory, driven by lines on ``control``; ``clock``
    holds the phases of a start-up done before (a forked child's warm-up)."""
    import torch

    from ..common.phases import PhaseClock
    from ..common.precision import pin_ieee_fp32
    from ..common.privileges import drop_privileges
    from ..common.proctree import become_subreaper
    from . import interpreter_compat
    from .audit import RuntimeAudit, warm_up_profiler
    from .startup import limit_memory, warm_up_cuda

    command = control.readline().split()
    if not command or command[0] != "go":
        return
    clock = clock or PhaseClock()
    become_subreaper()  # a setsid/double-forked grandchild stays in this tree, where it is killed
    warm_up_profiler()  # milliseconds where it was warmed while waiting
    try:
        job, inits, candidate_source = read_job(command[1:])
    except AlteredFile as exc:
        _write_json("compile.json", _sandbox_failure(exc))
        return
    device = "cuda" if job["device"] != "cpu" else "cpu"
    interpreter = autotune = None
    clock.count_c_builds()
    if device == "cpu":
        torch.set_num_threads(1)
        interpreter = interpreter_compat.install()
        interpreter.fresh.plan([bool(s.get("shuffle_programs")) for s in job["sets"]])
    else:
        autotune = interpreter_compat.rotate_autotune_on_cuda()
    limit_memory(int(job.get("memory_limit_mb", 0)), device)
    backend = pin_ieee_fp32()  # the reference's numerics, put back before the baseline is timed
    drop_privileges()  # no capability left to read other processes of this user (process isolation)
    with clock.phase("audit_install"):
        audit = RuntimeAudit(bool(job["allow_library_gemm"]), device, trace_dir=os.getcwd())
        audit.install()
        # Taken here, in the candidate's own process (a forked child included), before its import.
        verdicts = _Verdicts(_snapshot(device), audit, clock)
    try:
        with clock.phase("import"), audit.construction() as report:
            model_cls, flags = import_candidate(candidate_source)
        details = dict(report.details)
        flags += [f for f in report.flags if f not in flags]
        models = Models(model_cls, inits, int(job["seed"]), device, audit, job.get("param_noise") or {})
        if device != "cpu":  # after the import: a candidate that does not import never pays for CUDA
            warm_up_cuda(clock)
        with clock.phase("build"):
            _model, built_flags = models.get(0)
    except BaseException as exc:  # noqa: BLE001 - import errors, SystemExit, anything
        verdicts.write("compile.json", {"ok": False, "error": short_error(exc)})
        return
    flags += [f for f in built_flags if f not in flags]
    details["init_ops"] = sorted(set(details.get("init_ops", []) + audit.report.details.get("init_ops", [])))
    if models.pairing:
        details["param_pairing"] = dict(models.pairing)
    verdicts.write("compile.json", {"ok": True, "flags": flags, "details": details})
    previous_inputs = None
    for index, set_spec in enumerate(job["sets"]):
        command = control.readline().split()
        if not command or command[0] != "run":
            return
        try:
            (inputs,), _ = take_handed(f"set_{index}.in", device, command[1:])
        except AlteredFile as exc:
            verdicts.write(f"set_{index}.json", _sandbox_failure(exc))
            return
        inputs = previous_inputs = into_previous_tensors(previous_inputs, inputs)
        # The first set pays the kernel's compilation (and its launcher's, where Triton builds one).
        with clock.phase("first_set" if "first_set" not in clock.seconds else "other_sets"):
            status = run_set(models, index, set_spec, inputs, device, audit, interpreter, autotune)
        verdicts.write(f"set_{index}.json", status)
    command = control.readline().split()
    if command and command[0] == "time" and job.get("timing"):
        if autotune is not None:  # timed with the config the autotuner picks, as a user's GPU runs it
            autotune.finish()
        with clock.phase("timing"):
            status = run_timing(job, models, device, command[1:], backend)
        verdicts.write("timing.json", status)


def private_control_channel():
    """The parent's commands arrive on a private copy of stdin; the candidate's stdin is empty."""
    control = os.fdopen(os.dup(0), "r")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    return control


def main() -> None:
    from ..common.proctree import die_with_parent
    from .audit import warm_up_profiler
    from .startup import preload

    die_with_parent()
    control = private_control_channel()
    # Imports first: the parent may start this process before it has a candidate for it ("go").
    preload()
    warm_up_profiler()
    serve(control)


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    # Skip interpreter teardown: candidate objects' __del__ cannot run after the verdict files.
    os._exit(0)
