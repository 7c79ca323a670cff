"""``python -m extensions.pipeline``: what run_pipeline.sh calls.

    python -m extensions.pipeline state [--config F | --smoke] [--set K=V ...] [--bucket B] [--force]
    python -m extensions.pipeline run   [--config F | --smoke] [--set K=V ...] [--bucket B] [--force]

``state`` prints the run's stage status and locations as shell assignments (``NAME=value``, quoted
for ``eval``): the config the machine calls for when none is named, the run root, the logs folder,
the S3 mirror. It fails (exit 2, one line per difference) when a saved training result was made with
other settings and --force was not given. ``run`` runs the stages that are left, in order, and closes
with a summary (runner.py says how each stage ends); the stage scripts are looked up in
$KERNEL_RL_SCRIPTS_DIR, else the repository root.
"""
from __future__ import annotations

import argparse
import sys

from ..config import PipelineConfig, add_config_args, parse_flags
from ..runtime.entry_point import run_entry_point, start_config
from ..runtime.paths import RunPaths
from ..runtime.run_lock import lock_run

PROG = "run_pipeline"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m extensions.pipeline", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("state", "run"))
    parser.add_argument("--bucket", help="the run's S3 bucket (default: checkpoint.bucket or $KERNEL_RL_BUCKET)")
    parser.add_argument("--prefix", help="key prefix (default: checkpoint.prefix)")
    parser.add_argument("--run-id", help="run name under the prefix (default: run.run_id)")
    parser.add_argument("--force", action="store_true",
                        help="retrain the stages whose saved results were made with other settings")
    add_config_args(parser, stage_script=True)
    return parse_flags(parser, argv)


def s3_uri(cfg: PipelineConfig, args) -> str | None:
    from ..cloud.actions import resolve_location

    location = resolve_location(cfg, args.bucket, args.prefix, args.run_id)
    return location.uri if location is not None else None


def pipeline(argv=None) -> int:
    from .run_state import read_run_state, shell_assignments
    from .runner import PipelineRun
    from .stages import scripts_dir

    args = parse_args(argv)
    cfg = start_config(args, PROG, announce=False)
    paths = RunPaths.from_config(cfg)
    if args.action == "state":
        state = read_run_state(paths, cfg, force=args.force)
        print(shell_assignments(paths, state, s3_uri(cfg, args), cfg=cfg))
        return 0
    lock_run(paths)  # the lock run_pipeline.sh holds, shared through $KERNEL_RL_RUN_LOCK
    config_args = ["--config", str(cfg.source)] + [token for item in args.overrides for token in ("--set", item)]
    return PipelineRun(paths, cfg, config_args, force=args.force, s3_uri=s3_uri(cfg, args),
                       python=sys.executable, scripts_dir=scripts_dir()).run()


def main(argv=None) -> int:
    return run_entry_point(PROG, pipeline, argv)


if __name__ == "__main__":
    sys.exit(main())
