"""Trial runners: the code that actually calls the models and reads the clocks.

``CudaTrialRunner`` is the GPU timer (L2 flush, CUDA events, device-wide synchronisation, host
wall-clock cross-check). ``HostTrialRunner`` times with the host clock only: CPU runs, tests and the
benchmark's dry run. Both feed the models from fixed "live" input buffers into which each input set
is copied before its pair, so the candidate sees the same addresses with new contents: an output
cache keyed on addresses or tensor identity returns stale results, which the output checks catch.
"""
from __future__ import annotations

import time
from typing import Any, Optional, Sequence

from extensions.timing.schedule import CANDIDATE, REFERENCE, CallTiming

# Bytes to write per flush when the device does not report its L2 size (covers H100/H200's 50 MB).
FALLBACK_FLUSH_BYTES = 256 * 1024 * 1024
# The flush buffer is this many times the L2 size.
FLUSH_L2_MULTIPLE = 2

# Bound once at import so a candidate that rebinds time.perf_counter later cannot fool the
# wall-clock cross-check.
_perf_counter = time.perf_counter


def flatten_tensors(output: Any) -> list:
    """The tensors of a model output (a tensor, or nested tuples/lists of them), in order."""
    import torch

    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, (tuple, list)):
        tensors = []
        for item in output:
            tensors.extend(flatten_tensors(item))
        return tensors
    return []


def outputs_close(reference: Any, candidate: Any, config: Any) -> bool:
    """Same structure, shapes and dtypes, and values within the verifier's tolerances."""
    import torch

    ref_tensors, cand_tensors = flatten_tensors(reference), flatten_tensors(candidate)
    if len(ref_tensors) != len(cand_tensors) or not ref_tensors:
        return False
    for ref, cand in zip(ref_tensors, cand_tensors):
        if ref.shape != cand.shape or ref.dtype != cand.dtype:
            return False
        if ref.dtype in (torch.float32, torch.float64):
            atol, rtol = config.atol_fp32, config.rtol_fp32
        else:
            atol, rtol = config.atol_low_precision, config.rtol_low_precision
        if ref.is_floating_point() or ref.is_complex():
            if not torch.allclose(cand, ref, atol=atol, rtol=rtol, equal_nan=True):
                return False
        elif not torch.equal(cand, ref):
            return False
    return True


def _structure(input_set: Sequence[Any]) -> list:
    import torch

    return [
        (tuple(x.shape), x.dtype, tuple(x.stride()), x.device) if isinstance(x, torch.Tensor) else "value"
        for x in input_set
    ]


class _LiveInputs:
    """Fixed argument buffers that each input set is copied into before its pair."""

    def __init__(self, input_sets: Sequence[Sequence[Any]]):
        import torch

        if not input_sets:
            raise ValueError("timing needs at least one input set, got none")
        self.input_sets = [list(s) for s in input_sets]
        first = _structure(self.input_sets[0])
        mismatched = [i for i, s in enumerate(self.input_sets) if _structure(s) != first]
        # Sets of other shapes cannot share buffers; they are passed as they are.
        self.copies_into_fixed_buffers = not mismatched
        if self.copies_into_fixed_buffers:
            self.args = [torch.empty_like(x) if isinstance(x, torch.Tensor) else x for x in self.input_sets[0]]
        else:
            self.args = list(self.input_sets[0])
        self.loaded: Optional[int] = None

    @property
    def count(self) -> int:
        return len(self.input_sets)

    def load(self, index: int) -> None:
        import torch

        source = self.input_sets[index]
        if self.copies_into_fixed_buffers:
            for position, value in enumerate(source):
                if isinstance(value, torch.Tensor):
                    self.args[position].copy_(value)
                else:
                    self.args[position] = value
        else:
            self.args = list(source)
        self.loaded = index

    def data_pointers(self) -> set[int]:
        import torch

        return {x.data_ptr() for x in self.args if isinstance(x, torch.Tensor)}


class _RunnerBase:
    def __init__(self, reference, candidate, input_sets, config):
        self.models = {REFERENCE: reference, CANDIDATE: candidate}
        self.inputs = _LiveInputs(input_sets)
        self.config = config
        self._last: dict[str, Any] = {}
        self._previous_candidate: Any = None  # kept alive so its storage cannot be handed out again

    @property
    def num_input_sets(self) -> int:
        return self.inputs.count

    def load(self, index: int) -> None:
        self.inputs.load(index)

    def outputs_agree(self) -> bool:
        return outputs_close(self._last[REFERENCE], self._last[CANDIDATE], self.config)

    def output(self, role: str) -> Any:
        return self._last[role]

    def _forward(self, role: str):
        import torch

        with torch.no_grad():
            return self.models[role](*self.inputs.args)

    def _keep_output(self, role: str, output: Any) -> bool:
        """Stores the output; returns whether a candidate returned a still-held earlier storage."""
        reused = False
        if role == CANDIDATE:
            earlier = {t.data_ptr() for t in flatten_tensors(self._previous_candidate)}
            earlier |= {t.data_ptr() for t in flatten_tensors(self._last.get(CANDIDATE))}
            earlier -= self.inputs.data_pointers()  # a view of its input is not a cached result
            earlier.discard(0)
            reused = any(t.data_ptr() in earlier for t in flatten_tensors(output))
            self._previous_candidate = self._last.get(CANDIDATE)
        self._last[role] = output
        return reused


class HostTrialRunner(_RunnerBase):
    """Host-clock timing (no events, no cache flush): CPU runs and the benchmark's dry run."""

    method = "paired-interleaved/host-clock/rotating-inputs/median-of-ratios/bootstrap-ci"

    def time_call(self, role: str) -> CallTiming:
        started = _perf_counter()
        output = self._forward(role)
        wall_ms = (_perf_counter() - started) * 1000.0
        reused = self._keep_output(role, output)
        return CallTiming(stream_ms=wall_ms, device_ms=wall_ms, wall_ms=wall_ms, output_reused=reused)


def l2_flush_bytes(device) -> int:
    """Twice the device's L2 cache (``L2_cache_size`` of the CUDA device properties)."""
    import torch

    l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 0
    return FLUSH_L2_MULTIPLE * int(l2) if l2 > 0 else FALLBACK_FLUSH_BYTES


class CudaTrialRunner(_RunnerBase):
    """CUDA-event timing with an L2 flush before every call and a device-wide end of region.

    Per call: flush L2 (write a buffer twice its size), synchronise the device, read the host
    clock, record ``start`` on the calling stream, run forward, record ``end_stream`` on that
    stream, synchronise the whole device (work the model left on ANY stream), read the host clock,
    record ``end_device``. ``end_stream - start`` is the precise time of same-stream work;
    ``end_device - start`` bounds work on every stream (plus synchronisation latency, which the
    schedule subtracts using the reference's own latency); the host interval cross-checks both.
    """

    def __init__(self, reference, candidate, input_sets, config, device=None):
        import torch

        super().__init__(reference, candidate, input_sets, config)
        if device is None:
            device = next(
                (x.device for x in self.inputs.input_sets[0] if isinstance(x, torch.Tensor) and x.is_cuda),
                torch.device("cuda", torch.cuda.current_device()),
            )
        self.device = torch.device(device)
        self.use_events = bool(getattr(config, "timing_use_events", True))
        self.flush_buffer = torch.empty(l2_flush_bytes(self.device) // 4, dtype=torch.int32, device=self.device)
        self.events = {
            role: tuple(torch.cuda.Event(enable_timing=True) for _ in range(3)) for role in (REFERENCE, CANDIDATE)
        }
        clock = "cuda-events+device-sync+wall-check" if self.use_events else "host-clock+device-sync"
        self.method = f"paired-interleaved/{clock}/l2-flush/rotating-inputs/median-of-ratios/bootstrap-ci"

    def time_call(self, role: str) -> CallTiming:
        import torch

        start, end_stream, end_device = self.events[role]
        stream = torch.cuda.current_stream(self.device)
        self.flush_buffer.zero_()
        torch.cuda.synchronize(self.device)
        started = _perf_counter()
        start.record(stream)
        output = self._forward(role)
        end_stream.record(stream)
        torch.cuda.synchronize(self.device)
        wall_ms = (_perf_counter() - started) * 1000.0
        end_device.record(stream)
        end_device.synchronize()
        reused = self._keep_output(role, output)
        if not self.use_events:
            return CallTiming(stream_ms=wall_ms, device_ms=wall_ms, wall_ms=wall_ms, output_reused=reused)
        return CallTiming(
            stream_ms=start.elapsed_time(end_stream),
            device_ms=start.elapsed_time(end_device),
            wall_ms=wall_ms,
            output_reused=reused,
        )
