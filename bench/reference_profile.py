"""Where a reference's time goes: builds the references of N synthesized problems one after
another in one process, as a kept reference server does (``verifier.reference_server``), and
prints the time per problem by input set and the functions that take it (cProfile).

    python bench/reference_profile.py --pairs bench/results/synthesized_pairs_h100.jsonl.gz --count 40
    python bench/reference_profile.py --pairs PATH --count 8 --device cpu

The first problem pays the process's CUDA start and is reported apart. Each set's time is measured
around ``ReferenceBuilder.try_add`` (the reference run, its fp64 model, rounding slack and
ambiguity runs), so the table says which sets cost what.
"""
from __future__ import annotations

import argparse
import cProfile
import gzip
import io
import json
import os
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT_ROOT))


def load_tasks(path: str, count: int) -> list[tuple[str, str]]:
    from extensions.data.kernelbook import normalise_row
    from extensions.data.rejections import RowRejected

    opener = gzip.open if path.endswith(".gz") else open
    tasks = []
    with opener(path, "rt") as fh:
        for line in fh:
            try:
                pair = normalise_row(json.loads(line))
            except RowRejected:
                continue
            tasks.append((pair.uuid, pair.task_code))
            if len(tasks) >= count:
                break
    return tasks


class SetClock:
    """Wall time of each ``try_add`` call by set kind, and of the build's other work."""

    def __init__(self, builder_cls):
        self.by_kind: dict[str, list[float]] = {}
        original = builder_cls.try_add
        clock = self

        def timed(builder, name, kind, *args, **kwargs):
            started = time.perf_counter()
            try:
                return original(builder, name, kind, *args, **kwargs)
            finally:
                clock.by_kind.setdefault(kind, []).append(time.perf_counter() - started)

        builder_cls.try_add = timed


def build_one(source: str, job: dict, secret: dict) -> dict:
    import torch

    from extensions.verify.common.precision import pin_ieee_fp32
    from extensions.verify.common.tensor_io import save_tensors
    from extensions.verify.reference.builder import ReferenceBuilder

    pin_ieee_fp32()
    started = time.perf_counter()
    builder = ReferenceBuilder(source, job, secret)
    made = time.perf_counter()
    builder.build()
    built = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        save_tensors(os.path.join(tmp, "inputs.safetensors"), builder.tensors)
        save_tensors(os.path.join(tmp, "expected.safetensors"), builder.expected)
    saved = time.perf_counter()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    return {"load": made - started, "build": built - made, "save": saved - built,
            "sets": len(builder.sets), "skipped": len(builder.skipped_sets)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", default=str(PROJECT_ROOT / "bench/results/synthesized_pairs_h100.jsonl.gz"))
    parser.add_argument("--count", type=int, default=40)
    parser.add_argument("--device", default=None, help="cuda where visible, else cpu")
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()

    import torch

    from extensions.config.sections import VerifierConfig
    from extensions.verify.parent.reference_data import draw_secret, reference_job
    from extensions.verify.reference.builder import ReferenceBuilder

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    job = reference_job(VerifierConfig(), device)
    tasks = load_tasks(args.pairs, args.count + 1)
    clock = SetClock(ReferenceBuilder)
    started = time.perf_counter()
    first = build_one(tasks[0][1], job, draw_secret())
    print(f"first problem (the process's CUDA start, cold caches): {time.perf_counter() - started:.2f} s "
          f"(build {first['build']:.2f})")
    clock.by_kind.clear()
    rows, failures = [], 0
    profiler = cProfile.Profile()
    for uuid, source in tasks[1:]:
        profiler.enable()
        try:
            rows.append((uuid, build_one(source, job, draw_secret())))
        except Exception as exc:  # noqa: BLE001 - counted; the profile goes on
            failures += 1
            print(f"{uuid}: reference failed: {type(exc).__name__}: {str(exc)[:120]}")
        finally:
            profiler.disable()
    if not rows:
        sys.exit("no reference was built")
    builds = sorted(r["build"] for _, r in rows)
    print(f"\n{len(rows)} problems on {device} (failed {failures}): build median {statistics.median(builds):.3f} s, "
          f"mean {statistics.mean(builds):.3f}, p90 {builds[int(0.9 * (len(builds) - 1))]:.3f}, max {builds[-1]:.3f}; "
          f"load mean {statistics.mean(r['load'] for _, r in rows):.3f}, "
          f"save mean {statistics.mean(r['save'] for _, r in rows):.3f}, "
          f"sets mean {statistics.mean(r['sets'] for _, r in rows):.1f}")
    print("\n| set kind | calls | s per problem | s per call (mean) | max s |\n|---|---|---|---|---|")
    for kind, seconds in sorted(clock.by_kind.items(), key=lambda kv: -sum(kv[1])):
        print(f"| {kind} | {len(seconds)} | {sum(seconds) / len(rows):.3f} | {statistics.mean(seconds):.3f} | "
              f"{max(seconds):.3f} |")
    slowest = sorted(rows, key=lambda r: -r[1]["build"])[:5]
    print("\nslowest: " + ", ".join(f"{u} {r['build']:.2f} s" for u, r in slowest))
    for order in ("cumulative", "tottime"):
        text = io.StringIO()
        stats = pstats.Stats(profiler, stream=text)
        stats.sort_stats(order).print_stats(args.top)
        print(f"\n## by {order}\n")
        print("\n".join(line for line in text.getvalue().splitlines() if line.strip())[-6000:])


if __name__ == "__main__":
    main()
