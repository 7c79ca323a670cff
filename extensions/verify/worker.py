"""Sandboxed candidate worker: import the candidate, run its forward on the given inputs, report.

    python -m extensions.verify.worker        (cwd: the sandbox directory)

Reads ``job.json`` and the init inputs, deletes both, and only then imports the candidate: the
candidate never sees the job, and no input exists yet while it is imported and built. It never
holds expected outputs: it writes the candidate's outputs (and the inputs as they were after the
call) as safetensors plus a JSON status, and the trusted parent compares. The parent drives it
through stdin, one line per step, so evaluation stops at the first failure without wasting work:

    parent: "go"   -> worker: reads job.json (it imported torch/triton before, while waiting)
    worker: compile.json
    parent: writes set_<i>.in.safetensors, "run" -> worker: set_<i>.safetensors + set_<i>.json
            ("skip" passes a set over)                                       (repeat per input set)
    parent: writes timing.in.*, "time" -> worker: timing.json (+ timing.safetensors)   (CUDA)
    parent: "stop" -> worker exits

The runtime audit (``audit.py``) and, on CPU, the interpreter's missing pieces
(``interpreter_compat.py``) are installed before the candidate is imported; importing and building
``ModelNew`` are audited too. After the model is built the RNG is reseeded from the OS, so forward
cannot replay the verifier's draws. Before every status file is written, the worker's own code is
checked against the snapshot taken before the candidate was imported (``integrity.py``).
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
import traceback
from typing import Any

CANDIDATE_FILE = "candidate.py"
_PATHS = re.compile(r"(?:/[\w.\-+@]+)+/")


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
    import torch

    from .tensor_io import flatten_tensors

    return {t.untyped_storage().data_ptr() for t in flatten_tensors(value)
            if isinstance(t, torch.Tensor) and t.numel() > 0}


def import_candidate():
    import torch

    spec = importlib.util.spec_from_file_location("candidate", CANDIDATE_FILE)
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


class Models:
    """The candidate's models, one per constructor-argument set, each built (audited) when first
    needed."""

    def __init__(self, model_cls, inits: list, seed: int, device: str, audit):
        self.model_cls, self.inits, self.seed, self.device, self.audit = model_cls, inits, seed, device, audit
        self._built: dict[int, Any] = {}

    def get(self, index: int):
        """(model, construction flags); raises what the constructor raised."""
        if index in self._built:
            return self._built[index], []
        with self.audit.construction() as report:
            model = build_model(self.model_cls, self.inits[index], self.seed, self.device)
        self._built[index] = model
        return model, list(report.flags)


def _poison_allocator(output) -> None:
    """Fill freed CUDA memory with NaN so a second run that reads memory it never wrote sees it."""
    import torch

    from .tensor_io import flatten_tensors

    nbytes = sum(t.numel() * t.element_size() for t in flatten_tensors(output))
    if nbytes:
        torch.full((nbytes // 4 + 1,), float("nan"), device="cuda").sum()
        torch.cuda.synchronize()


def run_set(models: "Models", index: int, set_spec: dict, inputs: list, device: str, audit,
            order=None) -> dict:
    import torch

    from .tensor_io import TensorIOError, pack, save_tensors

    status: dict[str, Any] = {"ok": False}
    try:
        model, flags = models.get(int(set_spec.get("init", 0)))
    except BaseException as exc:  # noqa: BLE001 - the constructor at other sizes failed
        status["error"] = "constructor: " + short_error(exc)
        return status
    if flags:
        status.update({"flags": flags, "error": "constructor: runtime audit"})
        return status
    if order is not None:
        order.shuffled = bool(set_spec.get("shuffle_programs"))
    repeat = None
    try:
        with torch.no_grad(), audit.forward() as report:
            output = model(*inputs)
        if device != "cpu":
            torch.cuda.synchronize()
        flags = list(report.flags)
        if set_spec.get("repeat"):
            _poison_allocator(output)
            with torch.no_grad(), audit.forward() as again:
                repeat = model(*inputs)
            torch.cuda.synchronize()
            flags += [f for f in again.flags if f not in flags]
    except BaseException as exc:  # noqa: BLE001 - SystemExit from the candidate included
        status["error"] = short_error(exc)
        return status
    finally:
        if order is not None:
            order.shuffled = False
    input_storages = _storages(inputs)
    output_storages = _storages(output)
    if output_storages & input_storages:
        flags.append("output_aliases_input")
    if output_storages - report.kernel_storages:
        flags.append("output_not_from_kernel")
    weight_storages = _storages(list(model.parameters()) + list(model.buffers()))
    if output_storages & weight_storages:
        flags.append("output_aliases_weight")
    out_tensors: dict[str, Any] = {}
    try:
        out_spec = pack(output, "out", out_tensors)
        in_spec = pack(list(inputs), "in", out_tensors)
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


def run_timing(job: dict, models: "Models", device: str) -> dict:
    import torch

    from ..config.sections import VerifierConfig
    from .reference_worker import load_problem
    from .tensor_io import pack, save_tensors

    try:
        from extensions.timing import measure_speedup
    except Exception as exc:  # noqa: BLE001 - the timer is optional
        return {"error": f"timing unavailable: {type(exc).__name__}: {str(exc)[:120]}"}
    try:
        input_sets, handed = take_handed("timing.in", device)
        with open(job["timing"]["problem_file"]) as fh:
            problem = load_problem(fh.read())
        torch.manual_seed(int(job["seed"]))
        reference = problem.Model(*models.inits[0]).to(device)
        model, _flags = models.get(0)
        indices = [int(i) for i in handed["sets"]]
        config = VerifierConfig(**job["timing"]["config"])
        report = measure_speedup(reference, model, input_sets, config)
        data = report.to_dict()
        result = {"report": json.loads(json.dumps(data, default=str))}
        last = getattr(report, "last_output", None)
        last_index = getattr(report, "last_input_index", None)
        if last is not None and last_index is not None:
            out_tensors: dict[str, Any] = {}
            result["last_output"] = pack(last, "last", out_tensors)
            result["last_set"] = indices[int(last_index)]
            save_tensors("timing.safetensors", out_tensors)
        return result
    except BaseException as exc:  # noqa: BLE001
        return {"error": "timing failed: " + short_error(exc)}


def _read_job() -> tuple[dict, list]:
    """The job and the init inputs, both deleted once read: the candidate is imported after."""
    from .tensor_io import load_tensors, unpack

    with open("job.json") as fh:
        job = json.load(fh)
    tensors = load_tensors(job["init_file"])
    inits = [unpack(spec, tensors) for spec in job["inits"]]
    for name in ("job.json", job["init_file"]):
        os.remove(name)
    return job, inits


def take_handed(stem: str, device: str) -> tuple[list, dict]:
    """The values the parent handed over as ``stem``.safetensors + ``stem``.json (deleted once
    read: a set's inputs exist only from just before its run), and the JSON's other fields."""
    from .tensor_io import load_tensors, unpack

    with open(stem + ".json") as fh:
        handed = json.load(fh)
    tensors = load_tensors(stem + ".safetensors")
    for suffix in (".json", ".safetensors"):
        os.remove(stem + suffix)
    values = [unpack(spec, tensors, device if device != "cpu" else None) for spec in handed.pop("values")]
    return values, handed


class _Verdicts:
    """Writes status files, each after checking that the worker's code and the audit's hooks are
    as they were before the candidate was imported."""

    def __init__(self, snapshot, audit):
        self.snapshot, self.audit = snapshot, audit

    def write(self, name: str, status: dict) -> None:
        changed = self.snapshot.changes()
        if changed or not self.audit.hooks_intact():
            flags = status.setdefault("flags", [])
            if isinstance(flags, list) and "audit_tampered" not in flags:
                flags.append("audit_tampered")
            status["ok"] = False
            status["error"] = "runtime audit: the worker's code was changed"
            status.setdefault("details", {})["changed_code"] = changed[:10]
        _write_json(name, status)


def _snapshot(device: str):
    """The code a verdict depends on: this worker, the audit, the comparison, the tensor writer,
    ``json`` (the status writer) and, on CUDA, the timer (imported now so that it is covered)."""
    import json as json_module
    import json.encoder

    from . import audit, compare, integrity, interpreter_compat, tensor_io
    from .integrity import CodeSnapshot

    modules = [sys.modules[__name__], audit, compare, integrity, interpreter_compat, tensor_io, json_module,
               json.encoder]
    if device != "cpu":
        try:
            from extensions.timing import measure, runners, schedule, stats
        except Exception:  # noqa: BLE001 - the timer is optional; run_timing reports its absence
            pass
        else:
            modules += [measure, runners, schedule, stats]
    return CodeSnapshot(modules)


def main() -> None:
    # The parent's commands arrive on a private copy of stdin; the candidate's stdin is empty.
    control = os.fdopen(os.dup(0), "r")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)

    # Imports first: the parent may start this process before it has a candidate for it ("go").
    import torch
    import triton  # noqa: F401

    from .audit import RuntimeAudit, warm_up_profiler

    warm_up_profiler()
    if control.readline().strip() != "go":
        return
    job, inits = _read_job()
    device = "cuda" if job["device"] != "cpu" else "cpu"
    from . import interpreter_compat

    order = None
    if device == "cpu":
        torch.set_num_threads(1)
        order = interpreter_compat.install()
    else:
        interpreter_compat.benchmark_autotune_with_events()
    audit = RuntimeAudit(bool(job["allow_library_gemm"]), device, trace_dir=os.getcwd())
    audit.install()
    verdicts = _Verdicts(_snapshot(device), audit)
    try:
        with audit.construction() as report:
            model_cls, flags = import_candidate()
        details = dict(report.details)
        flags += [f for f in report.flags if f not in flags]
        models = Models(model_cls, inits, int(job["seed"]), device, audit)
        _model, built_flags = models.get(0)
    except BaseException as exc:  # noqa: BLE001 - import errors, SystemExit, anything
        verdicts.write("compile.json", {"ok": False, "error": short_error(exc)})
        return
    flags += [f for f in built_flags if f not in flags]
    details["init_ops"] = sorted(set(details.get("init_ops", []) + audit.report.details.get("init_ops", [])))
    verdicts.write("compile.json", {"ok": True, "flags": flags, "details": details})
    for index, set_spec in enumerate(job["sets"]):
        command = control.readline().strip()
        if command == "skip":
            continue
        if command != "run":
            return
        (inputs,), _ = take_handed(f"set_{index}.in", device)
        verdicts.write(f"set_{index}.json", run_set(models, index, set_spec, inputs, device, audit, order))
    if control.readline().strip() == "time" and job.get("timing"):
        verdicts.write("timing.json", run_timing(job, models, device))


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    # Skip interpreter teardown: candidate objects' __del__ cannot run after the verdict files.
    os._exit(0)
