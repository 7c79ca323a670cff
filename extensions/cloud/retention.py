"""Keep the newest ``keep_last`` complete checkpoints of each stage in S3.

Never deleted: the newest complete checkpoint of a stage, ``final/`` (and any other unnumbered
directory), and incomplete checkpoints newer than the newest complete one (they may be uploading).
Deleted: older complete checkpoints beyond ``keep_last``, and incomplete debris older than the
newest complete checkpoint. A pruned checkpoint loses its manifest first, so a reader never sees a
manifest whose files are being deleted.
"""
from __future__ import annotations

import logging
from typing import Any, Callable

from ..runtime.checkpoints import MANIFEST
from .location import S3Location
from .remote_tree import RemoteCheckpoint

log = logging.getLogger(__name__)


def checkpoints_to_prune(checkpoints: list[RemoteCheckpoint], keep_last: int) -> list[RemoteCheckpoint]:
    keep = max(1, keep_last)
    doomed: list[RemoteCheckpoint] = []
    for stage in sorted({c.stage for c in checkpoints}):
        numbered = [c for c in checkpoints if c.stage == stage and c.index is not None]
        complete = sorted((c for c in numbered if c.complete), key=lambda c: c.index)
        if not complete:
            continue
        newest = complete[-1].index
        doomed += complete[:-keep]
        doomed += [c for c in numbered if not c.complete and c.index < newest]
    return doomed


def delete_checkpoint(client: Any, location: S3Location, checkpoint: RemoteCheckpoint,
                      call: Callable[[Callable[[], Any], str], Any]) -> None:
    names = sorted(checkpoint.objects, key=lambda name: name != MANIFEST)  # manifest first
    if MANIFEST in checkpoint.objects:
        key = location.key_for(f"{checkpoint.rel_dir}/{MANIFEST}")
        call(lambda: client.delete_object(Bucket=location.bucket, Key=key), f"delete {key}")
        names = names[1:]
    for start in range(0, len(names), 1000):
        batch = [{"Key": location.key_for(f"{checkpoint.rel_dir}/{name}")} for name in names[start:start + 1000]]
        response = call(
            lambda: client.delete_objects(Bucket=location.bucket, Delete={"Objects": batch, "Quiet": True}),
            f"delete {checkpoint.rel_dir}",
        )
        errors = response.get("Errors") or []
        if errors:
            raise RuntimeError(f"could not delete {len(errors)} object(s) of {checkpoint.rel_dir}: {errors[0]}")
