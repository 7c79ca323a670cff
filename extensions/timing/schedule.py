"""The timing schedule: warm-up, budget planning, interleaved paired trials over rotating inputs,
re-measurement of unstable results, the fresh-input memoisation probe, and the verdict.

Everything here is device-free: it drives a ``TrialRunner`` (the CUDA runner on a GPU, a host-clock
runner on CPU, a simulated one in tests) and a clock, both injected, so the whole policy is tested
on a CPU.
"""
from __future__ import annotations

import gc
import math
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Protocol

from extensions.timing import report as flags
from extensions.timing.report import SpeedupReport
from extensions.timing.stats import PairedSummary, is_stable, median, summarize_pairs
from extensions.timing.tensors import flatten_tensors

REFERENCE = "reference"
CANDIDATE = "candidate"

# Budget mode spends at most this share of the budget warming up (after two pairs).
WARMUP_BUDGET_SHARE = 0.25
# An event/wall mismatch in more than this share of the trials flags the measurement.
WALL_MISMATCH_SHARE = 0.2
# The probe only calls memoisation when the fresh call is also slower by this many milliseconds.
MEMO_MIN_EXCESS_MS = 0.005
MIN_TRIALS_FLOOR = 3
# Candidate calls traced on the GPU (kernels and their streams) when two measurements both show
# more activity after the stream's end than the reference: enough to see a hider that hides in
# some calls only, few enough to cost milliseconds.
TRACED_CALLS = 8
# Distinct small element-wise disagreements (set, elements, values) handed to the caller to judge;
# past these, a new one counts as a mismatch (the caller reads each one's values). A call that
# repeats a kept one on its set is judged with it.
LOCALISED_MAX = 8
# Outputs of checked calls that disagree with the reference's at more elements (or in the
# relative norm), handed whole to the caller to judge, per input set: a correct kernel is
# deterministic or nearly so, and the caller reads each one (as large as the set's output).
WHOLE_PER_SET = 2


class TimingError(RuntimeError):
    """A model raised, or the runner failed, while being timed."""


@dataclass
class CallTiming:
    """One timed call. On a GPU all three clocks start at the same instant (the start event)."""

    stream_ms: float  # to an event on the calling stream, recorded right after forward returned
    device_ms: float  # to an event recorded after a device-wide synchronize (work on any stream)
    wall_ms: float  # host clock around the call and the synchronize
    output_reused: bool = False  # the output's storage is that of an earlier output still held
    # Device work left once the calling stream was done: the window between two events an awake
    # host recorded around a device-wide synchronize, less the same window timed again right after
    # (None: the runner cannot separate it from its wake-up latency).
    hidden_ms: Optional[float] = None
    # One host round trip (event, device-wide synchronize, event) on an idle device, right after.
    round_trip_ms: Optional[float] = None
    launch_excluded: bool = False  # the whole call was queued before its timed region opened


class TrialRunner(Protocol):
    """Runs single timed calls; knows nothing of schedules or statistics."""

    num_input_sets: int
    method: str
    launch_cost: str  # "excluded" or "included": whether host launch time is inside the timed region

    def load(self, index: int) -> None:
        """Make input set ``index`` the arguments of the following calls (not timed)."""

    def time_call(self, role: str) -> CallTiming:
        """Flush caches, then time one call of the ``role`` model on the loaded inputs."""

    def outputs_agree(self) -> bool:
        """Whether the last reference and candidate outputs (same loaded inputs) match."""

    def output(self, role: str) -> Any:
        """The last output of ``role``."""


@dataclass
class PairTrial:
    input_index: int
    reference: CallTiming
    candidate: CallTiming
    reference_first: bool = True


@dataclass
class Measurement:
    pairs: list[PairTrial]
    summary: PairedSummary
    flags: list[str] = field(default_factory=list)
    reference_gap_ms: float = 0.0  # median device-wait after the stream event, reference calls
    wall_overhead_ms: float = 0.0  # median host time around a reference call not seen by events
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class TimingSettings:
    """The timing_* fields of VerifierConfig, validated."""

    mode: str = "budget"
    launch_cost: str = flags.LAUNCH_EXCLUDED
    num_warmup: int = 10
    num_trials: int = 50
    budget_s: float = 2.0
    min_trials: int = 10
    max_trials: int = 1000
    max_cv: float = 0.02
    max_remeasure: int = 2
    review_bound: float = 10.0
    bootstrap_samples: int = 1000
    seed: int = 0
    output_checks: int = 3
    side_stream_tolerance_ms: float = 0.005
    side_stream_min_share: float = 0.1
    wall_slack_ms: float = 1.0
    memo_ratio: float = 1.5

    @classmethod
    def from_config(cls, config: Any) -> "TimingSettings":
        settings = cls(
            mode=str(getattr(config, "timing_mode", "budget")),
            launch_cost=str(getattr(config, "timing_launch_cost", flags.LAUNCH_EXCLUDED)),
            num_warmup=int(config.timing_num_warmup),
            num_trials=int(config.timing_num_trials),
            budget_s=float(config.timing_budget_s),
            min_trials=int(getattr(config, "timing_min_trials", 10)),
            max_trials=int(getattr(config, "timing_max_trials", 1000)),
            max_cv=float(config.timing_max_cv),
            max_remeasure=int(config.timing_max_remeasure),
            review_bound=float(config.speedup_review_bound),
            bootstrap_samples=int(getattr(config, "timing_bootstrap_samples", 1000)),
            seed=int(getattr(config, "timing_seed", 0)),
            output_checks=int(getattr(config, "timing_output_checks", 3)),
            side_stream_tolerance_ms=float(getattr(config, "timing_side_stream_tolerance_us", 5.0)) / 1000.0,
            side_stream_min_share=float(getattr(config, "timing_side_stream_min_share", 0.1)),
            wall_slack_ms=float(getattr(config, "timing_wall_slack_ms", 1.0)),
            memo_ratio=float(getattr(config, "timing_memo_ratio", 1.5)),
        )
        settings.validate()
        return settings

    def validate(self) -> None:
        problems = []
        if self.mode not in ("counts", "budget"):
            problems.append(f"timing_mode must be 'counts' or 'budget', got {self.mode!r}")
        if self.launch_cost not in flags.LAUNCH_COSTS:
            problems.append(f"timing_launch_cost must be one of {', '.join(flags.LAUNCH_COSTS)}, "
                            f"got {self.launch_cost!r}")
        if self.num_warmup < 1:
            problems.append(f"timing_num_warmup must be >= 1, got {self.num_warmup}")
        if self.num_trials < MIN_TRIALS_FLOOR:
            problems.append(f"timing_num_trials must be >= {MIN_TRIALS_FLOOR}, got {self.num_trials}")
        if self.min_trials < MIN_TRIALS_FLOOR:
            problems.append(f"timing_min_trials must be >= {MIN_TRIALS_FLOOR}, got {self.min_trials}")
        if self.max_trials < self.min_trials:
            problems.append(f"timing_max_trials ({self.max_trials}) is below timing_min_trials ({self.min_trials})")
        if self.mode == "budget" and self.budget_s <= 0:
            problems.append(f"timing_budget_s must be > 0 in budget mode, got {self.budget_s}")
        if self.max_remeasure < 0:
            problems.append(f"timing_max_remeasure must be >= 0, got {self.max_remeasure}")
        if not 0.0 <= self.side_stream_min_share < 1.0:
            problems.append(f"timing_side_stream_min_share must be in [0, 1), got {self.side_stream_min_share}")
        if problems:
            raise ValueError("invalid timing config: " + "; ".join(problems))


class SpeedupScheduler:
    """Times ``reference`` against ``candidate`` through ``runner``; ``run()`` returns the report."""

    def __init__(self, runner: TrialRunner, settings: TimingSettings, clock: Callable[[], float] = time.perf_counter):
        if runner.num_input_sets < 1:
            raise ValueError("timing needs at least one input set")
        self.runner = runner
        self.settings = settings
        self.clock = clock
        self._rng = random.Random(settings.seed)
        self._pair_number = 0  # across warm-up and every measurement, so rotation never restarts
        count = runner.num_input_sets
        # The last sets are held back: the candidate first sees them in the final probes. Two
        # probes (when four or more sets allow it and still leave two to rotate through) must
        # both look memoised before the flag is raised, so one disturbed call cannot raise it.
        probes = 2 if count >= 4 else (1 if count >= 2 else 0)
        self.probe_indices: list[int] = list(range(count - probes, count))
        self.rotation = list(range(count - probes))
        self.schedule_log: list[tuple[str, int]] = []  # (phase, input index) of every pair, for tests
        self._reused = 0
        self._mismatches = 0
        self._localised: list = []
        self._whole: list = []

    # --- single pairs ---------------------------------------------------------------------------

    def _next_index(self) -> int:
        return self.rotation[self._pair_number % len(self.rotation)]

    def _run_pair(self, index: int, phase: str, *, check_outputs: bool, candidate_last: bool = False) -> PairTrial:
        # Alternate which model goes first so any first/second position effect cancels over pairs.
        reference_first = candidate_last or self._pair_number % 2 == 0
        order = (REFERENCE, CANDIDATE) if reference_first else (CANDIDATE, REFERENCE)
        self._pair_number += 1
        self.schedule_log.append((phase, index))
        timings: dict[str, CallTiming] = {}
        try:
            # Each call gets the set afresh: a model that works in place (``x.add_(1)``, as some
            # problems do) would otherwise hand the other model, or its own next call, other inputs.
            for role in order:
                self.runner.load(index)
                timings[role] = self.runner.time_call(role)
            # Every timed call's output is checked: a fingerprint always, the full comparison on
            # the sampled pairs.
            agree = self.runner.outputs_agree() if check_outputs else _fingerprints_agree(self.runner)
            if not agree and check_outputs:
                localise = getattr(self.runner, "localised_disagreement", None)
                finding = localise() if localise is not None else None
                if finding is not None and not any(seen == index and _same_finding(kept, finding)
                                                   for seen, kept in self._localised):
                    if len(self._localised) < LOCALISED_MAX:
                        self._localised.append((index, finding))
                    else:
                        finding = None
                # Judged by the caller, which knows the reference's ambiguous elements (a call
                # that repeats a kept finding on the same set is judged with it).
                agree = finding is not None or self._keep_whole(index)
        except Exception as error:  # the model, not the timer, is at fault: say where it happened
            raise TimingError(f"{phase} pair on input set {index} failed: {type(error).__name__}: {error}") from error
        if timings[CANDIDATE].output_reused:
            self._reused += 1
        if not agree:
            self._mismatches += 1
        return PairTrial(index, timings[REFERENCE], timings[CANDIDATE], reference_first)

    def _keep_whole(self, index: int) -> bool:
        """Keep the candidate's last output, which disagrees with the reference's beyond a few
        elements, for the caller to judge against what it knows of the set (where the exact
        value lies when the reference rounds in low precision); whether it was kept or repeats
        one kept on the set. The caller judges every kept output as it judged the set."""
        copy = getattr(self.runner, "output_on_host", None)
        if copy is None or getattr(self.runner, "localise", None) is None:
            return False  # a caller that judges no disagreement itself has the timer's verdict
        output = copy()
        on_set = [kept for seen, kept in self._whole if seen == index]
        if any(_same_output(kept, output) for kept in on_set):
            return True
        if len(on_set) >= WHOLE_PER_SET:
            return False
        self._whole.append((index, output))
        return True

    # --- phases ---------------------------------------------------------------------------------

    def _warm_up(self) -> tuple[int, float, float]:
        """Runs warm-up pairs; returns (pairs run, estimated seconds per timed pair, seconds of
        warm-up that count against the budget).

        The first pair may include Triton's JIT compilation and allocator growth: that is neither
        what a trial costs nor GPU time, so it counts against neither the estimate nor the budget.
        """
        settings = self.settings
        costs = []
        for number in range(settings.num_warmup):
            before = self.clock()
            self._run_pair(self._next_index(), "warmup", check_outputs=number == 0)
            costs.append(self.clock() - before)
            spent = sum(costs[1:])
            if settings.mode == "budget" and number >= 1 and spent > WARMUP_BUDGET_SHARE * settings.budget_s:
                break
        steady = costs[1:] if len(costs) > 1 else costs
        return len(costs), max(median(steady), 1e-9), sum(costs[1:])

    def _plan_trials(self, pair_cost_s: float, warmup_s: float) -> tuple[int, bool]:
        """Trial pairs per measurement, rounded up to an even number: the estimate is taken over
        blocks of two pairs run in opposite orders, and an odd pair would have no partner."""
        settings = self.settings
        if settings.mode == "counts":
            return _even(settings.num_trials), False
        fitting = int(max(settings.budget_s - warmup_s, 0.0) // pair_cost_s)
        trials = min(max(fitting, settings.min_trials), settings.max_trials)
        return _even(trials), fitting < settings.num_trials

    def _measure(self, trials: int) -> Measurement:
        checked = set(self._rng.sample(range(trials), min(self.settings.output_checks, trials)))
        checked.add(trials - 1)
        pairs = [self._run_pair(self._next_index(), "trial", check_outputs=i in checked) for i in range(trials)]
        return analyse_pairs(pairs, self.settings)

    def _probe(self, index: int, measurement: Measurement) -> tuple[PairTrial, dict[str, Any]]:
        """Times one pair on a held-back input set, with the candidate called last."""
        pair = self._run_pair(index, "probe", check_outputs=True, candidate_last=True)
        summary = measurement.summary
        ref_fresh = pair.reference.stream_ms
        cand_fresh = charged_candidate_ms(pair.candidate, measurement)
        ref_slowdown = ref_fresh / max(summary.ref_median_ms, 1e-9)
        cand_slowdown = cand_fresh / max(summary.cand_median_ms, 1e-9)
        memoised = (
            cand_slowdown > self.settings.memo_ratio * max(1.0, ref_slowdown)
            and cand_fresh - summary.cand_median_ms > MEMO_MIN_EXCESS_MS
        )
        info = {
            "input_index": pair.input_index,
            "ref_ms": ref_fresh,
            "cand_ms": cand_fresh,
            "ref_slowdown": ref_slowdown,
            "cand_slowdown": cand_slowdown,
            "memoization_suspected": memoised,
        }
        return pair, info

    # --- the whole measurement ------------------------------------------------------------------

    def _traced_streams(self) -> Optional[dict]:
        """What the runner's CUDA trace of the candidate's calls saw (``trace_streams``), or None
        where the runner has none or it failed: then the timing's verdict stands."""
        trace = getattr(self.runner, "trace_streams", None)
        if trace is None:
            return None
        try:
            return trace(TRACED_CALLS)
        except Exception:  # noqa: BLE001 - no trace (profiler busy or unavailable): keep the flag
            return None

    def run(self) -> SpeedupReport:
        # A collector pause inside one timed call is the commonest outlier on a quiet GPU.
        collector_was_enabled = gc.isenabled()
        gc.collect()
        gc.disable()
        try:
            return self._run()
        finally:
            if collector_was_enabled:
                gc.enable()

    def _run(self) -> SpeedupReport:
        settings = self.settings
        started = self.clock()
        warmup_pairs, pair_cost_s, warmup_s = self._warm_up()
        trials, cut = self._plan_trials(pair_cost_s, warmup_s)

        measurements = [self._measure(trials)]
        while not is_stable(measurements[-1].summary, settings.max_cv) and len(measurements) <= settings.max_remeasure:
            measurements.append(self._measure(trials))
        stable_ones = [m for m in measurements if is_stable(m.summary, settings.max_cv)]
        chosen = stable_ones[0] if stable_ones else min(measurements, key=_cv_sort_key)
        unconfirmed_excess = traced_excess = None
        if flags.FLAG_SIDE_STREAM in chosen.flags:
            # Hidden work voids the verdict, so one disturbed measurement must not (the device's
            # after-effect of a call varies, docs/timing.md): a second one has to show it too.
            # Where it does not, the timing is that second measurement's, so hiding work in the
            # first alone gains nothing.
            confirming = self._measure(trials)
            measurements.append(confirming)
            if flags.FLAG_SIDE_STREAM not in confirming.flags:
                unconfirmed_excess = chosen.details["hidden_excess_ms"]
                chosen = confirming
            else:
                traced = self._traced_streams()
                if _no_other_stream(traced):
                    # Two measurements saw more device activity after the stream's end than the
                    # reference left, and the CUDA trace of the candidate's calls shows every
                    # kernel, copy and fill on the calling stream: the excess is the device's
                    # after-effect of its own work, not work hidden elsewhere. The measurement
                    # stays charged as it was (device-wide), so no hidden time is credited.
                    chosen = confirming
                    chosen.flags.remove(flags.FLAG_SIDE_STREAM)
                    traced_excess = {"hidden_excess_ms": chosen.details["hidden_excess_ms"], **traced}

        summary = chosen.summary
        report = SpeedupReport(
            speedup=summary.speedup,
            ref_ms=summary.ref_median_ms,
            cand_ms=summary.cand_median_ms,
            ref_trimmed_ms=summary.ref_trimmed_ms,
            cand_trimmed_ms=summary.cand_trimmed_ms,
            ci95=summary.ci95,
            cv=summary.cv,
            trial_cv=summary.trial_cv,
            stable=is_stable(chosen.summary, settings.max_cv),
            trials=summary.trials,
            warmup=warmup_pairs,
            remeasures=len(measurements) - 1,
            mode=settings.mode,
            launch_cost=_launch_cost(self.runner, chosen),
            cut_to_budget=cut,
            method=self.runner.method,
            measured_speedup=summary.speedup,
        )
        for flag in chosen.flags:
            report.add_flag(flag)
        report.details.update(chosen.details)
        report.details["planned_trials"] = trials
        report.details["pair_cost_ms"] = pair_cost_s * 1000.0
        report.details["measurement_cvs"] = [m.summary.cv for m in measurements]
        if unconfirmed_excess is not None:
            report.details["side_stream_unconfirmed_ms"] = unconfirmed_excess
        if traced_excess is not None:
            report.details["side_stream_traced"] = traced_excess
        if cut:
            report.add_flag(flags.FLAG_BUDGET_CUT)
        if not report.stable:
            report.add_flag(flags.FLAG_UNSTABLE)

        if self.probe_indices:
            probes = [self._probe(index, chosen) for index in self.probe_indices]
            report.details["probes"] = [info for _, info in probes]
            if all(info["memoization_suspected"] for _, info in probes):
                report.add_flag(flags.FLAG_MEMOIZATION)
                honest = median([pair.reference.stream_ms / max(info["cand_ms"], 1e-9) for pair, info in probes])
                report.speedup = min(report.speedup, honest)
                # The timed trials measured cache hits: their spread says nothing about this number.
                report.cand_ms = median([info["cand_ms"] for _, info in probes])
                report.ci95 = (float("nan"), float("nan"))
                report.stable = False
            report.last_input_index = probes[-1][0].input_index
        else:
            report.add_flag(flags.FLAG_SINGLE_INPUT_SET)
            report.last_input_index = self.schedule_log[-1][1]
        report.last_output = self.runner.output(CANDIDATE)

        report.details["output_reused_calls"] = self._reused
        report.details["output_mismatches"] = self._mismatches
        report.details["output_localised_mismatches"] = len(self._localised)
        report.localised_mismatches = list(self._localised)
        report.details["output_whole_mismatches"] = len(self._whole)
        report.whole_mismatches = list(self._whole)
        if self._reused:
            report.add_flag(flags.FLAG_OUTPUT_REUSED)
        if self._mismatches:
            report.add_flag(flags.FLAG_OUTPUT_MISMATCH)
        timers_intact = getattr(self.runner, "timers_intact", None)
        if timers_intact is not None and not timers_intact():
            report.add_flag(flags.FLAG_TIMER_PATCHED)
        if any(flag in report.flags for flag in flags.FLAGS_VOIDING_SPEEDUP):
            report.speedup = None
        if report.speedup is not None and report.speedup > settings.review_bound:
            report.add_flag(flags.FLAG_SPEEDUP_REVIEW)
        report.elapsed_s = self.clock() - started
        return report


def _no_other_stream(traced: Optional[dict]) -> bool:
    """The trace saw the candidate's own work on the calling stream in every traced call (its probe
    fill and at least one kernel of its own) and nothing on any other stream."""
    return (traced is not None and traced.get("elsewhere") == 0 and traced.get("calls", 0) > 0
            and traced.get("on_calling_stream", 0) >= 2 * traced["calls"])


def _even(count: int) -> int:
    return count + count % 2


def _same_finding(kept: list, finding: list) -> bool:
    """Whether two localised disagreements name the same elements with the same values."""
    import torch

    if len(kept) != len(finding):
        return False
    for a, b in zip(kept, finding):
        if (a is None) != (b is None):
            return False
        if a is not None and not (torch.equal(a[0], b[0]) and a[1].dtype == b[1].dtype and torch.equal(a[1], b[1])):
            return False
    return True


def _fingerprints_agree(runner: TrialRunner) -> bool:
    check = getattr(runner, "fingerprints_agree", None)
    return True if check is None else bool(check())


def _launch_cost(runner: TrialRunner, measurement: Measurement) -> str:
    """What the reported times hold: ``excluded`` only if every timed call was queued in full
    before its region opened (a call that waits for the host in forward cannot be)."""
    asked = getattr(runner, "launch_cost", flags.LAUNCH_INCLUDED)
    if asked != flags.LAUNCH_EXCLUDED:
        return asked
    gated = measurement.details.get("launch_excluded_calls", {})
    calls = 2 * len(measurement.pairs)
    return flags.LAUNCH_EXCLUDED if sum(gated.values()) == calls else flags.LAUNCH_MIXED


def _cv_sort_key(measurement: Measurement) -> float:
    cv = measurement.summary.cv
    return cv if math.isfinite(cv) else math.inf


def charged_candidate_ms(call: CallTiming, measurement: Measurement) -> float:
    """The time a candidate call is charged, with the corrections its measurement called for."""
    charged = call.stream_ms
    if flags.FLAG_SIDE_STREAM in measurement.flags:
        # A hider's host waits in the device-wide synchronize and records the last event as soon
        # as the hidden work ends: its device-wide time holds one round trip past the work, which
        # the runner timed right after (``round_trip_ms``); else the reference's whole wait.
        overhead = call.round_trip_ms if call.round_trip_ms is not None else measurement.reference_gap_ms
        charged = max(charged, call.device_ms - overhead)
    if flags.FLAG_EVENT_WALL in measurement.flags:
        charged = max(charged, call.wall_ms - measurement.wall_overhead_ms)
    return charged


def analyse_pairs(pairs: list[PairTrial], settings: TimingSettings) -> Measurement:
    """Per-trial times to charge, the side-stream and wall-clock checks, and the paired summary.

    The reference (a PyTorch module) runs on the calling stream, so whatever the device still does
    after that stream's end event holds no hidden work for it. A candidate whose ``hidden_ms`` (the
    window after its stream event, recorded by an awake host, less the control round trip timed
    right after) exceeds the reference's in the same pair by more than the tolerance and the share,
    in the median pair, left work running on another stream: it is charged its device-wide time
    less its round trip. The median of the pairs' differences, not the difference of the two
    medians: a host preempted between its two events lengthens that call's window, and on a loaded
    machine a model disturbed in just over half of its calls moves its own median while the
    other's stays (the likeliest cause of two honest reductions flagged on an H100). The median
    difference moves only where the candidate's window is the longer one by that margin in over
    half the pairs; a disturbance that hits both calls of a pair cancels.
    Runners without ``hidden_ms`` are judged on the raw gap after the stream event, which also
    holds the host's wake-up latency. A candidate whose event time trails the host's wall time
    (beyond the overhead the reference shows) in many trials is charged wall time.
    """
    ref_ms = [p.reference.stream_ms for p in pairs]
    reference_gap = median([p.reference.device_ms - p.reference.stream_ms for p in pairs])
    candidate_gap = median([p.candidate.device_ms - p.candidate.stream_ms for p in pairs])
    wall_overhead = median([p.reference.wall_ms - p.reference.stream_ms for p in pairs])
    measurement = Measurement(pairs=pairs, summary=None, reference_gap_ms=reference_gap, wall_overhead_ms=wall_overhead)  # type: ignore[arg-type]
    measurement.details.update(
        {"reference_gap_ms": reference_gap, "candidate_gap_ms": candidate_gap, "wall_overhead_ms": wall_overhead}
    )
    if all(p.reference.hidden_ms is not None and p.candidate.hidden_ms is not None for p in pairs):
        reference_hidden = median([p.reference.hidden_ms for p in pairs])
        candidate_hidden = median([p.candidate.hidden_ms for p in pairs])
        measurement.details.update({"reference_hidden_ms": reference_hidden, "candidate_hidden_ms": candidate_hidden})
        hidden_excess = median([p.candidate.hidden_ms - p.reference.hidden_ms for p in pairs])
    else:
        hidden_excess = median([(p.candidate.device_ms - p.candidate.stream_ms)
                                - (p.reference.device_ms - p.reference.stream_ms) for p in pairs])
    # What the device still does right after a call is not only hidden work: the call's memory
    # traffic leaves an after-effect (4 to 71 us on an H100, growing with the data written, from
    # -19 to +5 us apart between two honest modules; docs/timing.md). Hidden work must exceed the
    # tolerance and a share of the candidate's own time: a hider that stays under the share gains
    # less than that share.
    candidate_stream = median([p.candidate.stream_ms for p in pairs])
    threshold = max(settings.side_stream_tolerance_ms, settings.side_stream_min_share * candidate_stream)
    measurement.details.update({"hidden_excess_ms": hidden_excess, "side_stream_threshold_ms": threshold})
    if hidden_excess > threshold:
        measurement.flags.append(flags.FLAG_SIDE_STREAM)

    provisional = [charged_candidate_ms(p.candidate, measurement) for p in pairs]
    mismatched = sum(
        1
        for call, charged in zip((p.candidate for p in pairs), provisional)
        if call.wall_ms - wall_overhead - charged > settings.wall_slack_ms and charged < 0.5 * call.wall_ms
    )
    measurement.details["wall_mismatch_trials"] = mismatched
    if mismatched > WALL_MISMATCH_SHARE * len(pairs):
        measurement.flags.append(flags.FLAG_EVENT_WALL)
    measurement.details["launch_excluded_calls"] = {
        REFERENCE: sum(p.reference.launch_excluded for p in pairs),
        CANDIDATE: sum(p.candidate.launch_excluded for p in pairs),
    }

    cand_ms = [charged_candidate_ms(p.candidate, measurement) for p in pairs]
    measurement.summary = summarize_pairs(
        ref_ms, cand_ms, bootstrap_samples=settings.bootstrap_samples, seed=settings.seed,
        reference_first=[p.reference_first for p in pairs],
    )
    return measurement


def _same_output(kept: Any, output: Any) -> bool:
    """Whether two host copies of an output are bitwise the same (NaN included)."""
    import torch

    a, b = flatten_tensors(kept), flatten_tensors(output)
    return len(a) == len(b) and all(
        x.shape == y.shape and x.dtype == y.dtype
        and torch.equal(x.contiguous().reshape(-1).view(torch.uint8), y.contiguous().reshape(-1).view(torch.uint8))
        for x, y in zip(a, b))
