"""Stages 2-3: LoRA SFT on KernelBook pairs, then Best-of-N RL on verified rewards.

    python train_integrated.py --config configs/default.yaml --stage all      # one process
    accelerate launch --num_processes 8 train_integrated.py --stage all       # 8 GPUs, data parallel
    python train_integrated.py --smoke --stage all                            # CPU smoke run

A stage whose final/ checkpoint is complete is skipped unless --force. A rerun resumes from the
newest complete checkpoint. SIGTERM (or a save request from the spot watcher) checkpoints at the
next step boundary; SIGTERM then stops the process with exit status 75 ("rerun to resume").
"""
from __future__ import annotations

import argparse
import sys

from extensions.config import add_config_args, config_from_args
from extensions.training.stages import EXIT_STOPPED, run_stages


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_args(parser)
    parser.add_argument("--stage", choices=["sft", "rl", "all"], default="all")
    parser.add_argument("--force", action="store_true", help="retrain a stage even if its final/ is complete")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars (log files, CI)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    stopped = run_stages(config_from_args(args), args.stage, force=args.force, progress=not args.no_progress)
    return EXIT_STOPPED if stopped else 0


if __name__ == "__main__":
    sys.exit(main())
