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
    """The verifier's own comparison (structure, shape, dtype, NaN/Inf positions, tolerances and
    the relative-error bound), so the timer is never more lenient than correctness was."""
    from extensions.verify.compare import compare_outputs

    if not flatten_tensors(reference):
        return False
    return compare_outputs(candidate, reference, config) is None


def fingerprint(output: Any) -> list:
    """Per output tensor: its sum, a weighted sum (fixed pseudo-random weights in [0, 1)) and the
    sum of absolute values, in float64 on the output's device (no host synchronisation)."""
    import torch

    prints = []
    for tensor in flatten_tensors(output):
        values = torch.nan_to_num(tensor.detach().reshape(-1).to(torch.float64), nan=0.0, posinf=0.0, neginf=0.0)
        positions = torch.arange(values.numel(), device=values.device, dtype=torch.float64)
        weights = torch.frac(positions * 0.6180339887498949)
        prints.append((torch.stack([values.sum(), (values * weights).sum(), values.abs().sum()]), values.numel(),
                       tensor.dtype))
    return prints


def fingerprints_close(reference: list, candidate: list, config: Any) -> bool:
    """Whether two outputs' fingerprints differ by no more than element-wise closeness allows:
    with |c - r| <= atol + rtol * |r| everywhere, a sum weighted by w in [0, 1] moves by at most
    n * atol + rtol * sum|r|. Cheap enough for every timed call."""
    import torch

    if len(reference) != len(candidate):
        return False
    for (ref, n_ref, dtype_ref), (cand, n_cand, dtype_cand) in zip(reference, candidate):
        if n_ref != n_cand or dtype_ref != dtype_cand:
            return False
        if dtype_ref in (torch.float32, torch.float64):
            atol, rtol = config.atol_fp32, config.rtol_fp32
        else:
            atol, rtol = config.atol_low_precision, config.rtol_low_precision
        bound = n_ref * atol + rtol * float(ref[2]) + 1e-9
        difference = (cand[:2] - ref[:2]).abs().max()
        if float(difference) > bound:
            return False
    return True


def timer_bindings() -> list:
    """What the timer reads its clocks through, as bound now: a candidate that rebinds any of these
    (a class attribute of ``torch.cuda.Event``, ``torch.cuda.synchronize``, ``time.perf_counter``)
    is caught by comparing with the bindings taken before it ran."""
    import torch

    bound = [(time, "perf_counter"), (time, "perf_counter_ns"), (time, "monotonic")]
    if torch.cuda.is_available():
        bound += [(torch.cuda, "Event"), (torch.cuda, "synchronize"), (torch.cuda, "current_stream")]
        bound += [(torch.cuda.Event, name) for name in ("record", "elapsed_time", "synchronize", "query")]
    return [(owner, name, getattr(owner, name, None)) for owner, name in bound]


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
        self._prints: dict[str, list] = {}
        self._previous_candidate: Any = None  # kept alive so its storage cannot be handed out again
        self._timer_bindings = timer_bindings()

    @property
    def num_input_sets(self) -> int:
        return self.inputs.count

    def load(self, index: int) -> None:
        self.inputs.load(index)

    def outputs_agree(self) -> bool:
        return outputs_close(self._last[REFERENCE], self._last[CANDIDATE], self.config)

    def fingerprints_agree(self) -> bool:
        return fingerprints_close(self._prints[REFERENCE], self._prints[CANDIDATE], self.config)

    def timers_intact(self) -> bool:
        return all(getattr(owner, name, None) is value for owner, name, value in self._timer_bindings)

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
        self._prints[role] = fingerprint(output)  # after the timed region: costs no measured time
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
