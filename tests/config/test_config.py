import argparse
import dataclasses
import os
import subprocess
import sys

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


def test_histogram_every_is_checked_after_the_file_and_every_override(project_root, tmp_path):
    smoke = project_root / "configs" / "smoke.yaml"
    assert load_config(smoke).logging.histogram_every == 1
    assert load_config(smoke, ["logging.histogram_every=0"]).logging.histogram_every == 0
    with pytest.raises(ConfigError, match="logging.histogram_every: -1 is below 0"):
        load_config(smoke, ["logging.histogram_every=-1"])
    path = tmp_path / "negative.yaml"
    path.write_text("logging:\n  histogram_every: -2\n")
    with pytest.raises(ConfigError, match="logging.histogram_every: -2 is below 0"):
        load_config(path)
    assert load_config(path, ["logging.histogram_every=3"]).logging.histogram_every == 3


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


def test_push_to_hub_needs_an_owner_name_repository(tmp_path, project_root):
    smoke = project_root / "configs" / "smoke.yaml"
    assert load_config(smoke).checkpoint.push_to_hub is False and load_config(smoke).checkpoint.hub_private is True
    with pytest.raises(ConfigError, match=r"checkpoint.push_to_hub is true but checkpoint.hub_model_id is not set"):
        load_config(smoke, ["checkpoint.push_to_hub=true"])
    path = tmp_path / "push.yaml"
    path.write_text("checkpoint:\n  push_to_hub: true\n  hub_model_id: just-a-name\n")
    with pytest.raises(ConfigError, match=r"checkpoint.hub_model_id: 'just-a-name' is not a hub repository id; "
                                          r"give it as owner/name"):
        load_config(path)
    cfg = load_config(path, ["checkpoint.hub_model_id=alice/qwen-triton", "checkpoint.hub_private=false"])
    assert cfg.checkpoint.hub_model_id == "alice/qwen-triton" and not cfg.checkpoint.hub_private
    # Publishing settings do not decide a result: the fingerprints stay those of the plain config.
    from extensions.config.fingerprint import config_fingerprint, stage_fingerprint

    plain = load_config(smoke)
    publishing = load_config(smoke, ["checkpoint.push_to_hub=true", "checkpoint.hub_model_id=alice/qwen-triton"])
    assert config_fingerprint(publishing) == config_fingerprint(plain)
    assert stage_fingerprint(publishing, "rl") == stage_fingerprint(plain, "rl")
    started = _run_script(project_root, "train_integrated.py", "--smoke", "--set", "checkpoint.push_to_hub=true")
    assert started.returncode == 2 and started.stderr.strip().splitlines() == [
        "train_integrated: config error: checkpoint.push_to_hub is true but checkpoint.hub_model_id is not set: "
        "name the repository as owner/name, e.g. --set checkpoint.hub_model_id=alice/qwen-coder-triton-lora"]


def test_missing_config_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")


# -- YAML 1.2 numbers, nearest keys, section help -----------------------------------------------------
def _parser():
    parser = argparse.ArgumentParser()
    add_config_args(parser)
    return parser


def test_exponent_floats_follow_yaml_1_2_in_files_and_overrides(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text("sft:\n  learning_rate: 1e-4\n  weight_decay: 5E-3\nrl:\n  learning_rate: '3e-6'\n"
                    "verifier:\n  timeout_s: 1e2\n")
    cfg = load_config(path, ["rl.temperature=7e-1", "eval.top_p=.5", "run.run_id=1e5"])
    assert cfg.sft.learning_rate == 1e-4 and cfg.sft.weight_decay == 5e-3
    assert cfg.rl.learning_rate == 3e-6  # a quoted number in a float field is read as the number
    assert cfg.verifier.timeout_s == 100.0 and cfg.rl.temperature == 0.7 and cfg.eval.top_p == 0.5
    assert cfg.run.run_id == "1e5"  # a string field keeps the text
    with pytest.raises(ConfigError, match="rl.num_rounds: expected an integer"):
        load_config(path, ["rl.num_rounds=1e3"])


def test_unknown_keys_name_the_nearest_valid_key(tmp_path):
    cfg_path = tmp_path / "typo.yaml"
    cfg_path.write_text("sft:\n  learnig_rate: 1e-4\n")
    with pytest.raises(ConfigError, match=r"unknown config key sft.learnig_rate \(did you mean sft.learning_rate\?\)"):
        load_config(cfg_path)
    parser = _parser()
    with pytest.raises(ConfigError, match=r"did you mean verifier\?"):
        config_from_args(parser.parse_args(["--smoke", "--set", "verifer.device=cpu"]))
    with pytest.raises(ConfigError, match=r"did you mean sft.learning_rate or rl.learning_rate\?"):
        config_from_args(parser.parse_args(["--smoke", "--set", "learning_rate=1e-4"]))
    with pytest.raises(ConfigError, match=r"did you mean rl.curriculum.curriculum_step\?"):
        config_from_args(parser.parse_args(["--smoke", "--set", "rl.curriculum.curriculum_stp=0.2"]))


def test_section_help_lists_its_keys_with_values():
    from extensions.config import ConfigHelpRequested

    with pytest.raises(ConfigHelpRequested) as listed:
        config_from_args(_parser().parse_args(["--smoke", "--set", "sft.help"]))
    text = str(listed.value)
    assert "keys of section sft" in text and "  learning_rate: float = 0.0001" in text
    assert "  batching: 'packed' | 'length_grouped' | 'padded' = 'packed'" in text
    with pytest.raises(ConfigHelpRequested, match="curriculum: \\(section; --set rl.curriculum.help\\)"):
        config_from_args(_parser().parse_args(["--smoke", "--set", "rl.help"]))


def test_default_config_follows_the_gpu(tmp_path, monkeypatch):
    from extensions.config import DEFAULT_CONFIG, SMOKE_CONFIG
    from extensions.config.machine import default_config

    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    smi = fake_bin / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake_bin}:{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert default_config().path == DEFAULT_CONFIG
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert default_config().path == SMOKE_CONFIG and "no CUDA GPU" in default_config().reason
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert default_config().path == SMOKE_CONFIG


# -- every entry point: one clean line, exit 2; --print-config; the default it took ------------------
ENTRY_POINTS = {
    "train_integrated.py": ["--stage", "sft"],
    "evaluate.py": ["--compare"],
    "prepare_data.py": [],
    "resume_training.py": ["--dry-run"],
    "checkpoint_manager.py": ["--action", "list", "--bucket", "b"],
}


def _run_script(project_root, script, *args, cwd=None, env=None):
    return subprocess.run([sys.executable, str(project_root / script), *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd or project_root, env=env)


@pytest.mark.parametrize("script", sorted(ENTRY_POINTS))
def test_config_errors_are_one_line_with_exit_code_2(project_root, script, tmp_path):
    typo = _run_script(project_root, script, *ENTRY_POINTS[script], "--smoke", "--set", "sft.learnig_rate=1e-4")
    assert typo.returncode == 2, typo.stdout + typo.stderr
    assert typo.stderr.strip().splitlines() == [
        f"{script[:-3]}: config error: unknown config key sft.learnig_rate (did you mean sft.learning_rate?); "
        "--set sft.help lists the valid keys"]
    bad_file = tmp_path / "bad.yaml"
    bad_file.write_text("rl:\n  num_rounds: many\n")
    wrong_type = _run_script(project_root, script, *ENTRY_POINTS[script], "--config", str(bad_file))
    assert wrong_type.returncode == 2 and len(wrong_type.stderr.strip().splitlines()) == 1, wrong_type.stderr
    assert "rl.num_rounds: expected an integer, got 'many'" in wrong_type.stderr
    listed = _run_script(project_root, script, *ENTRY_POINTS[script], "--smoke", "--set", "eval.help")
    assert listed.returncode == 0 and "keys of section eval" in listed.stdout, listed.stderr


def test_print_config_prints_a_loadable_config_and_exits_0(project_root, tmp_path):
    import yaml

    printed = _run_script(project_root, "train_integrated.py", "--smoke", "--set", "sft.learning_rate=1e-4",
                          "--set", "rl.num_rounds=5", "--print-config")
    assert printed.returncode == 0, printed.stderr
    assert yaml.safe_load(printed.stdout)["sft"]["learning_rate"] == 1e-4
    copy = tmp_path / "resolved.yaml"
    copy.write_text(printed.stdout)
    reloaded = load_config(copy)
    original = load_config(project_root / "configs" / "smoke.yaml", ["sft.learning_rate=1e-4", "rl.num_rounds=5"])
    assert dataclasses.replace(reloaded, source=None) == dataclasses.replace(original, source=None)
    assert not (project_root / "runs" / "smoke" / ".run.lock").exists()  # nothing was started


def test_bare_scripts_take_the_machines_default_and_say_so(project_root, tmp_path):
    env = {**os.environ, "PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""}
    state = _run_script(project_root, "resume_training.py", "--print-state", cwd=tmp_path, env=env)
    assert state.returncode == 0, state.stderr
    assert f"CONFIG_FILE={project_root / 'configs' / 'smoke.yaml'}" in state.stdout
    assert "no CUDA GPU visible" in state.stdout
    dry = _run_script(project_root, "resume_training.py", "--dry-run", cwd=tmp_path, env=env)
    assert dry.returncode == 0, dry.stderr
    assert "configs/smoke.yaml (no CUDA GPU visible: the CPU smoke config" in dry.stderr
