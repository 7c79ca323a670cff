"""Trusted reference process: build the input sets of one problem and the reference outputs.

    python -m extensions.verify.reference.reference_worker JOB_DIR      (first stdin line: the batch secret)
    python -m extensions.verify.reference.reference_worker --serve      (one job per stdin line)

Reads ``JOB_DIR/job.json``, ``JOB_DIR/problem.py`` and, from stdin, the secret the parent drew for
this batch (input seed and value-transform parameters: never written to a file); writes
``inputs.safetensors`` (init inputs and every input set), ``expected.safetensors`` and, last,
``prepared.json``. It runs the problem's own code (trusted) in its own process so that a hang or an
out-of-memory in the reference cannot take the verifier down; it never sees a candidate.

Input sets: ``tiny`` (batch-like constants set to 2), ``base`` (the problem's sizes, shrunk on CPU
to ``cpu_max_input_numel``), other shapes (module-level constants set to odd sizes; constants that
feed ``get_init_inputs()`` included, so constructor sizes vary too and the model is rebuilt from
the same seed), other values (mapped to both signs, then large (the problem's own values with a
few outliers spread over many powers of ten, as far as the fp32 reference stays exact; else every
element times one factor), then whole lines along every axis negative (a few at secret places,
some far from zero; where the fp32 reference is not exact with them, every element), then small; exact zeros in some places
and the problem's Python float inputs varied, with parameters drawn per batch) and one ``wide``
set whose non-batch sizes exceed the problem's own (and, on CPU, whose elements exceed the cap).
A variation whose reference fails, or turns non-finite where its fp64 run does not (overflow), is
skipped and reported; non-finite values the fp64 run shares (masking, log of zero) are compared by
position, and so, for a model with no fp64 run, are those the same draw has without the transform.
Integer inputs that are numbers (not indices, targets or sizes) get signs and large magnitudes in
the signed and large sets.

``--serve`` builds one problem after another in the same process, so that torch's import and the
CUDA context are paid once per batch instead of once per problem (torch's import alone was 4.8 of a
small problem's 14 seconds on an H100). Each stdin line is a job, ``{"job_dir": ..., "secret":
...}``; the process answers through the job's folder (``prepared.json``). After any failure it
prints the one-line reason on stderr and exits, as a process of one problem does: a problem that
raised may have left the process (or its CUDA context) in a state the next one must not inherit. Between jobs it puts back the
global torch settings a problem's code can change.
"""
from __future__ import annotations

import gc
import json
import os
import sys
import time

from ..common.precision import pin_ieee_fp32
from ..common.tensor_io import pack
from .builder import ReferenceBuilder


def run(job_dir: str, secret: dict, started: float) -> None:
    import torch

    from ..common.tensor_io import save_tensors

    phases = {"import": time.monotonic() - started}
    mark = time.monotonic()

    with open(os.path.join(job_dir, "job.json")) as fh:
        job = json.load(fh)
    with open(os.path.join(job_dir, "problem.py")) as fh:
        source = fh.read()
    torch.set_num_threads(max(1, int(job.get("threads", 1))))
    pin_ieee_fp32()  # cuDNN's convolutions default to TF32: an fp32 problem's reference is fp32
    builder = ReferenceBuilder(source, job, secret)
    builder.build()
    init_specs = [pack(init, f"init{i}", builder.tensors) for i, init in enumerate(builder.inits)]
    phases["build"], mark = time.monotonic() - mark, time.monotonic()
    save_tensors(os.path.join(job_dir, "inputs.safetensors"), builder.tensors)
    save_tensors(os.path.join(job_dir, "expected.safetensors"), builder.expected)
    phases["save"] = time.monotonic() - mark
    prepared = {
        "problem_source": builder.base_source, "constants": builder.values, "notes": builder.notes,
        "init": init_specs[0], "inits": init_specs, "sets": builder.sets, "skipped": builder.skipped,
        "unanswered": builder.unanswered,
        "param_keys": builder.param_keys,
        "model_bytes": builder.model_bytes(),
        "shrunk": builder.values != builder.original_values,
        "problem_numel": builder.problem_numel(),
        "phase_s": {name: round(seconds, 4) for name, seconds in phases.items()},
    }
    tmp = os.path.join(job_dir, "prepared.json.tmp")
    with open(tmp, "w") as fh:
        json.dump(prepared, fh)
    os.replace(tmp, os.path.join(job_dir, "prepared.json"))


def _failure_line(exc: BaseException) -> str:
    import traceback

    where = traceback.extract_tb(exc.__traceback__)[-1]
    return (f"reference failed: {type(exc).__name__}: {str(exc)[:300]} "
            f"({os.path.basename(where.filename)}:{where.lineno})")


class _GlobalTorchState:
    """The process-wide torch settings a problem's code can change at import or in its forward,
    taken once when the server starts and put back before each job, so that no problem's
    reference is built under another problem's settings."""

    def __init__(self):
        import torch

        from ..common.precision import backend_settings

        self.dtype = torch.get_default_dtype()
        self.grad = torch.is_grad_enabled()
        self.matmul_precision = torch.get_float32_matmul_precision()
        self.deterministic = torch.are_deterministic_algorithms_enabled()
        self.backends = backend_settings()

    def restore(self) -> None:
        import torch

        from ..common.precision import restore

        torch.set_default_dtype(self.dtype)
        torch.set_grad_enabled(self.grad)
        torch.set_float32_matmul_precision(self.matmul_precision)
        torch.use_deterministic_algorithms(self.deterministic)
        restore(self.backends)


def serve(started: float) -> None:
    """Build one job per stdin line until stdin closes; exit after the first failure."""
    import torch

    state = _GlobalTorchState()
    first = True
    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        job_dir, secret = job["job_dir"], job["secret"]
        state.restore()
        try:
            if not isinstance(secret, dict):
                raise ValueError("no batch secret in the job")
            # The first job's import phase is the server's start-up; later jobs import nothing.
            run(job_dir, secret, started if first else time.monotonic())
        except Exception as exc:  # noqa: BLE001 - reported to the parent in one line
            print(_failure_line(exc), file=sys.stderr, flush=True)
            sys.exit(1)
        first = False
        gc.collect()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.empty_cache()


def main() -> None:
    started = time.monotonic()
    if sys.argv[1:] == ["--serve"]:
        serve(started)
        return
    if len(sys.argv) != 2:
        sys.exit("usage: python -m extensions.verify.reference.reference_worker JOB_DIR | --serve")
    try:
        secret = json.loads(sys.stdin.readline() or "null")
        if not isinstance(secret, dict):
            raise ValueError("no batch secret on stdin")
        run(sys.argv[1], secret, started)
    except Exception as exc:  # noqa: BLE001 - reported to the parent in one line
        print(_failure_line(exc), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
