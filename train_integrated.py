"""Stages 2-3: LoRA SFT on verified PyTorch -> Triton pairs, then RL on verified rewards (rl.algorithm:
Best-of-N by default, GRPO, RLOO, REINFORCE or reward-weighted SFT).

    python train_integrated.py --config configs/default.yaml --stage all      # one process
    accelerate launch --num_processes 8 train_integrated.py --stage all       # 8 GPUs, data parallel
    python train_integrated.py --smoke --stage all                            # CPU smoke run

Without --config or --smoke: configs/default.yaml when a CUDA GPU is visible, else configs/smoke.yaml.
A stage whose final/ checkpoint is complete and was made with this run's settings is skipped; one
made with other settings stops the run, naming the keys that differ (--force retrains). A rerun
resumes from the newest complete checkpoint. RL starts from sft/final (rl.init: base starts from
the base model). SIGTERM, a first Ctrl-C or a save request from the spot watcher checkpoint at the
next step boundary; SIGTERM and Ctrl-C then stop the process with exit status 75 ("rerun to
resume"); a second Ctrl-C aborts at once (130). Exit 2: config error or a stale/missing stage
result; 73: another process is working on this run.
"""
from __future__ import annotations

import argparse
import sys

from extensions.config import add_config_args, parse_flags
from extensions.runtime.entry_point import run_entry_point, start_config
from extensions.runtime.paths import RunPaths
from extensions.runtime.run_lock import lock_run
from extensions.training.stages import EXIT_STOPPED, run_stages

PROG = "train_integrated"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_args(parser, stage_script=True)
    parser.add_argument("--stage", choices=["sft", "rl", "all"], default="all")
    parser.add_argument("--force", action="store_true", help="retrain a stage even if its final/ is complete")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars (log files, CI)")
    return parse_flags(parser, argv)


def train(argv=None) -> int:
    args = parse_args(argv)
    cfg = start_config(args, PROG)
    lock_run(RunPaths.from_config(cfg))
    stopped = run_stages(cfg, args.stage, force=args.force, progress=not args.no_progress)
    return EXIT_STOPPED if stopped else 0


def main(argv=None) -> int:
    return run_entry_point(PROG, train, argv, interrupted_hint="aborted without saving; rerun to resume from "
                                                               "the newest complete checkpoint")


if __name__ == "__main__":
    sys.exit(main())
