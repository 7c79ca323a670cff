"""Whether a stage's saved result still belongs to the current config and data.

A training stage's newest complete checkpoint (``final/`` when it finished) is reused, skipped or
resumed, only when the config keys that decide that stage (``extensions.config.fingerprint``) and
the content of what it read (data files; for RL the SFT adapter it started from) are what the
current run would use. Otherwise the run stops with one line per difference and the two ways on:
``--force`` to retrain, or the checkpoint's own config (its ``config.yaml``) to continue it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from ..config.fingerprint import differences, stage_view
from ..config.sections import PipelineConfig, RLConfig
from . import checkpoints
from . import io as run_io
from .paths import RunPaths
from .run_files import LOCAL_FILES, RunFiles

TRAINING_STAGES = ("sft", "rl")


class StageCheckError(RuntimeError):
    """A stage cannot start as asked; the message says how to go on (exit status 2)."""


class StaleResultError(StageCheckError):
    """A saved result was made with another config or other data."""


class MissingStageInput(StageCheckError):
    """A stage's input (the SFT adapter RL starts from) does not exist yet."""


def file_sha256(path: Path) -> Optional[str]:
    """The file's sha256, or None when there is no such file (a stage input not made yet)."""
    return run_io.file_sha256(path) if Path(path).is_file() else None


def rl_start_adapter(paths: RunPaths, rl: RLConfig) -> Optional[Path]:
    """The adapter RL starts from: ``sft/final`` unless ``rl.init`` is ``base`` (None)."""
    return None if getattr(rl, "init", "sft") == "base" else paths.final("sft")


def stage_inputs(paths: RunPaths, cfg: PipelineConfig, stage: str, files: RunFiles = LOCAL_FILES) -> dict[str, Any]:
    """Content hashes of what ``stage`` reads, as stored in meta.json's ``inputs``."""
    if stage == "sft":
        return {"sft_train.jsonl": files.sha256(paths.sft_train), "sft_val.jsonl": files.sha256(paths.sft_val)}
    if stage == "rl":
        start = rl_start_adapter(paths, cfg.rl)
        return {"rl_tasks.jsonl": files.sha256(paths.rl_tasks),
                "start_adapter": "base" if start is None else files.adapter_hash(start)}
    raise ValueError(f"no inputs recorded for stage {stage!r}")


def _short(value: Any) -> str:
    if isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value):
        return f"sha256:{value[:12]}"
    return "(missing)" if value is None else str(value)


@dataclass
class Freshness:
    stage: str
    checkpoint: Optional[Path]  # the result judged (final/ if complete, else the newest checkpoint)
    finished: bool  # checkpoint is the stage's complete final/
    changes: list[str] = field(default_factory=list)  # "key: old -> new"
    in_s3: bool = False  # judged as a restore from S3 will bring it (a dry run downloads nothing)

    @property
    def stale(self) -> bool:
        return self.checkpoint is not None and bool(self.changes)

    def message(self, force_hint: str = "--force") -> str:
        what = "finished result" if self.finished else "newest checkpoint"
        where = " (in S3; the restore brings it here)" if self.in_s3 else ""
        lines = [f"{self.stage}: the {what} {self.checkpoint}{where} was made with other settings than this run's:"]
        lines += [f"  {change}" for change in self.changes]
        config_copy = self.checkpoint / checkpoints.CONFIG_COPY if self.checkpoint else None
        old = (f"--config {config_copy}" if config_copy is not None and config_copy.is_file()
               else "the config it was made with")
        lines.append(f"either retrain the stage ({force_hint}) or keep the result by running with {old}")
        return "\n".join(lines)


def checkpoint_changes(directory: Path, cfg: PipelineConfig, paths: RunPaths, stage: str, *, finished: bool = True,
                       files: RunFiles = LOCAL_FILES) -> list[str]:
    """What differs between the config and inputs recorded in ``directory`` and the current ones
    (``finished``: judged as the stage's result, else as a checkpoint to continue from)."""
    try:
        meta = files.read_meta(directory)
    except (OSError, ValueError) as exc:
        return [f"meta.json: unreadable ({exc})"]
    recorded = meta.get("config")
    if not isinstance(recorded, dict):
        return ["config: not recorded in meta.json (written by an older version of this pipeline)"]
    changes = [f"{key}: {old!r} -> {new!r}"
               for key, old, new in differences(stage_view(recorded, stage, continuing=not finished),
                                                stage_view(cfg, stage, continuing=not finished))]
    old_inputs, new_inputs = meta.get("inputs") or {}, stage_inputs(paths, cfg, stage, files)
    for name in sorted(new_inputs):
        if old_inputs.get(name) != new_inputs[name]:
            changes.append(f"input {name}: {_short(old_inputs.get(name))} -> {_short(new_inputs[name])}")
    return changes


def stage_freshness(paths: RunPaths, cfg: PipelineConfig, stage: str, files: RunFiles = LOCAL_FILES) -> Freshness:
    """Judge the stage's complete final/ (or, before it finished, its newest complete checkpoint)."""
    final = paths.final(stage)
    if files.is_complete(final):
        return Freshness(stage, final, True, checkpoint_changes(final, cfg, paths, stage, files=files),
                         in_s3=files.from_s3(final))
    newest = files.newest_complete(paths.stage_dir(stage))
    if newest is None:
        return Freshness(stage, None, False)
    return Freshness(stage, newest, False, checkpoint_changes(newest, cfg, paths, stage, finished=False, files=files),
                     in_s3=files.from_s3(newest))


def require_fresh(paths: RunPaths, cfg: PipelineConfig, stage: str, force_hint: str = "--force") -> Freshness:
    freshness = stage_freshness(paths, cfg, stage)
    if freshness.stale:
        raise StaleResultError(freshness.message(force_hint))
    return freshness


def require_rl_start(paths: RunPaths, cfg: PipelineConfig) -> None:
    """RL continues its own checkpoints, or starts from a complete SFT adapter unless ``rl.init: base``."""
    start = rl_start_adapter(paths, cfg.rl)
    if start is None or checkpoints.newest_complete(paths.stage_dir("rl")) is not None \
            or checkpoints.is_complete(paths.final("rl")):
        return
    if not checkpoints.is_complete(start):
        raise MissingStageInput(
            f"rl: no complete SFT adapter at {start}; RL starts from the SFT adapter (rl.init: sft). "
            f"Run the SFT stage first (train_integrated.py --stage sft, or --stage all), "
            f"or set rl.init: base to start RL from the base model with a fresh LoRA"
        )
