"""A TRL user's GRPO key names are read as this project's (rl.KEY_ALIASES), in YAML and --set."""
from __future__ import annotations

import pytest

from extensions.config import ConfigError, load_config

PAIRS = [("num_generations", "samples_per_task", 6, 6), ("max_completion_length", "max_new_tokens", 512, 512),
         ("epsilon", "clip_eps_low", 0.1, 0.1), ("epsilon_high", "clip_eps_high", 0.3, 0.3),
         ("num_iterations", "ppo_epochs", 2, 2), ("loss_type", "loss_normalization", "grpo", "sequence"),
         ("loss_type", "loss_normalization", "dapo", "token"), ("scale_rewards", "scale_advantages", False, False),
         ("scale_rewards", "scale_advantages", "group", True)]


@pytest.mark.parametrize("alias,key,value,expected", PAIRS)
def test_trl_names_in_yaml_and_set_mean_our_keys(tmp_path, alias, key, value, expected):
    text = value if not isinstance(value, bool) else str(value).lower()
    config = tmp_path / "c.yaml"
    config.write_text(f"rl:\n  {alias}: {text}\n")
    assert getattr(load_config(config).rl, key) == expected
    assert getattr(load_config(config.parent / "c.yaml", [f"rl.{alias}={text}"]).rl, key) == expected
    assert getattr(load_config(None, [f"rl.{alias}={text}"]).rl, key) == expected


def test_an_alias_beside_its_key_or_without_an_equivalent_is_an_error(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("rl:\n  num_generations: 4\n  samples_per_task: 8\n")
    with pytest.raises(ConfigError, match="name the same key"):
        load_config(config)
    with pytest.raises(ConfigError, match="rl.loss_type: 'dr_grpo' has no equivalent.*loss_normalization"):
        load_config(None, ["rl.loss_type=dr_grpo"])
    with pytest.raises(ConfigError):
        load_config(None, ["rl.num_generationz=4"])  # a typo is still a typo


def test_the_old_reward_keys_set_the_one_reward_table_with_a_warning(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text("verifier:\n  reward_tiny_correct: 0.45\nrl:\n  reward_weights:\n    compile: 0.25\n")
    table = load_config(config).verifier.reward_weights
    assert (table.tiny, table.compile, table.full) == (0.45, 0.25, 0.7)
    assert capsys.readouterr().err.splitlines() == [
        "config: rl.reward_weights is deprecated; set verifier.reward_weights instead",
        "config: verifier.reward_tiny_correct is deprecated; set verifier.reward_weights.tiny instead"]
    assert load_config(None, ["rl.reward_weights.full=0.8"]).verifier.reward_weights.full == 0.8
    config.write_text("verifier:\n  reward_compiled: 0.2\n  reward_weights:\n    compile: 0.3\n")
    with pytest.raises(ConfigError, match="name the same key"):
        load_config(config)
    with pytest.raises(ConfigError):
        load_config(None, ["verifier.reward_compiledd=0.2"])  # a typo is still a typo
    with pytest.raises(ConfigError):
        load_config(None, ["rl.reward_weights.fulll=0.2"])
