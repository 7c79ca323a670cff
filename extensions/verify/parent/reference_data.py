"""A problem's reference data for one batch: input sets and expected outputs.

``ProblemPreparer`` builds them once per problem per batch in a trusted reference process, from an
input seed and value transforms drawn here per batch from the OS's secure random source
(``draw_secret``: sent on the reference's stdin, never written to a file). The inputs and expected
outputs then live in this process's memory only.

A batch of many problems (``verify_batch``) keeps its reference processes between problems
(``reuse_processes``: ``reference_worker --serve``), so torch's import and the CUDA start-up are
paid once per process rather than once per problem; a process is dropped after any failure or
timeout and a fresh one takes its place. A single preparation starts one process and ends it.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from ...config.sections import VerifierConfig
from ..common.compare import TOLERANCE_FIELDS
from ..common.tensor_io import load_tensors
from .sandbox import SandboxedProcess
from .verdict import tail_line


def draw_secret() -> dict:
    """One batch's input seed and value-transform parameters, from the OS's secure random source.
    They reach the trusted reference process only; no candidate can replay its inputs."""
    rng = secrets.SystemRandom()
    scale = rng.uniform(3.0, 5.0)
    return {
        "input_seed": secrets.randbits(62),
        # Noise for constant-initialised parameters (``param_noise``): the same in both models.
        "param_seed": secrets.randbits(62),
        "transforms": {
            "signed": [scale, scale / 2 * rng.uniform(0.8, 1.2), rng.choice((-1.0, 1.0))],
            "scale_down": 10 ** rng.uniform(-3.5, -2.5),
            "scale_up": 10 ** rng.uniform(2.0, 3.0),
            # Powers of ten the largest ``scale_up`` elements reach, highest first: the set takes
            # the first at which the reference in fp32 still matches itself in fp64. No higher: a
            # correct kernel's fourth powers (a product of two sums of squares) overflow fp32 near
            # 1e9, where the reference's own formula may not.
            "scale_up_tops": [rng.uniform(5.5, 6.0), rng.uniform(4.0, 4.5)],
            # The share of elements that are large in that set: too few for a sample of a few
            # dozen to find one (``reference.variations.with_outliers``).
            "scale_up_share": 10 ** rng.uniform(-3.3, -2.7),
            # Below the tensor's maximum by this much, then scaled by ``shift_scale``.
            "shift": rng.uniform(1.5, 3.5),
            "shift_scale": 10 ** rng.uniform(2.0, 2.5),
            # The odd-shape set's common offset, in standard deviations of each float input
            # (``reference.variations.with_offset``).
            "offset": rng.uniform(60.0, 120.0) * rng.choice((-1.0, 1.0)),
        },
        # The odd-shape set also varies the float constants that reach the constructor.
        "scalar_factor": rng.choice((rng.uniform(0.6, 0.8), rng.uniform(1.25, 1.6))),
    }


def reference_job(cfg: VerifierConfig, device: str) -> dict:
    """What the reference process needs of the verifier config (``reference_worker``'s job.json)."""
    return {
        "device": device, "seed": cfg.seed,
        "max_input_numel": cfg.cpu_max_input_numel if device == "cpu" else cfg.cuda_max_input_numel,
        "tiny_first": cfg.enable_staged_eval and cfg.staged_tiny_batch_first,
        "multi_input": cfg.enable_multi_input, "num_tests": cfg.multi_input_num_tests,
        "shape_variations": cfg.multi_input_shape_variations,
        "value_variations": cfg.multi_input_value_variations, "threads": 1,
        "tolerances": {name: getattr(cfg, name) for name in TOLERANCE_FIELDS},
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
    unanswered: list[str] = field(default_factory=list)  # sets left out: the reference failed or overflowed
    notes: list[str] = field(default_factory=list)
    shrunk: bool = False  # the base sizes are below the problem's own (the element cap)
    problem_numel: int = 0  # the elements of the problem's own inputs (0: not measured)
    param_seed: int = 0  # ``param_noise``: the seed and, per init index, the reference's keys
    param_keys: list = field(default_factory=list)
    model_bytes: int = 0  # the reference model's parameters and buffers (``memory_limit_mb`` allows for them)
    seconds: float = 0.0  # the reference process's wall time (once per problem per batch)
    # Where that time went: the reference's own phases (import, build, save) and the parent's load
    phases: dict = field(default_factory=dict)
    # The serialized input files handed to every candidate of this problem (candidate_run)
    handover_cache: dict = field(default_factory=dict, repr=False, compare=False)
    handover_copied: list = field(default_factory=list, repr=False, compare=False)  # bytes those hold


REFERENCE_MODULE = "extensions.verify.reference.reference_worker"


@dataclass
class _Built:
    """How one reference job ended."""
    ok: bool
    timed_out: bool = False
    error: str = ""


def _out_of_memory(built: "_Built") -> bool:
    """A reference that failed for memory (CUDA's allocator, or torch's own error on any device)."""
    text = built.error.lower()
    return not built.ok and not built.timed_out and ("out of memory" in text or "outofmemoryerror" in text)


class ReferenceServer:
    """A reference process kept for one problem after another (``reference_worker --serve``):
    a job goes in as a line on its stdin, the answer comes back as a file in the job's folder, and a
    failure ends the process as it ends a fresh one."""

    def __init__(self, device: str, gpu: Optional[int], work_root: str, max_output_bytes: int):
        self.gpu = gpu
        home = tempfile.mkdtemp(prefix="reference-", dir=work_root)
        self.proc = SandboxedProcess([sys.executable, "-m", REFERENCE_MODULE, "--serve"], home, device=device,
                                     gpu_index=gpu, isolation="process", max_output_bytes=max_output_bytes)

    def build(self, job_dir: str, secret: dict, deadline: float) -> _Built:
        self.proc.send_line(json.dumps({"job_dir": job_dir, "secret": secret}))
        # The same wait as a candidate's status file; the job's folder lies beside the server's own.
        answer = os.path.relpath(os.path.join(job_dir, "prepared.json"), self.proc.sandbox_dir)
        if self.proc.wait_for_file(answer, deadline):
            return _Built(True)
        if self.proc.timed_out:
            return _Built(False, timed_out=True)
        # A failed job ends the process with its one-line reason on stderr, as a fresh process does.
        outcome = self.proc.finish(time.monotonic() + 5)
        return _Built(False, error=tail_line(outcome.stderr) or f"reference exited {outcome.returncode}")

    def close(self) -> None:
        self.proc.kill()


class ProblemPreparer:
    """Builds each problem once (thread-safe); failures are verdicts on the problem, not crashes.
    With ``reuse_processes`` its reference processes serve one problem after another until
    ``close``; without, each problem gets a process of its own."""

    def __init__(self, config, device: str, work_root: str, pool, *, reuse_processes: bool = False):
        self.config, self.device, self.work_root, self.pool = config, device, work_root, pool
        self.reuse_processes = reuse_processes
        self._lock = threading.Lock()
        self._running: set = set()
        self._idle: list[ReferenceServer] = []
        self._aborted = False
        self._closed = False

    def abort(self) -> None:
        """Stop every reference now and start none (the batch cannot run)."""
        with self._lock:
            self._aborted = True
            running = list(self._running)
        for proc in running:
            proc.kill()
        self.close()

    def close(self) -> None:
        """End the kept reference processes (a batch's last problem is built)."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for server in idle:
            server.close()

    def _take_server(self, gpu: Optional[int]) -> ReferenceServer:
        with self._lock:
            for i, server in enumerate(self._idle):
                if server.gpu == gpu:
                    return self._idle.pop(i)
        return ReferenceServer(self.device, gpu, self.work_root, self.config.max_output_bytes)

    def _build_in_server(self, job_dir: str, secret: dict, gpu: Optional[int], deadline: float) -> _Built:
        server = self._take_server(gpu)
        with self._lock:
            self._running.add(server.proc)
        if self._aborted:
            server.proc.kill()
        try:
            built = server.build(job_dir, secret, deadline)
        finally:
            with self._lock:
                self._running.discard(server.proc)
        with self._lock:
            keep = built.ok and not (self._aborted or self._closed)
            if keep:
                self._idle.append(server)
        if not keep:
            server.close()
        return built

    def _build_in_own_process(self, job_dir: str, secret: dict, gpu: Optional[int], deadline: float) -> _Built:
        proc = SandboxedProcess(
            [sys.executable, "-m", REFERENCE_MODULE, job_dir], job_dir,
            device=self.device, gpu_index=gpu, isolation="process",
            max_output_bytes=self.config.max_output_bytes,
        )
        with self._lock:
            self._running.add(proc)
        if self._aborted:
            proc.kill()
        try:
            proc.send_line(json.dumps(secret))
            outcome = proc.finish(deadline)
        finally:
            with self._lock:
                self._running.discard(proc)
        if outcome.timed_out:
            return _Built(False, timed_out=True)
        if outcome.returncode != 0 or not os.path.exists(os.path.join(job_dir, "prepared.json")):
            return _Built(False, error=tail_line(outcome.stderr) or f"reference exited {outcome.returncode}")
        return _Built(True)

    def prepare(self, problem_code: str) -> PreparedProblem:
        if self._aborted:
            return PreparedProblem(False, "the batch was stopped")
        job_dir = tempfile.mkdtemp(prefix="problem-", dir=self.work_root)
        with open(os.path.join(job_dir, "problem.py"), "w") as fh:
            fh.write(problem_code)
        cfg = self.config
        with open(os.path.join(job_dir, "job.json"), "w") as fh:
            json.dump(reference_job(cfg, self.device), fh)
        gpu = self.pool.next_gpu()
        started = time.monotonic()
        secret = draw_secret()
        # The reference runs several input sets and variations: a few timeouts' worth.
        deadline = time.monotonic() + 3 * cfg.timeout_s
        build = self._build_in_server if self.reuse_processes else self._build_in_own_process
        with self.pool.gate(gpu).shared():  # never while a candidate is timed on this GPU
            built = build(job_dir, secret, gpu, deadline)
        if _out_of_memory(built) and not self._aborted:
            # Beside the other slots' candidates a large problem's reference may not fit; once
            # more with the device to itself, so the problem is judged rather than left out.
            with self.pool.gate(gpu).exclusive():
                built = build(job_dir, secret, gpu, time.monotonic() + 3 * cfg.timeout_s)
        seconds = time.monotonic() - started
        prepared_path = os.path.join(job_dir, "prepared.json")
        if built.timed_out:
            return PreparedProblem(False, f"reference timed out after {3 * cfg.timeout_s:.0f}s")
        if not built.ok:
            return PreparedProblem(False, built.error)
        with open(prepared_path) as fh:
            data = json.load(fh)
        loading = time.monotonic()
        inputs = _private_copy(load_tensors(os.path.join(job_dir, "inputs.safetensors")))
        expected = _private_copy(load_tensors(os.path.join(job_dir, "expected.safetensors")))
        phases = {str(k): float(v) for k, v in (data.get("phase_s") or {}).items()}
        phases["load"] = round(time.monotonic() - loading, 4)
        prepared = PreparedProblem(
            True, directory=job_dir, source=data["problem_source"], init=data["init"],
            inits=data.get("inits") or [data["init"]], sets=data["sets"],
            inputs=inputs, expected=expected,
            skipped=data["skipped"], unanswered=list(data.get("unanswered") or []), notes=data["notes"], shrunk=bool(data.get("shrunk")), seconds=seconds,
            problem_numel=int(data.get("problem_numel") or 0),
            phases=phases,
            param_seed=int(secret["param_seed"]), param_keys=list(data["param_keys"]),
            model_bytes=int(data["model_bytes"]),
        )
        # Inputs and expected outputs live in the parent's memory only.
        shutil.rmtree(job_dir, ignore_errors=True)
        return prepared


def _private_copy(tensors: dict) -> dict:
    """Tensors in this process's own memory. safetensors may map the file instead, and a mapped
    page still follows the file until it is written: a process that rewrote the file would then
    change the parent's reference copy."""
    return {name: tensor.clone() for name, tensor in tensors.items()}
