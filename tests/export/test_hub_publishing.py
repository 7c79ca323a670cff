"""Training's final adapters carry their model card inside a complete checkpoint, and with
checkpoint.push_to_hub the RL stage's final adapter is pushed: to a hub stand-in on 127.0.0.1
(tests/hub_testing.py), with every other address refused. A tiny random Qwen2, 2 SFT steps and one
RL round with the synthetic reward."""
from __future__ import annotations

import fnmatch
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from extensions.runtime import checkpoints
from extensions.config import config_yaml
from extensions.export.hub import TRAINING_STATE_PATTERNS
from extensions.export.model_card import CARD
from extensions.runtime.paths import RunPaths
from extensions.models.tiny import save_tiny_model

from hub_testing import FakeHub, folder_files, hub_env, loopback_only_env
from rl_synthetic import judge_nothing, synthetic_config, vowel_reward
from project_paths import PROJECT_ROOT

REPO = "alice/tiny-triton"


# The synthetic RL settings (rl_synthetic.synthetic_config), starting from a 2-step SFT adapter.
RUN_SETTINGS = ["rl.init=sft", "rl.num_rounds=1", "sft.max_steps=2", "sft.save_every_steps=0", "sft.eval_every_steps=0",
                "sft.per_device_batch_size=2", "sft.gradient_accumulation_steps=1", "sft.gradient_checkpointing=false",
                "logging.report_to=[]"]


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """A run whose SFT and RL stages finished, with a prepare report."""
    from extensions.training.rl import run_rl
    from extensions.training.sft import run_sft

    root = tmp_path_factory.mktemp("run")
    model_dir = save_tiny_model(tmp_path_factory.mktemp("tiny_model"))
    cfg = synthetic_config(root, model_dir, RUN_SETTINGS)
    paths = RunPaths.from_config(cfg)
    rows = [{"prompt": [{"role": "user", "content": f"relu {i}"}], "completion": f"out = x * {i}"} for i in range(8)]
    for path in (paths.sft_train, paths.sft_val):
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    paths.prepare_report.write_text(json.dumps({
        "sources": {"kernelbook": {"source": "bundled", "read": 9, "kept": 8, "dropped": {"too_long": 1}}},
        "outputs": {"sft_train": 8, "sft_val": 8, "rl_tasks": 4, "eval_tasks": 0},
        "verification": {"pairs": 8, "passed": 8, "failed": 0, "devices": ["cpu"]}}))
    assert run_sft(cfg, progress=False).status == "finished"
    assert run_rl(cfg, progress=False, verify_fn=judge_nothing, score_fn=vowel_reward).status == "finished"
    return {"cfg": cfg, "paths": paths, "model_dir": model_dir}


def _card_header(directory: Path) -> dict:
    text = (directory / CARD).read_text()
    assert text.startswith("---\n")
    return yaml.safe_load(text.split("---\n", 2)[1])


def test_final_adapters_carry_the_card_and_stay_complete(trained_run):
    paths = trained_run["paths"]
    for stage, words in (("sft", "supervised fine-tuning (SFT), 2 optimizer steps on 8 pairs"),
                         ("rl", "1 rounds of `best_of_n`")):
        final = paths.final(stage)
        assert checkpoints.is_complete(final, verify_hashes=True), stage
        assert CARD in json.loads((final / checkpoints.MANIFEST).read_text())["files"]
        text = (final / CARD).read_text()
        assert "Model Card for Model ID" not in text and words in text, stage
        header = _card_header(final)
        # The tiny base is a local directory that records no hub id: named, said to be local, no path.
        assert "base_model" not in header and header["library_name"] == "peft"
        assert str(trained_run["model_dir"]) not in text and str(paths.root) not in text
        assert "| kernelbook (bundled) | 9 | 8 |" in text and "No evaluation yet" in text
    # The round checkpoints keep PEFT's template: only what leaves the run gets a card.
    round_dir = checkpoints.newest_complete(paths.stage_dir("rl"))
    assert "Model Card for Model ID" in (round_dir / CARD).read_text()


def _train(trained_run, tmp_path, hub: FakeHub) -> subprocess.CompletedProcess:
    """train_integrated.py --stage rl on the finished run, with its own resolved config: the stage is
    skipped as finished, then its adapter pushed."""
    config = tmp_path / "run.yaml"
    config.write_text(config_yaml(trained_run["cfg"]))
    env = loopback_only_env(tmp_path / "guard", hub_env(hub, {**os.environ, "HF_HOME": str(tmp_path / "hf_home")}))
    command = [sys.executable, str(PROJECT_ROOT / "train_integrated.py"), "--config", str(config), "--stage", "rl",
               "--no-progress", "--set", "checkpoint.push_to_hub=true", "--set", f"checkpoint.hub_model_id={REPO}"]
    return subprocess.run(command, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=600, env=env)


def test_finished_rl_adapter_is_pushed_with_its_card(trained_run, tmp_path):
    paths = trained_run["paths"]
    final = paths.final("rl")
    weights = checkpoints.adapter_content_hash(final)
    # An evaluation written after training: the pushed card is brought up to date with it.
    paths.outputs.mkdir(parents=True, exist_ok=True)
    paths.compare_json.write_text(json.dumps({
        "inputs": {"models": {"rl": weights}}, "model_order": ["rl"], "paired_tasks": 4,
        "models": {"rl": {"correct_rate": 25.0, "compiled_rate": 50.0, "timing": False}}}))
    with FakeHub() as hub:
        result = _train(trained_run, tmp_path, hub)
    paths.compare_json.unlink()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "skipping the stage" in result.stdout and f"[rl] pushed {final} to {REPO}" in result.stdout
    assert hub.repos == [{"name": "tiny-triton", "organization": "alice", "visibility": "private", "type": "model"}]
    # What loads the model, byte for byte (adapter, tokenizer, card); no optimizer, RNG or run records.
    published = {name: data for name, data in folder_files(final).items()
                 if not any(fnmatch.fnmatch(name, pattern) for pattern in TRAINING_STATE_PATTERNS)}
    assert hub.files[REPO] == published and "adapter_model.safetensors" in published
    assert not {"optimizer.pt", "meta.json", "config.yaml", "manifest.json"} & set(hub.files[REPO])
    assert hub.tokens == {"hf_test_token"} and [c["revision"] for c in hub.commits] == ["main"]
    assert hub.validated == [(final / CARD).read_text()] and not hub.unexpected
    card = hub.files[REPO][CARD].decode()
    assert f'PeftModel.from_pretrained(base, "{REPO}")' in card and "| rl (this model) | 25.0 | 50.0 |" in card
    assert checkpoints.is_complete(final, verify_hashes=True) and checkpoints.adapter_content_hash(final) == weights


def test_refused_push_keeps_the_adapter_and_says_where_it_is(trained_run, tmp_path):
    final = trained_run["paths"].final("rl")
    weights = checkpoints.adapter_content_hash(final)
    with FakeHub(refuse=401) as hub:
        result = _train(trained_run, tmp_path, hub)
    assert result.returncode == 0, result.stdout + result.stderr
    warnings = [line for line in result.stdout.splitlines() if "push to hub failed" in line]
    assert len(warnings) == 1 and "Traceback" not in result.stdout + result.stderr
    assert warnings[0].startswith("[rl] warning: push to hub failed: HTTP 401 from ")
    assert f"the trained adapter is at {final}" in warnings[0] and "--stage rl" in warnings[0]
    assert checkpoints.is_complete(final, verify_hashes=True) and checkpoints.adapter_content_hash(final) == weights
    assert not hub.files
