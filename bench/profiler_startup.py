"""Where a fresh CUDA worker's start-up time goes, and whether it overlaps across processes.

    python3 bench/profiler_startup.py [--procs 1,2,4,8] [--out DIR]

The verifier's runtime audit needs the C++ profiler with CUDA activity (CUPTI) in every
candidate's own process, and its first start costs seconds. This script measures, each in fresh
processes on one GPU, the start-up phases (CUDA context, the profiler's first and later starts,
a Triton kernel's first profiled launch) in several orders and settings, and then starts N
processes at once to see whether those start-ups run side by side or one after another. It prints
one table per question; nothing of it is a test.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SCENARIOS = {
    "current": "CUDA context, then the profiler's first start with CUDA activity (the worker today)",
    "profiler_first": "the profiler's first start with CUDA activity before any CUDA context",
    "cpu_profiler": "CUDA context, then a CPU-only profiler start (no CUPTI)",
    "eager_modules": "as current, with CUDA_MODULE_LOADING=EAGER",
    "no_teardown": "as current, with TEARDOWN_CUPTI=0 (CUPTI kept between profiler sessions)",
}


# -- one fresh process -----------------------------------------------------------------------------

def _child(scenario: str) -> None:
    phases: dict = {}
    start = time.perf_counter()

    def mark(name: str, since: float) -> float:
        now = time.perf_counter()
        phases[name] = round(now - since, 3)
        return now

    t = start
    import torch
    import triton
    import triton.language as tl
    from torch.profiler import ProfilerActivity, _ExperimentalConfig, profile
    t = mark("import", t)

    cuda_activity = scenario != "cpu_profiler"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda_activity else [])

    def session(name: str, body=None) -> None:
        nonlocal t
        prof = profile(activities=activities,
                       experimental_config=_ExperimentalConfig(profile_all_threads=True))
        prof.__enter__()
        t = mark(f"{name}_start", t)
        if body is not None:
            body()
            torch.cuda.synchronize()
            t = mark(f"{name}_body", t)
        prof.__exit__(None, None, None)
        t = mark(f"{name}_stop", t)
        if body is not None:
            prof.events()
            t = mark(f"{name}_events", t)

    if scenario == "profiler_first":
        session("profiler1")
        torch.zeros(1, device="cuda")
        torch.cuda.synchronize()
        t = mark("cuda_init", t)
    else:
        torch.zeros(1, device="cuda")
        torch.cuda.synchronize()
        t = mark("cuda_init", t)
        session("profiler1")
    session("profiler2")
    triton.runtime.driver.active.utils  # noqa: B018
    t = mark("triton_driver", t)

    @triton.jit
    def add_one(x_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1.0, mask=mask)

    x = torch.zeros(1 << 20, device="cuda")
    grid = (triton.cdiv(x.numel(), 1024),)
    add_one[grid](x, x.numel(), BLOCK=1024)  # compile (or cache hit) and first load, unprofiled
    torch.cuda.synchronize()
    t = mark("triton_first_launch", t)

    @triton.jit
    def add_two(x_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 2.0, mask=mask)

    session("profiled_new_kernel", lambda: add_two[grid](x, x.numel(), BLOCK=1024))
    session("profiled_known_kernel", lambda: add_one[grid](x, x.numel(), BLOCK=1024))
    phases["total"] = round(time.perf_counter() - start, 3)
    print("PHASES " + json.dumps(phases), flush=True)


# -- the parent ------------------------------------------------------------------------------------

def _env(scenario: str) -> dict:
    env = dict(os.environ)
    if scenario == "eager_modules":
        env["CUDA_MODULE_LOADING"] = "EAGER"
    if scenario == "no_teardown":
        env["TEARDOWN_CUPTI"] = "0"
    return env


def _launch(scenario: str):
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", scenario],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(scenario))


def _collect(proc) -> dict:
    out, err = proc.communicate(timeout=300)
    for line in out.splitlines():
        if line.startswith("PHASES "):
            return json.loads(line[len("PHASES "):])
    return {"error": (err.strip().splitlines() or ["no output"])[-1][:200]}


def _phase_table(rows: list) -> str:
    names = []
    for _scenario, phases in rows:
        for name in phases:
            if name not in names:
                names.append(name)
    head = "| phase (s) | " + " | ".join(s for s, _ in rows) + " |"
    lines = [head, "|---|" + "---:|" * len(rows)]
    for name in names:
        lines.append(f"| {name} | " + " | ".join(str(p.get(name, "-")) for _, p in rows) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", choices=sorted(SCENARIOS))
    parser.add_argument("--procs", default="1,2,4,8", help="concurrent process counts to try")
    parser.add_argument("--repeats", type=int, default=2, help="fresh processes per scenario")
    parser.add_argument("--out", default="outputs/profiler_startup")
    args = parser.parse_args()
    if args.child:
        _child(args.child)
        return
    import torch

    os.makedirs(args.out, exist_ok=True)
    report = [f"# Worker start-up on {torch.cuda.get_device_name(0)} "
              f"(torch {torch.__version__})", ""]
    # One untimed process first: it builds Triton's driver utilities and the test kernels' cache.
    _collect(_launch("current"))

    report.append("## Phases of one fresh process, one at a time (mean of repeats)\n")
    for scenario, what in SCENARIOS.items():
        report.append(f"- `{scenario}`: {what}")
    rows = []
    for scenario in SCENARIOS:
        runs = [_collect(_launch(scenario)) for _ in range(args.repeats)]
        good = [r for r in runs if "error" not in r]
        if not good:
            rows.append((scenario, {"error": runs[0].get("error", "?")}))
            continue
        rows.append((scenario, {k: round(statistics.mean(r[k] for r in good if k in r), 3)
                                for k in good[0]}))
    report += ["", _phase_table(rows), ""]

    report.append("## N processes started at once (scenario `current`)\n")
    report.append("| N | wall s | profiler1_start mean / max s | cuda_init mean / max s | total mean / max s |")
    report.append("|---:|---:|---:|---:|---:|")
    for n in [int(v) for v in args.procs.split(",") if v]:
        began = time.perf_counter()
        procs = [_launch("current") for _ in range(n)]
        results = [_collect(p) for p in procs]
        wall = time.perf_counter() - began
        good = [r for r in results if "error" not in r]

        def stat(key: str) -> str:
            values = [r[key] for r in good if key in r]
            return f"{statistics.mean(values):.2f} / {max(values):.2f}" if values else "-"

        report.append(f"| {n} | {wall:.1f} | {stat('profiler1_start')} | {stat('cuda_init')} | "
                      f"{stat('total')} |" + ("" if len(good) == n else f" ({n - len(good)} failed)"))
    text = "\n".join(report) + "\n"
    print(text)
    with open(os.path.join(args.out, "profiler_startup.md"), "w") as fh:
        fh.write(text)


if __name__ == "__main__":
    main()
