"""Bring a run back from S3: complete checkpoints only, every byte verified.

Checkpoints are defined by their manifests: a remote checkpoint without a manifest, or whose
manifest lists a file that is missing or of another size, is not restored (and is counted). A
restored checkpoint is downloaded into a hidden staging directory, each file checked against the
manifest's size and sha256, moved into place, and its manifest written last, so an interrupted
restore leaves nothing that looks complete. Other run files (data, outputs, logs) are downloaded
when missing or different and checked against the S3 ETag, or the sha256 stored at upload.

``Restorer.preview`` tells what a restore would leave on disk without downloading it (RestoredFiles,
read by the stage checks of ``resume_training.py --dry-run``).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from ..runtime.checkpoints import MANIFEST, is_complete, manifest_adapter_hash, read_manifest
from ..runtime.io import atomic_write_text
from ..runtime.paths import RunPaths, checkpoint_index
from ..runtime.run_files import NotKnownBeforeRestore, RunFiles
from .failures import likely_cause
from .fingerprint import Fingerprint, compute_fingerprint
from .location import S3Location, chunk_bytes, make_s3_client, transfer_config
from .remote_tree import (CHECKPOINTS_DIR, ManifestReader, RemoteCheckpoint, RemoteObject, checkpoint_of,
                          list_objects, remote_checkpoints)
from .retry import with_backoff
from .s3_sync import NOT_SYNCED

log = logging.getLogger(__name__)

# The most a preview reads of one object: meta.json, the data report and compare.json are a few KB.
SMALL_READ_BYTES = 4 * 1024 * 1024


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

    def _wanted(self, dirs: Optional[list[str]]) -> tuple[list[RemoteCheckpoint], dict[str, RemoteObject]]:
        """What a restore of ``dirs`` (default: the config's sync_dirs) considers: the checkpoints in
        them, complete or not, and the other objects (loose files)."""
        dirs = list(dirs if dirs is not None else self.settings.sync_dirs)
        objects = self._call(lambda: list_objects(self.client, self.location), "list bucket")
        wanted = {rel: obj for rel, obj in objects.items() if rel.split("/", 1)[0] in dirs}
        checkpoints = remote_checkpoints(wanted, ManifestReader(self.client, self.location))
        loose = {rel: obj for rel, obj in wanted.items()
                 if checkpoint_of(rel) is None and Path(rel).name not in NOT_SYNCED}
        return checkpoints, loose

    def preview(self, dirs: Optional[list[str]] = None) -> "RestoredFiles":
        """The run as ``restore(dirs)`` would leave it, from the listing and the manifests: nothing
        is downloaded or written."""
        return RestoredFiles(self, *self._wanted(dirs))

    def holds_locally(self, rel: str, obj: RemoteObject) -> Optional[Fingerprint]:
        """The local file's fingerprint when it already holds the object (restore leaves it alone)."""
        target = self.paths.root / rel
        if not (target.is_file() and target.stat().st_size == obj.size):
            return None
        fp = compute_fingerprint(target, self.chunk, self.chunk)
        return fp if fp.etag == obj.etag else None

    def checkpoint_held_locally(self, checkpoint: RemoteCheckpoint) -> bool:
        """Whether the local directory already is this checkpoint (restore leaves it alone)."""
        destination = self.paths.root / checkpoint.rel_dir
        local = read_manifest(destination)
        return (local is not None and local["files"] == checkpoint.manifest["files"]
                and is_complete(destination, verify_hashes=True))

    def read_object(self, rel: str) -> bytes:
        key = self.location.key_for(rel)
        return self._call(lambda: self.client.get_object(Bucket=self.location.bucket, Key=key)["Body"].read(),
                          f"get {key}")

    def stored_sha256(self, rel: str) -> Optional[str]:
        """The sha256 sync stored with the object's upload (None when another tool uploaded it)."""
        return self._stored_sha256(self.location.key_for(rel))

    def restore(self, dirs: Optional[list[str]] = None) -> RestoreReport:
        """Download the run's ``dirs`` (default: the config's sync_dirs) into the local run root."""
        report = RestoreReport()
        checkpoints, loose = self._wanted(dirs)
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
        if self.checkpoint_held_locally(checkpoint):
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
            if self.holds_locally(rel, obj) is not None:
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


class RestoredFiles(RunFiles):
    """The run as ``Restorer.restore`` will leave it, told from the bucket listing without downloading it.

    A complete remote checkpoint replaces the local directory of its name (incomplete ones are
    skipped); any other object of the synced folders replaces the local file when that differs;
    everything else stays as it is on disk. A checkpoint file's hash comes from its manifest, a loose
    file's from the sha256 stored with its upload; the few small files the stage checks read
    (meta.json, the data report, compare.json) come from this disk where it holds them already,
    else from one GET each. What cannot be known so raises NotKnownBeforeRestore.
    """

    def __init__(self, restorer: Restorer, checkpoints: list[RemoteCheckpoint], loose: dict[str, RemoteObject]):
        self.restorer = restorer
        self.root = restorer.paths.root
        self.checkpoints = checkpoints  # every remote checkpoint considered, complete or not
        self._complete = {self.root / c.rel_dir: c for c in checkpoints if c.complete}
        self._loose = {self.root / rel: (rel, obj) for rel, obj in loose.items()}
        # Local copies already compared with S3 (restore leaves those alone).
        self._local_files: dict[Path, Optional[Fingerprint]] = {}
        self._local_checkpoints: dict[Path, bool] = {}

    # -- where a path's content will come from -------------------------------------------------
    def _in_checkpoint(self, path: Path) -> Optional[tuple[RemoteCheckpoint, str]]:
        """(complete remote checkpoint, name inside it) for a file the restore puts there."""
        try:
            where = checkpoint_of(Path(path).relative_to(self.root).as_posix())
        except ValueError:
            return None
        if where is None:
            return None
        stage, name, inner = where
        checkpoint = self._complete.get(self.root / CHECKPOINTS_DIR / stage / name)
        return (checkpoint, inner) if checkpoint is not None else None

    def _local_copy(self, path: Path, rel: str, obj: RemoteObject) -> Optional[Fingerprint]:
        if path not in self._local_files:
            self._local_files[path] = self.restorer.holds_locally(rel, obj)
        return self._local_files[path]

    def _checkpoint_local(self, checkpoint: RemoteCheckpoint) -> bool:
        directory = self.root / checkpoint.rel_dir
        if directory not in self._local_checkpoints:
            self._local_checkpoints[directory] = self.restorer.checkpoint_held_locally(checkpoint)
        return self._local_checkpoints[directory]

    @staticmethod
    def _small(rel: str, size: int) -> None:
        if size > SMALL_READ_BYTES:
            raise NotKnownBeforeRestore(f"{rel} is {size / 1e6:.1f} MB in S3, read only once restored")

    # -- RunFiles ------------------------------------------------------------------------------
    def is_file(self, path: Path) -> bool:
        inside = self._in_checkpoint(path)
        if inside is not None:
            checkpoint, name = inside
            return name == MANIFEST or name in checkpoint.manifest["files"]
        return Path(path) in self._loose or Path(path).is_file()

    def read_text(self, path: Path) -> str:
        path = Path(path)
        inside = self._in_checkpoint(path)
        if inside is not None:
            checkpoint, name = inside
            if name == MANIFEST:
                return json.dumps(checkpoint.manifest, indent=2, sort_keys=True) + "\n"
            entry = checkpoint.manifest["files"].get(name)
            if entry is None:
                raise FileNotFoundError(f"{path}: not listed in the manifest of {checkpoint.rel_dir} in S3")
            rel, size = f"{checkpoint.rel_dir}/{name}", int(entry.get("size") or 0)
            self._small(rel, size)
            data = path.read_bytes() if path.is_file() and path.stat().st_size == size else None
            if data is None or hashlib.sha256(data).hexdigest() != entry.get("sha256"):
                data = self.restorer.read_object(rel)
                if hashlib.sha256(data).hexdigest() != entry.get("sha256"):
                    raise NotKnownBeforeRestore(f"{rel} in S3 does not match its manifest")
            return data.decode()
        remote = self._loose.get(path)
        if remote is not None and self._local_copy(path, *remote) is None:
            rel, obj = remote
            self._small(rel, obj.size)
            return self.restorer.read_object(rel).decode()
        return path.read_text()

    def sha256(self, path: Path) -> Optional[str]:
        path = Path(path)
        inside = self._in_checkpoint(path)
        if inside is not None:
            checkpoint, name = inside
            if name == MANIFEST:
                return hashlib.sha256(self.read_text(path).encode()).hexdigest()
            return checkpoint.manifest["files"].get(name, {}).get("sha256")
        remote = self._loose.get(path)
        if remote is None:
            return super().sha256(path)
        local = self._local_copy(path, *remote)
        if local is not None:
            return local.sha256
        stored = self.restorer.stored_sha256(remote[0])
        if not stored:
            raise NotKnownBeforeRestore(f"{remote[0]} in S3 has no stored sha256 (not uploaded by this pipeline)")
        return stored

    def manifest(self, directory: Path) -> Optional[dict]:
        checkpoint = self._complete.get(Path(directory))
        return checkpoint.manifest if checkpoint is not None else super().manifest(directory)

    def complete_checkpoints(self, stage_dir: Path) -> list[Path]:
        remote = {d for d in self._complete if d.parent == Path(stage_dir) and checkpoint_index(d) is not None}
        return sorted(remote | set(super().complete_checkpoints(stage_dir)), key=checkpoint_index)

    def adapter_hash(self, directory: Path) -> Optional[str]:
        checkpoint = self._complete.get(Path(directory))
        return manifest_adapter_hash(checkpoint.manifest) if checkpoint is not None else super().adapter_hash(directory)

    def from_s3(self, path: Path) -> bool:
        path = Path(path)
        checkpoint = self._complete.get(path)
        if checkpoint is not None:
            return not self._checkpoint_local(checkpoint)
        inside = self._in_checkpoint(path)
        if inside is not None:
            return not self._checkpoint_local(inside[0])
        remote = self._loose.get(path)
        return remote is not None and self._local_copy(path, *remote) is None


def format_checkpoint_table(checkpoints: list[RemoteCheckpoint]) -> str:
    if not checkpoints:
        return "(no checkpoints)"
    lines = [f"{'stage':<6} {'checkpoint':<18} {'files':>5} {'MB':>9}  status"]
    for c in checkpoints:
        lines.append(f"{c.stage:<6} {c.name:<18} {len(c.objects):>5} {c.size / 1e6:>9.1f}  {c.status}")
    return "\n".join(lines)
