"""What the SFT and RL stages share: the outcome a stage reports, skipping a stage whose final
checkpoint is complete, seeding, and the base model with its LoRA adapter to train."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..config.sections import PipelineConfig
from ..models.loading import attach_lora, enable_gradient_checkpointing, load_adapter, load_base_model
from ..runtime import checkpoints


@dataclass
class StageOutcome:
    status: str  # "finished" | "skipped" | "stopped"
    directory: Optional[str] = None  # final/ when finished or skipped, the saved checkpoint when stopped
    detail: str = ""


def skipped_if_finished(stage: str, final_dir, dist, force: bool) -> Optional[StageOutcome]:
    """The outcome of a stage whose final/ checkpoint is already complete (None: run it)."""
    if force or not checkpoints.is_complete(final_dir):
        return None
    msg = f"[{stage}] {final_dir} is complete; skipping the stage (use --force to retrain)"
    if dist.is_main:
        print(msg, flush=True)
    return StageOutcome("skipped", str(final_dir), msg)


def set_seed(seed: int) -> None:
    import random

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def prepare_trainable_model(cfg: PipelineConfig, dist, *, resume_from=None, gradient_checkpointing: bool = False):
    """Base model with a LoRA adapter: loaded (trainable) from ``resume_from`` or freshly attached."""
    device = None if cfg.model.device_map else str(dist.device)
    model = load_base_model(cfg.model, device=device, for_training=True)
    if resume_from is not None:
        model = load_adapter(model, resume_from, trainable=True)
    else:
        set_seed(cfg.run.seed)  # LoRA initialisation is random
        model = attach_lora(model, cfg.lora)
    if gradient_checkpointing:
        enable_gradient_checkpointing(model)
    return model
