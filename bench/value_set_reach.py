"""How far do the ``scale_up`` and ``shift`` value sets reach on each KernelBench problem? Markdown tables.

``scale_up`` keeps the problem's own values except a few outliers, spread over the powers of ten
up to 10^t, with t the first of two powers drawn per batch (in [5.5, 6], [4, 4.5]) at which the
problem's fp32 reference still matches its own fp64 run within a quarter of the tolerances (atol
the base set's); otherwise one factor 10^u (u in [2, 3]) for every element. A kernel wrong only
above some threshold is caught where the set reaches past it. This builds each problem's reference
sets the way a batch does (a fresh secret per problem) and counts, per level, how many problems got
which reach, and why the outliers were dropped where they were. ``shift`` makes a few whole lines
along every axis negative where the fp32 reference stays exact with them (a peek at one element
sees the problem's own values), otherwise every element: the second table counts which, and why.

    python bench/value_set_reach.py --device cuda --levels 1 2 3        # GPU, full sizes
    python bench/value_set_reach.py --device cpu --levels 1 --max-minutes 5

``--kernelbench`` defaults to ../shared/kernelbench/kernelbench_problems.jsonl next to the repository.
"""
from __future__ import annotations

import argparse
import collections
import gc
import json
import math
import re
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

REACHES = ("1e5.5-1e6", "1e4-1e4.5", "one factor", "no set")
SHIFTS = ("lines", "every element", "no set")


def shift_reach(builder) -> tuple[str, str]:
    """(``SHIFTS`` bucket, why the lines were dropped) of a built problem's ``shift`` set."""
    chosen = [s for s in builder.sets if s["name"] == "shift"]
    why = next((note.split("(lines: ", 1)[-1].rstrip(")") for note in builder.skipped
                if note.startswith("shift: every element shifted")), "")
    if not chosen:
        return SHIFTS[2], "; ".join(n for n in builder.skipped if n.startswith("shift"))
    return (SHIFTS[0], "") if chosen[0].get("negative_lines") else (SHIFTS[1], why)


def problem_reach(code: str, device: str) -> tuple[str, float, str, tuple[str, str]]:
    """(reach bucket, log10 of the largest |element| of scale_up's inputs, why the outliers were
    dropped, ``shift_reach``)."""
    import torch

    from extensions.config import VerifierConfig
    from extensions.verify.parent.reference_data import draw_secret, reference_job
    from extensions.verify.reference.builder import ReferenceBuilder

    builder = ReferenceBuilder(code, reference_job(VerifierConfig(), device), draw_secret())
    builder.build()
    chosen = [s for s in builder.sets if s["name"] == "scale_up"]
    why = next((note.split("(outliers ", 1)[-1].rstrip(")") for note in builder.skipped
                if note.startswith("scale_up: one factor")), "")
    shift = shift_reach(builder)
    if not chosen:
        return "no set", float("nan"), why or "; ".join(n for n in builder.skipped if n.startswith("scale_up")), shift
    largest = 0.0
    for spec in chosen[0]["inputs"]["list"]:
        tensor = builder.tensors.get(spec.get("tensor"))
        if isinstance(tensor, torch.Tensor) and tensor.is_floating_point() and tensor.numel():
            largest = max(largest, float(tensor.abs().max()))
    top = chosen[0].get("spread_top")
    bucket = "one factor" if top is None else REACHES[0] if top >= 5.5 else REACHES[1]
    return bucket, math.log10(largest) if largest > 0 else float("-inf"), why, shift


def reason_kind(why: str) -> str:
    """The first rung's reason, without the numbers (for counting)."""
    first = why.split(";", 1)[0]
    return re.sub(r"^1e[\d.]+( either sign)?: ", "", first).strip() or "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernelbench", default=str(REPO_ROOT.parent / "shared" / "kernelbench"
                                                     / "kernelbench_problems.jsonl"))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--max-minutes", type=float, default=8.0)
    args = parser.parse_args()

    import torch

    from extensions.verify.common.precision import pin_ieee_fp32

    torch.set_num_threads(1)
    pin_ieee_fp32()  # the reference worker's settings: cuDNN's fp32 convolutions would run in TF32
    problems = [json.loads(line) for line in open(args.kernelbench) if line.strip()]
    problems = [p for p in problems if p["level"] in args.levels]
    deadline = time.monotonic() + 60 * args.max_minutes
    counts: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    reasons: collections.Counter = collections.Counter()
    shifts: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    shift_reasons: collections.Counter = collections.Counter()
    rows, done = [], 0
    for problem in problems:
        if time.monotonic() > deadline:
            break
        started = time.monotonic()
        try:
            bucket, largest, why, (shift, shift_why) = problem_reach(problem["code"], args.device)
        except Exception as exc:  # noqa: BLE001 - the problem itself fails to build: counted, not fatal
            bucket, largest, why = "no set", float("nan"), f"reference failed ({type(exc).__name__})"
            shift, shift_why = SHIFTS[2], why
        counts[problem["level"]][bucket] += 1
        shifts[problem["level"]][shift] += 1
        if shift != SHIFTS[0]:
            shift_reasons[re.sub(r"\(.*", "", shift_why).strip() or "-"] += 1
        if bucket != REACHES[0]:
            reasons[reason_kind(why)] += 1
        rows.append((problem["level"], problem["problem_id"], problem["name"], bucket, largest, why,
                     shift, shift_why, time.monotonic() - started))
        done += 1
        gc.collect()
        if args.device != "cpu":
            torch.cuda.empty_cache()

    print(f"# scale_up reach, {args.device}, {done} of {len(problems)} problems\n")
    print("| level | " + " | ".join(REACHES) + " |")
    print("|---|" + "---:|" * len(REACHES))
    for level in sorted(counts):
        print(f"| {level} | " + " | ".join(str(counts[level][r]) for r in REACHES) + " |")
    print("\n## Why the highest outliers were not kept\n\n| reason | problems |\n|---|---:|")
    for reason, count in reasons.most_common():
        print(f"| {reason} | {count} |")
    print(f"\n# shift: negative lines or every element, {args.device}\n")
    print("| level | " + " | ".join(SHIFTS) + " |")
    print("|---|" + "---:|" * len(SHIFTS))
    for level in sorted(shifts):
        print(f"| {level} | " + " | ".join(str(shifts[level][r]) for r in SHIFTS) + " |")
    print("\n## Why the lines were not kept\n\n| reason | problems |\n|---|---:|")
    for reason, count in shift_reasons.most_common():
        print(f"| {reason} | {count} |")
    print("\n## Per problem\n\n| level | id | name | reach | log10 max | s | outliers dropped because | shift | lines dropped because |")
    print("|---:|---:|---|---|---:|---:|---|---|---|")
    for level, pid, name, bucket, largest, why, shift, shift_why, seconds in rows:
        print(f"| {level} | {pid} | {name} | {bucket} | {largest:.1f} | {seconds:.1f} | {why[:160]} | {shift} | {shift_why[:120]} |")


if __name__ == "__main__":
    main()
