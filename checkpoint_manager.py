#!/usr/bin/env python3
"""Mirror a run to S3 and guard it against spot interruption.

    python checkpoint_manager.py --action setup   --bucket B          # versioned, encrypted bucket
    python checkpoint_manager.py --action sync    --bucket B [--smoke] # one sync round now
    python checkpoint_manager.py --action restore --bucket B [--smoke] # complete checkpoints + run files
    python checkpoint_manager.py --action list    --bucket B [--smoke] # checkpoints in S3, per stage
    python checkpoint_manager.py --action watch  [--bucket B] [--smoke]
        # beside training: sync every checkpoint.sync_interval_s, poll for spot notices; SIGINT stops
        # (with a final sync), SIGTERM means the machine is going down (save request + emergency sync)

The run is mirrored at s3://BUCKET/PREFIX/RUN_ID/ (PREFIX: checkpoint.prefix, RUN_ID: run.run_id);
the bucket may also come from checkpoint.bucket or $KERNEL_RL_BUCKET. Credentials: boto3's standard
chain; endpoint: $AWS_ENDPOINT_URL for S3-compatible stores. See docs/spot.md.
"""
from __future__ import annotations

import argparse
import sys

from extensions.cloud import actions
from extensions.config import PipelineConfig, add_config_args, parse_flags
from extensions.runtime.entry_point import EXIT_USAGE, run_entry_point, start_config
from extensions.runtime.paths import RunPaths
from extensions.runtime.run_lock import lock_run
from extensions.runtime.freshness import stage_freshness

PROG = "checkpoint_manager"

ACTIONS = ("setup", "sync", "restore", "list", "watch")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--action", required=True, choices=ACTIONS)
    parser.add_argument("--bucket", help="S3 bucket (default: checkpoint.bucket or $KERNEL_RL_BUCKET)")
    parser.add_argument("--prefix", help="key prefix (default: checkpoint.prefix)")
    parser.add_argument("--run-id", help="run name under the prefix (default: run.run_id)")
    parser.add_argument("--local-dir", help="the run's local root (default: run.root)")
    parser.add_argument("--exit-with-parent", action="store_true",
                        help="watch: stop (with a final sync) when the starting process is gone")
    add_config_args(parser, stage_script=True)
    return parse_flags(parser, argv)


def manage(argv=None) -> int:
    args = parse_args(argv)
    actions.configure_logging("checkpoint_manager")
    cfg = start_config(args, PROG, [f"run.root={args.local_dir}"] if args.local_dir else [],
                       announce=args.action != "watch")
    paths = RunPaths.from_config(cfg)
    location = actions.resolve_location(cfg, args.bucket, args.prefix, args.run_id)
    if location is None and args.action != "watch":
        print(f"{PROG}: --action {args.action} needs a bucket: --bucket, checkpoint.bucket or ${actions.BUCKET_ENV}",
              file=sys.stderr, flush=True)
        return EXIT_USAGE
    if args.action == "setup":
        return actions.setup(cfg, location)
    if args.action == "sync":
        return actions.sync(cfg, paths, location)
    if args.action == "restore":
        lock_run(paths)  # restoring replaces checkpoints: never under a running stage
        code = actions.restore(cfg, paths, location)
        if code == 0:
            report_stale_results(paths, cfg)
        return code
    if args.action == "list":
        return actions.list_checkpoints(cfg, location)
    return actions.watch(cfg, paths, location, exit_with_parent=args.exit_with_parent)


def report_stale_results(paths: RunPaths, cfg: PipelineConfig) -> None:
    """Say at once when what was restored was made with other settings than this command's."""
    for stage in ("sft", "rl"):
        freshness = stage_freshness(paths, cfg, stage)
        if freshness.stale:
            print(f"{PROG}: note: {freshness.message()}", file=sys.stderr, flush=True)


def main(argv=None) -> int:
    return run_entry_point(PROG, manage, argv)


if __name__ == "__main__":
    sys.exit(main())
