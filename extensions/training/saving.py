"""Writing adapter checkpoints that resume exactly and are complete only once finished.

Order inside a checkpoint directory: adapter weights, optimizer/scheduler, trainer state, each
rank's RNG streams, extra files, ``meta.json``, for a stage's ``final/`` the model card; then
``checkpoints.finalize`` writes ``manifest.json`` last. A directory left half-written by a crash has
no manifest and is ignored (and replaced when the same step is saved again).
"""
from __future__ import annotations

import dataclasses
import hashlib
import shutil
from pathlib import Path
from typing import Any, Callable, Optional

from ..config import CheckpointConfig, PipelineConfig
from ..models.loading import model_meta
from ..runtime import checkpoints
from ..runtime.freshness import stage_inputs
from ..runtime.paths import RunPaths
from . import state as train_state


def file_fingerprint(path: Path) -> dict[str, Any]:
    """Name, size and sha256 of a data file, for meta.json's ``data`` field."""
    path = Path(path)
    if not path.is_file():
        return {"path": str(path), "missing": True}
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return {"path": str(path), "size": path.stat().st_size, "sha256": digest}


def save_adapter_checkpoint(directory: Path, *, dist, model, cfg: PipelineConfig, stage: str, data: Any,
                            optimizer=None, scheduler=None, trainer_state: Optional[train_state.TrainerState] = None,
                            tokenizer=None, step: Optional[int] = None, round_index: Optional[int] = None,
                            write_extra: Optional[Callable[[Path], None]] = None,
                            before_finalize: Optional[Callable[[Path], None]] = None, **meta_extra: Any) -> Path:
    """Write and finalize one checkpoint; collective (every rank calls it). ``before_finalize``
    runs on the main rank once meta.json is written: what it writes is listed in the manifest."""
    directory = Path(directory)
    if dist.is_main:
        if directory.exists():
            shutil.rmtree(directory)  # an incomplete leftover of a killed save, or --force
        directory.mkdir(parents=True)
        dist.unwrap(model).save_pretrained(str(directory))
        if optimizer is not None:
            train_state.save_optimizer(directory, optimizer, scheduler)
        if trainer_state is not None:
            train_state.save_trainer_state(directory, trainer_state)
        if tokenizer is not None:
            tokenizer.save_pretrained(str(directory))
        if write_extra is not None:
            write_extra(directory)
    dist.barrier()
    train_state.save_rng_state(directory, dist.rank)
    dist.barrier()
    if dist.is_main:
        checkpoints.write_meta(
            directory, stage=stage, config=cfg, base_model=cfg.model.name_or_path, data=data,
            inputs=stage_inputs(RunPaths.from_config(cfg), cfg, stage),
            step=step, round_index=round_index, model=model_meta(cfg.model), lora=dataclasses.asdict(cfg.lora),
            run_id=cfg.run.run_id, world_size=dist.world_size, **meta_extra,
        )
        if before_finalize is not None:
            before_finalize(directory)
        checkpoints.finalize(directory)
        print(f"[{stage}] saved complete checkpoint {directory}", flush=True)
    dist.barrier()
    return directory


def model_card_writer(paths: RunPaths, hub: CheckpointConfig) -> Callable[[Path], None]:
    """Writes a final adapter's model card (over PEFT's template) into a checkpoint before it is
    finalized. A card that cannot be written leaves the template and a warning: the trained adapter
    must be saved whatever goes wrong in its documentation."""
    def write(directory: Path) -> None:
        from ..export.model_card import write_model_card

        try:
            write_model_card(directory, paths=paths, repo_id=hub.hub_model_id)
        except Exception as exc:  # noqa: BLE001
            print(f"warning: no model card for {directory}: {type(exc).__name__}: {exc}", flush=True)

    return write


def set_stage_aside(stage: str, stage_dir: Path, dist) -> None:
    """``--force``, once the new run has loaded everything it needs: the old results move to
    ``<stage>.replaced-<stamp>`` and stay there until the new run has a complete checkpoint."""
    if dist.is_main:
        moved = checkpoints.set_aside(stage_dir)
        if moved is not None:
            print(f"[{stage}] --force: earlier results moved to {moved}; they are deleted once this run "
                  "writes its first complete checkpoint", flush=True)
    dist.barrier()


def discard_replaced(stage: str, stage_dir: Path, dist) -> None:
    """After a complete checkpoint of the new run: what ``--force`` set aside can go."""
    if dist.is_main:
        for old in checkpoints.discard_set_aside(stage_dir):
            print(f"[{stage}] removed {old} (set aside by --force; this run now has a complete checkpoint)",
                  flush=True)
