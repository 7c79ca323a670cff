"""Why does the timer's speedup spread from run to run, and why does it flag honest candidates?

Runs a few KernelBench problems (full size) under three timer variants and records every timed
call, so each candidate cause is measured rather than guessed:

- ``whole-fingerprint``: eager launch (host launch time inside the region) and the fingerprint
  computed over the whole output at once (float64 temporaries several times the output's size);
- ``eager``: eager launch, chunked fingerprint;
- ``gated``: the launch gate (``timing_launch_cost: excluded``), chunked fingerprint.

``new rule`` is the awake-host window less the control round trip timed right after each call
(``hidden_ms``); the control round trip itself is in the JSON beside the table.

Per variant and problem it prints the run-to-run CV of the speedup, the side-stream verdict by
the raw post-stream gap (the old rule) and by the awake-host window (``hidden_ms``, the new one),
the host wake-up latency of each model (gap minus window), how the per-pair ratio depends on which
model ran first, the driver allocations and allocator retries during the measurements, the share
of gated calls, and the SM clock and throttle reasons before and after.

    python bench/timing_causes.py --kernelbench PATH --out outputs/timing_causes.md   # GPU, ~2 min
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

BENCH = Path(__file__).resolve().parent
if str(BENCH.parent) not in sys.path:
    sys.path.insert(0, str(BENCH.parent))
sys.path.insert(0, str(BENCH))

import timing_accuracy as accuracy  # noqa: E402  (the problems and candidates of the benchmark)

VARIANTS = ("gated", "eager", "whole-fingerprint")
DEFAULT_PROBLEMS = "L1/21 Sigmoid,L1/88 MinGPTNewGelu,L1/40 LayerNorm,L1/47 Sum reduction,L2/12"


def whole_output_fingerprint(output):
    """The fingerprint as first written: float64 temporaries of the whole output at once."""
    import torch

    from extensions.timing.tensors import flatten_tensors

    prints = []
    for tensor in flatten_tensors(output):
        values = torch.nan_to_num(tensor.detach().reshape(-1).to(torch.float64), nan=0.0, posinf=0.0, neginf=0.0)
        positions = torch.arange(values.numel(), device=values.device, dtype=torch.float64)
        weights = torch.frac(positions * 0.6180339887498949)
        prints.append((torch.stack([values.sum(), (values * weights).sum(), values.abs().sum()]), values.numel(),
                       tensor.dtype))
    return prints


def gpu_clock_state() -> str:
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        sm = pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)
        mem = pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM)
        reasons = pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle)
        power = pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0
        temp = pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)
        return f"SM {sm} MHz, mem {mem} MHz, throttle 0x{reasons:x}, {power:.0f} W, {temp} C"
    except Exception as error:  # the diagnosis goes on without the clock reading
        return f"clock unread ({type(error).__name__})"


def host_clock_source() -> str:
    path = Path("/sys/devices/system/clocksource/clocksource0/current_clocksource")
    return path.read_text().strip() if path.exists() else "unknown"


class LoggingRunner:
    """Wraps a trial runner and keeps (role, position in pair, CallTiming) of every call."""

    def __init__(self, runner):
        self.runner = runner
        self.calls = []
        self._in_pair = 0

    def __getattr__(self, name):
        return getattr(self.runner, name)

    def load(self, index):
        self._in_pair = 0
        return self.runner.load(index)

    def time_call(self, role):
        timing = self.runner.time_call(role)
        self.calls.append((role, self._in_pair, timing))
        self._in_pair += 1
        return timing


def run_variant(variant, reference, candidate, sets, config, repeats):
    import torch

    from extensions.timing import measure_speedup, runners
    from extensions.timing.runners import CudaTrialRunner
    from extensions.verify.common.compare import compare_outputs

    launch = "excluded" if variant == "gated" else "included"
    config = replace(config, timing_launch_cost=launch)
    saved = runners.fingerprint
    if variant == "whole-fingerprint":
        runners.fingerprint = whole_output_fingerprint
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()
    reports, calls, plain_medians = [], [], []
    clock_before = gpu_clock_state()
    try:
        for _ in range(repeats):
            logger = LoggingRunner(CudaTrialRunner(reference, candidate, sets, config, compare_outputs))
            reports.append(measure_speedup(reference, candidate, sets, config, compare_outputs=compare_outputs,
                                           runner=logger).to_dict())
            probes = len(reports[-1]["details"].get("probes", []))
            timed = logger.calls[2 * reports[-1]["warmup"]:len(logger.calls) - 2 * probes]
            calls.extend(timed)
            plain_medians.append(plain_median_of_ratios(timed))
    finally:
        runners.fingerprint = saved
    after = torch.cuda.memory_stats()
    memory = {key: after.get(key, 0) - before.get(key, 0)
              for key in ("num_device_alloc", "num_device_free", "num_alloc_retries")}
    result = summarize(variant, reports, calls, memory, clock_before, gpu_clock_state())
    result["cv_plain_median"] = statistics.stdev(plain_medians) / statistics.mean(plain_medians)
    return result


def plain_median_of_ratios(calls) -> float:
    """The estimator as first written: the median of single-pair ratios, orders mixed."""
    ratios, pending = [], {}
    for role, _, timing in calls:
        pending[role] = timing.stream_ms
        if len(pending) == 2:
            ratios.append(pending["reference"] / max(pending["candidate"], 1e-9))
            pending = {}
    return statistics.median(ratios)


def summarize(variant, reports, calls, memory, clock_before, clock_after):
    speedups = [r["speedup"] for r in reports if r["speedup"] is not None]

    def med(values):
        return statistics.median(values) if values else float("nan")

    def per_role(role, attribute):
        return med([getattr(t, attribute) for r, _, t in calls if r == role])

    gaps = {role: med([t.device_ms - t.stream_ms for r, _, t in calls if r == role]) for role in ("reference", "candidate")}
    hidden = {role: med([t.hidden_ms for r, _, t in calls if r == role and t.hidden_ms is not None])
              for role in ("reference", "candidate")}
    ratios_by_order = {}
    pending = {}
    for role, position, timing in calls:
        pending[role] = (position, timing.stream_ms)
        if len(pending) == 2:
            first = "candidate first" if pending["candidate"][0] == 0 else "reference first"
            ratios_by_order.setdefault(first, []).append(pending["reference"][1] / max(pending["candidate"][1], 1e-9))
            pending = {}
    return {
        "variant": variant,
        "speedups": speedups,
        "cv": statistics.stdev(speedups) / statistics.mean(speedups) if len(speedups) > 1 else float("nan"),
        "trials": [r["trials"] for r in reports],
        "flags": sorted({f for r in reports for f in r["flags"]}),
        "launch_cost": sorted({r["launch_cost"] for r in reports}),
        "ref_ms": med([r["ref_ms"] for r in reports]),
        "cand_ms": med([r["cand_ms"] for r in reports]),
        "gap_ms": gaps,
        "hidden_ms": hidden,
        "wake_ms": {role: gaps[role] - hidden[role] for role in gaps},
        "old_rule_excess_us": 1000 * (gaps["candidate"] - gaps["reference"]),
        "new_rule_excess_us": 1000 * (hidden["candidate"] - hidden["reference"]),
        "median_ratio_by_order": {k: med(v) for k, v in ratios_by_order.items()},
        "trial_cv_by_order": {k: (statistics.stdev(v) / statistics.mean(v) if len(v) > 1 else float("nan"))
                              for k, v in ratios_by_order.items()},
        "gated_share": {role: sum(t.launch_excluded for r, _, t in calls if r == role)
                        / max(1, sum(1 for r, _, _ in calls if r == role)) for role in ("reference", "candidate")},
        "round_trip_ms": {role: med([t.round_trip_ms for r, _, t in calls if r == role and t.round_trip_ms is not None])
                          for role in ("reference", "candidate")},
        "wall_minus_stream_ms": {role: med([t.wall_ms - t.stream_ms for r, _, t in calls if r == role])
                                 for role in ("reference", "candidate")},
        "stream_ms": {role: per_role(role, "stream_ms") for role in ("reference", "candidate")},
        "memory": memory,
        "clock_before": clock_before,
        "clock_after": clock_after,
    }


def render(results, header) -> str:
    lines = [header, "", "| problem | variant | ref ms | cand ms | speedup CV (blocks / plain median) | trials | old rule excess us | "
             "new rule excess us | wake ref/cand us | ratio ref-first / cand-first | gated ref/cand | "
             "driver allocs / frees / retries | flags |", "|" + "---|" * 13]
    for problem, result in results:
        if "error" in result:
            lines.append(f"| {problem} | {result['variant']} | {result['error'].replace('|', '/')} |" + " |" * 10)
            continue
        order = result["median_ratio_by_order"]
        lines.append(" | ".join([
            f"| {problem}", result["variant"], f"{result['ref_ms']:.4f}", f"{result['cand_ms']:.4f}",
            f"{100 * result['cv']:.2f}% / {100 * result['cv_plain_median']:.2f}%", ",".join(map(str, result["trials"])),
            f"{result['old_rule_excess_us']:+.1f}", f"{result['new_rule_excess_us']:+.1f}",
            f"{1000 * result['wake_ms']['reference']:.1f} / {1000 * result['wake_ms']['candidate']:.1f}",
            f"{order.get('reference first', float('nan')):.4f} / {order.get('candidate first', float('nan')):.4f}",
            f"{result['gated_share']['reference']:.2f} / {result['gated_share']['candidate']:.2f}",
            "{num_device_alloc} / {num_device_free} / {num_alloc_retries}".format(**result["memory"]),
            ",".join(result["flags"]) or "none",
        ]) + " |")
    return "\n".join(lines) + "\n"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernelbench", default=None, help="KernelBench problems JSONL")
    parser.add_argument("--out", default=None, help="write the table (markdown) here, and the raw numbers as JSON beside it")
    parser.add_argument("--problems", default=DEFAULT_PROBLEMS, help="comma list of case-label substrings")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--budget-s", type=float, default=0.8)
    parser.add_argument("--max-minutes", type=float, default=3.0)
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: this diagnosis needs one", file=sys.stderr)
        return 2
    from extensions.config.sections import VerifierConfig

    started = time.monotonic()
    bench = accuracy.BenchDevice(dry_run=False)
    config = VerifierConfig(timing_mode="budget", timing_budget_s=args.budget_s)
    sources = accuracy.load_problem_sources(accuracy.find_kernelbench(args.kernelbench))
    wanted = [w.strip() for w in args.problems.split(",") if w.strip()]
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    results = []
    for spec in accuracy.PROBLEMS:
        if not spec.full_size or not any(w in spec.label for w in wanted):
            continue
        if time.monotonic() - started > 60 * args.max_minutes:
            print(f"out of time before {spec.label}", flush=True)
            break
        reference, candidate, sets = accuracy.build_problem(sources[(spec.level, spec.problem_id)], spec, bench, {})
        for variant in variants:
            try:
                result = run_variant(variant, reference, candidate, sets, config, args.repeats)
            except Exception as error:  # an out-of-memory variant is itself a finding
                message = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:200]
                result = {"variant": variant, "error": message}
                bench.release()
            results.append((spec.label, result))
            print(json.dumps({"problem": spec.label, **result}, default=str), flush=True)
        del reference, candidate, sets
        bench.release()
    header = (f"Device: {bench.name} | torch {torch.__version__} | host clock source {host_clock_source()} | "
              f"budget {args.budget_s}s | {args.repeats} repeats | {time.monotonic() - started:.0f}s")
    text = render(results, header)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
        Path(args.out).with_suffix(".json").write_text(json.dumps(
            [{"problem": p, **r} for p, r in results], indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
