"""Trial runners: the code that actually calls the models and reads the clocks.

``CudaTrialRunner`` is the GPU timer (L2 flush, CUDA events, device-wide synchronisation, host
wall-clock cross-check). ``HostTrialRunner`` times with the host clock only: CPU runs, tests and the
benchmark's dry run. Both feed the models from fixed "live" input buffers into which the input set
is copied before every call, so the candidate sees the same addresses with new contents (an output
cache keyed on addresses or tensor identity returns stale results, which the output checks catch)
and each call sees the set as drawn, whatever a model working in place did to it before.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Optional, Sequence

from extensions.timing.cuda_trace import read_device_events
from extensions.timing.report import LAUNCH_COSTS, LAUNCH_EXCLUDED, LAUNCH_INCLUDED
from extensions.timing.schedule import CANDIDATE, REFERENCE, CallTiming
from extensions.timing.tensors import (flatten_tensors, group_span, held_elsewhere, plain_output, storage_groups,
                                       stored_stretch, view_span, views_over, with_elements)

# The caller's output comparison: ``compare(candidate, reference, config)`` is None when the two
# agree and describes the first difference otherwise. The verifier hands in its own, so the timer
# is never more lenient than correctness was, without the timer importing the verifier.
OutputComparison = Callable[[Any, Any, Any], Any]
# The caller's localisation of a disagreement: ``localise(candidate, reference, config)`` is, per
# output tensor, the flat indices where the two disagree element by element (None where none),
# or None when they disagree otherwise or at too many elements (the verifier's
# ``disagreeing_elements``).
OutputLocalisation = Callable[[Any, Any, Any], Optional[list]]

# Bytes to write per flush when the device does not report its L2 size (covers H100/H200's 50 MB).
FALLBACK_FLUSH_BYTES = 256 * 1024 * 1024
# The flush buffer is this many times the L2 size.
FLUSH_L2_MULTIPLE = 2

# The launch gate: first guess, floor, ceiling and margin over the host's enqueue time.
GATE_FIRST_MS = 1.0
GATE_FIRST_CYCLES_PER_MS = 1.5e6  # a 1.5 GHz SM clock; corrected by the first gate's events
GATE_MIN_MS = 0.05
GATE_MIN_CYCLES = 1000
GATE_MAX_MS = 50.0
# The gate outlasts the slowest of the role's last GATE_HISTORY enqueue times by GATE_MARGIN
# times, and by GATE_HEADROOM_MS at least: a host hiccup of a tenth of a millisecond (seen on
# virtualised hosts) must not open it early.
GATE_MARGIN = 3.0
GATE_HEADROOM_MS = 0.2
GATE_HISTORY = 8

# Outputs above this many elements are compared a slice at a time: the comparison works in
# float64 with several temporaries of the output's size, which a multi-GB output cannot have
# beside the timer's own buffers on an 80 GB GPU. (The verifier caps inputs far below this.)
COMPARE_SLICE = 1 << 27
# Elements fingerprinted at a time (float64 temporaries of 512 MB each).
FINGERPRINT_CHUNK = 1 << 26

# Bound once at import so a candidate that rebinds time.perf_counter later cannot fool the
# wall-clock cross-check.
_perf_counter = time.perf_counter


def outputs_close(reference: Any, candidate: Any, config: Any, compare_outputs: OutputComparison) -> bool:
    """``compare_outputs``, the caller's comparison (the verifier's: structure, shape, dtype, NaN/Inf
    positions, tolerances and the relative-error bound), a slice at a time on large outputs."""
    tensors = flatten_tensors(reference)
    if not tensors:
        return False
    if max(t.numel() for t in tensors) <= COMPARE_SLICE:
        return compare_outputs(candidate, reference, config) is None
    return _sliced_outputs_close(reference, candidate, config, compare_outputs)


def _sliced_outputs_close(reference: Any, candidate: Any, config: Any, compare_outputs: OutputComparison) -> bool:
    """``compare_outputs`` on matching slices of each tensor above ``COMPARE_SLICE`` elements, after
    checking structure, shape and dtype whole. The element-wise rules are the same per slice; the
    relative-error bound holding on every slice implies it for the whole tensor."""
    import torch

    if isinstance(reference, torch.Tensor):
        if not isinstance(candidate, torch.Tensor) or candidate.shape != reference.shape \
                or candidate.dtype != reference.dtype:
            return False
        flat_ref, flat_cand = reference.reshape(-1), candidate.reshape(-1)
        return all(
            compare_outputs(flat_cand[begin:begin + COMPARE_SLICE], flat_ref[begin:begin + COMPARE_SLICE], config) is None
            for begin in range(0, flat_ref.numel(), COMPARE_SLICE)
        )
    if isinstance(reference, (list, tuple)):
        return isinstance(candidate, (list, tuple)) and len(candidate) == len(reference) and all(
            _sliced_outputs_close(r, c, config, compare_outputs) for r, c in zip(reference, candidate))
    return compare_outputs(candidate, reference, config) is None


def fingerprint(output: Any) -> list:
    """Per output tensor: its sum, a weighted sum (fixed pseudo-random weights in [0, 1)) and the
    sum of absolute values, in float64 on the output's device (no host synchronisation).

    Worked through in chunks of ``FINGERPRINT_CHUNK`` elements: float64 temporaries of a whole
    multi-GB output are several times its size, and on a GPU with little headroom they force the
    caching allocator to return memory to the driver and ask for it again inside timed calls.
    """
    import torch

    prints = []
    for tensor in flatten_tensors(output):
        flat = tensor.detach().reshape(-1)
        sums = torch.zeros(3, dtype=torch.float64, device=flat.device)
        for begin in range(0, flat.numel(), FINGERPRINT_CHUNK):
            chunk = flat[begin:begin + FINGERPRINT_CHUNK]
            values = torch.nan_to_num(chunk.to(torch.float64), nan=0.0, posinf=0.0, neginf=0.0)
            positions = torch.arange(begin, begin + chunk.numel(), device=flat.device, dtype=torch.float64)
            weights = torch.frac(positions * 0.6180339887498949)
            sums += torch.stack([values.sum(), (values * weights).sum(), values.abs().sum()])
        prints.append((sums, flat.numel(), tensor.dtype))
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
        bound += [(torch.cuda, "Event"), (torch.cuda, "synchronize"), (torch.cuda, "current_stream"),
                  (torch.cuda, "_sleep")]
        bound += [(torch.cuda.Event, name) for name in ("record", "elapsed_time", "synchronize", "query")]
    return [(owner, name, getattr(owner, name, None)) for owner, name in bound]


def _structure(input_set: Sequence[Any]) -> list:
    import torch

    return [
        (tuple(x.shape), x.dtype, tuple(x.stride()), x.storage_offset(), x.device)
        if isinstance(x, torch.Tensor) else "value"
        for x in input_set
    ] + [storage_groups(list(input_set))]


def _fixed_buffer(x: Any) -> tuple[Any, int]:
    """An empty tensor laid out as ``x`` (shape, strides and storage offset, a sliced or expanded
    view's included: a kernel is timed on the layout it was judged on) and how many elements of
    its storage loading copies, the values between a view's elements included."""
    import torch

    if x.numel() == 0:
        return torch.empty_like(x), 0
    shape, strides, offset = list(x.shape), list(x.stride()), x.storage_offset()
    span = view_span(shape, strides, offset)
    return torch.empty(span, dtype=x.dtype, device=x.device).as_strided(shape, strides, offset), span


class _LiveInputs:
    """Fixed argument buffers that each input set is copied into before every timed call."""

    def __init__(self, input_sets: Sequence[Sequence[Any]]):
        if not input_sets:
            raise ValueError("timing needs at least one input set, got none")
        self.input_sets = [list(s) for s in input_sets]
        first = _structure(self.input_sets[0])
        mismatched = [i for i, s in enumerate(self.input_sets) if _structure(s) != first]
        # Sets of other shapes cannot share buffers: each gets buffers of its own, so a model that
        # writes into its inputs never changes the set itself.
        self.copies_into_fixed_buffers = not mismatched
        self._buffers: dict[int, tuple[list, dict[int, int]]] = {}
        self.args = self._buffers_for(0)[0]
        self.loaded: Optional[int] = None

    def _buffers_for(self, index: int) -> tuple[list, dict[int, int]]:
        import torch

        key = 0 if self.copies_into_fixed_buffers else index
        if key not in self._buffers:
            input_set = self.input_sets[key]
            # Inputs that share a storage (``[x, x]``, two slices of one matrix) share one buffer,
            # as they were judged: a kernel is timed on the aliasing it was judged on, and a model
            # writing into one input sees the other change, as on the problem's own call.
            shared: dict[int, tuple[Any, int]] = {}
            for members in storage_groups(input_set):
                span = group_span(input_set, members)
                first = input_set[members[0]]
                buffer = torch.empty(span, dtype=first.dtype, device=first.device)
                for position, view in views_over(buffer, input_set, members).items():
                    shared[position] = (view, span)
            args, spans = [], {}
            for position, x in enumerate(input_set):
                if isinstance(x, torch.Tensor):
                    x, spans[position] = shared[position] if position in shared else _fixed_buffer(x)
                args.append(x)
            self._buffers[key] = (args, spans)
        return self._buffers[key]

    @property
    def count(self) -> int:
        return len(self.input_sets)

    # The live buffers were in the candidate's hands, which may have given them instance attributes
    # (``x.copy_ = f``): they are written and read through torch's own methods, called unbound, so
    # nothing the candidate attached runs between timed calls.
    def load(self, index: int) -> None:
        import torch

        args, spans = self._buffers_for(index)
        for position, value in enumerate(self.input_sets[index]):
            if isinstance(value, torch.Tensor):
                span = spans[position]
                torch._C.TensorBase.copy_(stored_stretch(args[position], span), stored_stretch(value, span))
            else:
                args[position] = value
        self.args = args
        self.loaded = index

    def data_pointers(self) -> set[int]:
        import torch

        return {torch._C.TensorBase.data_ptr(x) for x in self.args if isinstance(x, torch.Tensor)}

    def storages(self) -> set[int]:
        import torch

        return {torch.Tensor.untyped_storage(x).data_ptr() for x in self.args if isinstance(x, torch.Tensor)}


class _RunnerBase:
    def __init__(self, reference, candidate, input_sets, config, compare_outputs: OutputComparison,
                 localise: Optional[OutputLocalisation] = None):
        self.models = {REFERENCE: reference, CANDIDATE: candidate}
        self.inputs = _LiveInputs(input_sets)
        self.config = config
        self.compare_outputs = compare_outputs
        self.localise = localise
        self._last: dict[str, Any] = {}
        self._prints: dict[str, list] = {}
        # Each role's output before the last, kept alive so its storage cannot be handed out again.
        # Kept for the reference too: both models then allocate against the same allocator state,
        # so the same module timed against itself lands its outputs alike.
        self._previous: dict[str, Any] = {REFERENCE: None, CANDIDATE: None}
        self._timer_bindings = timer_bindings()

    @property
    def num_input_sets(self) -> int:
        return self.inputs.count

    def load(self, index: int) -> None:
        self.inputs.load(index)

    def outputs_agree(self) -> bool:
        return outputs_close(self._last[REFERENCE], self._last[CANDIDATE], self.config, self.compare_outputs)

    def fingerprints_agree(self) -> bool:
        return fingerprints_close(self._prints[REFERENCE], self._prints[CANDIDATE], self.config)

    def localised_disagreement(self) -> Optional[list]:
        """Where the last outputs, which do not agree, disagree at a few elements only: per output
        tensor None or (flat indices, the candidate's values there, on the host), when the
        candidate's output with those elements taken from the reference's agrees under the full
        comparison; else None. The reference's own ambiguous elements (a floor whose argument lies
        within rounding of a step) disagree so; whether these are such elements is for the
        caller to judge, which alone knows them."""
        if self.localise is None:
            return None
        reference, candidate = self._last[REFERENCE], self._last[CANDIDATE]
        places = self.localise(candidate, reference, self.config)
        outputs, references = flatten_tensors(candidate), flatten_tensors(reference)
        if places is None or len(places) != len(outputs) or len(outputs) != len(references):
            return None
        from_reference = [None if index is None else (index, ref.reshape(-1)[index])
                          for ref, index in zip(references, places)]
        if not outputs_close(reference, with_elements(candidate, from_reference), self.config, self.compare_outputs):
            return None
        return [None if index is None else (index.to("cpu"), out.reshape(-1)[index].to("cpu"))
                for out, index in zip(outputs, places)]

    def output_on_host(self) -> Any:
        """A host copy of the candidate's last output, taken now: the candidate cannot change
        what the caller will judge by writing into its earlier output later."""
        import torch

        def copy(value):
            if isinstance(value, torch.Tensor):
                return value.detach().to("cpu", copy=True)
            if isinstance(value, (list, tuple)):
                return type(value)(copy(v) for v in value)
            return value

        return copy(self._last[CANDIDATE])

    def timers_intact(self) -> bool:
        return all(getattr(owner, name, None) is value for owner, name, value in self._timer_bindings)

    def output(self, role: str) -> Any:
        return self._last[role]

    def _forward(self, role: str):
        import torch

        with torch.no_grad():
            return self.models[role](*self.inputs.args)

    def _keep_output(self, role: str, handed: list) -> bool:
        """Stores the output, which the caller hands over as the one item of ``handed`` and no
        longer holds (a reference of the caller's would count as one the model keeps); returns
        whether a candidate returned a storage it or the timer still holds.

        The output is first replaced by plain aliases of torch's own tensor types (``plain_output``;
        another type raises): its reuse check, fingerprint and comparison then call nothing the
        model's code defined, and no such code runs after the timed region."""
        output = plain_output(handed.pop())
        reused = False
        if role == CANDIDATE:
            earlier = {t.data_ptr() for t in flatten_tensors(self._previous[CANDIDATE])}
            earlier |= {t.data_ptr() for t in flatten_tensors(self._last.get(CANDIDATE))}
            earlier -= self.inputs.data_pointers()  # a view of its input is not a cached result
            earlier.discard(0)
            reused = any(t.data_ptr() in earlier for t in flatten_tensors(output))
            # Only the last two outputs are held here, so a ring of three buffers, or views of one
            # arena at moving offsets, would pass that test: a storage the model still holds is a
            # buffer it returns again.
            reused = reused or bool(held_elsewhere(output, self.inputs.storages()))
        self._previous[role] = self._last.get(role)
        self._last[role] = output
        self._prints[role] = fingerprint(output)  # after the timed region: costs no measured time
        return reused


class HostTrialRunner(_RunnerBase):
    """Host-clock timing (no events, no cache flush): CPU runs and the benchmark's dry run."""

    method = "paired-interleaved/host-clock/rotating-inputs/order-balanced-median/bootstrap-ci"
    launch_cost = LAUNCH_INCLUDED  # the host clock runs from before forward is called

    def time_call(self, role: str) -> CallTiming:
        started = _perf_counter()
        handed = [self._forward(role)]
        wall_ms = (_perf_counter() - started) * 1000.0
        reused = self._keep_output(role, handed)
        return CallTiming(stream_ms=wall_ms, device_ms=wall_ms, wall_ms=wall_ms, output_reused=reused,
                          hidden_ms=0.0)


def l2_flush_bytes(device) -> int:
    """Twice the device's L2 cache (``L2_cache_size`` of the CUDA device properties)."""
    import torch

    l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 0
    return FLUSH_L2_MULTIPLE * int(l2) if l2 > 0 else FALLBACK_FLUSH_BYTES


class CudaTrialRunner(_RunnerBase):
    """CUDA-event timing with an L2 flush before every call and a device-wide end of region.

    Per call: flush L2 (write a buffer twice its size), synchronise the device, read the host
    clock; with ``launch_cost: excluded`` hold the stream in a gate (see ``LaunchGate``); record
    ``start``, run forward, record ``end_stream`` on the calling stream. Then wait for that event
    alone, record ``mark``, synchronise the whole device (work the model left on ANY stream), read
    the host clock and record ``settled``.

    ``end_stream - start`` is the precise time of same-stream work. ``settled - mark`` is what the
    device still had to do once the calling stream was done, plus one host round trip: both events
    are recorded by a host that is already awake, so the wake-up latency after a long wait is in
    neither. The round trip itself is not a constant (it was seen 15 us longer after some PyTorch
    modules than after others on an H100 host), so the same round trip is timed again right after
    (``control_mark`` to ``control_settled``), when nothing can be pending, and ``hidden_ms`` is the
    difference: work left on other streams, and nothing else. The schedule compares it with the
    reference's and charges ``settled - start`` minus the reference's own post-stream window when
    it finds some. The host interval cross-checks both.
    """

    def __init__(self, reference, candidate, input_sets, config, compare_outputs: OutputComparison, device=None,
                 localise: Optional[OutputLocalisation] = None):
        import torch

        super().__init__(reference, candidate, input_sets, config, compare_outputs, localise)
        if device is None:
            device = next(
                (x.device for x in self.inputs.input_sets[0] if isinstance(x, torch.Tensor) and x.is_cuda),
                torch.device("cuda", torch.cuda.current_device()),
            )
        self.device = torch.device(device)
        self.use_events = bool(getattr(config, "timing_use_events", True))
        launch_cost = str(getattr(config, "timing_launch_cost", LAUNCH_EXCLUDED))
        if launch_cost not in LAUNCH_COSTS:
            raise ValueError(f"timing_launch_cost must be one of {', '.join(LAUNCH_COSTS)}, got {launch_cost!r}")
        self.gate = LaunchGate() if launch_cost == LAUNCH_EXCLUDED and self.use_events else None
        self.launch_cost = LAUNCH_EXCLUDED if self.gate is not None else LAUNCH_INCLUDED
        self.flush_buffer = torch.empty(l2_flush_bytes(self.device) // 4, dtype=torch.int32, device=self.device)
        self.events = {
            role: {name: torch.cuda.Event(enable_timing=True)
                   for name in ("gate", "start", "end_stream", "mark", "settled", "control_mark", "control_settled")}
            for role in (REFERENCE, CANDIDATE)
        }
        clock = "cuda-events+device-sync+wall-check" if self.use_events else "host-clock+device-sync"
        launch = "gated-launch" if self.gate is not None else "eager-launch"
        self.method = f"paired-interleaved/{clock}/{launch}/l2-flush/rotating-inputs/order-balanced-median/bootstrap-ci"

    def time_call(self, role: str) -> CallTiming:
        import torch

        events = self.events[role]
        stream = torch.cuda.current_stream(self.device)
        gated = self.gate is not None and self.gate.active(role)
        self.flush_buffer.zero_()
        torch.cuda.synchronize(self.device)
        started = _perf_counter()
        if gated:
            cycles = self.gate.cycles(role)
            events["gate"].record(stream)
            torch.cuda._sleep(cycles)
        events["start"].record(stream)
        handed = [self._forward(role)]
        events["end_stream"].record(stream)
        # Still waiting at the gate once everything is queued: no host launch time is in the region.
        held = gated and not events["start"].query()
        enqueue_ms = (_perf_counter() - started) * 1000.0
        events["end_stream"].synchronize()
        events["mark"].record(stream)
        torch.cuda.synchronize(self.device)
        wall_ms = (_perf_counter() - started) * 1000.0
        events["settled"].record(stream)
        events["settled"].synchronize()
        # The same round trip once more, on a device with nothing left to do: what the host's
        # state right after this call adds to such a window, without any pending work in it.
        events["control_mark"].record(stream)
        torch.cuda.synchronize(self.device)
        events["control_settled"].record(stream)
        events["control_settled"].synchronize()
        reused = self._keep_output(role, handed)
        gate_ms = events["gate"].elapsed_time(events["start"]) if gated else 0.0
        if gated:
            self.gate.update(role, cycles, gate_ms, enqueue_ms, held)
        wall_ms -= gate_ms  # the host waited out the gate; the events start after it
        if not self.use_events:
            return CallTiming(stream_ms=wall_ms, device_ms=wall_ms, wall_ms=wall_ms, output_reused=reused,
                              hidden_ms=0.0)
        round_trip_ms = events["control_mark"].elapsed_time(events["control_settled"])
        return CallTiming(
            stream_ms=events["start"].elapsed_time(events["end_stream"]),
            device_ms=events["start"].elapsed_time(events["settled"]),
            wall_ms=wall_ms,
            output_reused=reused,
            hidden_ms=events["mark"].elapsed_time(events["settled"]) - round_trip_ms,
            round_trip_ms=round_trip_ms,
            launch_excluded=held,
        )

    def trace_streams(self, calls: int) -> dict:
        """The streams the candidate's GPU work ran on over ``calls`` forwards, as the CUDA profiler
        (CUPTI, which sees every kernel, copy and fill of the process, whatever launched it) records
        them. Each call first runs a probe fill on the calling stream, so the first traced event
        names that stream. Returns ``calls``, ``on_calling_stream`` (events there, probes included)
        and ``elsewhere`` (events on any other stream)."""
        import os

        import torch
        from torch.profiler import ProfilerActivity, profile

        torch.cuda.synchronize(self.device)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiler:
            for call in range(calls):
                self.load(call % self.num_input_sets)
                torch.empty(1, device=self.device).fill_(0)
                self._forward(CANDIDATE)
            torch.cuda.synchronize(self.device)
        traced = read_device_events(profiler, os.path.join(os.getcwd(), "timing_stream_trace.json"))
        events = sorted((event.ts, event.stream) for event in traced)
        if not events:
            return {"calls": calls, "on_calling_stream": 0, "elsewhere": 0}
        calling = events[0][1]
        on_stream = sum(stream == calling for _ts, stream in events)
        return {"calls": calls, "on_calling_stream": on_stream, "elsewhere": len(events) - on_stream}


class LaunchGate:
    """Holds the calling stream in a spin kernel (``torch.cuda._sleep``) while the host enqueues
    one call, so the timed region opens with the whole call already queued: the device runs it back
    to back, as it does for a caller that launches ahead of the GPU, and the host's launch time
    (Python, the Triton launcher, the driver) is outside the measurement.

    The gate is sized per role from the host's enqueue times of that role's recent calls (see
    ``GATE_MARGIN``), in spin cycles converted with the rate the last gate showed. A gate that opened
    before the host finished enqueuing (the call waited for the device, or the host stalled) is
    reported by the call, and the role's next gate is twice as long; a role whose gate opens early
    even at ``GATE_MAX_MS`` is timed without a gate from then on.
    """

    def __init__(self):
        self.cycles_per_ms = GATE_FIRST_CYCLES_PER_MS
        self.target_ms = {REFERENCE: GATE_FIRST_MS, CANDIDATE: GATE_FIRST_MS}
        self.enqueue_ms: dict[str, list[float]] = {REFERENCE: [], CANDIDATE: []}
        self.abandoned: set[str] = set()

    def active(self, role: str) -> bool:
        return role not in self.abandoned

    def cycles(self, role: str) -> int:
        return max(GATE_MIN_CYCLES, int(self.target_ms[role] * self.cycles_per_ms))

    def update(self, role: str, cycles: int, gate_ms: float, enqueue_ms: float, held: bool) -> None:
        if gate_ms > GATE_MIN_MS / 2:
            self.cycles_per_ms = cycles / gate_ms
        recent = self.enqueue_ms[role]
        if held:  # an early-opened gate's enqueue time may hold compilation or a wait for the device
            recent.append(enqueue_ms)
            del recent[:-GATE_HISTORY]
        slowest = max(recent, default=enqueue_ms)
        wanted = max(GATE_MARGIN * slowest, slowest + GATE_HEADROOM_MS, GATE_MIN_MS)
        if not held:
            if self.target_ms[role] >= GATE_MAX_MS:
                self.abandoned.add(role)
            wanted = max(wanted, 2.0 * self.target_ms[role])
        self.target_ms[role] = min(wanted, GATE_MAX_MS)
