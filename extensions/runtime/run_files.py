"""How the stage checks read a run's files: from this disk, or as a restore from S3 will leave them.

Whether a stage is done, and whether its result still fits the config, is decided by a few small
files (the data report, checkpoint manifests and ``meta.json``, ``compare.json``), by the presence
of others and by the content hashes of a few more. The checks (``extensions.pipeline.run_state``,
``extensions.runtime.freshness``, the data pipeline's ``is_up_to_date``, ``comparison_inputs``) read
them through a RunFiles object. The plain one reads this disk; ``extensions.cloud.restore``'s
RestoredFiles answers as the disk will look once the run is restored from S3, so a dry run plans
what the real run will do without downloading the run.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from . import checkpoints
from .io import file_sha256


class NotKnownBeforeRestore(RuntimeError):
    """A file's content or hash that only the restore itself can tell (the message says which)."""


class RunFiles:
    """A run's files as they are on this disk."""

    def is_file(self, path: Path) -> bool:
        return Path(path).is_file()

    def read_text(self, path: Path) -> str:
        return Path(path).read_text()

    def sha256(self, path: Path) -> Optional[str]:
        """The file's content hash; None when there is no such file."""
        return file_sha256(path) if Path(path).is_file() else None

    def manifest(self, directory: Path) -> Optional[dict]:
        """The manifest of the complete checkpoint at ``directory``; None when there is none."""
        return checkpoints.read_manifest(directory) if checkpoints.is_complete(directory) else None

    def complete_checkpoints(self, stage_dir: Path) -> list[Path]:
        """Complete ``checkpoint-N`` / ``round-NNN`` directories of one stage, oldest first."""
        return checkpoints.complete_checkpoints(stage_dir)

    def adapter_hash(self, directory: Path) -> Optional[str]:
        return checkpoints.adapter_content_hash(directory)

    def from_s3(self, path: Path) -> bool:
        """Whether the file or checkpoint at ``path`` is one the restore brings (never, here)."""
        return False

    # Built on the methods above, so every view answers them alike.
    def is_complete(self, directory: Path) -> bool:
        return self.manifest(directory) is not None

    def newest_complete(self, stage_dir: Path) -> Optional[Path]:
        found = self.complete_checkpoints(stage_dir)
        return found[-1] if found else None

    def read_meta(self, directory: Path) -> dict:
        path = Path(directory) / checkpoints.META
        if not self.is_file(path):
            raise FileNotFoundError(f"{directory} has no {checkpoints.META}; it is not a checkpoint of this pipeline")
        return json.loads(self.read_text(path))


LOCAL_FILES = RunFiles()
