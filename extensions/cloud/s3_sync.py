"""Mirror a run's directories to ``s3://BUCKET/PREFIX/RUN_ID/``: periodically, and in an emergency.

Rules that make an interruption cost minutes, never the run:

* Only new or changed files are sent: a local file's size and S3 ETag (computed locally with the
  configured part size, see fingerprint.py) are compared with the bucket listing; where the ETag
  cannot be reproduced, the sha256 stored in the object's metadata decides.
* Files go through boto3's transfer manager (multipart, concurrent parts) with several files in
  flight, each retried with exponential backoff. An unreachable endpoint ends the round early; the
  next round, stateless, uploads whatever is still missing.
* A checkpoint's ``manifest.json`` is uploaded last, only after every file it lists was uploaded (or
  found identical) and hashes as listed. Before files of a checkpoint whose remote manifest exists
  are overwritten, that manifest is withdrawn. So a manifest in S3 never points at missing or
  partial data, whatever moment the upload is killed at.
* Per stage, only the newest ``keep_last`` complete checkpoints (plus ``final/`` and any newer
  incomplete ones) are uploaded, and older ones are pruned from S3 (retention.py).
"""
from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from ..runtime.checkpoints import MANIFEST, is_complete, read_manifest
from ..runtime.paths import RunPaths, checkpoint_index
from .failures import describe, endpoint_of, likely_cause
from .fingerprint import Fingerprint, FingerprintCache
from .location import S3Location, chunk_bytes, make_s3_client, transfer_config
from .remote_tree import CHECKPOINTS_DIR, ManifestReader, RemoteObject, list_objects, remote_checkpoints
from .retention import checkpoints_to_prune, delete_checkpoint
from .retry import is_connection_error, with_backoff

log = logging.getLogger(__name__)

# Requests between processes about one machine: restoring them onto another machine would make a
# resumed trainer save and stop at once.
NOT_SYNCED = frozenset({"save_request.json", "save_done.json"})


class FileChangedDuringUpload(RuntimeError):
    pass


@dataclass
class SyncUnit:
    """A checkpoint directory (manifest handled last) or the loose files of the run."""

    label: str
    files: list[Path]
    checkpoint_dir: Optional[Path] = None
    newest_mtime: float = 0.0


@dataclass
class SyncReport:
    started_unix: float
    duration_s: float = 0.0
    uploaded_files: int = 0
    uploaded_bytes: int = 0
    unchanged_files: int = 0
    manifests_uploaded: list[str] = field(default_factory=list)
    manifests_withdrawn: list[str] = field(default_factory=list)
    manifests_held_back: list[str] = field(default_factory=list)  # with the reason
    failed: list[str] = field(default_factory=list)  # "path: error"
    skipped_for_deadline: int = 0
    skipped_old_checkpoints: int = 0
    pruned: list[str] = field(default_factory=list)
    endpoint_down: bool = False
    error: Optional[str] = None

    @property
    def ok(self) -> bool:
        return not (self.failed or self.error or self.endpoint_down or self.skipped_for_deadline)

    def summary(self) -> str:
        parts = [
            f"{self.uploaded_files} file(s) / {self.uploaded_bytes / 1e6:.1f} MB uploaded",
            f"{self.unchanged_files} unchanged",
            f"{len(self.manifests_uploaded)} manifest(s) sealed",
        ]
        if self.manifests_held_back:
            parts.append(f"{len(self.manifests_held_back)} manifest(s) held back")
        if self.pruned:
            parts.append(f"{len(self.pruned)} old checkpoint(s) pruned")
        if self.skipped_old_checkpoints:
            parts.append(f"{self.skipped_old_checkpoints} checkpoint(s) beyond keep_last not sent")
        if self.failed:
            parts.append(f"{len(self.failed)} failed (first: {self.failed[0]})")
        if self.skipped_for_deadline:
            parts.append(f"{self.skipped_for_deadline} left for lack of time")
        if self.endpoint_down:
            parts.append("endpoint unreachable, round cut short")
        if self.error:
            parts.append(f"error: {self.error}")
        return f"sync in {self.duration_s:.1f} s: " + ", ".join(parts)


def _synced(path: Path, root: Path) -> bool:
    relative = path.relative_to(root).parts
    return path.name not in NOT_SYNCED and not any(part.startswith(".") for part in relative)


def _files_under(directory: Path, root: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file() and _synced(p, root))


def _newest_mtime(files: list[Path]) -> float:
    times = []
    for path in files:
        try:
            times.append(path.stat().st_mtime)
        except FileNotFoundError:
            pass
    return max(times, default=0.0)


def plan_units(paths: RunPaths, sync_dirs: list[str], keep_last: int) -> tuple[list[SyncUnit], int]:
    """Checkpoint units (newest first) then one unit of loose files; and how many old ones were left."""
    root = paths.root
    units: list[SyncUnit] = []
    loose: list[Path] = []
    skipped = 0
    for name in sync_dirs:
        top = root / name
        if not top.is_dir():
            continue
        if name != CHECKPOINTS_DIR:
            loose += _files_under(top, root)
            continue
        loose += [p for p in top.iterdir() if p.is_file() and _synced(p, root)]
        for stage_dir in sorted(p for p in top.iterdir() if p.is_dir() and _synced(p, root)):
            loose += [p for p in stage_dir.iterdir() if p.is_file() and _synced(p, root)]
            chosen, left = _checkpoints_to_send(stage_dir, root, keep_last)
            skipped += left
            for directory in chosen:
                files = _files_under(directory, root)
                payload = [p for p in files if p.name != MANIFEST or p.parent != directory]
                units.append(SyncUnit(str(directory.relative_to(root)), payload, directory, _newest_mtime(files)))
    units.sort(key=lambda unit: unit.newest_mtime, reverse=True)
    if loose:
        units.append(SyncUnit("other run files", loose))
    return units, skipped


def _checkpoints_to_send(stage_dir: Path, root: Path, keep_last: int) -> tuple[list[Path], int]:
    dirs = [p for p in stage_dir.iterdir() if p.is_dir() and _synced(p, root)]
    numbered = sorted((p for p in dirs if checkpoint_index(p) is not None), key=checkpoint_index)
    complete = [p for p in numbered if is_complete(p)]
    newest = checkpoint_index(complete[-1]) if complete else -1
    kept = set(complete[-max(1, keep_last):])
    chosen = [p for p in dirs if checkpoint_index(p) is None]
    chosen += [p for p in numbered if p in kept or (p not in complete and checkpoint_index(p) > newest)]
    return chosen, len(dirs) - len(chosen)


class CheckpointManager:
    """Syncs a run to S3 from a background thread; ``emergency_sync`` for spot notices.

    ``settings`` is the config's ``checkpoint`` section. Thread-safe: rounds never overlap, and an
    emergency sync pre-empts a periodic round (which stops starting new uploads) instead of queueing.
    """

    def __init__(self, settings, paths: RunPaths, location: S3Location, client: Any = None,
                 progress: bool = False):
        self.settings = settings
        self.paths = paths
        self.location = location
        self.client = client if client is not None else make_s3_client(settings)
        self.transfer = transfer_config(settings)
        self.fingerprints = FingerprintCache(chunk_bytes(settings), chunk_bytes(settings))
        self.manifests = ManifestReader(self.client, location)
        self.progress = progress
        self.last_report: Optional[SyncReport] = None
        self._round_lock = threading.Lock()
        self._preempt = threading.Event()
        self._abort_round = threading.Event()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._sha_by_etag: dict[tuple[str, str], Optional[str]] = {}
        self._counters_lock = threading.Lock()

    # -- background thread ------------------------------------------------------------------
    def start(self) -> None:
        if self._thread and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="s3-sync", daemon=True)
        self._thread.start()
        log.info("S3 sync of %s to %s every %.0f s", self.paths.root, self.location.uri,
                 self.settings.sync_interval_s)

    def _loop(self) -> None:
        while not self._stop.is_set():
            report = self.sync_once()
            if not report.ok:
                log.warning("S3 %s; retrying next round", report.summary())
            self._stop.wait(self.settings.sync_interval_s)

    @property
    def running(self) -> bool:
        return bool(self._thread and self._thread.is_alive())

    def stop(self, final_sync: bool = True, timeout: Optional[float] = None) -> Optional[SyncReport]:
        self._stop.set()
        if self._thread:
            self._preempt.set()
            self._thread.join(timeout)
            self._preempt.clear()
        return self.sync_once() if final_sync else None

    # -- one round ----------------------------------------------------------------------------
    def emergency_sync(self, deadline_unix: Optional[float] = None) -> SyncReport:
        """Sync what is new now, newest checkpoint first, starting no upload after the deadline."""
        self._preempt.set()
        with self._round_lock:
            self._preempt.clear()
            return self._round(deadline_unix, prune=False)

    def sync_once(self, deadline_unix: Optional[float] = None, prune: bool = True) -> SyncReport:
        with self._round_lock:
            return self._round(deadline_unix, prune)

    def _round(self, deadline_unix: Optional[float], prune: bool) -> SyncReport:
        report = SyncReport(started_unix=time.time())
        self._abort_round.clear()
        try:
            self._sync(report, deadline_unix, prune)
        except Exception as exc:  # noqa: BLE001 - a sync round must never take the run down
            report.endpoint_down = report.endpoint_down or is_connection_error(exc)
            report.error = describe(exc, "sync", endpoint_of(self.client), self.location.bucket)
        report.duration_s = time.time() - report.started_unix
        self.last_report = report
        log.info("S3 %s", report.summary())
        return report

    def _call(self, call, what: str):
        return with_backoff(call, what=what, attempts=self.settings.max_retries,
                            base_s=self.settings.retry_backoff_s, cap_s=self.settings.retry_backoff_max_s,
                            should_stop=self._abort_round.is_set)

    def _sync(self, report: SyncReport, deadline_unix: Optional[float], prune: bool) -> None:
        remote = self._call(lambda: list_objects(self.client, self.location), "list bucket")
        units, report.skipped_old_checkpoints = plan_units(
            self.paths, list(self.settings.sync_dirs), self.settings.keep_last)
        bar = self._progress_bar(units)
        try:
            with ThreadPoolExecutor(max_workers=max(1, self.settings.file_concurrency)) as pool:
                for unit in units:
                    if self._abort_round.is_set() or self._preempt.is_set():
                        break
                    self._sync_unit(unit, remote, report, deadline_unix, pool, bar)
        finally:
            if bar is not None:
                bar.close()
        if prune and not self._abort_round.is_set() and not self._preempt.is_set():
            self._prune(report)

    def _progress_bar(self, units: list[SyncUnit]):
        if not self.progress:
            return None
        from tqdm import tqdm

        return tqdm(total=len(units), unit="dir", desc="S3 sync", leave=False)

    # -- a unit: files first, manifest last ---------------------------------------------------
    def _sync_unit(self, unit: SyncUnit, remote: dict[str, RemoteObject], report: SyncReport,
                   deadline_unix: Optional[float], pool: ThreadPoolExecutor, bar) -> None:
        root = self.paths.root
        fingerprints: dict[Path, Fingerprint] = {}
        for path in unit.files:
            try:
                fingerprints[path] = self.fingerprints.get(path)
            except FileNotFoundError:
                continue  # removed since the walk (e.g. a pruned checkpoint): nothing to send
        pending = []
        for path, fp in fingerprints.items():
            rel = str(path.relative_to(root))
            if self._needs_upload(rel, fp, remote):
                pending.append((path, rel, fp))
            else:
                report.unchanged_files += 1

        manifest_rel = f"{unit.label}/{MANIFEST}"
        if unit.checkpoint_dir is not None and pending and manifest_rel in remote:
            # Files the remote manifest vouches for are about to change: withdraw it first.
            key = self.location.key_for(manifest_rel)
            self._call(lambda: self.client.delete_object(Bucket=self.location.bucket, Key=key), f"withdraw {key}")
            remote.pop(manifest_rel, None)
            report.manifests_withdrawn.append(unit.label)

        results = list(pool.map(lambda item: self._upload(*item, report, deadline_unix), pending))
        all_sent = all(results)
        if unit.checkpoint_dir is not None:
            self._seal(unit, fingerprints, remote, report, all_sent, deadline_unix)
        if bar is not None:
            bar.update(1)

    def _seal(self, unit: SyncUnit, fingerprints: dict[Path, Fingerprint], remote: dict[str, RemoteObject],
              report: SyncReport, all_sent: bool, deadline_unix: Optional[float]) -> None:
        directory = unit.checkpoint_dir
        manifest = read_manifest(directory)
        if manifest is None:
            return  # an incomplete checkpoint: its files may be uploaded, a manifest never
        if not all_sent:
            report.manifests_held_back.append(f"{unit.label}: not every file was uploaded")
            return
        for name, entry in manifest["files"].items():
            fp = fingerprints.get(directory / name)
            if fp is None or fp.size != entry.get("size") or fp.sha256 != entry.get("sha256"):
                report.manifests_held_back.append(f"{unit.label}: {name} does not match its manifest entry")
                return
        manifest_path = directory / MANIFEST
        fp = self.fingerprints.get(manifest_path)
        rel = f"{unit.label}/{MANIFEST}"
        if not self._needs_upload(rel, fp, remote):
            report.unchanged_files += 1
            return
        if self._upload(manifest_path, rel, fp, report, deadline_unix):
            report.manifests_uploaded.append(unit.label)
        else:
            report.manifests_held_back.append(f"{unit.label}: manifest upload failed")

    def _needs_upload(self, rel: str, fp: Fingerprint, remote: dict[str, RemoteObject]) -> bool:
        obj = remote.get(rel)
        if obj is None or obj.size != fp.size:
            return True
        if obj.etag == fp.etag:
            return False
        # Not reproducible here (another part size, SSE-KMS): the sha256 stored at upload decides.
        cache_key = (rel, obj.etag)
        if cache_key not in self._sha_by_etag:
            key = self.location.key_for(rel)
            head = self._call(lambda: self.client.head_object(Bucket=self.location.bucket, Key=key), f"head {key}")
            self._sha_by_etag[cache_key] = head.get("Metadata", {}).get("sha256")
        return self._sha_by_etag[cache_key] != fp.sha256

    def _upload(self, path: Path, rel: str, fp: Fingerprint, report: SyncReport,
                deadline_unix: Optional[float]) -> bool:
        if self._abort_round.is_set() or self._preempt.is_set():
            return False  # the round was cut short; the next one sends this file
        if deadline_unix is not None and time.time() >= deadline_unix:
            with self._counters_lock:
                report.skipped_for_deadline += 1
            return False
        key = self.location.key_for(rel)

        def send():
            self.client.upload_file(str(path), self.location.bucket, key, Config=self.transfer,
                                    ExtraArgs={"Metadata": {"sha256": fp.sha256}})
            if not self.fingerprints.unchanged_since(path, fp):
                raise FileChangedDuringUpload(f"{rel} changed while it was uploaded")

        try:
            self._call(send, f"upload {key}")
        except FileNotFoundError:
            with self._counters_lock:
                report.failed.append(f"{rel}: removed during upload")
            return False
        except Exception as exc:  # noqa: BLE001 - reported, retried next round
            with self._counters_lock:
                report.failed.append(f"{rel}: {likely_cause(exc, self.location.bucket)}")
                if is_connection_error(exc):
                    report.endpoint_down = True
                    self._abort_round.set()
            return False
        with self._counters_lock:
            report.uploaded_files += 1
            report.uploaded_bytes += fp.size
        return True

    # -- retention ----------------------------------------------------------------------------
    def _prune(self, report: SyncReport) -> None:
        objects = self._call(lambda: list_objects(self.client, self.location), "list bucket")
        checkpoints = remote_checkpoints(objects, self.manifests)
        for checkpoint in checkpoints_to_prune(checkpoints, self.settings.keep_last):
            delete_checkpoint(self.client, self.location, checkpoint, self._call)
            report.pruned.append(checkpoint.rel_dir)
