"""A finished stage is reused only when it was made with this run's settings and data.

Real train_integrated.py processes on a tiny random Qwen2: the first run records its resolved config
in meta.json, an identical re-run skips, a re-run with another learning rate or other data stops
with exit status 2 naming what differs, --force retrains, and the checkpoint's own config.yaml
resumes the old result. RL refuses to start without an SFT adapter unless rl.init is base.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from extensions.runtime import checkpoints
from extensions.config import load_config
from extensions.config.fingerprint import config_fingerprint, stage_fingerprint, stage_view
from extensions.runtime.paths import RunPaths
from extensions.runtime.freshness import StaleResultError, require_fresh, stage_freshness, stage_inputs
from extensions.models.tiny import save_tiny_model, tiny_sft_rows
from project_paths import PROJECT_ROOT



@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny_model"))


def write_run_config(path: Path, root: Path, model_dir: Path, extra: str = "") -> Path:
    path.write_text(f"""
run: {{root: "{root}", run_id: fresh-test}}
model: {{name_or_path: "{model_dir}", dtype: float32}}
lora: {{r: 4, alpha: 8}}
sft: {{learning_rate: 5e-3, max_steps: 2, save_every_steps: 1, eval_every_steps: 0, per_device_batch_size: 2,
       gradient_accumulation_steps: 1, max_seq_len: 2048, gradient_checkpointing: false}}
checkpoint: {{sync_interval_s: 60}}
{extra}
""")
    paths = RunPaths(root)
    paths.processed.mkdir(parents=True, exist_ok=True)
    for target, rows in ((paths.sft_train, tiny_sft_rows(6)), (paths.sft_val, tiny_sft_rows(2, 10))):
        target.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def train(config: Path, *extra: str) -> subprocess.CompletedProcess:
    command = [sys.executable, str(PROJECT_ROOT / "train_integrated.py"), "--config", str(config), "--no-progress",
               *extra]
    return subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=PROJECT_ROOT,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})


def test_finished_sft_is_reused_only_with_its_own_settings(tmp_path, model_dir):
    root = tmp_path / "run"
    config = write_run_config(tmp_path / "run.yaml", root, model_dir)
    paths = RunPaths(root)
    first = train(config, "--stage", "sft")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "train_integrated: config" in first.stderr and "fingerprint" in first.stderr  # announced at start

    final = paths.final("sft")
    meta = checkpoints.read_meta(final)
    cfg = load_config(config)
    assert meta["config"]["sft"]["learning_rate"] == 0.005  # `5e-3` is a number (YAML 1.2)
    assert meta["config_fingerprint"] == config_fingerprint(cfg)
    assert meta["stage_fingerprint"] == stage_fingerprint(cfg, "sft")
    assert meta["inputs"] == stage_inputs(paths, cfg, "sft") and meta["inputs"]["sft_train.jsonl"]
    assert load_config(final / "config.yaml").sft == cfg.sft  # the copy works as --config

    again = train(config, "--stage", "sft")
    assert again.returncode == 0 and "skipping the stage" in again.stdout, again.stdout + again.stderr

    # Keys that only say where results go or how often they sync do not count.
    harmless = train(config, "--stage", "sft", "--set", "checkpoint.sync_interval_s=5", "--set", "sft.log_every_steps=7")
    assert harmless.returncode == 0 and "skipping the stage" in harmless.stdout, harmless.stderr

    changed = train(config, "--stage", "sft", "--set", "sft.learning_rate=1e-3", "--set", "lora.r=8")
    assert changed.returncode == 2, changed.stdout + changed.stderr
    assert "sft.learning_rate: 0.005 -> 0.001" in changed.stderr and "lora.r: 4 -> 8" in changed.stderr
    assert "--force" in changed.stderr and f"--config {final / 'config.yaml'}" in changed.stderr
    assert "Traceback" not in changed.stderr and not (paths.logs / "sft_metrics.jsonl").read_text().count("\n") > 2

    # The old result with its own config: accepted as it is.
    kept = train(final / "config.yaml", "--stage", "sft")
    assert kept.returncode == 0 and "skipping the stage" in kept.stdout, kept.stderr

    # Other data under the same config is another result too.
    with open(paths.sft_train, "a") as handle:
        handle.write(json.dumps(tiny_sft_rows(1, 40)[0]) + "\n")
    new_data = train(config, "--stage", "sft")
    assert new_data.returncode == 2 and "input sft_train.jsonl: sha256:" in new_data.stderr, new_data.stderr

    forced = train(config, "--stage", "sft", "--force", "--set", "sft.learning_rate=1e-3")
    assert forced.returncode == 0, forced.stdout + forced.stderr
    assert checkpoints.read_meta(final)["config"]["sft"]["learning_rate"] == 0.001
    assert checkpoints.read_meta(final)["inputs"]["sft_train.jsonl"] == stage_inputs(paths, cfg, "sft")["sft_train.jsonl"]


def test_rl_needs_an_sft_adapter_unless_init_is_base(tmp_path, model_dir):
    config = write_run_config(tmp_path / "run.yaml", tmp_path / "run", model_dir)
    refused = train(config, "--stage", "rl")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "no complete SFT adapter" in refused.stderr and "rl.init: base" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert not RunPaths(tmp_path / "run").stage_dir("rl").exists()


def _checkpoint(paths: RunPaths, cfg, stage: str, directory: Path, weights: bytes) -> Path:
    directory.mkdir(parents=True)
    (directory / "adapter_model.safetensors").write_bytes(weights)
    checkpoints.write_meta(directory, stage=stage, config=cfg, base_model="m", data="d",
                           inputs=stage_inputs(paths, cfg, stage))
    checkpoints.finalize(directory)
    return directory


def _run(tmp_path, *overrides):
    cfg = load_config(PROJECT_ROOT / "configs" / "smoke.yaml", [f"run.root={tmp_path / 'run'}", *overrides])
    paths = RunPaths.from_config(cfg)
    paths.processed.mkdir(parents=True, exist_ok=True)
    paths.rl_tasks.write_text('{"task_id": "t"}\n')
    return cfg, paths


def test_rl_result_depends_on_its_sft_adapter_and_rewards(tmp_path):
    cfg, paths = _run(tmp_path)
    _checkpoint(paths, cfg, "sft", paths.final("sft"), b"sft weights")
    _checkpoint(paths, cfg, "rl", paths.final("rl"), b"rl weights")
    assert not stage_freshness(paths, cfg, "rl").stale

    # Retrained SFT adapter: the RL result was built on the old one.
    (paths.final("sft") / "adapter_model.safetensors").write_bytes(b"other sft")
    checkpoints.finalize(paths.final("sft"))
    changes = stage_freshness(paths, cfg, "rl").changes
    assert len(changes) == 1 and changes[0].startswith("input start_adapter: sha256:")

    cfg2, _ = _run(tmp_path, "verifier.reward_weights.compile=0.2", "rl.verify_chunk_size=7", "eval.max_new_tokens=9")
    (paths.final("sft") / "adapter_model.safetensors").write_bytes(b"sft weights")
    checkpoints.finalize(paths.final("sft"))
    with pytest.raises(StaleResultError) as raised:
        require_fresh(paths, cfg2, "rl")
    lines = str(raised.value).splitlines()
    assert lines[1:-1] == ["  verifier.reward_weights.compile: 0.3 -> 0.2"]  # speed and eval keys do not count


def test_unfinished_rl_continues_with_more_rounds_but_a_finished_one_does_not(tmp_path):
    cfg, paths = _run(tmp_path, "rl.num_rounds=2")
    _checkpoint(paths, cfg, "sft", paths.final("sft"), b"sft")
    _checkpoint(paths, cfg, "rl", paths.rl_round(2), b"round 2")
    more, _ = _run(tmp_path, "rl.num_rounds=5")
    assert not stage_freshness(paths, more, "rl").stale  # continue after round 2 up to round 5
    checkpoints.copy_checkpoint(paths.rl_round(2), paths.final("rl"))
    finished = stage_freshness(paths, more, "rl")
    assert finished.stale and finished.changes == ["rl.num_rounds: 2 -> 5"]
    assert "the finished result" in finished.message()


def test_checkpoint_without_a_recorded_config_is_not_trusted(tmp_path):
    cfg, paths = _run(tmp_path)
    directory = paths.final("sft")
    directory.mkdir(parents=True)
    checkpoints.write_meta(directory, stage="sft", config="configs/smoke.yaml", base_model="m", data="d")
    checkpoints.finalize(directory)
    freshness = stage_freshness(paths, cfg, "sft")
    assert freshness.stale and "not recorded" in freshness.changes[0]


def test_stage_views_leave_out_paths_and_sync_settings():
    cfg = load_config(PROJECT_ROOT / "configs" / "smoke.yaml")
    moved = load_config(PROJECT_ROOT / "configs" / "smoke.yaml",
                        ["run.root=/elsewhere", "run.run_id=other", "checkpoint.bucket=b", "model.device_map=auto",
                         "sft.save_every_steps=50", "rl.keep_last_rounds=9", "verifier.workers=3"])
    for stage in ("sft", "rl", "eval"):
        assert stage_view(moved, stage) == stage_view(cfg, stage)
    assert config_fingerprint(moved) != config_fingerprint(cfg)  # the full record still tells them apart
    assert "rl.learning_rate" not in stage_view(cfg, "sft") and "rl.learning_rate" in stage_view(cfg, "rl")
    assert "eval.temperature" in stage_view(cfg, "eval") and "eval.temperature" not in stage_view(cfg, "rl")


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_force_keeps_earlier_results_until_the_new_run_has_a_checkpoint(tmp_path, model_dir):
    """--force with a start that cannot work (a model path with a typo, RL without its tasks)
    leaves the earlier results byte-identical; a start that works moves them aside and removes
    them only once it has a complete checkpoint of its own."""
    root = tmp_path / "run"
    config = write_run_config(tmp_path / "run.yaml", root, model_dir)
    paths = RunPaths(root)
    assert train(config, "--stage", "sft").returncode == 0
    checkpoints_dir = paths.stage_dir("sft").parent
    before = _snapshot(checkpoints_dir)
    assert any(name.startswith("sft/final/") for name in before)

    typo = train(config, "--stage", "sft", "--force", "--set", f"model.name_or_path={model_dir}-typo")
    assert typo.returncode != 0
    assert _snapshot(checkpoints_dir) == before
    hub_typo = train(config, "--stage", "sft", "--force", "--set", "model.name_or_path=Qwen/Qwen2.5-Coder-0.5B-Instruc")
    assert hub_typo.returncode == 2 and "Traceback" not in hub_typo.stderr, hub_typo.stderr[-2000:]
    assert _snapshot(checkpoints_dir) == before

    # RL's earlier rounds: a forced start without its tasks file touches none of them.
    fake_round = paths.rl_round(1)
    fake_round.mkdir(parents=True)
    (fake_round / "adapter_model.safetensors").write_bytes(b"earlier round")
    before = _snapshot(checkpoints_dir)
    no_tasks = train(config, "--stage", "rl", "--force", "--set", "rl.init=base")
    assert no_tasks.returncode != 0 and "rl_tasks" in (no_tasks.stdout + no_tasks.stderr)
    assert _snapshot(checkpoints_dir) == before

    forced = train(config, "--stage", "sft", "--force", "--set", "sft.learning_rate=1e-3")
    assert forced.returncode == 0, forced.stdout + forced.stderr
    assert "moved to" in forced.stdout and "removed" in forced.stdout
    summary = [line for line in forced.stdout.splitlines() if line.startswith("[sft] done:")]
    assert len(summary) == 1 and "2 steps" in summary[0] and "last train loss" in summary[0] and "tokens/s" in summary[0]
    assert checkpoints.read_meta(paths.final("sft"))["config"]["sft"]["learning_rate"] == 0.001
    assert not [p for p in checkpoints_dir.iterdir() if ".replaced-" in p.name]
