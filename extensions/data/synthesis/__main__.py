"""Build verified PyTorch -> Triton pairs with torch inductor on a CUDA GPU.

    python -m extensions.data.synthesis --count 3000 --out data/synthesized/pairs.jsonl \\
        --eval-tasks ../shared/kernelbench/kernelbench_problems.jsonl [--modules my_modules/*.py] \\
        [--max-minutes 9] [--seed 0] [--capture-workers 8] [--verify-workers 8] [--capture-ahead N]
        [--no-progress]

The output is KernelBook-format JSONL: ``prepare_data.py --kernelbook data/synthesized/pairs.jsonl``
reads it like the hub's. A rerun continues where the last one stopped. Exit status 2 when no CUDA
device is visible or an input file is missing.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .build import SynthesisOptions, format_report, synthesize
from .programs import FAMILIES


def parse_args(argv: list[str]) -> SynthesisOptions:
    parser = argparse.ArgumentParser(prog="python -m extensions.data.synthesis", description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--count", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--families", nargs="+", choices=FAMILIES, default=list(FAMILIES))
    parser.add_argument("--modules", nargs="*", type=Path, default=[], help="KernelBench-form module files")
    parser.add_argument("--eval-tasks", "--eval_tasks", nargs="*", type=Path, default=[],
                        help="KernelBench-style JSONL (level, name, code) to decontaminate against")
    parser.add_argument("--capture-workers", "--capture_workers", type=int, default=0)
    parser.add_argument("--verify-workers", "--verify_workers", type=int, default=0)
    parser.add_argument("--max-minutes", "--max_minutes", type=float, default=0.0)
    parser.add_argument("--capture-ahead", "--capture_ahead", type=int, default=0,
                        help="programs in capture or awaiting a verdict, at most (0: automatic)")
    parser.add_argument("--no-progress", "--no_progress", action="store_true")
    args = parser.parse_args(argv)
    return SynthesisOptions(out=args.out, count=args.count, seed=args.seed, families=tuple(args.families),
                            module_files=args.modules, eval_tasks=args.eval_tasks,
                            capture_workers=args.capture_workers, verify_workers=args.verify_workers,
                            capture_ahead=args.capture_ahead,
                            max_minutes=args.max_minutes,
                            progress=not args.no_progress)


def main(argv: list[str] | None = None) -> int:
    options = parse_args(sys.argv[1:] if argv is None else argv)
    for path in [*options.module_files, *options.eval_tasks]:
        if not path.is_file():
            print(f"synthesis: {path}: file not found", file=sys.stderr)
            return 2
    import torch

    if not torch.cuda.is_available():
        print("synthesis: no CUDA device is visible; torch inductor writes Triton kernels for GPUs only "
              "(run this on a GPU machine and copy the JSONL back)", file=sys.stderr)
        return 2
    report = synthesize(options)
    print(format_report(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
