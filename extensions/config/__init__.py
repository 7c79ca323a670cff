"""Pipeline configuration: typed sections loaded from YAML and overridden from the command line.

    cfg = load_config("configs/smoke.yaml", ["rl.num_rounds=2"])

Scripts add the shared flags with ``add_config_args`` and turn parsed arguments into a config with
``config_from_args``: ``--config FILE``, ``--smoke`` (configs/smoke.yaml) and any number of
``--set section.key=value``.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional

from .loader import ConfigError, build, override, to_dict
from .sections import (
    CheckpointConfig,
    CurriculumConfig,
    DataConfig,
    EvalConfig,
    LoggingConfig,
    LoraConfig,
    ModelConfig,
    PromptConfig,
    RLConfig,
    RunConfig,
    SFTConfig,
    VerifierConfig,
)

PROJECT_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CONFIG = PROJECT_ROOT / "configs" / "default.yaml"
SMOKE_CONFIG = PROJECT_ROOT / "configs" / "smoke.yaml"


@dataclass
class PipelineConfig:
    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    data: DataConfig = field(default_factory=DataConfig)
    prompt: PromptConfig = field(default_factory=PromptConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    rl: RLConfig = field(default_factory=RLConfig)
    verifier: VerifierConfig = field(default_factory=VerifierConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    # The file this config came from, so checkpoints can name it in meta.json.
    source: Optional[str] = None


def load_config(path: str | Path | None = None, overrides: Iterable[str] = ()) -> PipelineConfig:
    """Read ``path`` (default: configs/default.yaml) and apply ``section.key=value`` overrides."""
    import yaml

    path = Path(path) if path is not None else DEFAULT_CONFIG
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping of sections")
    if "source" in data:
        raise ConfigError(f"{path}: 'source' is set by the loader, not by the file")
    try:
        cfg = build(PipelineConfig, data)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    cfg.source = str(path)
    for assignment in overrides:
        override(cfg, assignment)
    return cfg


def add_config_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("configuration")
    group.add_argument("--config", default=None, help="YAML config (default: configs/default.yaml)")
    group.add_argument("--smoke", action="store_true", help="use configs/smoke.yaml (CPU, small model)")
    group.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
        help="override one config value, e.g. --set rl.num_rounds=3 (repeatable)",
    )


def config_from_args(args: argparse.Namespace, extra_overrides: Iterable[str] = ()) -> PipelineConfig:
    if args.config and args.smoke:
        raise ConfigError("give --config or --smoke, not both")
    path = SMOKE_CONFIG if args.smoke else args.config
    return load_config(path, [*args.overrides, *extra_overrides])


__all__ = [
    "CheckpointConfig", "ConfigError", "CurriculumConfig", "DataConfig", "EvalConfig", "LoggingConfig", "LoraConfig",
    "ModelConfig", "PipelineConfig", "PromptConfig", "RLConfig", "RunConfig", "SFTConfig", "VerifierConfig",
    "add_config_args", "config_from_args", "load_config", "to_dict", "build", "override",
]
