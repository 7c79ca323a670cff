#!/usr/bin/env python3
"""Continue an interrupted run from its newest complete checkpoint.

    python resume_training.py --smoke [--bucket B] [--dry-run]
    python resume_training.py --config configs/default.yaml --bucket my-bucket

With a bucket (--bucket, checkpoint.bucket or $KERNEL_RL_BUCKET) the run is first restored from
s3://BUCKET/PREFIX/RUN_ID/ (complete checkpoints only, verified). Then the newest complete checkpoint
decides where to continue (SFT step, RL round), and the remaining stages run with the same commands
run_pipeline.sh uses (train_integrated.py resumes from that checkpoint by itself). --dry-run prints
the plan and changes nothing; with a bucket it plans the run as the restore will leave it (each
stage done locally, done in S3 and restored first, or to run), from the bucket's listing, the
checkpoint manifests and a few small reads, without downloading the run. A finished run (complete
rl/final and outputs/compare.json) is left alone. --print-state prints the stage status as shell
assignments (as `python -m extensions.pipeline state` does).

A finished stage or checkpoint made with other settings than this run's (config keys that decide
the stage, or the data it read; restored ones included) stops the resume with one line per
difference: --force retrains those stages, or run with the config they were made with. The run
lock keeps a second process out of the run directory; --dry-run says who holds it. Without
--config or --smoke: configs/default.yaml when a CUDA GPU is visible, else configs/smoke.yaml.
"""
from __future__ import annotations

import argparse
import sys

from extensions.cloud import actions
from extensions.pipeline.run_state import read_run_state, shell_assignments
from extensions.pipeline.runner import ResumePlan, execute_plan, plan_resume
from extensions.pipeline.stages import scripts_dir
from extensions.config import add_config_args, parse_flags
from extensions.runtime.entry_point import run_entry_point, start_config
from extensions.runtime.interrupt import SaveSignal
from extensions.runtime.paths import RunPaths
from extensions.runtime.run_files import LOCAL_FILES, RunFiles
from extensions.runtime.run_lock import lock_run, lock_status

PROG = "resume_training"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bucket", help="restore from this S3 bucket first")
    parser.add_argument("--prefix", help="key prefix (default: checkpoint.prefix)")
    parser.add_argument("--run-id", help="run name under the prefix (default: run.run_id)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    parser.add_argument("--print-state", action="store_true", help="stage status as shell assignments")
    parser.add_argument("--force", action="store_true",
                        help="retrain the stages whose saved results were made with other settings")
    add_config_args(parser, stage_script=True)
    return parse_flags(parser, argv)


def resume(argv=None) -> int:
    args = parse_args(argv)
    actions.configure_logging("resume")
    cfg = start_config(args, PROG, announce=not args.print_state)
    paths = RunPaths.from_config(cfg)
    location = actions.resolve_location(cfg, args.bucket, args.prefix, args.run_id)
    if args.print_state:
        state = read_run_state(paths, cfg, force=args.force)
        print(shell_assignments(paths, state, location.uri if location else None, cfg=cfg))
        return 0
    if args.dry_run:
        print(lock_status(paths.run_lock), flush=True)
    else:
        lock_run(paths)
    config_args = ["--config", str(cfg.source)] + [token for item in args.overrides for token in ("--set", item)]

    def make_plan(files: RunFiles = LOCAL_FILES) -> ResumePlan:
        return plan_resume(paths, sys.executable, scripts_dir(), config_args, cfg, force=args.force, files=files)

    if location is not None:
        if args.dry_run:
            return actions.dry_run(cfg, paths, location, make_plan)
        code = actions.restore(cfg, paths, location)
        if code != 0:
            return code
    plan = make_plan()
    print(plan.describe(), flush=True)
    if args.dry_run or not plan.stages:
        return 0
    SaveSignal.for_run(paths).clear_request()
    return execute_plan(plan, paths)


def main(argv=None) -> int:
    return run_entry_point(PROG, resume, argv)


if __name__ == "__main__":
    sys.exit(main())
