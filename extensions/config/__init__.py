"""Pipeline configuration: typed sections loaded from YAML and overridden from the command line.

    cfg = load_config("configs/smoke.yaml", ["rl.num_rounds=2"])

Scripts add the shared flags with ``add_config_args`` and turn parsed arguments into a config with
``config_from_args`` (``extensions.config.cli``): ``--config FILE``, ``--smoke`` (configs/smoke.yaml),
any number of ``--set section.key=value`` and ``--print-config``. Without ``--config``/``--smoke``
every stage script takes the config ``extensions.config.machine.default_config`` picks (production
with a CUDA GPU, smoke without); other tools (the verifier CLI) read configs/default.yaml.
"""
from __future__ import annotations

from .cli import add_config_args, announce_config, config_from_args, config_yaml, parse_flags
from .errors import ConfigError, ConfigHelpRequested
from .loader import build, check_sections, load_config, override, to_dict, yaml_load
from .machine import DEFAULT_CONFIG, PROJECT_ROOT, SMOKE_CONFIG, default_config
from .sections import (
    CheckpointConfig,
    CurriculumConfig,
    DataConfig,
    EvalConfig,
    LoggingConfig,
    LoraConfig,
    ModelConfig,
    PipelineConfig,
    PromptConfig,
    RLConfig,
    RunConfig,
    SFTConfig,
    VerifierConfig,
)

__all__ = [
    "CheckpointConfig", "ConfigError", "CurriculumConfig", "DataConfig", "EvalConfig", "LoggingConfig", "LoraConfig",
    "ModelConfig", "PipelineConfig", "PromptConfig", "RLConfig", "RunConfig", "SFTConfig", "VerifierConfig",
    "ConfigHelpRequested", "add_config_args", "announce_config", "config_from_args", "config_yaml", "parse_flags",
    "load_config", "to_dict", "build", "override", "yaml_load", "DEFAULT_CONFIG", "SMOKE_CONFIG", "default_config",
]
