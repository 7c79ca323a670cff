import argparse

import pytest

from extensions.config import (
    ConfigError, PipelineConfig, add_config_args, config_from_args, load_config,
)


def test_default_and_smoke_configs_load(project_root):
    default = load_config(project_root / "configs" / "default.yaml")
    smoke = load_config(project_root / "configs" / "smoke.yaml")
    assert default.model.name_or_path == "Qwen/Qwen2.5-Coder-7B-Instruct"
    assert default.lora.r == 16 and default.lora.alpha == 32 and default.lora.dropout == 0.05
    assert default.rl.samples_per_task == 10 and default.rl.top_k == 3
    assert default.rl.reward_threshold == 0.3 and default.rl.learning_rate == 5e-6
    assert default.verifier.multi_input_num_tests == 5
    assert default.verifier.timing_num_warmup == 10 and default.verifier.timing_num_trials == 50
    assert smoke.verifier.device == "cpu"
    assert smoke.source.endswith("smoke.yaml")


def test_unknown_key_is_an_error_naming_it(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("verifier:\n  timing_num_trails: 50\n")
    with pytest.raises(ConfigError, match="verifier.timing_num_trails"):
        load_config(path)


def test_unknown_section_is_an_error(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("verifer:\n  device: cpu\n")
    with pytest.raises(ConfigError, match="verifer"):
        load_config(path)


def test_wrong_type_is_an_error(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("rl:\n  samples_per_task: many\n")
    with pytest.raises(ConfigError, match="rl.samples_per_task"):
        load_config(path)
    path.write_text("verifier:\n  device: tpu\n")
    with pytest.raises(ConfigError, match="verifier.device"):
        load_config(path)


def test_nested_sections_and_cli_overrides(project_root):
    parser = argparse.ArgumentParser()
    add_config_args(parser)
    args = parser.parse_args([
        "--smoke", "--set", "rl.curriculum.curriculum_start_p=0.2", "--set", "eval.levels=[1,2]",
        "--set", "model.name_or_path=123", "--set", "data.max_samples=null",
    ])
    cfg = config_from_args(args)
    assert isinstance(cfg, PipelineConfig)
    assert cfg.rl.curriculum.curriculum_start_p == 0.2
    assert cfg.eval.levels == [1, 2]
    assert cfg.model.name_or_path == "123"
    assert cfg.data.max_samples is None
    with pytest.raises(ConfigError, match="unknown config key"):
        config_from_args(parser.parse_args(["--set", "rl.rounds=3"]))
    with pytest.raises(ConfigError, match="expected an integer"):
        config_from_args(parser.parse_args(["--set", "rl.num_rounds=2.5"]))


def test_missing_config_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
