"""Pipeline configuration: typed sections loaded from YAML and overridden from the command line.

    cfg = load_config("configs/smoke.yaml", ["rl.num_rounds=2"])

Scripts add the shared flags with ``add_config_args`` and turn parsed arguments into a config with
``config_from_args`` (``extensions.config.cli``): ``--config FILE``, ``--smoke`` (configs/smoke.yaml),
any number of ``--set section.key=value`` and ``--print-config``. Without ``--config``/``--smoke``
every stage script takes the config ``extensions.config.machine.default_config`` picks (production
with a CUDA GPU, smoke without); other tools (the verifier CLI) read configs/default.yaml.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional

from .cli import add_config_args, announce_config, config_from_args, config_yaml, parse_flags
from .deprecated import translate_file, translate_override
from .loader import ConfigError, ConfigHelpRequested, build, override, to_dict, yaml_load
from .machine import DEFAULT_CONFIG, PROJECT_ROOT, SMOKE_CONFIG, default_config
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
    # The file this config came from, so checkpoints can name it in meta.json, and why that file
    # was taken when the command line named none (see extensions.config.machine).
    source: Optional[str] = None
    source_reason: Optional[str] = None


def load_config(path: str | Path | None = None, overrides: Iterable[str] = ()) -> PipelineConfig:
    """Read ``path`` (default: configs/default.yaml) and apply ``section.key=value`` overrides."""
    import yaml

    path = Path(path) if path is not None else DEFAULT_CONFIG
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = yaml_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" (line {where.line + 1})" if where is not None else ""
        raise ConfigError(f"{path}: not valid YAML{line}: {getattr(exc, 'problem', None) or exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping of sections")
    for reserved in ("source", "source_reason"):
        if reserved in data:
            raise ConfigError(f"{path}: '{reserved}' is set by the loader, not by the file")
    try:
        cfg = build(PipelineConfig, translate_file(data))
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    cfg.source = str(path)
    for assignment in overrides:
        for current in translate_override(assignment):
            override(cfg, current)
    check_sections(cfg)
    return cfg


def check_sections(cfg: PipelineConfig) -> None:
    """Each section's checks across its keys (``check``), once the file and the overrides are in."""
    for f in dataclasses.fields(cfg):
        check = getattr(getattr(cfg, f.name), "check", None)
        if callable(check):
            check(f.name)


__all__ = [
    "CheckpointConfig", "ConfigError", "CurriculumConfig", "DataConfig", "EvalConfig", "LoggingConfig", "LoraConfig",
    "ModelConfig", "PipelineConfig", "PromptConfig", "RLConfig", "RunConfig", "SFTConfig", "VerifierConfig",
    "ConfigHelpRequested", "add_config_args", "announce_config", "config_from_args", "config_yaml", "parse_flags",
    "load_config", "to_dict", "build", "override", "yaml_load", "DEFAULT_CONFIG", "SMOKE_CONFIG", "default_config",
]
