"""What a run's S3 prefix holds: objects, and the checkpoints they form, complete or not.

A remote checkpoint is complete when its ``manifest.json`` exists and every file the manifest lists
is present with the listed size. Sync uploads a manifest only after its files, so an incomplete
remote checkpoint is one caught mid-upload; restore and resume ignore those.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Optional

from ..runtime.checkpoints import MANIFEST
from ..runtime.paths import checkpoint_index
from .location import S3Location

CHECKPOINTS_DIR = "checkpoints"


@dataclass(frozen=True)
class RemoteObject:
    size: int
    etag: str


@dataclass
class RemoteCheckpoint:
    stage: str
    name: str
    objects: dict[str, RemoteObject]  # file name inside the checkpoint -> object
    manifest: Optional[dict] = None
    missing: list[str] = field(default_factory=list)  # manifest entries absent or of another size

    @property
    def rel_dir(self) -> str:
        return f"{CHECKPOINTS_DIR}/{self.stage}/{self.name}"

    @property
    def index(self) -> Optional[int]:
        return checkpoint_index(self.name)

    @property
    def complete(self) -> bool:
        return self.manifest is not None and not self.missing

    @property
    def size(self) -> int:
        return sum(obj.size for obj in self.objects.values())

    @property
    def status(self) -> str:
        if self.complete:
            return "complete"
        if self.manifest is None:
            return "incomplete (no manifest)"
        return f"incomplete ({len(self.missing)} listed file(s) missing or wrong size)"


def list_objects(client: Any, location: S3Location) -> dict[str, RemoteObject]:
    """Every object under the run prefix, keyed by its path relative to the run root."""
    found: dict[str, RemoteObject] = {}
    paginator = client.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=location.bucket, Prefix=location.root_key):
        for item in page.get("Contents", []):
            found[location.relative(item["Key"])] = RemoteObject(int(item["Size"]), item["ETag"].strip('"'))
    return found


def checkpoint_of(relative: str) -> Optional[tuple[str, str, str]]:
    """``checkpoints/STAGE/NAME/FILE...`` -> (stage, name, file); None for any other key."""
    parts = relative.split("/")
    if len(parts) < 4 or parts[0] != CHECKPOINTS_DIR:
        return None
    return parts[1], parts[2], "/".join(parts[3:])


def group_checkpoints(objects: dict[str, RemoteObject]) -> dict[tuple[str, str], RemoteCheckpoint]:
    groups: dict[tuple[str, str], RemoteCheckpoint] = {}
    for relative, obj in objects.items():
        where = checkpoint_of(relative)
        if where is None:
            continue
        stage, name, inner = where
        group = groups.setdefault((stage, name), RemoteCheckpoint(stage, name, {}))
        group.objects[inner] = obj
    return groups


class ManifestReader:
    """Fetches remote manifests, remembering them by ETag so a sync round re-reads only new ones."""

    def __init__(self, client: Any, location: S3Location):
        self.client = client
        self.location = location
        self._by_etag: dict[tuple[str, str], Optional[dict]] = {}

    def read(self, checkpoint: RemoteCheckpoint) -> Optional[dict]:
        obj = checkpoint.objects.get(MANIFEST)
        if obj is None:
            return None
        cache_key = (checkpoint.rel_dir, obj.etag)
        if cache_key not in self._by_etag:
            key = self.location.key_for(f"{checkpoint.rel_dir}/{MANIFEST}")
            body = self.client.get_object(Bucket=self.location.bucket, Key=key)["Body"].read()
            try:
                manifest = json.loads(body)
                manifest = manifest if isinstance(manifest.get("files"), dict) else None
            except (ValueError, AttributeError):
                manifest = None
            self._by_etag[cache_key] = manifest
        return self._by_etag[cache_key]


def remote_checkpoints(objects: dict[str, RemoteObject], manifests: ManifestReader) -> list[RemoteCheckpoint]:
    """Remote checkpoints with completeness worked out, sorted by stage, then index, finals last."""
    found = []
    for checkpoint in group_checkpoints(objects).values():
        checkpoint.manifest = manifests.read(checkpoint)
        if checkpoint.manifest is not None:
            checkpoint.missing = [
                name for name, entry in checkpoint.manifest["files"].items()
                if name not in checkpoint.objects or checkpoint.objects[name].size != entry.get("size")
            ]
        found.append(checkpoint)
    return sorted(found, key=lambda c: (c.stage, c.index is None, c.index or 0, c.name))
