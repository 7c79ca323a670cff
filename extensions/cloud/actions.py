"""The S3 and spot actions behind checkpoint_manager.py and resume_training.py, one function each.

Each returns a process exit status: 0 when it did its job, 1 when something is left undone (the
report says what), so run_pipeline.sh can tell a finished sync from a partial one. An S3 failure
ends an action with one line naming the endpoint, the operation and the likely cause.
"""
from __future__ import annotations

import functools
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Callable, Optional, Protocol

from ..config.sections import PipelineConfig
from ..runtime.interrupt import SaveSignal
from ..runtime.paths import RunPaths
from ..runtime.run_files import RunFiles
from .failures import describe, endpoint_of, is_s3_failure
from .location import S3Location, location_from_config, make_s3_client

log = logging.getLogger(__name__)

BUCKET_ENV = "KERNEL_RL_BUCKET"


class DescribedPlan(Protocol):
    """What the dry run needs of a resume plan. The plan itself belongs to the pipeline package,
    a layer above this one, which passes it in."""

    def describe(self) -> str: ...


def configure_logging(tag: str) -> None:
    """Timestamped INFO logging for a command-line tool; the AWS SDK's chatter kept at WARNING."""
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s [{tag}] %(message)s")
    for noisy in ("botocore", "boto3", "s3transfer", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def resolve_location(cfg: PipelineConfig, bucket: Optional[str], prefix: Optional[str], run_id: Optional[str]) -> Optional[S3Location]:
    """The run's S3 location, or None when no bucket is given anywhere (flag, config, environment)."""
    bucket = bucket or cfg.checkpoint.bucket or os.environ.get(BUCKET_ENV) or None
    if not bucket:
        return None
    return location_from_config(cfg, bucket=bucket, prefix=prefix, run_id=run_id)


def reporting_s3_failures(action: Callable[..., int]) -> Callable[..., int]:
    """An action that ends an S3 failure with one line on stderr (endpoint, operation, likely
    cause) and exit status 1, instead of botocore's traceback; other errors pass through."""

    @functools.wraps(action)
    def run(cfg: PipelineConfig, *args, **kwargs) -> int:
        try:
            return action(cfg, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - only S3 failures are caught, see below
            if not is_s3_failure(exc):
                raise
            location = next((a for a in (*args, *kwargs.values()) if isinstance(a, S3Location)), None)
            target = f"{action.__name__.replace('_', ' ')} {location.uri}" if location else action.__name__
            endpoint = endpoint_of(make_s3_client(cfg.checkpoint))
            print(f"error: {describe(exc, target, endpoint, location.bucket if location else None)}",
                  file=sys.stderr, flush=True)
            return 1

    return run


@reporting_s3_failures
def setup(cfg: PipelineConfig, location: S3Location) -> int:
    from .bucket_setup import setup_bucket

    client = make_s3_client(cfg.checkpoint)
    for line in setup_bucket(client, location.bucket, cfg.checkpoint.noncurrent_version_days):
        print(f"setup: {line}")
    print(f"run mirror: {location.uri}")
    return 0


@reporting_s3_failures
def sync(cfg: PipelineConfig, paths: RunPaths, location: S3Location) -> int:
    from .s3_sync import CheckpointManager

    report = CheckpointManager(cfg.checkpoint, paths, location, progress=sys.stderr.isatty()).sync_once()
    print(f"{paths.root} -> {location.uri}: {report.summary()}")
    return 0 if report.ok else 1


@reporting_s3_failures
def restore(cfg: PipelineConfig, paths: RunPaths, location: S3Location) -> int:
    from .restore import Restorer

    report = Restorer(cfg.checkpoint, paths, location, progress=sys.stderr.isatty()).restore()
    print(f"{location.uri} -> {paths.root}: {report.summary()}")
    for line in report.checkpoints_incomplete:
        print(f"  skipped {line}")
    for line in report.failed:
        print(f"  FAILED {line}")
    return 0 if report.ok else 1


@reporting_s3_failures
def list_checkpoints(cfg: PipelineConfig, location: S3Location) -> int:
    from .restore import Restorer, format_checkpoint_table

    restorer = Restorer(cfg.checkpoint, RunPaths(Path(".").resolve()), location)
    table = format_checkpoint_table(restorer.checkpoints())
    print(f"{location.uri}")
    print(table)
    return 0


@reporting_s3_failures
def dry_run(cfg: PipelineConfig, paths: RunPaths, location: S3Location, make_plan: Callable[[RunFiles], DescribedPlan]) -> int:
    """Print the run's checkpoints in S3 and the plan the run will follow once it is restored from
    there (``make_plan`` given the run as the restore will leave it); downloads and writes nothing."""
    from .restore import Restorer, format_checkpoint_table

    restored = Restorer(cfg.checkpoint, paths, location).preview()
    print(f"{location.uri}")
    print(format_checkpoint_table(restored.checkpoints), flush=True)
    print(make_plan(restored).describe(), flush=True)
    return 0


def watch(cfg: PipelineConfig, paths: RunPaths, location: Optional[S3Location], exit_with_parent: bool = False) -> int:
    """Sync every sync_interval_s and watch for spot notices until SIGINT (stop, final sync) or
    SIGTERM (the machine is going down: save request unless a notice was already handled, then an
    emergency sync). With ``exit_with_parent`` it also stops (final sync) once the process that
    started it is gone, so a SIGKILLed run_pipeline.sh leaves no watcher behind."""
    from .s3_sync import CheckpointManager
    from .spot_watcher import InterruptionHandler, SpotNotice, watcher_for

    settings = cfg.checkpoint
    save_signal = SaveSignal.for_run(paths)
    if save_signal.clear_request():
        log.info("cleared a save request left by an earlier, interrupted run")
    manager = CheckpointManager(settings, paths, location) if location is not None else None
    handler = InterruptionHandler(save_signal, manager, settings, paths.spot_interruption_report)
    watcher, polling = watcher_for(settings, handler.handle)
    received: list[int] = []

    def on_signal(signum, _frame):
        # Only a list append: an Event.set() here takes the lock that the Event.wait() this signal
        # interrupted may hold, and the watcher hung on its own SIGINT (one run in three).
        received.append(signum)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    if manager is not None:
        manager.start()
    if watcher is not None:
        watcher.start()
        notices = f"spot notices from {settings.metadata_endpoint} every {settings.spot_poll_interval_s:.0f} s: {polling.reason}"
    else:
        notices = f"no metadata polling ({polling.reason}); SIGTERM still triggers a save"
    log.info("watching %s (%s)%s", paths.root, notices,
             f", syncing to {location.uri}" if location else ", no S3 sync")
    parent = os.getppid()
    while not received:
        time.sleep(0.5)
        if exit_with_parent and os.getppid() != parent:
            log.warning("the process that started this watcher is gone: stopping")
            break
    if watcher is not None:
        watcher.stop(timeout=5)
    if received and received[0] == signal.SIGTERM:
        if manager is not None:
            manager.stop(final_sync=False)
        if handler.reports and manager is not None:
            report = manager.emergency_sync(deadline_unix=handler.reports[-1].deadline_unix)
            log.warning("SIGTERM after a handled notice: %s", report.summary())
            return 0 if report.ok else 1
        outcome = handler.handle(SpotNotice.from_signal("sigterm", settings.notice_deadline_s))
        return 0 if outcome.sync_ok or manager is None else 1
    if manager is None:
        return 0
    final = manager.stop(final_sync=True)
    log.info("final %s", final.summary())
    return 0 if final.ok else 1
