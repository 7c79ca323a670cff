"""Self-describing, verifiably complete checkpoint directories.

A checkpoint directory holds ``meta.json`` (the full resolved config and its fingerprints, base
model, stage, step or round, the content hashes of the data it read), ``config.yaml`` (the same
config, ready for ``--config``) and is *complete* only once ``manifest.json`` (every other file's name, size and sha256) exists. The manifest
is written last and atomically, so a directory caught mid-write by a crash, a SIGKILL or a spot
reclaim is never mistaken for a checkpoint: restore, resume and S3 sync consider complete ones only.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Iterable

from .io import atomic_write_json, atomic_write_text, file_sha256
from .paths import checkpoint_index, replaced_stage_dir, replaced_stage_dirs

META = "meta.json"
MANIFEST = "manifest.json"
CONFIG_COPY = "config.yaml"
ADAPTER_WEIGHTS_PREFIX = "adapter_model"


def write_meta(directory: Path, *, stage: str, config: Any, base_model: str, data: Any,
               step: int | None = None, round_index: int | None = None, inputs: dict | None = None,
               **extra: Any) -> dict:
    """Write ``meta.json`` (and ``config.yaml`` when ``config`` is a resolved config object).

    ``config``: the run's PipelineConfig (stored in full with its fingerprints, so a later run can
    tell whether this result still fits its own config), or just a file name where no resolved
    config exists. ``inputs``: content hashes of what the stage read (data files, start adapter).
    """
    from ..config.fingerprint import config_fingerprint, resolved_dict, stage_fingerprint

    described: dict[str, Any] = {"config": config, "config_file": config if isinstance(config, str) else None}
    if config is not None and not isinstance(config, str):
        from ..config import config_yaml

        described = {
            "config": resolved_dict(config),
            "config_file": config.source,
            "config_fingerprint": config_fingerprint(config),
            "stage_fingerprint": stage_fingerprint(config, stage) if stage in ("sft", "rl") else None,
        }
        atomic_write_text(Path(directory) / CONFIG_COPY, config_yaml(config))
    meta = {
        "stage": stage,
        **described,
        "inputs": inputs,
        "base_model": base_model,
        "step": step,
        "round": round_index,
        "data": data,
        "created_unix": time.time(),
        **extra,
    }
    atomic_write_json(Path(directory) / META, meta)
    return meta


def read_meta(directory: Path) -> dict:
    path = Path(directory) / META
    if not path.is_file():
        raise FileNotFoundError(f"{directory} has no {META}; it is not a checkpoint of this pipeline")
    return json.loads(path.read_text())


def adapter_content_hash(directory: Path) -> str | None:
    """sha256 over the adapter weight files of a checkpoint or adapter directory (None: no adapter).

    Names a trained adapter by what it is, not where it lies: a retrained ``sft/final`` gets a new
    hash, and an RL adapter that no update changed has its SFT adapter's hash.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return None
    manifest = read_manifest(directory) if is_complete(directory) else None
    if manifest is not None:
        return manifest_adapter_hash(manifest)
    return _adapter_digest({str(path.relative_to(directory)): file_sha256(path)
                            for path in sorted(directory.glob(f"{ADAPTER_WEIGHTS_PREFIX}*")) if path.is_file()})


def manifest_adapter_hash(manifest: dict) -> str | None:
    """``adapter_content_hash`` of the complete checkpoint ``manifest`` lists, from the manifest
    alone (a checkpoint still in S3 is named without downloading it)."""
    return _adapter_digest({name: entry.get("sha256") for name, entry in manifest["files"].items()
                            if Path(name).name.startswith(ADAPTER_WEIGHTS_PREFIX)})


def _adapter_digest(entries: dict[str, str | None]) -> str | None:
    if not entries or not all(entries.values()):
        return None
    digest = hashlib.sha256()
    for name in sorted(entries):
        digest.update(f"{Path(name).name}:{entries[name]}\n".encode())
    return digest.hexdigest()


def _payload_files(directory: Path) -> Iterable[Path]:
    for path in sorted(Path(directory).rglob("*")):
        if path.is_file() and path.name != MANIFEST and not path.name.startswith(f".{MANIFEST}"):
            yield path


def finalize(directory: Path) -> dict:
    """Write ``manifest.json`` for ``directory``: the last write, which marks it complete."""
    directory = Path(directory)
    if not (directory / META).is_file():
        raise FileNotFoundError(f"{directory}: write meta.json before finalizing")
    files = {
        str(path.relative_to(directory)): {"size": path.stat().st_size, "sha256": file_sha256(path)}
        for path in _payload_files(directory)
    }
    manifest = {"files": files, "finalized_unix": time.time()}
    atomic_write_json(directory / MANIFEST, manifest)
    return manifest


def read_manifest(directory: Path) -> dict | None:
    path = Path(directory) / MANIFEST
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return manifest if isinstance(manifest.get("files"), dict) else None


def is_complete(directory: Path, verify_hashes: bool = False) -> bool:
    """True when the manifest exists and every file it lists is present with its size (and hash)."""
    directory = Path(directory)
    manifest = read_manifest(directory)
    if manifest is None:
        return False
    for name, entry in manifest["files"].items():
        path = directory / name
        if not path.is_file() or path.stat().st_size != entry.get("size"):
            return False
        if verify_hashes and file_sha256(path) != entry.get("sha256"):
            return False
    return True


def complete_checkpoints(stage_dir: Path) -> list[Path]:
    """Complete ``checkpoint-N`` / ``round-NNN`` directories of one stage, oldest first."""
    stage_dir = Path(stage_dir)
    if not stage_dir.is_dir():
        return []
    found = [
        (checkpoint_index(path), path)
        for path in stage_dir.iterdir()
        if path.is_dir() and checkpoint_index(path) is not None and is_complete(path)
    ]
    return [path for _, path in sorted(found)]


def newest_complete(stage_dir: Path) -> Path | None:
    found = complete_checkpoints(stage_dir)
    return found[-1] if found else None


def prune(stage_dir: Path, keep_last: int) -> list[Path]:
    """Delete all but the newest ``keep_last`` complete checkpoints (never the newest one)."""
    found = complete_checkpoints(stage_dir)
    keep = max(1, keep_last)
    removed = found[:-keep] if len(found) > keep else []
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed


def copy_checkpoint(source: Path, destination: Path, before_finalize: Callable[[Path], None] | None = None) -> None:
    """Copy a complete checkpoint (e.g. the last round to ``final/``) keeping completeness last;
    ``before_finalize`` may add or replace files in the copy (the manifest lists them)."""
    source, destination = Path(source), Path(destination)
    if not is_complete(source):
        raise ValueError(f"{source} is not a complete checkpoint")
    staging = destination.with_name(f".{destination.name}.staging")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(source, staging, ignore=shutil.ignore_patterns(MANIFEST))
    if before_finalize is not None:
        before_finalize(staging)
    shutil.rmtree(destination, ignore_errors=True)
    os.replace(staging, destination)
    finalize(destination)


def set_aside(stage_dir: Path) -> Path | None:
    """Move a stage's results out of the way for a ``--force`` run, keeping them: called only once
    everything the new run needs has loaded, so a failing start never touches them. ``None`` when
    there was nothing to move."""
    stage_dir = Path(stage_dir)
    if not stage_dir.exists():
        return None
    target = replaced_stage_dir(stage_dir, time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + f"-{os.getpid()}")
    os.replace(stage_dir, target)
    return target


def discard_set_aside(stage_dir: Path) -> list[Path]:
    """Delete the results a ``--force`` run set aside, once the new run has a complete checkpoint of
    its own (until then they are the newest complete work there is)."""
    stage_dir = Path(stage_dir)
    if newest_complete(stage_dir) is None and not is_complete(stage_dir / "final"):
        return []
    removed = []
    for old in replaced_stage_dirs(stage_dir):
        shutil.rmtree(old, ignore_errors=True)
        removed.append(old)
    return removed
