"""CPU tests of the timer: statistics, the schedule (budget cuts, re-measurement, rotation, exploit
checks) driven by a simulated runner and clock, the host runner with real modules, and the GPU
lease with real processes."""
from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
import textwrap
import time
from dataclasses import replace

import numpy as np
import pytest
import torch

from extensions.config.sections import VerifierConfig
from extensions.verify.common.compare import compare_outputs
from extensions.timing import (
    CallTiming,
    LeaseTimeout,
    SpeedupScheduler,
    TimingError,
    TimingSettings,
    gpu_lease,
    lock_path,
    measure_speedup,
)
from extensions.timing.runners import (
    GATE_FIRST_CYCLES_PER_MS,
    GATE_FIRST_MS,
    GATE_HEADROOM_MS,
    GATE_HISTORY,
    GATE_MARGIN,
    GATE_MAX_MS,
    LaunchGate,
    fingerprint,
    outputs_close,
)
from extensions.timing.stats import (
    coefficient_of_variation,
    order_balanced_ratios,
    is_stable,
    median,
    summarize_pairs,
    trimmed_mean,
)
import project_paths

PROJECT_ROOT = str(project_paths.PROJECT_ROOT)


# --- statistics ------------------------------------------------------------------------------------


def test_trimmed_mean_drops_ten_percent_each_side():
    values = list(range(1, 10)) + [1000.0]  # one wild trial among ten
    assert trimmed_mean(values, 0.1) == pytest.approx(np.mean(range(2, 10)))
    assert trimmed_mean([5.0, 7.0], 0.1) == pytest.approx(6.0)  # too few to trim anything
    assert median(values) == pytest.approx(5.5)
    with pytest.raises(ValueError, match="trim proportion"):
        trimmed_mean(values, 0.5)


def test_coefficient_of_variation():
    assert coefficient_of_variation([2.0, 2.0, 2.0]) == 0.0
    values = [1.0, 2.0, 3.0, 4.0]
    assert coefficient_of_variation(values) == pytest.approx(np.std(values, ddof=1) / 2.5)
    assert math.isnan(coefficient_of_variation([1.0]))


def _synthetic_pairs(rng, true_ratio, n, noise, drift=0.1):
    # A slow clock drift that moves both members of a pair together, plus independent noise.
    cand_base = 1.0
    drift_factor = 1.0 + drift * np.sin(np.linspace(0, 3 * np.pi, n))
    ref = true_ratio * cand_base * drift_factor * rng.lognormal(0.0, noise, n)
    cand = cand_base * drift_factor * rng.lognormal(0.0, noise, n)
    return ref, cand


def test_bootstrap_ci_covers_the_true_ratio():
    rng = np.random.default_rng(7)
    true_ratio = 1.7
    covered = 0
    runs = 200
    for run in range(runs):
        ref, cand = _synthetic_pairs(rng, true_ratio, n=60, noise=0.03)
        summary = summarize_pairs(ref, cand, bootstrap_samples=500, seed=run)
        low, high = summary.ci95
        assert low <= summary.speedup <= high
        covered += low <= true_ratio <= high
    # Nominal 95%; the percentile bootstrap of a median is a little liberal at n=60.
    assert covered / runs >= 0.88
    # Drift cancels in the paired ratio: the estimate's CV is far below the times' own spread.
    assert summary.cv < 0.01 < summary.ref_cv


def test_bootstrap_is_seeded():
    rng = np.random.default_rng(1)
    ref, cand = _synthetic_pairs(rng, 1.2, n=40, noise=0.05)
    first = summarize_pairs(ref, cand, bootstrap_samples=300, seed=3)
    again = summarize_pairs(ref, cand, bootstrap_samples=300, seed=3)
    other = summarize_pairs(ref, cand, bootstrap_samples=300, seed=4)
    assert first.ci95 == again.ci95 and first.cv == again.cv
    assert first.ci95 != other.ci95


def test_unstable_detection():
    rng = np.random.default_rng(2)
    quiet = summarize_pairs(*_synthetic_pairs(rng, 1.0, n=50, noise=0.01), bootstrap_samples=400)
    noisy = summarize_pairs(*_synthetic_pairs(rng, 1.0, n=10, noise=0.4), bootstrap_samples=400)
    assert is_stable(quiet, 0.02)
    assert not is_stable(noisy, 0.02)


def test_paired_inputs_are_validated():
    with pytest.raises(ValueError, match="differ in length"):
        summarize_pairs([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="no paired trials"):
        summarize_pairs([], [])


# --- a simulated GPU for the schedule ---------------------------------------------------------------


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class SimulatedRunner:
    """Costs in milliseconds; advances the fake clock as a real run would spend time.

    ``candidate_kind``: "honest", "side_stream" (does the reference's work on another stream),
    "content_memo" (caches by input contents), "address_memo" (caches by buffer address, so it
    returns stale results once contents change), "reuse" (returns the same stored tensor),
    "host_hidden" (event clocks see nothing, the host clock does).

    ``after_effect_ms``: per role, device time after the stream's end that the call's own memory
    traffic causes (no hidden work). ``hidden_share``: how much of its work a side-stream
    candidate hides. ``wake_ms``: per role, the host's wake-up latency after waiting for the call; it lands in the
    raw post-stream gap but not in the awake-host window (``hidden_ms``). ``first_call_factor``
    slows whichever model runs first in a pair. ``launch_cost``/``gated``: what the runner claims
    and whether each call was queued before its region opened. ``for_pair``: per pair number, a
    dict overriding ``after_effect_ms`` (``"after_effect"``: the candidate's,
    ``"reference_after_effect"``) or ``hidden_share`` (``"hidden_share"``), for a device or host
    disturbed, or a candidate hiding, during some pairs only.
    """

    method = "simulated"
    SYNC_GAP_MS = 0.006
    OVERHEAD_MS = 0.05  # flush + synchronise + copy per call, outside the timed region

    def __init__(self, clock, ref_ms=1.0, cand_ms=0.5, num_input_sets=3, noise=0.01, seed=0,
                 candidate_kind="honest", noise_for_pair=None, fail_on_call=None, wake_ms=None,
                 first_call_factor=1.0, launch_cost="included", gated=None, after_effect_ms=None,
                 hidden_share=1.0, for_pair=None):
        self.clock = clock
        self.cost = {"reference": ref_ms, "candidate": cand_ms}
        self.num_input_sets = num_input_sets
        self.noise = noise
        self.noise_for_pair = noise_for_pair
        self.rng = np.random.default_rng(seed)
        self.kind = candidate_kind
        self.loaded = None
        self.loads = []
        self.calls = []  # (role, input index)
        self.seen_contents = set()
        self.first_seen = None
        self.outputs = {}
        self.fail_on_call = fail_on_call
        self.wake_ms = wake_ms or {"reference": 0.0, "candidate": 0.0}
        self.after_effect_ms = after_effect_ms or {"reference": 0.0, "candidate": 0.0}
        self.hidden_share = hidden_share  # side_stream: the share of the work it hides
        self.for_pair = for_pair or (lambda pair: {})
        self.first_call_factor = first_call_factor
        self.stream_log = []  # (role, stream_ms) of every call
        self.launch_cost = launch_cost
        self.gated = gated or (lambda role, call_number: launch_cost == "excluded")

    def load(self, index):
        self.loaded = index
        self.loads.append(index)

    def time_call(self, role):
        self.calls.append((role, self.loaded))
        if self.fail_on_call is not None and len(self.calls) == self.fail_on_call:
            raise RuntimeError("illegal memory access")
        pair_number = (len(self.calls) - 1) // 2
        noise = self.noise_for_pair(pair_number) if self.noise_for_pair else self.noise
        drift = 1.0 + 0.05 * math.sin(len(self.calls) / 40.0)
        work = self.cost[role] * drift * float(self.rng.lognormal(0.0, noise))
        if len(self.calls) % 2 == 1:  # the first call of its pair
            work *= self.first_call_factor
        stream, gap, wall_extra, reused = work, self.SYNC_GAP_MS, 0.01, False
        output = ("result", self.loaded)
        this_pair = self.for_pair(pair_number)
        after_effect = this_pair.get("reference_after_effect", self.after_effect_ms[role])
        if role == "candidate":
            after_effect = this_pair.get("after_effect", after_effect)
            if self.first_seen is None:
                self.first_seen = self.loaded
            if self.kind == "side_stream":
                hidden = this_pair.get("hidden_share", self.hidden_share) * work
                stream, gap = max(work - hidden, 0.003), hidden + self.SYNC_GAP_MS
            elif self.kind == "content_memo" and self.loaded in self.seen_contents:
                stream = work = 0.002
            elif self.kind == "address_memo" and self.loaded != self.first_seen:
                stream = work = 0.002
                output = ("result", self.first_seen)
            elif self.kind == "reuse" and self.seen_contents:
                reused = True
            elif self.kind == "host_hidden":
                stream, gap, wall_extra = 0.003, self.SYNC_GAP_MS, work
            self.seen_contents.add(self.loaded)
        self.outputs[role] = output
        self.stream_log.append((role, stream))
        wake = self.wake_ms[role]
        gap += after_effect  # device work the call's memory traffic leaves behind
        self.clock.now += (stream + gap + wake + wall_extra + self.OVERHEAD_MS) / 1000.0
        # The runner's control round trip right after the call: nothing pending, no wake-up.
        round_trip = self.SYNC_GAP_MS
        return CallTiming(stream_ms=stream, device_ms=stream + wake + gap, wall_ms=stream + wake + gap + wall_extra,
                          output_reused=reused, hidden_ms=gap - round_trip, round_trip_ms=round_trip,
                          launch_excluded=self.gated(role, len(self.calls)))

    def outputs_agree(self):
        return self.outputs["reference"] == self.outputs["candidate"]

    def output(self, role):
        return self.outputs[role]


def _settings(**overrides):
    base = TimingSettings(mode="counts", num_warmup=3, num_trials=40, budget_s=2.0, min_trials=10,
                          max_trials=1000, max_cv=0.02, max_remeasure=2, bootstrap_samples=300)
    return replace(base, **overrides)


def _run(runner, settings):
    return SpeedupScheduler(runner, settings, clock=runner.clock).run()


def test_counts_mode_interleaves_rotates_and_probes_last():
    runner = SimulatedRunner(FakeClock(), ref_ms=1.0, cand_ms=0.5, num_input_sets=3)
    report = _run(runner, _settings())
    assert report.warmup == 3 and report.trials == 40 and report.remeasures == 0
    assert report.stable and report.flags == []
    assert report.speedup == pytest.approx(2.0, rel=0.02)
    assert report.ci95[0] <= 2.0 * 1.01 and report.ci95[1] >= 2.0 * 0.99
    # Every pair times both models on the same loaded inputs, in alternating order.
    pairs = [runner.calls[i:i + 2] for i in range(0, len(runner.calls), 2)]
    assert all(a[1] == b[1] for a, b in pairs)
    firsts = [p[0][0] for p in pairs[:-1]]
    assert firsts[0::2] == ["reference"] * len(firsts[0::2])
    assert firsts[1::2] == ["candidate"] * len(firsts[1::2])
    # Rotation over sets 0 and 1, loaded afresh before each of a pair's two calls; set 2 is held
    # back for the probe, where the candidate runs last.
    assert runner.loads[:-2] == [(i // 2) % 2 for i in range(len(runner.loads) - 2)]
    assert runner.loads[-2:] == [2, 2] and 2 not in runner.loads[:-2]
    assert runner.calls[-1] == ("candidate", 2)
    assert report.last_input_index == 2 and report.last_output == ("result", 2)
    data = report.to_dict()
    for key in ("speedup", "flags", "ref_ms", "cand_ms", "ci95", "cv", "stable", "trials", "method"):
        assert key in data
    assert "last_output" not in data


def test_budget_mode_cuts_a_slow_candidate_to_fit():
    clock = FakeClock()
    runner = SimulatedRunner(clock, ref_ms=40.0, cand_ms=60.0, num_input_sets=3, noise=0.005)
    settings = _settings(mode="budget", num_warmup=10, num_trials=50, budget_s=2.0, min_trials=10)
    report = _run(runner, settings)
    pair_s = (40.0 + 60.0) / 1000.0
    # Warm-up stops at a quarter of the budget; the rest buys about (2 - 0.6) / 0.1 pairs.
    assert 2 <= report.warmup <= 6
    assert 10 <= report.trials <= 16
    assert report.cut_to_budget and "timing_budget_cut" in report.flags
    assert report.elapsed_s <= 2.0 + 2 * pair_s + 0.05  # the probe pair comes on top
    assert report.speedup == pytest.approx(40.0 / 60.0, rel=0.02)


class CompilingRunner(SimulatedRunner):
    """The candidate's first call stands for Triton's JIT compile: seconds of host time."""

    COMPILE_S = 5.0

    def time_call(self, role):
        if role == "candidate" and not any(r == "candidate" for r, _ in self.calls):
            self.clock.now += self.COMPILE_S
        return super().time_call(role)


def test_first_call_compilation_is_not_charged_to_the_budget():
    runner = CompilingRunner(FakeClock(), ref_ms=0.05, cand_ms=0.05, noise=0.01)
    report = _run(runner, _settings(mode="budget", budget_s=1.0, num_trials=50, max_trials=1000))
    assert not report.cut_to_budget and "timing_budget_cut" not in report.flags
    assert report.trials >= 50


def test_budget_mode_floors_and_caps_trials():
    slow = SimulatedRunner(FakeClock(), ref_ms=400.0, cand_ms=400.0, noise=0.001)
    report = _run(slow, _settings(mode="budget", budget_s=1.0, min_trials=10))
    assert report.trials == 10 and report.cut_to_budget

    fast = SimulatedRunner(FakeClock(), ref_ms=0.01, cand_ms=0.01, noise=0.01)
    report = _run(fast, _settings(mode="budget", budget_s=2.0, max_trials=300, num_trials=50))
    assert report.trials == 300 and not report.cut_to_budget and "timing_budget_cut" not in report.flags


def test_unstable_measurement_is_remeasured_then_reported_unstable():
    runner = SimulatedRunner(FakeClock(), ref_ms=1.0, cand_ms=1.0, noise=0.5)
    report = _run(runner, _settings(num_trials=12, max_remeasure=2))
    assert report.remeasures == 2 and not report.stable
    assert "timing_unstable" in report.flags
    assert len(report.details["measurement_cvs"]) == 3
    assert report.cv == pytest.approx(min(report.details["measurement_cvs"]))
    # warm-up + three measurements + probe
    assert len(runner.calls) == 2 * (3 + 3 * 12 + 1)


def test_remeasure_stops_at_the_first_stable_measurement():
    trials = 30
    noisy_until = 3 + trials  # warm-up and the first measurement are disturbed
    runner = SimulatedRunner(FakeClock(), ref_ms=1.0, cand_ms=0.8,
                             noise_for_pair=lambda pair: 0.6 if pair < noisy_until else 0.005)
    report = _run(runner, _settings(num_trials=trials, max_remeasure=2))
    assert report.remeasures == 1 and report.stable and "timing_unstable" not in report.flags
    assert report.speedup == pytest.approx(1.25, rel=0.01)


def test_side_stream_candidate_is_charged_and_flagged():
    runner = SimulatedRunner(FakeClock(), ref_ms=1.0, cand_ms=1.0, candidate_kind="side_stream")
    report = _run(runner, _settings())
    assert "side_stream_suspected" in report.flags and report.remeasures == 1  # confirmed
    assert report.speedup <= 1.2 and report.speedup == pytest.approx(1.0, rel=0.03)
    assert report.measured_speedup == report.speedup


def test_wake_up_latency_of_an_honest_candidate_is_not_hidden_work():
    # The host wakes 30 us later after waiting for the candidate than for the reference (a longer
    # wait on a virtualised host): the raw post-stream gap differs, the awake-host window does not.
    runner = SimulatedRunner(FakeClock(), ref_ms=1.0, cand_ms=0.8, wake_ms={"reference": 0.004, "candidate": 0.034})
    report = _run(runner, _settings())
    assert report.details["candidate_gap_ms"] - report.details["reference_gap_ms"] == pytest.approx(0.030, abs=1e-9)
    assert "side_stream_suspected" not in report.flags and report.flags == []
    assert report.speedup == pytest.approx(1.25, rel=0.02)


def test_side_stream_is_flagged_whatever_the_wake_up_latency():
    runner = SimulatedRunner(FakeClock(), ref_ms=1.0, cand_ms=1.0, candidate_kind="side_stream",
                             wake_ms={"reference": 0.03, "candidate": 0.0})
    report = _run(runner, _settings())
    assert "side_stream_suspected" in report.flags
    assert report.speedup <= 1.2


def test_memory_after_effect_of_an_honest_candidate_is_not_hidden_work():
    # 15 us more device after-effect than the reference after a 0.3 ms call: not worth hiding.
    runner = SimulatedRunner(FakeClock(), ref_ms=1.0, cand_ms=0.3,
                             after_effect_ms={"reference": 0.0, "candidate": 0.015})
    report = _run(runner, _settings())
    assert report.details["hidden_excess_ms"] == pytest.approx(0.015, abs=1e-6)
    assert report.flags == [] and report.speedup == pytest.approx(1.0 / 0.3, rel=0.02)


def test_a_candidate_hiding_part_of_its_work_is_flagged_and_charged():
    runner = SimulatedRunner(FakeClock(), ref_ms=1.0, cand_ms=1.0, candidate_kind="side_stream", hidden_share=0.3)
    report = _run(runner, _settings())
    assert "side_stream_suspected" in report.flags
    assert report.measured_speedup == pytest.approx(1.0, rel=0.03)


WARMUP = 3  # _settings' warm-up pairs: the first measurement is pairs 3 to 42


def test_one_disturbed_measurement_does_not_flag_an_honest_candidate():
    # The device leaves 40 us behind the candidate's calls during the first measurement only.
    runner = SimulatedRunner(FakeClock(), ref_ms=0.2, cand_ms=0.1,
                             for_pair=lambda pair: {"after_effect": 0.04} if WARMUP <= pair < WARMUP + 40 else {})
    report = _run(runner, _settings())
    assert "side_stream_suspected" not in report.flags and report.flags == []
    assert report.remeasures == 1 and report.details["side_stream_unconfirmed_ms"] == pytest.approx(0.04, abs=1e-6)
    assert report.speedup == pytest.approx(2.0, rel=0.03)


def test_hiding_work_in_the_first_measurement_only_gains_nothing():
    runner = SimulatedRunner(FakeClock(), ref_ms=1.0, cand_ms=1.0, candidate_kind="side_stream",
                             for_pair=lambda pair: {} if WARMUP <= pair < WARMUP + 40 else {"hidden_share": 0.0})
    report = _run(runner, _settings())
    assert report.remeasures == 1 and "side_stream_suspected" not in report.flags
    assert report.speedup == pytest.approx(1.0, rel=0.03)  # the second, honest measurement's


class TracedRunner(SimulatedRunner):
    """A runner with a CUDA trace of the candidate's calls: ``trace`` is what it reports (a dict),
    or an exception it raises."""

    def __init__(self, clock, trace, **kwargs):
        super().__init__(clock, **kwargs)
        self.trace = trace
        self.traced = []

    def trace_streams(self, calls):
        self.traced.append(calls)
        if isinstance(self.trace, Exception):
            raise self.trace
        return {"calls": calls, **self.trace}


SHORT_KERNEL = dict(ref_ms=0.06, cand_ms=0.05, after_effect_ms={"reference": 0.0, "candidate": 0.008})


def test_after_effect_of_a_short_kernel_is_cleared_by_the_trace():
    """An honest 50 us kernel whose own memory traffic leaves 8 us of device activity after its
    stream's end (above the 5 us tolerance) in every measurement: the trace shows its work on the
    calling stream only, so it is not flagged; its time stays charged device-wide."""
    runner = TracedRunner(FakeClock(), {"on_calling_stream": 16, "elsewhere": 0}, **SHORT_KERNEL)
    report = _run(runner, _settings())
    assert runner.traced == [8] and report.remeasures == 1
    assert "side_stream_suspected" not in report.flags
    assert report.details["side_stream_traced"]["hidden_excess_ms"] == pytest.approx(0.008, abs=1e-6)
    assert report.speedup == pytest.approx(0.06 / 0.058, rel=0.03)  # charged with the after-effect


@pytest.mark.parametrize("trace", [
    {"on_calling_stream": 16, "elsewhere": 3},   # kernels on another stream
    {"on_calling_stream": 8, "elsewhere": 0},    # the probes alone: the candidate's work unseen
    RuntimeError("profiler already running"),    # no trace
], ids=["other_stream", "own_work_unseen", "no_trace"])
def test_the_trace_clears_only_what_it_saw(trace):
    """Without a trace that saw the candidate's own work on the calling stream and nothing
    elsewhere, two measurements' excess stays ``side_stream_suspected``: a real hider (here it
    hides 30% of its work) and a short honest kernel alike."""
    hider = TracedRunner(FakeClock(), trace, ref_ms=1.0, cand_ms=1.0, candidate_kind="side_stream", hidden_share=0.3)
    assert "side_stream_suspected" in _run(hider, _settings()).flags
    honest = TracedRunner(FakeClock(), trace, **SHORT_KERNEL)
    report = _run(honest, _settings())
    assert "side_stream_suspected" in report.flags and "side_stream_traced" not in report.details


def test_a_host_preempted_in_most_calls_does_not_flag_an_honest_candidate():
    # A loaded machine: the host is preempted between its two events in 60% of the candidate's
    # calls and 30% of the reference's, partly in the same pairs (each 50 us more window): the
    # candidate's median window is 50 us longer, its window in the median pair is not.
    runner = SimulatedRunner(FakeClock(), ref_ms=0.2, cand_ms=0.1, for_pair=lambda pair: {
        "after_effect": 0.05 if pair % 10 < 6 else 0.0,
        "reference_after_effect": 0.05 if 4 <= pair % 10 < 7 else 0.0})
    report = _run(runner, _settings())
    assert report.details["candidate_hidden_ms"] - report.details["reference_hidden_ms"] == pytest.approx(0.05)
    assert "side_stream_suspected" not in report.flags and report.remeasures == 0
    assert report.details["hidden_excess_ms"] == pytest.approx(0.0, abs=1e-6)
    assert report.speedup == pytest.approx(2.0, rel=0.03)


def test_first_call_effect_cancels_in_order_balanced_blocks():
    # Whichever model runs first in a pair is 4% slower: single ratios split into two clusters.
    speedups, plain_medians = [], []
    for seed in range(6):
        runner = SimulatedRunner(FakeClock(), ref_ms=1.0, cand_ms=0.8, noise=0.01, seed=seed, first_call_factor=1.04)
        report = _run(runner, _settings(num_trials=21, max_remeasure=0))
        assert report.trials == 22  # rounded up to whole blocks
        speedups.append(report.speedup)
        timed = runner.stream_log[2 * report.warmup: 2 * (report.warmup + report.trials)]
        pairs = [dict(timed[i:i + 2]) for i in range(0, len(timed), 2)]
        plain_medians.append(float(np.median([p["reference"] / p["candidate"] for p in pairs])))
    assert max(abs(s / 1.25 - 1) for s in speedups) < 0.01
    assert np.std(speedups) < np.std(plain_medians)


def test_order_balanced_ratios_pair_opposite_orders():
    ratios = np.array([1.1, 0.9, 1.21, 0.81, 2.0])
    blocks = order_balanced_ratios(ratios, [True, False, True, False, True])
    assert blocks == pytest.approx([math.sqrt(1.1 * 0.9), math.sqrt(1.21 * 0.81)])  # the odd pair is left out
    assert order_balanced_ratios(ratios, [True] * 5) is ratios  # no block forms: single ratios
    assert order_balanced_ratios(ratios, None) is ratios
    with pytest.raises(ValueError, match="5 orders for 4 paired trials"):
        order_balanced_ratios(ratios[:4], [True] * 5)


def test_report_says_whether_launch_time_was_excluded():
    excluded = _run(SimulatedRunner(FakeClock(), launch_cost="excluded"), _settings())
    assert excluded.launch_cost == "excluded" and excluded.to_dict()["launch_cost"] == "excluded"
    assert excluded.details["launch_excluded_calls"] == {"reference": 40, "candidate": 40}
    # A candidate that waits for the device in forward cannot be gated: the report says so.
    mixed = _run(SimulatedRunner(FakeClock(), launch_cost="excluded", gated=lambda role, n: role == "reference"),
                 _settings())
    assert mixed.launch_cost == "mixed" and mixed.details["launch_excluded_calls"]["candidate"] == 0
    included = _run(SimulatedRunner(FakeClock()), _settings())
    assert included.launch_cost == "included"


def test_content_memoiser_is_caught_by_the_fresh_input_probe():
    runner = SimulatedRunner(FakeClock(), ref_ms=1.0, cand_ms=1.0, candidate_kind="content_memo")
    report = _run(runner, _settings())
    assert report.measured_speedup > 100  # what a naive timer would report
    assert "memoization_suspected" in report.flags
    assert report.speedup <= 1.2 and report.cand_ms == pytest.approx(1.0, rel=0.1)
    assert not report.stable and report.to_dict()["ci95"] == [None, None]
    # An honest candidate's first sight of the probe inputs costs what any other call costs.
    honest = _run(SimulatedRunner(FakeClock(), ref_ms=1.0, cand_ms=1.0), _settings())
    assert "memoization_suspected" not in honest.flags and honest.details["probes"][0]["cand_slowdown"] < 1.2


def test_memoisation_needs_every_probe_to_agree():
    five_sets = _run(SimulatedRunner(FakeClock(), ref_ms=1.0, cand_ms=1.0, num_input_sets=5,
                                     candidate_kind="content_memo"), _settings())
    assert "memoization_suspected" in five_sets.flags and len(five_sets.details["probes"]) == 2
    assert five_sets.last_input_index == 4

    class OneSlowProbe(SimulatedRunner):
        """An honest candidate whose first probe call is hit by a long outside pause."""

        def time_call(self, role):
            timing = super().time_call(role)
            if role == "candidate" and self.loaded == 3:
                timing.stream_ms *= 10
            return timing

    runner = OneSlowProbe(FakeClock(), ref_ms=1.0, cand_ms=1.0, num_input_sets=5)
    report = _run(runner, _settings())
    assert "memoization_suspected" not in report.flags
    assert [info["memoization_suspected"] for info in report.details["probes"]] == [True, False]
    assert set(runner.loads[:-4]) == {0, 1, 2}  # the two probes (sets 3 and 4) load twice each


def test_address_memoiser_gets_no_speedup():
    runner = SimulatedRunner(FakeClock(), ref_ms=1.0, cand_ms=1.0, candidate_kind="address_memo")
    report = _run(runner, _settings())
    assert "output_mismatch_during_timing" in report.flags and report.speedup is None
    assert report.to_dict()["speedup"] is None


def test_reused_output_voids_the_speedup():
    runner = SimulatedRunner(FakeClock(), ref_ms=1.0, cand_ms=0.5, candidate_kind="reuse")
    report = _run(runner, _settings())
    assert "output_reused" in report.flags and report.speedup is None


def test_work_hidden_from_events_is_charged_wall_time():
    runner = SimulatedRunner(FakeClock(), ref_ms=5.0, cand_ms=5.0, candidate_kind="host_hidden")
    report = _run(runner, _settings())
    assert "event_wall_mismatch" in report.flags
    assert report.speedup == pytest.approx(1.0, rel=0.05)


def test_large_speedup_goes_to_review_and_single_set_is_flagged():
    runner = SimulatedRunner(FakeClock(), ref_ms=20.0, cand_ms=1.0, num_input_sets=1)
    report = _run(runner, _settings())
    assert report.speedup == pytest.approx(20.0, rel=0.03)
    assert "speedup_review" in report.flags and "single_input_set" in report.flags
    assert set(runner.loads) == {0} and report.last_input_index == 0


def test_a_failing_model_names_the_phase():
    runner = SimulatedRunner(FakeClock(), fail_on_call=9)
    with pytest.raises(TimingError, match="trial pair on input set 0 failed: RuntimeError: illegal memory access"):
        _run(runner, _settings())


def test_config_is_validated():
    with pytest.raises(ValueError, match="timing_mode must be"):
        TimingSettings.from_config(VerifierConfig(timing_mode="forever"))
    with pytest.raises(ValueError, match="timing_num_trials must be >= 3"):
        TimingSettings.from_config(VerifierConfig(timing_num_trials=1))
    with pytest.raises(ValueError, match="timing_launch_cost must be one of excluded, included, got 'never'"):
        TimingSettings.from_config(VerifierConfig(timing_launch_cost="never"))
    with pytest.raises(ValueError, match=r"timing_side_stream_min_share must be in \[0, 1\), got 1.5"):
        TimingSettings.from_config(VerifierConfig(timing_side_stream_min_share=1.5))
    settings = TimingSettings.from_config(VerifierConfig())
    assert settings.mode == "budget" and settings.side_stream_tolerance_ms == pytest.approx(0.005)
    assert settings.launch_cost == "excluded"


def test_launch_gate_is_sized_from_the_host_enqueue_time():
    gate = LaunchGate()
    assert gate.active("candidate") and gate.cycles("candidate") == int(GATE_FIRST_MS * GATE_FIRST_CYCLES_PER_MS)
    # The first gate spun 1.5e6 cycles in 0.75 ms (a 2 GHz clock); the host queued the call in 0.5 ms.
    gate.update("candidate", 1_500_000, 0.75, 0.5, held=True)
    assert gate.cycles_per_ms == pytest.approx(2e6)
    assert gate.target_ms["candidate"] == pytest.approx(GATE_MARGIN * 0.5)
    assert gate.cycles("candidate") == int(GATE_MARGIN * 0.5 * 2e6)
    assert gate.target_ms["reference"] == GATE_FIRST_MS  # roles are sized apart
    # Quick calls keep the slowest recent enqueue time in view, and a headroom over it.
    for _ in range(GATE_HISTORY - 1):
        gate.update("candidate", gate.cycles("candidate"), 1.0, 0.01, held=True)
    assert gate.target_ms["candidate"] == pytest.approx(GATE_MARGIN * 0.5)
    gate.update("candidate", gate.cycles("candidate"), 1.0, 0.01, held=True)
    assert gate.target_ms["candidate"] == pytest.approx(0.01 + GATE_HEADROOM_MS)
    # Opened before the host was done: the next gate is at least twice as long.
    before = gate.target_ms["candidate"]
    gate.update("candidate", gate.cycles("candidate"), before, 0.1, held=False)
    assert gate.target_ms["candidate"] == pytest.approx(2 * before)


def test_launch_gate_gives_up_on_a_call_that_waits_for_the_device():
    gate = LaunchGate()
    opened_early = 0
    while gate.active("candidate"):
        target = gate.target_ms["candidate"]
        # forward reads a value back: the host finishes only after the gate and the work
        gate.update("candidate", gate.cycles("candidate"), target, target + 1.0, held=False)
        opened_early += 1
        assert opened_early < 20
    assert gate.target_ms["candidate"] == GATE_MAX_MS and gate.active("reference")


def test_chunked_fingerprint_matches_the_whole_output_formula(monkeypatch):
    from extensions.timing import runners

    monkeypatch.setattr(runners, "FINGERPRINT_CHUNK", 1000)
    output = (torch.randn(2500, generator=torch.Generator().manual_seed(3)), torch.ones(3, 7))
    prints = fingerprint(output)
    values = output[0].to(torch.float64)
    weights = torch.frac(torch.arange(2500, dtype=torch.float64) * 0.6180339887498949)
    expected = torch.stack([values.sum(), (values * weights).sum(), values.abs().sum()])
    assert torch.allclose(prints[0][0], expected, rtol=1e-12, atol=1e-9)
    assert prints[0][1:] == (2500, torch.float32)
    assert prints[1][0][0].item() == 21.0 and prints[1][1] == 21


def test_large_outputs_are_compared_slice_by_slice_with_the_same_rules(monkeypatch):
    from extensions.timing import runners

    monkeypatch.setattr(runners, "COMPARE_SLICE", 100)
    config = VerifierConfig()
    reference = torch.randn(3, 150, generator=torch.Generator().manual_seed(5))
    assert outputs_close(reference, reference.clone(), config, compare_outputs)
    assert outputs_close((reference, torch.ones(2)), (reference.clone(), torch.ones(2)), config, compare_outputs)
    wrong = reference.clone()
    wrong[2, 140] += 1.0  # one element, in the last slice
    assert not outputs_close(reference, wrong, config, compare_outputs)
    nan_placed = reference.clone()
    nan_placed[1, 3] = float("nan")
    assert not outputs_close(reference, nan_placed, config, compare_outputs)
    assert not outputs_close(reference, reference.reshape(150, 3).clone(), config, compare_outputs)  # shape
    assert not outputs_close(reference, reference.double(), config, compare_outputs)  # dtype
    assert not outputs_close((reference,), reference.clone(), config, compare_outputs)  # structure


# --- the host runner with real modules ----------------------------------------------------------------


class Scale(torch.nn.Module):
    def forward(self, x):
        return x * 2.0


class AddressMemo(torch.nn.Module):
    """Caches by buffer address: fast, and wrong once the buffer's contents change."""

    def __init__(self):
        super().__init__()
        self.cache = {}

    def forward(self, x):
        if x.data_ptr() not in self.cache:
            self.cache[x.data_ptr()] = x * 2.0
        return self.cache[x.data_ptr()]


class BufferRing(torch.nn.Module):
    """Writes each answer into the next of five buffers it keeps: right values, and a caller's
    result is overwritten five calls later, past the two outputs the timer holds."""

    def __init__(self):
        super().__init__()
        self.ring = [None] * 5
        self.calls = 0

    def forward(self, x):
        slot = self.calls % len(self.ring)
        self.calls += 1
        if self.ring[slot] is None or self.ring[slot].shape != x.shape:
            self.ring[slot] = torch.empty_like(x)
        return torch.mul(x, 2.0, out=self.ring[slot])


class HeavyScale(torch.nn.Module):
    def forward(self, x):
        for _ in range(20):
            y = torch.tanh(x)
        return x * 2.0 + 0.0 * y


def _cpu_config(**overrides):
    return VerifierConfig(timing_mode="counts", timing_num_warmup=2, timing_num_trials=20,
                          timing_max_remeasure=0, timing_bootstrap_samples=200, **overrides)


def _input_sets(count=3, size=20000):
    generator = torch.Generator().manual_seed(0)
    return [[torch.randn(size, generator=generator)] for _ in range(count)]


def test_host_runner_times_real_modules():
    sets = _input_sets()
    report = measure_speedup(HeavyScale(), Scale(), sets, _cpu_config(), compare_outputs=compare_outputs)
    assert report.method.startswith("paired-interleaved/host-clock")
    assert report.speedup > 2.0 and report.trials == 20
    assert report.last_input_index == 2
    assert torch.equal(report.last_output, sets[2][0] * 2.0)
    assert not any(f in report.flags for f in ("output_mismatch_during_timing", "output_reused"))


class AddInPlaceThenScale(torch.nn.Module):
    def forward(self, x):
        x.add_(1.0)
        return x * 2.0


@pytest.mark.parametrize("sizes", [(20000, 20000, 20000), (20000, 15000, 10000)], ids=["one_shape", "shapes"])
def test_a_model_working_in_place_is_timed_on_the_set_every_call(sizes):
    """Some problems change their input (``x.add_(1)``): every timed call gets the set as drawn,
    not as the other model or an earlier call left it, and the set itself stays as drawn."""
    generator = torch.Generator().manual_seed(0)
    sets = [[torch.randn(size, generator=generator)] for size in sizes]
    drawn = [[x.clone() for x in s] for s in sets]
    report = measure_speedup(AddInPlaceThenScale(), AddInPlaceThenScale(), sets, _cpu_config(),
                             compare_outputs=compare_outputs)
    assert "output_mismatch_during_timing" not in report.flags and report.speedup is not None
    assert torch.equal(report.last_output, (drawn[report.last_input_index][0] + 1.0) * 2.0)
    assert all(torch.equal(x, y) for s, d in zip(sets, drawn) for x, y in zip(s, d))


def test_host_runner_catches_an_address_memoiser():
    report = measure_speedup(Scale(), AddressMemo(), _input_sets(), _cpu_config(), compare_outputs=compare_outputs)
    assert "output_mismatch_during_timing" in report.flags and report.speedup is None
    assert "output_reused" in report.flags  # it hands back the same stored tensor every call


def test_host_runner_catches_a_ring_of_buffers_longer_than_it_holds():
    report = measure_speedup(Scale(), BufferRing(), _input_sets(), _cpu_config(), compare_outputs=compare_outputs)
    assert "output_reused" in report.flags and report.speedup is None


def test_outputs_close_checks_structure_dtype_and_values():
    config = VerifierConfig()
    a = torch.ones(4)
    assert outputs_close((a, a), (a.clone(), a.clone()), config, compare_outputs)
    assert not outputs_close(a, a.double(), config, compare_outputs)
    assert not outputs_close(a, a[:3], config, compare_outputs)
    assert not outputs_close(a, a + 1e-2, config, compare_outputs)
    assert not outputs_close((a, a), a, config, compare_outputs)


# --- the GPU lease, with real processes ------------------------------------------------------------

_LEASE_CHILD = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {root!r})
    from extensions.timing import gpu_lease, LeaseTimeout
    device, hold_s, timeout_s, log = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4]
    timeout_s = None if timeout_s == "none" else float(timeout_s)
    try:
        with gpu_lease(device, timeout_s=timeout_s):
            entered = time.time()
            time.sleep(hold_s)
            left = time.time()
    except LeaseTimeout:
        sys.exit(3)
    with open(log, "a") as f:
        f.write(f"{{entered}} {{left}}\\n")
    """
)


def _child_command(tmp_path, device, hold_s, timeout_s, log):
    script = tmp_path / "lease_child.py"
    if not script.exists():
        script.write_text(_LEASE_CHILD.format(root=PROJECT_ROOT))
    return [sys.executable, str(script), str(device), str(hold_s), str(timeout_s), str(log)]


def _lease_env(tmp_path):
    return {**os.environ, "KERNEL_TIMING_LOCK_DIR": str(tmp_path / "locks")}


def test_lease_excludes_processes_on_the_same_gpu(tmp_path):
    log = tmp_path / "intervals.txt"
    children = [subprocess.Popen(_child_command(tmp_path, 0, 0.3, "none", log), env=_lease_env(tmp_path))
                for _ in range(3)]
    assert [c.wait(timeout=60) for c in children] == [0, 0, 0]
    intervals = sorted(tuple(map(float, line.split())) for line in log.read_text().splitlines())
    assert len(intervals) == 3
    for (_, left), (entered, _) in zip(intervals, intervals[1:]):
        assert entered >= left  # never two holders at once
    assert (tmp_path / "locks" / "gpu0.lock").exists()


def test_lease_times_out_and_other_gpus_stay_free(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNEL_TIMING_LOCK_DIR", str(tmp_path / "locks"))
    log = tmp_path / "intervals.txt"
    with gpu_lease(0) as lease:
        assert lease.lock_path == lock_path(0) == tmp_path / "locks" / "gpu0.lock"
        blocked = subprocess.run(_child_command(tmp_path, 0, 0.0, 0.3, log), env=_lease_env(tmp_path), timeout=60)
        other_gpu = subprocess.run(_child_command(tmp_path, 1, 0.0, 5.0, log), env=_lease_env(tmp_path), timeout=60)
    assert blocked.returncode == 3
    assert other_gpu.returncode == 0
    with gpu_lease(0, timeout_s=1.0) as lease:  # released on exit
        assert lease.waited_s < 1.0
    with pytest.raises(ValueError, match="device index"):
        lock_path(-1)


def test_lease_is_released_when_the_holder_dies(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNEL_TIMING_LOCK_DIR", str(tmp_path / "locks"))
    holder = subprocess.Popen(_child_command(tmp_path, 0, 30.0, "none", tmp_path / "log"), env=_lease_env(tmp_path))
    deadline = time.time() + 20
    while not lock_path(0).exists() and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # let it take the lock
    with pytest.raises(LeaseTimeout):
        with gpu_lease(0, timeout_s=0.2):
            pass
    holder.kill()
    holder.wait(timeout=30)
    with gpu_lease(0, timeout_s=5.0):
        pass


def _python_and_project_dirs_under(hidden: str) -> list[str]:
    """Directories of this interpreter's installation (prefixes, site-packages, sys.path) and of the
    project that lie under ``hidden``."""
    import site

    candidates = {sys.prefix, sys.base_prefix, sys.exec_prefix, str(PROJECT_ROOT),
                  os.path.dirname(os.path.realpath(sys.executable)), *site.getsitepackages()}
    candidates.update(p for p in sys.path if p and os.path.isabs(p))
    found = set()
    for path in candidates:
        for variant in (os.path.abspath(path), os.path.realpath(path)):  # a symlinked venv needs both
            if os.path.isdir(variant) and variant.startswith(hidden.rstrip("/") + "/"):
                found.add(variant)
    return sorted(found)


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")
def test_lease_holds_across_a_bubblewrap_sandbox(tmp_path, monkeypatch):
    locks = tmp_path / "locks"
    locks.mkdir()
    monkeypatch.setenv("KERNEL_TIMING_LOCK_DIR", str(locks))
    log = tmp_path / "log"
    command = _child_command(tmp_path, 0, 0.0, 0.3, log)
    # Later binds sit on top of earlier ones: the lock directory stays writable inside the
    # read-only test directory, as the verifier binds it.
    # The tmpfs hides whatever lives under /tmp, a virtual environment's Python or this checkout
    # included: bind those back read-only, as the verifier's sandbox does.
    sandbox = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
    for needed in _python_and_project_dirs_under("/tmp"):
        sandbox += ["--ro-bind", needed, needed]
    sandbox += ["--ro-bind", str(tmp_path), str(tmp_path), "--bind", str(locks), str(locks),
                "--unshare-net", "--die-with-parent"]
    probe = subprocess.run(sandbox + ["true"], capture_output=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip(f"bubblewrap cannot run here: {probe.stderr.decode()[:200]}")
    # The sandbox sees the log directory read-only; give the child a writable log inside the lock dir.
    command[-1] = str(locks / "log")
    with gpu_lease(0):
        blocked = subprocess.run(sandbox + command, env=_lease_env(tmp_path), timeout=60)
    assert blocked.returncode == 3
    free = subprocess.run(sandbox + command, env=_lease_env(tmp_path), timeout=60)
    assert free.returncode == 0


# --- the benchmark's dry run ---------------------------------------------------------------------------


def test_benchmark_dry_run_exercises_every_section(tmp_path, kernelbench_jsonl):
    out = tmp_path / "table.md"
    command = [sys.executable, os.path.join(PROJECT_ROOT, "bench", "timing_accuracy.py"), "--dry-run",
               "--kernelbench", str(kernelbench_jsonl), "--problems", "L1/19 ReLU,L2/12", "--out", str(out)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=PROJECT_ROOT,
                            env={**os.environ, "TRITON_INTERPRET": "1"})
    assert result.returncode == 0, result.stderr[-2000:]
    table = out.read_text()
    assert table.startswith("Device: cpu (dry run")
    for case in ("Triton ReLU 256 MB vs itself", "2-pass vs 1-pass sweep", "4-pass vs 1-pass sweep",
                 "L1/19 ReLU |", "L1/19 ReLU at 16x65536 (reduced)", "L2/12 Gemm+Multiply+LeakyReLU",
                 "median over 2 full-size problems", "side stream", "address memo", "fingerprint memo"):
        assert case in table, case
    assert "ERROR" not in table, table
    memo_rows = [line for line in table.splitlines() if "memo (" in line]
    assert all(line.rstrip().endswith("| PASS |") for line in memo_rows), memo_rows
