#!/usr/bin/env python3
"""Continue an interrupted run from its newest complete checkpoint.

    python resume_training.py --smoke [--bucket B] [--dry-run]
    python resume_training.py --config configs/default.yaml --bucket my-bucket

With a bucket (--bucket, checkpoint.bucket or $KERNEL_RL_BUCKET) the run is first restored from
s3://BUCKET/PREFIX/RUN_ID/ (complete checkpoints only, verified). Then the newest complete checkpoint
decides where to continue (SFT step, RL round), and the remaining stages run with the same commands
run_pipeline.sh uses (train_integrated.py resumes from that checkpoint by itself). --dry-run prints
the plan and changes nothing. A finished run (complete rl/final and outputs/compare.json) is left
alone. --print-state prints the stage status as shell assignments (for run_pipeline.sh).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from extensions.cloud import actions
from extensions.cloud.run_state import plan_resume, read_run_state, shell_assignments
from extensions.config import add_config_args, config_from_args
from extensions.interrupt import SaveSignal
from extensions.paths import RunPaths

# Where the stage scripts live; tests point it at stand-ins.
SCRIPTS_DIR = Path(os.environ.get("KERNEL_RL_SCRIPTS_DIR") or Path(__file__).resolve().parent)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bucket", help="restore from this S3 bucket first")
    parser.add_argument("--prefix", help="key prefix (default: checkpoint.prefix)")
    parser.add_argument("--run-id", help="run name under the prefix (default: run.run_id)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    parser.add_argument("--print-state", action="store_true", help="stage status as shell assignments")
    add_config_args(parser)
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    actions.configure_logging("resume")
    cfg = config_from_args(args)
    paths = RunPaths.from_config(cfg)
    location = actions.resolve_location(cfg, args.bucket, args.prefix, args.run_id)
    if args.print_state:
        print(shell_assignments(paths, read_run_state(paths), location.uri if location else None,
                                cfg.model.device_map))
        return 0
    if location is not None:
        code = actions.list_checkpoints(cfg, location) if args.dry_run else actions.restore(cfg, paths, location)
        if code != 0:
            return code
    config_args = ["--config", str(cfg.source)] + [token for item in args.overrides for token in ("--set", item)]
    plan = plan_resume(paths, sys.executable, SCRIPTS_DIR, config_args, cfg.model.device_map)
    if args.dry_run and location is not None and plan.stages:
        # A dry run downloads nothing, so the plan reads local files; the real run restores first.
        print(f"(plan from the local files; without --dry-run the complete checkpoints listed above are "
              f"restored from {location.uri} first, and stages whose output they hold are skipped)", flush=True)
    print(plan.describe(), flush=True)
    if args.dry_run or not plan.stages:
        return 0
    SaveSignal.for_run(paths).clear_request()
    return actions.execute_plan(plan, paths)


if __name__ == "__main__":
    sys.exit(main())
