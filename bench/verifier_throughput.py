"""Verifier throughput: candidates per minute through ``verify_batch`` against a KernelBench-style
baseline that starts one fresh Python process per candidate which imports, builds, runs and checks
everything itself (how KernelBench's eval_from_generations judges a generation).

The batch is built from a few KernelBench level-1 elementwise problems and mixes what a policy
model produces: unparsable answers, static-check failures (PyTorch in forward), compile failures,
wrong kernels, correct kernels and duplicates of them (as raw markdown responses).

    python bench/verifier_throughput.py --kernelbench ../shared/kernelbench/kernelbench_problems.jsonl
    python bench/verifier_throughput.py --kernelbench PATH --device cpu --copies 1 --set verifier.multi_input_num_tests=2
    python bench/verifier_throughput.py --kernelbench PATH --shape pairs --slots 2,4,8,16 --limit 96

Three batch shapes (``--shape``): ``mixed`` (RL-like: a few problems, several answers each, mostly
wrong, with duplicates), ``fixtures`` (evaluation-like: many problems, each with its correct
solution and the wrong kernels written for it, from tests/fixtures/candidates) and ``pairs``
(data-like: the synthesizer's verified pairs, each its own problem with one correct candidate,
timing off as the data stage runs it). ``--slots`` runs the verifier at several worker-slot counts,
each against the fresh-process baseline at the same process count where ``--baseline-slots`` names it.

Prints one markdown table with the same batch judged several ways (``--modes``): the verifier with its fork servers
(the default: one sandboxed server per worker slot imports torch and Triton once and forks a fresh
child per candidate), the verifier with a fresh sandboxed process per candidate
(``verifier.fork_server: false``, the older path), and the KernelBench-style baseline; the last
column is each rate over the baseline's. A second table breaks each verifier path's time per
candidate down by phase (``details["phase_s"]``: the parent's and the worker's). All sides judge the same problem sizes (the verifier's
``cpu_max_input_numel`` / ``cuda_max_input_numel`` shrink, applied to the baseline's problems too).
"""
from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import random
import re
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT_ROOT))

# problem_id -> the Triton expression of the elementwise op (x is the loaded block)
ELEMENTWISE = {
    19: "tl.maximum(x, 0.0)",
    21: "1.0 / (1.0 + tl.exp(-x))",
    25: "x / (1.0 + tl.exp(-x))",
    30: "x / (1.0 + tl.abs(x))",
}

KERNEL_TEMPLATE = '''import torch
import torch.nn as nn
import triton
import triton.language as tl
{extra_import}

@triton.jit
def elementwise_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, {expr}, mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        n = x.numel()
        elementwise_kernel[(triton.cdiv(n, 1024),)](x, y, n, BLOCK=1024)
        return {ret}
'''


def mixed_candidates(expr: str) -> dict[str, str]:
    correct = KERNEL_TEMPLATE.format(extra_import="", expr=expr, ret="y")
    return {
        "unparsable": "I am not sure how to write this kernel, sorry.",
        "static_fail": KERNEL_TEMPLATE.format(extra_import="", expr=expr, ret="torch.relu(y) * 1.0 + torch.sigmoid(x) * 0.0"),
        "compile_fail": KERNEL_TEMPLATE.format(extra_import="from triton.language import not_a_builtin", expr=expr, ret="y"),
        "wrong": KERNEL_TEMPLATE.format(extra_import="", expr="x", ret="y"),
        "correct": correct,
        "duplicate": "Here is the kernel:\n\n```python\n" + correct + "```\n",
    }


def load_problems(path: str, ids: list[int]) -> dict[int, str]:
    rows = {}
    with open(path) as fh:
        for line in fh:
            row = json.loads(line)
            if row.get("level") == 1 and row.get("problem_id") in ids:
                rows[row["problem_id"]] = row["code"]
    missing = sorted(set(ids) - set(rows))
    if missing:
        raise SystemExit(f"problems {missing} of level 1 not found in {path}")
    return rows


def shrunk_source(code: str, config, device: str) -> str:
    """The problem at the sizes the verifier uses, so the baseline does the same work."""
    from extensions.verify.common.problem_constants import rewrite_constants
    from extensions.verify.common.problem_sizes import shrink_to_cap

    cap = config.cpu_max_input_numel if device == "cpu" else config.cuda_max_input_numel
    values, _ = shrink_to_cap(code, cap)
    return rewrite_constants(code, values)


# -- baseline: one fresh process per candidate ---------------------------------------------------

BASELINE_TRIALS = 5


def baseline_worker(job_dir: str) -> None:
    """Runs in the fresh process: extract, import, build, check ``BASELINE_TRIALS`` seeds, time."""
    import importlib.util

    from extensions.verify.static.extract import extract_code
    from extensions.verify.common.problem_sizes import load_problem

    job = json.loads(Path(job_dir, "job.json").read_text())
    verdict = {"correct": False, "error": None, "speedup": None}
    try:
        import torch

        extraction = extract_code(Path(job_dir, "response.txt").read_text())
        if extraction.code is None:
            raise ValueError(f"extract: {extraction.error}")
        Path(job_dir, "candidate.py").write_text(extraction.code)
        problem = load_problem(Path(job_dir, "problem.py").read_text())
        spec = importlib.util.spec_from_file_location("candidate", Path(job_dir, "candidate.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        device = job["device"]
        torch.manual_seed(42)
        init = problem.get_init_inputs()
        torch.manual_seed(42)
        reference = problem.Model(*init).to(device)
        torch.manual_seed(42)
        candidate = module.ModelNew(*init).to(device)
        correct = True
        with torch.no_grad():
            for trial in range(BASELINE_TRIALS):
                torch.manual_seed(42 + trial)
                inputs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in problem.get_inputs()]
                if not torch.allclose(candidate(*inputs), reference(*inputs), atol=1e-2, rtol=1e-2):
                    correct = False
                    break
            verdict["correct"] = correct
            if correct and device == "cuda":
                verdict["speedup"] = _event_speedup(reference, candidate, inputs)
    except BaseException as exc:  # noqa: BLE001 - the verdict is the output
        verdict["error"] = f"{type(exc).__name__}: {str(exc)[:100]}"
    print(json.dumps(verdict))


def _event_speedup(reference, candidate, inputs, trials: int = 50) -> float:
    import torch

    def timed(model) -> float:
        for _ in range(5):
            model(*inputs)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(trials):
            model(*inputs)
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / trials

    return timed(reference) / timed(candidate)


def run_baseline(batch: list[tuple[str, str, str]], device: str, workers: int, timeout_s: float) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "HF_"))}
    env["PYTHONPATH"] = str(PROJECT_ROOT)
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"

    def one(item: tuple[str, str, str]) -> dict:
        _label, problem, response = item
        with tempfile.TemporaryDirectory(prefix="baseline-") as job_dir:
            Path(job_dir, "problem.py").write_text(problem)
            Path(job_dir, "response.txt").write_text(response)
            Path(job_dir, "job.json").write_text(json.dumps({"device": device}))
            try:
                done = subprocess.run([sys.executable, __file__, "--baseline-worker", job_dir], env=env,
                                      capture_output=True, text=True, timeout=timeout_s)
                lines = done.stdout.strip().splitlines()
                return json.loads(lines[-1]) if lines else {"correct": False, "error": "no verdict"}
            except (subprocess.TimeoutExpired, ValueError) as exc:
                return {"correct": False, "error": type(exc).__name__}

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(one, batch))


# -- the benchmark -----------------------------------------------------------------------------

def build_batch(problems: dict[int, str], copies: int) -> list[tuple[str, str, str]]:
    batch = []
    for copy in range(copies):
        for pid, code in problems.items():
            for kind, text in mixed_candidates(ELEMENTWISE[pid]).items():
                batch.append((f"p{pid}/{kind}/{copy}", code, text))
    return batch


_FIXTURE_HEADER = re.compile(r"^#\s*kernelbench:\s*level=(\d+)\s+problem_id=(\d+)\s", re.M)


def fixture_batch(kernelbench: str) -> list[tuple[str, str, str]]:
    """Evaluation-like: every correct KernelBench solution among the test fixtures and every wrong
    kernel written for one of those problems (many problems, one or few correct answers each)."""
    folder = PROJECT_ROOT / "tests" / "fixtures" / "candidates"
    files = []
    for kind in ("kernelbench", "wrong"):
        for path in sorted((folder / kind).glob("*.py")):
            text = path.read_text()
            header = _FIXTURE_HEADER.search("\n".join(text.splitlines()[:6]))
            if header:
                files.append((f"{kind}/{path.stem}", (int(header.group(1)), int(header.group(2))), text))
    wanted = {key for _, key, _ in files}
    problems = {}
    with open(kernelbench) as fh:
        for line in fh:
            row = json.loads(line)
            key = (row.get("level"), row.get("problem_id"))
            if key in wanted:
                problems[key] = row["code"]
    return [(label, problems[key], text) for label, key, text in files if key in problems]


def pair_batch(path: str) -> list[tuple[str, str, str]]:
    """Data-like: each synthesized pair's task with its own solution, as the data stage judges it."""
    from extensions.data.kernelbook import normalise_row
    from extensions.data.rejections import RowRejected

    opener = gzip.open if path.endswith(".gz") else open
    batch, rejected = [], {}
    with opener(path, "rt") as fh:
        for line in fh:
            try:
                pair = normalise_row(json.loads(line))
            except RowRejected as exc:
                rejected[exc.reason] = rejected.get(exc.reason, 0) + 1
                continue
            batch.append((pair.uuid, pair.task_code, pair.solution_code))
    if rejected:
        print(f"pairs left out of the batch (the data stage would drop them too): {rejected}", file=sys.stderr)
    return batch


def longest_silence(results) -> tuple[float, float]:
    """The longest stretch (s) without a verdict while candidates were still waiting, and when it
    began, counted from the moment the batch's workers started. Candidates answered without a
    worker (cached, duplicates, static rejects) are answered at once and do not count."""
    ends = sorted(r.details["batch_span_s"][1] for r in results if not r.cached and "batch_span_s" in r.details)
    longest, began, previous = 0.0, 0.0, 0.0
    for end in ends:
        if end - previous > longest:
            longest, began = end - previous, previous
        previous = end
    return longest, began


VERIFIER_MODES = {  # key: (row label, fork_server, prebuilt_triton_cache, reference_server)
    "fork": ("verify_batch, fork server per slot (one fork per candidate)", True, True, True),
    "fork-fresh-references": ("verify_batch, fork server per slot, a fresh reference process per problem",
                              True, True, False),
    "fork-nocache": ("verify_batch, fork server per slot, no pre-built Triton cache", True, False, True),
    "fresh": ("verify_batch, fresh sandboxed process per candidate", False, True, True),
}


def phase_breakdown(results) -> dict:
    """Mean seconds per phase over the candidates that ran a worker (cached copies and candidates
    rejected before the sandbox excluded), and the references' mean preparation time."""
    ran = [r for r in results if not r.cached and "phase_s" in r.details]
    sums: dict[str, float] = {}
    for result in ran:
        for side in ("parent", "worker"):
            for name, seconds in result.details["phase_s"].get(side, {}).items():
                sums[f"{side}.{name}"] = sums.get(f"{side}.{name}", 0.0) + seconds
    prepare = [s for s in {r.details.get("problem_prepare_s") for r in ran} if s is not None]
    means = {name: total / len(ran) for name, total in sums.items()} if ran else {}
    # Each problem's reference phases once (every candidate of a problem carries the same dict).
    distinct = {json.dumps(r.details.get("problem_prepare_phases") or {}, sort_keys=True) for r in ran}
    per_problem = [json.loads(d) for d in distinct if d != "{}"]
    for name in sorted({n for d in per_problem for n in d}):
        means[f"reference.{name}"] = sum(d.get(name, 0.0) for d in per_problem) / len(per_problem)
    seeds = sorted({r.details["triton_cache_seed"] for r in ran if r.details.get("triton_cache_seed")})
    return {"candidates": len(ran), "phases": means,
            "prepare_s": sum(prepare) / len(prepare) if prepare else None, "seed": "; ".join(seeds) or "-"}


def phase_table(breakdowns: dict) -> str:
    """Mean seconds per worker-run candidate and phase, one column per verifier mode."""
    keys = list(breakdowns)
    order = ("parent.", "worker.", "reference.")
    names = sorted({name for b in breakdowns.values() for name in b["phases"]},
                   key=lambda n: (next((i for i, p in enumerate(order) if n.startswith(p)), 3), n))
    lines = ["| phase (mean s per candidate that ran) | " + " | ".join(keys) + " |",
             "|---|" + "---:|" * len(keys)]
    for name in names:
        cells = [f"{breakdowns[k]['phases'][name]:.2f}" if name in breakdowns[k]["phases"] else "-" for k in keys]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    cells = [f"{b['prepare_s']:.2f}" if b["prepare_s"] is not None else "-" for b in breakdowns.values()]
    lines.append("| reference data, per problem (once per batch) | " + " | ".join(cells) + " |")
    lines.append("| candidates that ran a worker | " + " | ".join(str(b["candidates"]) for b in breakdowns.values()) + " |")
    lines.append("| pre-built Triton cache | " + " | ".join(b["seed"] for b in breakdowns.values()) + " |")
    return "\n".join(lines)


def timeline_table(results) -> str:
    """Each candidate that ran a worker: when its judging began (its problem's reference ready and a
    slot's thread free) and ended, in seconds since the batch's workers started: the critical path."""
    ran = sorted((r for r in results if not r.cached and "batch_span_s" in r.details),
                 key=lambda r: r.details["batch_span_s"][0])
    lines = ["| candidate | began s | ended s | took s | stage | correct |", "|---|---:|---:|---:|---|---|"]
    for r in ran:
        began, ended = r.details["batch_span_s"]
        lines.append(f"| {r.candidate} | {began:.1f} | {ended:.1f} | {ended - began:.1f} | {r.stage} | {r.correct} |")
    return "\n".join(lines)


@contextlib.contextmanager
def timed_close():
    """When the batch's workers were started, and when closing them began and ended (monotonic)."""
    from extensions.verify.parent import launcher

    original = launcher.WorkerLauncher.close
    seconds: list[tuple[float, float, float]] = []

    def close(self):
        began = time.monotonic()
        try:
            return original(self)
        finally:
            seconds.append((self.created, began, time.monotonic()))

    launcher.WorkerLauncher.close = close
    try:
        yield seconds
    finally:
        launcher.WorkerLauncher.close = original


def markdown_table(rows: list[dict]) -> str:
    head = ["mode", "slots", "reference processes", "device", "isolation", "candidates", "processes", "wall s", "candidates/min", "correct",
            "correct/min", "longest silence s", "reference s max"]
    if any("vs fresh process" in row for row in rows):
        head.append("vs fresh process")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        lines.append("| " + " | ".join(str(row.get(h, "-")) for h in head) + " |")
    return "\n".join(lines)


def main() -> None:
    from extensions.config import add_config_args, config_from_args

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kernelbench", required=False, help="KernelBench JSONL (level, problem_id, code)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    parser.add_argument("--shape", choices=("mixed", "fixtures", "pairs"), default="mixed",
                        help="mixed: RL-like; fixtures: evaluation-like; pairs: data-like, timing off")
    parser.add_argument("--pairs", default=str(PROJECT_ROOT / "bench/results/synthesized_pairs_h100.jsonl.gz"),
                        help="KernelBook-format JSONL(.gz) of verified pairs (--shape pairs)")
    parser.add_argument("--limit", type=int, default=0, help="judge at most this many candidates (0: all)")
    parser.add_argument("--problems", default=",".join(str(p) for p in ELEMENTWISE),
                        help=f"level-1 problem ids among {sorted(ELEMENTWISE)} (--shape mixed)")
    parser.add_argument("--copies", type=int, default=2, help="repeat the mixed batch (more duplicates)")
    parser.add_argument("--workers", type=int, default=0, help="parallel workers for both sides (0: default)")
    parser.add_argument("--slots", default="",
                        help="comma-separated worker-slot counts to run the verifier at (default: --workers)")
    parser.add_argument("--reference-processes", default="",
                        help="comma-separated verifier.reference_processes values to run each slot count at "
                             "(default: the config's)")
    parser.add_argument("--baseline-slots", default="",
                        help="slot counts at which the fresh-process baseline also runs (default: the largest)")
    parser.add_argument("--timing", choices=("auto", "on", "off"), default="auto",
                        help="calibrated timing of correct kernels (auto: off for --shape pairs)")
    parser.add_argument("--skip-baseline", action="store_true")
    parser.add_argument("--modes", default="fork,fresh",
                        help="verifier paths to time, in order: fork (fork servers), fork-fresh-references (fork "
                             "servers, a fresh reference process per problem), fork-nocache (fork servers, no "
                             "pre-built Triton cache), fresh (a fresh sandboxed process per candidate)")
    parser.add_argument("--baseline-worker", help=argparse.SUPPRESS)
    add_config_args(parser)
    args = parser.parse_args()
    if args.baseline_worker:
        baseline_worker(args.baseline_worker)
        return
    if not args.kernelbench and args.shape != "pairs":
        parser.error("--kernelbench is required")

    from extensions.verify import summarize_results, verify_batch, VerifyRequest

    config = config_from_args(args).verifier
    if args.workers:
        config.workers = args.workers
    if args.timing != "auto" or args.shape == "pairs":
        config.enable_calibrated_timing = args.timing == "on"
    if args.shape == "mixed":
        ids = [int(p) for p in args.problems.split(",") if p.strip()]
        unknown = sorted(set(ids) - set(ELEMENTWISE))
        if unknown:
            parser.error(f"no candidates written for problems {unknown}; choose among {sorted(ELEMENTWISE)}")
        problems = load_problems(args.kernelbench, ids)
        batch = build_batch(problems, args.copies)
    elif args.shape == "fixtures":
        batch = fixture_batch(args.kernelbench)
    else:
        batch = pair_batch(args.pairs)
    if args.limit and len(batch) > args.limit:
        batch = random.Random(0).sample(batch, args.limit)
    # The verifier gets each problem as written (it shrinks it itself, and its wide set grows from
    # the problem's own sizes); the baseline gets the sizes the verifier's base set uses.
    shrunk = {problem: shrunk_source(problem, config, args.device) for problem in {p for _, p, _ in batch}}
    baseline_batch = [(label, shrunk[problem], text) for label, problem, text in batch]
    default_slots = config.workers or (os.cpu_count() or 1 if args.device == "cpu" else 2)
    slot_counts = [int(n) for n in args.slots.split(",") if n.strip()] or [default_slots]
    reference_counts = [int(n) for n in args.reference_processes.split(",") if n.strip()] or [
        config.reference_processes]
    baseline_at = {int(n) for n in args.baseline_slots.split(",") if n.strip()} or {max(slot_counts)}
    print(f"shape {args.shape}: {len(batch)} candidates over {len({p for _, p, _ in batch})} problems; "
          f"timing {'on' if config.enable_calibrated_timing else 'off'}; slots {slot_counts}", file=sys.stderr, flush=True)

    # The first import of torch on a fresh machine reads its libraries from disk; whichever side
    # ran first would pay for it. Both start from the same warm file cache instead.
    subprocess.run([sys.executable, "-c", "import torch, triton, torch._inductor.config"], check=False)
    rows, breakdowns, timelines, ends = [], {}, {}, {}
    summary = None
    for slots in slot_counts:
        config.workers = slots
        slot_rows = []
        runs = [(key, refs) for key in [m.strip() for m in args.modes.split(",") if m.strip()]
                for refs in reference_counts]
        for key, refs in runs:
            config.reference_processes = refs
            if key not in VERIFIER_MODES:
                parser.error(f"unknown mode {key!r}; choose among {sorted(VERIFIER_MODES)}")
            mode, fork_server, prebuilt_cache, reference_server = VERIFIER_MODES[key]
            config.fork_server, config.prebuilt_triton_cache = fork_server, prebuilt_cache
            config.reference_server = reference_server
            started = time.monotonic()
            with timed_close() as closing:
                results = verify_batch([VerifyRequest(p, t, label) for label, p, t in batch], config,
                                       device=args.device, progress=True)
            wall = time.monotonic() - started
            run_key = f"{key}@{slots}" + (f"/refs{refs}" if refs else "")
            last_end = max((r.details["batch_span_s"][1] for r in results if "batch_span_s" in r.details), default=None)
            silence, silence_began = longest_silence(results)
            if closing:
                created, began, ended = (t - started for t in closing[0])
                ends[run_key] = (f"{run_key}: workers started {created:.1f}s after the call, last verdict at "
                                 f"{created + (last_end or 0.0):.1f}s, closing the workers from {began:.1f}s to "
                                 f"{ended:.1f}s, returned at {wall:.1f}s")
            summary = summarize_results(results)
            breakdowns[run_key] = phase_breakdown(results)
            timelines[run_key] = timeline_table(results)
            prepare = [r.details.get("problem_prepare_s") for r in results if r.details.get("problem_prepare_s")]
            slot_rows.append({
                "mode": mode, "slots": slots, "reference processes": refs or "auto", "device": args.device,
                "candidates": len(batch), "processes": summary["per_stage_reached"]["static"] - summary["cached"],
                "wall s": f"{wall:.1f}", "candidates/min": f"{60 * len(batch) / wall:.1f}",
                "correct": summary["correct"], "correct/min": f"{60 * summary['correct'] / wall:.1f}",
                "longest silence s": f"{silence:.1f} (from {silence_began:.0f})",
                "reference s max": f"{max(prepare):.1f}" if prepare else "-",
                "isolation": results[-1].isolation if results else "-",
            })
            print(f"done: {json.dumps(slot_rows[-1])}\n{phase_table({run_key: breakdowns[run_key]})}",
                  file=sys.stderr, flush=True)
            if args.shape == "pairs":  # every pair was verified correct once: a reject is worth its reason
                for result in results:
                    if not result.correct:
                        print(f"rejected pair {result.candidate} at {result.stage}: {result.error} {result.flags}",
                              file=sys.stderr, flush=True)
        if not args.skip_baseline and slots in baseline_at:
            started = time.monotonic()
            verdicts = run_baseline(baseline_batch, args.device, slots, config.timeout_s)
            baseline_s = time.monotonic() - started
            correct = sum(1 for v in verdicts if v.get("correct"))
            slot_rows.append({
                "mode": "fresh process per candidate (KernelBench-style, no sandbox)", "slots": slots,
                "device": args.device, "candidates": len(batch), "processes": len(batch), "wall s": f"{baseline_s:.1f}",
                "candidates/min": f"{60 * len(batch) / baseline_s:.1f}", "correct": correct,
                "correct/min": f"{60 * correct / baseline_s:.1f}", "isolation": "none",
            })
            base_rate = float(slot_rows[-1]["candidates/min"])
            for row in slot_rows:
                row["vs fresh process"] = f"{float(row['candidates/min']) / base_rate:.2f}x"
        rows.extend(slot_rows)
    print(markdown_table(rows))
    if summary is not None:
        print(f"\nrejected early by the verifier (last verifier run): {json.dumps(summary['rejected_at'])}")
    if breakdowns:
        print("\n" + phase_table(breakdowns))
    for key, table in timelines.items():
        print(f"\nTimeline of {key}:\n{table}")
    if ends:
        print("\nBatch start and end (seconds since verify_batch was called):\n" + "\n".join(ends.values()))


if __name__ == "__main__":
    main()
