#!/usr/bin/env python
"""Stage 1: prepare the training and evaluation data.

Reads KernelBook (PyTorch -> Triton pairs: the hub dataset GPUMODE/KernelBook, a local .jsonl,
.json or .parquet file, or ``bundled``, the project's starter set) and KernelBench (the hub dataset,
a local JSONL, or ``none``), and writes the run's ``data/processed/`` files: sft_train.jsonl,
sft_val.jsonl, rl_tasks.jsonl, eval_tasks.jsonl, difficulty_labels.jsonl and prepare_report.json.
Bad rows are counted by reason, never fatal; a missing or unreadable source exits with status 2.
A second run with the same inputs does nothing unless --force. Without --config or --smoke the
config is configs/default.yaml when a CUDA GPU is visible, else configs/smoke.yaml. Ctrl-C stops
at once; the outputs are replaced atomically, so the previous ones stay whole.

    python prepare_data.py --smoke
    python prepare_data.py --config configs/default.yaml
    python prepare_data.py --kernelbook kb.jsonl --kernelbench none --out /tmp/data --max_samples 500
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from extensions.config import add_config_args, parse_flags
from extensions.data import SourceError, format_summary, prepare
from extensions.runtime.entry_point import EXIT_USAGE, run_entry_point, start_config
from extensions.runtime.paths import RunPaths
from extensions.runtime.run_lock import lock_run

PROG = "prepare_data"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_config_args(parser, stage_script=True)
    parser.add_argument("--kernelbook", help="hub id, local .jsonl/.json/.parquet, or 'bundled'; several joined by commas (data.kernelbook)")
    parser.add_argument("--kernelbench", help="hub id, local JSONL, or 'none' (data.kernelbench)")
    parser.add_argument("--out", type=Path, help="output directory (default: the run's data/processed)")
    parser.add_argument("--max_samples", type=int, help="read at most N KernelBook rows (data.max_samples)")
    parser.add_argument("--force", action="store_true", help="rebuild even when the outputs are up to date")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    return parse_flags(parser, argv)


def run(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    overrides = [f"data.{key}={value}" for key, value in
                 (("kernelbook", args.kernelbook), ("kernelbench", args.kernelbench)) if value is not None]
    cfg = start_config(args, PROG, overrides)
    paths = RunPaths.from_config(cfg)
    if args.out is None:
        lock_run(paths)
    try:
        outcome = prepare(cfg, args.out or paths.processed, force=args.force, max_samples=args.max_samples,
                          progress=not args.no_progress)
    except (SourceError, ValueError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if outcome.up_to_date:
        print(f"{outcome.out_dir}: up to date (same inputs and config); pass --force to rebuild")
    print(format_summary(outcome.report))
    return 0


def main(argv=None) -> int:
    return run_entry_point(PROG, run, argv, interrupted_hint="the previous outputs (if any) are unchanged")


if __name__ == "__main__":
    sys.exit(main())
