"""Sandboxed candidate worker: import the candidate, run its forward on the given inputs, report.

    python -m extensions.verify.worker        (cwd: the sandbox directory)

Reads ``job.json`` and the input tensors from the sandbox directory. It never holds expected
outputs: it writes the candidate's outputs (and the inputs as they were after the call) as
safetensors plus a JSON status, and the trusted parent compares. The parent drives it through
stdin, one line per step, so evaluation stops at the first failure without wasting work:

    parent: "go"   -> worker: reads job.json (it imported torch/triton before, while waiting)
    worker: compile.json
    parent: "run"  -> worker: set_<i>.safetensors + set_<i>.json     (repeat per input set)
    parent: "time" -> worker: timing.json (+ timing.safetensors)     (CUDA, after all passed)
    parent: "stop" -> worker exits

The runtime audit is installed before the candidate is imported.
"""
from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import re
import sys
import traceback
from typing import Any, Optional

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


class _VerifiedSource(importlib.machinery.SourceFileLoader):
    """Loads the candidate from bytes already checked against the parent's hash, so a file swapped
    on disk after the check is never what runs."""

    def __init__(self, fullname: str, path: str, source: bytes):
        super().__init__(fullname, path)
        self.source = source

    def get_data(self, path):
        return self.source if path == self.path else super().get_data(path)


def _load_spec(source: Optional[bytes]):
    if source is None:
        return importlib.util.spec_from_file_location("candidate", CANDIDATE_FILE)
    import linecache

    # Triton reads a kernel's source through linecache (inspect.getsource): give it the same bytes.
    text = source.decode("utf-8", "replace")
    linecache.cache[CANDIDATE_FILE] = (len(text), None, text.splitlines(True), CANDIDATE_FILE)
    loader = _VerifiedSource("candidate", CANDIDATE_FILE, source)
    return importlib.util.spec_from_file_location("candidate", CANDIDATE_FILE, loader=loader)


def build_candidate(job: dict, tensors: dict, device: str, source: Optional[bytes] = None):
    import torch

    from .tensor_io import unpack

    spec = _load_spec(source)
    module = importlib.util.module_from_spec(spec)
    sys.modules["candidate"] = module
    spec.loader.exec_module(module)
    model_cls = getattr(module, "ModelNew", None)
    if model_cls is None:
        raise NameError("the candidate defines no class ModelNew")
    if not (isinstance(model_cls, type) and issubclass(model_cls, torch.nn.Module)):
        raise TypeError("ModelNew is not an nn.Module subclass")
    init = unpack(job["init"], tensors)
    torch.manual_seed(int(job["seed"]))
    model = model_cls(*init)
    if device != "cpu":
        model = model.to(device)
    flags = []
    if any(cls.__name__ == "Model" or cls.__module__ == "problem" for cls in model_cls.__mro__[1:]):
        flags.append("inherits_reference")
    return model, flags


def run_set(model, index: int, set_spec: dict, tensors: dict, device: str, audit) -> dict:
    import torch

    from .tensor_io import TensorIOError, pack, save_tensors, unpack

    inputs = unpack(set_spec["inputs"], tensors, device if device != "cpu" else None)
    if device == "cpu":  # the candidate gets its own copies; the file's tensors stay pristine
        inputs = [t.clone() if isinstance(t, torch.Tensor) else t for t in inputs]
    status: dict[str, Any] = {"ok": False}
    try:
        with torch.no_grad(), audit.forward() as report:
            output = model(*inputs)
        if device != "cpu":
            torch.cuda.synchronize()
    except BaseException as exc:  # noqa: BLE001 - SystemExit from the candidate included
        status["error"] = short_error(exc)
        return status
    flags = list(report.flags)
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


def run_timing(job: dict, model, tensors: dict, device: str) -> dict:
    import torch

    from ..config.sections import VerifierConfig
    from .reference_worker import load_problem
    from .tensor_io import pack, save_tensors, unpack

    try:
        from extensions.timing import measure_speedup
    except Exception as exc:  # noqa: BLE001 - the timer is optional
        return {"error": f"timing unavailable: {type(exc).__name__}: {str(exc)[:120]}"}
    try:
        with open(job["timing"]["problem_file"]) as fh:
            problem = load_problem(fh.read())
        init = unpack(job["init"], tensors)
        torch.manual_seed(int(job["seed"]))
        reference = problem.Model(*init).to(device)
        indices = [i for i, s in enumerate(job["sets"]) if s.get("timing")]
        input_sets = [unpack(job["sets"][i]["inputs"], tensors, device) for i in indices]
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


def preload() -> None:
    """Everything a worker imports before it is given a candidate (no CUDA initialisation: a
    fork server forks its children after this)."""
    import torch  # noqa: F401
    import triton  # noqa: F401
    import triton.language  # noqa: F401

    from . import audit, tensor_io  # noqa: F401


def limit_memory(limit_mb: int, device: str) -> None:
    """Cap the data segment (heap and private writable mappings) at what the worker holds now
    plus ``limit_mb``: an allocation above it fails at once, before pages are touched. Only on
    CPU: CUDA's runtime maps memory in ways a data limit can break; there the parent's resident
    memory watch is the cap."""
    import resource

    if limit_mb <= 0 or device != "cpu":
        return
    held = 0
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmData:"):
                held = int(line.split()[1]) * 1024
    limit = held + limit_mb * (1 << 20)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))


def serve(control) -> None:
    """Judge one candidate in the current directory, driven by lines on ``control``."""
    import torch

    from .audit import RuntimeAudit
    from .privileges import drop_privileges
    from .proctree import become_subreaper
    from .tensor_io import load_tensors

    command = control.readline().split()
    if not command or command[0] != "go":
        return
    become_subreaper()  # a setsid/double-forked grandchild stays in this tree, where it is killed
    # Under process isolation other processes of this user could rewrite the job and input files:
    # their hashes come on this private channel and each file is read once, then checked.
    expected_hashes = command[1:]  # inputs, candidate, job
    with open("job.json", "rb") as fh:
        job_bytes = fh.read()
    if expected_hashes and hashlib.sha256(job_bytes).hexdigest() != expected_hashes[-1]:
        _write_json("compile.json", {"ok": False, "sandbox_error": True,
                                     "error": "the job file was altered by another process"})
        return
    job = json.loads(job_bytes)
    device = "cuda" if job["device"] != "cpu" else "cpu"
    if device == "cpu":
        torch.set_num_threads(1)
    candidate_source = None  # under bwrap no other process can reach the file
    if expected_hashes:
        from safetensors.torch import load as load_tensor_bytes

        with open(job["inputs_file"], "rb") as fh:
            input_bytes = fh.read()
        if hashlib.sha256(input_bytes).hexdigest() != expected_hashes[0]:
            _write_json("compile.json", {"ok": False, "sandbox_error": True,
                                         "error": "the input file was altered by another process"})
            return
        tensors = load_tensor_bytes(input_bytes)
        del input_bytes
        with open(CANDIDATE_FILE, "rb") as fh:
            candidate_source = fh.read()
        if len(expected_hashes) > 2 and hashlib.sha256(candidate_source).hexdigest() != expected_hashes[1]:
            _write_json("compile.json", {"ok": False, "sandbox_error": True,
                                         "error": "the candidate file was altered by another process"})
            return
    else:
        tensors = load_tensors(job["inputs_file"])
    limit_memory(int(job.get("memory_limit_mb", 0)), device)
    drop_privileges()  # no capability left to read other processes of this user (process isolation)
    audit = RuntimeAudit(bool(job["allow_library_gemm"]), device, trace_dir=os.getcwd())
    audit.install()
    try:
        model, flags = build_candidate(job, tensors, device, candidate_source)
    except BaseException as exc:  # noqa: BLE001 - import errors, SystemExit, anything
        _write_json("compile.json", {"ok": False, "error": short_error(exc)})
        return
    _write_json("compile.json", {"ok": True, "flags": flags})
    for index, set_spec in enumerate(job["sets"]):
        if control.readline().strip() != "run":
            return
        _write_json(f"set_{index}.json", run_set(model, index, set_spec, tensors, device, audit))
    if control.readline().strip() == "time" and job.get("timing"):
        _write_json("timing.json", run_timing(job, model, tensors, device))


def private_control_channel():
    """The parent's commands arrive on a private copy of stdin; the candidate's stdin is empty."""
    control = os.fdopen(os.dup(0), "r")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    return control


def main() -> None:
    from .proctree import die_with_parent

    die_with_parent()
    control = private_control_channel()
    # Imports first: the parent may start this process before it has a candidate for it ("go").
    preload()
    serve(control)


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    # Skip interpreter teardown: candidate objects' __del__ cannot run after the verdict files.
    os._exit(0)
