"""Worker slots and the per-GPU gate that keeps timing runs alone on their GPU."""
from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from typing import Optional


class VerifierUnavailable(RuntimeError):
    """No device for the slots (the public face re-raises it as ``VerifierError``)."""


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


class DevicePool:
    """Worker slots. On CUDA each slot is bound to a GPU (round robin) and several workers may share
    a GPU for correctness; timing is serialised per GPU by ``extensions.timing.gpu_lease``."""

    def __init__(self, device: str, workers: int):
        self.device = device
        self._free: list[Optional[int]]
        if device == "cuda":
            import torch

            count = torch.cuda.device_count()
            if count == 0:
                raise VerifierUnavailable("device cuda requested but no CUDA device is visible")
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
        self.gates = {index: GpuGate() for index in set(self._free) if index is not None}

    def gate(self, index: Optional[int]) -> "GpuGate":
        return self.gates.get(index) or NO_GATE

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


class GpuGate:
    """Per-GPU readers/writer gate in this process: correctness runs share the GPU, a timing run
    has it alone (writers first, so timing never starves). The caller's own GPU work (the RL
    sampler's decode, ``host``) keeps timing off the GPU but not correctness runs: while it holds
    the GPU a waiting timing run does not hold readers back, since it could not start anyway; the
    host's next hold waits for the timing runs queued meanwhile."""

    def __init__(self):
        self._cond = threading.Condition()
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0
        self._hosts = 0

    @contextmanager
    def shared(self):
        with self._cond:
            while self._writer or (self._writers_waiting and not self._hosts):
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
            while self._writer or self._readers or self._hosts:
                self._cond.wait()
            self._writers_waiting -= 1
            self._writer = True
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                self._cond.notify_all()

    @contextmanager
    def host(self):
        with self._cond:
            while self._writer or self._writers_waiting:
                self._cond.wait()
            self._hosts += 1
        try:
            yield
        finally:
            with self._cond:
                self._hosts -= 1
                self._cond.notify_all()


NO_GATE = GpuGate()
