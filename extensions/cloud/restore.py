"""Bring a run back from S3: complete checkpoints only, every byte verified.

Checkpoints are defined by their manifests: a remote checkpoint without a manifest, or whose
manifest lists a file that is missing or of another size, is not restored (and is counted). A
restored checkpoint is downloaded into a hidden staging directory, each file checked against the
manifest's size and sha256, moved into place, and its manifest written last, so an interrupted
restore leaves nothing that looks complete. Other run files (data, outputs, logs) are downloaded
when missing or different and checked against the S3 ETag, or the sha256 stored at upload.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from ..checkpoints import MANIFEST, atomic_write_text, is_complete, read_manifest
from ..paths import RunPaths
from .failures import likely_cause
from .fingerprint import compute_fingerprint
from .location import S3Location, chunk_bytes, make_s3_client, transfer_config
from .remote_tree import ManifestReader, RemoteCheckpoint, checkpoint_of, list_objects, remote_checkpoints
from .retry import with_backoff
from .s3_sync import NOT_SYNCED

log = logging.getLogger(__name__)


class RestoreError(RuntimeError):
    pass


@dataclass
class RestoreReport:
    checkpoints_restored: list[str] = field(default_factory=list)
    checkpoints_already_local: list[str] = field(default_factory=list)
    checkpoints_incomplete: list[str] = field(default_factory=list)  # "dir: why", not restored
    files_downloaded: int = 0
    files_unchanged: int = 0
    bytes_downloaded: int = 0
    failed: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failed

    def summary(self) -> str:
        text = (f"restored {len(self.checkpoints_restored)} checkpoint(s), "
                f"{len(self.checkpoints_already_local)} already local, "
                f"{len(self.checkpoints_incomplete)} incomplete in S3 skipped; "
                f"{self.files_downloaded} file(s) / {self.bytes_downloaded / 1e6:.1f} MB downloaded, "
                f"{self.files_unchanged} unchanged")
        if self.failed:
            text += f"; {len(self.failed)} FAILED (first: {self.failed[0]})"
        return text


class Restorer:
    def __init__(self, settings, paths: RunPaths, location: S3Location, client: Any = None,
                 progress: bool = False):
        self.settings = settings
        self.paths = paths
        self.location = location
        self.client = client if client is not None else make_s3_client(settings)
        self.transfer = transfer_config(settings)
        self.chunk = chunk_bytes(settings)
        self.progress = progress
        self._lock = threading.Lock()

    def _call(self, call, what: str):
        return with_backoff(call, what=what, attempts=self.settings.max_retries,
                            base_s=self.settings.retry_backoff_s, cap_s=self.settings.retry_backoff_max_s)

    def checkpoints(self) -> list[RemoteCheckpoint]:
        objects = self._call(lambda: list_objects(self.client, self.location), "list bucket")
        return remote_checkpoints(objects, ManifestReader(self.client, self.location))

    def restore(self, dirs: Optional[list[str]] = None) -> RestoreReport:
        """Download the run's ``dirs`` (default: the config's sync_dirs) into the local run root."""
        dirs = list(dirs if dirs is not None else self.settings.sync_dirs)
        report = RestoreReport()
        objects = self._call(lambda: list_objects(self.client, self.location), "list bucket")
        wanted = {rel: obj for rel, obj in objects.items() if rel.split("/", 1)[0] in dirs}
        checkpoints = remote_checkpoints(wanted, ManifestReader(self.client, self.location))
        loose = {rel: obj for rel, obj in wanted.items()
                 if checkpoint_of(rel) is None and Path(rel).name not in NOT_SYNCED}
        with ThreadPoolExecutor(max_workers=max(1, self.settings.file_concurrency)) as pool:
            for checkpoint in self._progress(checkpoints, "restore checkpoints"):
                if not checkpoint.complete:
                    report.checkpoints_incomplete.append(f"{checkpoint.rel_dir}: {checkpoint.status}")
                    continue
                try:
                    self._restore_checkpoint(checkpoint, report, pool)
                except Exception as exc:  # noqa: BLE001 - one bad checkpoint must not stop the rest
                    report.failed.append(f"{checkpoint.rel_dir}: {likely_cause(exc, self.location.bucket)}")
            results = pool.map(lambda item: self._restore_file(*item, report), sorted(loose.items()))
            for _ in self._progress(list(results), "restore files"):
                pass
        if report.checkpoints_incomplete:
            log.warning("not restored (incomplete in S3): %s", "; ".join(report.checkpoints_incomplete))
        log.info("%s", report.summary())
        return report

    def _progress(self, items, desc: str):
        if not self.progress:
            return items
        from tqdm import tqdm

        return tqdm(items, desc=desc, leave=False)

    def _restore_checkpoint(self, checkpoint: RemoteCheckpoint, report: RestoreReport,
                            pool: ThreadPoolExecutor) -> None:
        destination = self.paths.root / checkpoint.rel_dir
        manifest = checkpoint.manifest
        local = read_manifest(destination)
        if local is not None and local["files"] == manifest["files"] and is_complete(destination, verify_hashes=True):
            report.checkpoints_already_local.append(checkpoint.rel_dir)
            return
        staging = destination.with_name(f".{destination.name}.restoring")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)

        def fetch(item):
            name, entry = item
            target = staging / name
            target.parent.mkdir(parents=True, exist_ok=True)
            key = self.location.key_for(f"{checkpoint.rel_dir}/{name}")
            self._call(lambda: self.client.download_file(self.location.bucket, key, str(target),
                                                         Config=self.transfer), f"download {key}")
            fp = compute_fingerprint(target, self.chunk, self.chunk)
            if fp.size != entry.get("size") or fp.sha256 != entry.get("sha256"):
                raise RestoreError(f"{checkpoint.rel_dir}/{name}: downloaded bytes do not match the manifest "
                                   f"(size {fp.size} vs {entry.get('size')})")
            return fp.size

        sizes = list(pool.map(fetch, sorted(manifest["files"].items())))
        shutil.rmtree(destination, ignore_errors=True)
        os.replace(staging, destination)
        atomic_write_text(destination / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        report.checkpoints_restored.append(checkpoint.rel_dir)
        report.files_downloaded += len(sizes) + 1
        report.bytes_downloaded += sum(sizes)

    def _restore_file(self, rel: str, obj, report: RestoreReport) -> None:
        target = self.paths.root / rel
        try:
            if target.is_file() and target.stat().st_size == obj.size:
                if compute_fingerprint(target, self.chunk, self.chunk).etag == obj.etag:
                    with self._lock:
                        report.files_unchanged += 1
                    return
            key = self.location.key_for(rel)
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(f".{target.name}.restoring")
            self._call(lambda: self.client.download_file(self.location.bucket, key, str(partial),
                                                         Config=self.transfer), f"download {key}")
            fp = compute_fingerprint(partial, self.chunk, self.chunk)
            if fp.size != obj.size or (fp.etag != obj.etag and fp.sha256 != self._stored_sha256(key)):
                partial.unlink(missing_ok=True)
                raise RestoreError(f"{rel}: downloaded bytes match neither the S3 ETag nor the stored sha256")
            os.replace(partial, target)
            with self._lock:
                report.files_downloaded += 1
                report.bytes_downloaded += fp.size
        except Exception as exc:  # noqa: BLE001 - counted and reported
            with self._lock:
                report.failed.append(f"{rel}: {likely_cause(exc, self.location.bucket)}")

    def _stored_sha256(self, key: str) -> Optional[str]:
        head = self._call(lambda: self.client.head_object(Bucket=self.location.bucket, Key=key), f"head {key}")
        return head.get("Metadata", {}).get("sha256")


def format_checkpoint_table(checkpoints: list[RemoteCheckpoint]) -> str:
    if not checkpoints:
        return "(no checkpoints)"
    lines = [f"{'stage':<6} {'checkpoint':<18} {'files':>5} {'MB':>9}  status"]
    for c in checkpoints:
        lines.append(f"{c.stage:<6} {c.name:<18} {len(c.objects):>5} {c.size / 1e6:>9.1f}  {c.status}")
    return "\n".join(lines)
