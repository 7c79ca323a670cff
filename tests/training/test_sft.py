"""SFT: completion-only loss, packing correctness, the training loop, checkpoints and exact resume."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from extensions.runtime import checkpoints
from extensions.config import load_config
from extensions.runtime.interrupt import SaveSignal
from extensions.models.loading import prepare_tokenizer
from extensions.runtime.paths import RunPaths
from extensions.training.batching import (
    IGNORE_INDEX, batch_target_tokens, collate, plan_epoch, tokenize_example, tokenize_examples,
)
from extensions.models.tiny import build_tiny_qwen2, build_tiny_tokenizer, save_tiny_model, tiny_sft_rows
from extensions.training.trainer import forward_loss_sum, warmup_cosine
from project_paths import PROJECT_ROOT



@pytest.fixture(scope="module")
def tokenizer():
    tok = build_tiny_tokenizer()
    prepare_tokenizer(tok)
    return tok


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny_model"))


def _short_rows(count: int, start: int = 0) -> list[dict]:
    """Small examples (a few dozen tokens) so packing puts several in a row."""
    return [{"prompt": [{"role": "user", "content": f"relu {i}"}], "completion": f"out = x * {i}" + " y" * (i % 5)}
            for i in range(start, start + count)]


def _write_run(root: Path, model_dir: Path, *, train_rows, val_rows, overrides=()):
    overrides = [
        f"run.root={root}", f"model.name_or_path={model_dir}", "model.gguf_file=null", "model.dtype=float32",
        "sft.max_steps=8", "sft.save_every_steps=2", "sft.eval_every_steps=4", "sft.keep_last_checkpoints=2",
        "sft.per_device_batch_size=2", "sft.gradient_accumulation_steps=2", "sft.max_seq_len=64",
        "sft.learning_rate=0.005", "sft.warmup_ratio=0.2", "sft.log_every_steps=1", "lora.r=4", "lora.alpha=8",
        *overrides,
    ]
    cfg = load_config(PROJECT_ROOT / "configs" / "smoke.yaml", overrides)
    paths = RunPaths.from_config(cfg)
    paths.processed.mkdir(parents=True, exist_ok=True)
    for path, rows in ((paths.sft_train, train_rows), (paths.sft_val, val_rows)):
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    config_file = root / "config.yaml"
    return cfg, paths, overrides, config_file


def _adapter_tensors(directory: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(directory / "adapter_model.safetensors"))


# -- tokenization and batching ---------------------------------------------------------------------------
def test_prompt_tokens_are_masked_and_completion_kept(tokenizer):
    row = tiny_sft_rows(1)[0]
    example = tokenize_example(tokenizer, row["prompt"], row["completion"])
    first_target = next(i for i, label in enumerate(example.labels) if label != IGNORE_INDEX)
    assert all(label == IGNORE_INDEX for label in example.labels[:first_target])
    assert example.labels[first_target:] == example.input_ids[first_target:]
    prompt_text = tokenizer.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
    assert tokenizer.decode(example.input_ids[:first_target]) == prompt_text
    target_text = tokenizer.decode(example.input_ids[first_target:])
    assert target_text.startswith(row["completion"]) and "<|im_end|>" in target_text


def test_too_long_and_empty_examples_are_counted(tokenizer):
    pairs = [(r["prompt"], r["completion"]) for r in _short_rows(3)]
    pairs.append(([{"role": "user", "content": "x"}], "  "))
    pairs.append(([{"role": "user", "content": "y " * 400}], "z"))
    examples, report = tokenize_examples(tokenizer, pairs, max_seq_len=128)
    assert len(examples) == 3 and report.kept == 3
    assert sum(report.dropped.values()) == 2
    assert "longer than max_seq_len=128" in report.summary("x") and "empty completion" in report.summary("x")


@pytest.mark.parametrize("mode", ["packed", "length_grouped", "padded"])
def test_epoch_plan_covers_every_example_once(mode):
    lengths = [5, 40, 17, 33, 8, 60, 21, 12, 3, 50]
    batches = plan_epoch(lengths, mode=mode, batch_size=2, max_seq_len=64, seed=7, epoch=0)
    flat = [i for batch in batches for row in batch for i in row]
    assert sorted(flat) == list(range(len(lengths)))
    assert all(len(batch) <= 2 for batch in batches)
    if mode == "packed":
        assert all(sum(lengths[i] for i in row) <= 64 for batch in batches for row in batch)
        assert len(flat) > sum(len(batch) for batch in batches)  # several examples share rows
    assert batches == plan_epoch(lengths, mode=mode, batch_size=2, max_seq_len=64, seed=7, epoch=0)
    later = [plan_epoch(lengths, mode=mode, batch_size=2, max_seq_len=64, seed=7, epoch=e) for e in (1, 2, 3)]
    assert any(plan != batches for plan in later)  # each epoch reshuffles


def test_packed_loss_equals_examples_run_one_by_one(tokenizer):
    """Position-id resets keep packed examples independent: same summed loss as unpacked."""
    model = build_tiny_qwen2(len(tokenizer), eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    model.eval()
    examples, _ = tokenize_examples(tokenizer, [(r["prompt"], r["completion"]) for r in _short_rows(5)], 512)
    packed_batch = [[0, 1, 2], [3, 4]]
    tensors = collate(packed_batch, examples, pad_token_id=tokenizer.pad_token_id, packed=True)
    assert "attention_mask" not in tensors
    with torch.no_grad():
        packed_loss = float(forward_loss_sum(model, tensors))
        single = sum(float(forward_loss_sum(model, collate([[i]], examples, pad_token_id=tokenizer.pad_token_id, packed=False)))
                     for i in range(5))
        padded = collate([[i] for i in range(5)], examples, pad_token_id=tokenizer.pad_token_id, packed=False)
        padded_loss = float(forward_loss_sum(model, padded))
    assert packed_loss == pytest.approx(single, rel=1e-5)
    assert padded_loss == pytest.approx(single, rel=1e-5)
    # A wrong packing (no position reset => attention across examples) must change the loss.
    leaky = dict(tensors)
    leaky["position_ids"] = torch.arange(tensors["input_ids"].shape[1]).expand_as(tensors["input_ids"])
    with torch.no_grad():
        leaky_loss = float(forward_loss_sum(model, leaky))
    assert abs(leaky_loss - single) > 1e-3
    assert batch_target_tokens(packed_batch, examples) == int((tensors["labels"][:, 1:] != IGNORE_INDEX).sum())


def test_warmup_cosine_schedule():
    assert warmup_cosine(0, 100, 10) == pytest.approx(0.1)
    assert warmup_cosine(9, 100, 10) == pytest.approx(1.0)
    assert warmup_cosine(10, 100, 10) == pytest.approx(1.0)
    assert warmup_cosine(55, 100, 10) == pytest.approx(0.5)
    assert warmup_cosine(100, 100, 10) == pytest.approx(0.0)


# -- the training loop -----------------------------------------------------------------------------------
def test_sft_trains_lora_only_checkpoints_and_skips_when_done(tmp_path, model_dir):
    from extensions.training.sft import run_sft

    cfg, paths, _, _ = _write_run(tmp_path, model_dir, train_rows=_short_rows(16), val_rows=_short_rows(4, 50),
                                  overrides=["sft.gradient_checkpointing=true"])
    outcome = run_sft(cfg, progress=False)
    assert outcome.status == "finished"
    final = paths.final("sft")
    assert checkpoints.is_complete(final, verify_hashes=True)
    meta = checkpoints.read_meta(final)
    assert meta["stage"] == "sft" and meta["base_model"] == str(model_dir) and meta["step"] == 8
    assert meta["data"]["train_examples"] == 16 and meta["data"]["train"]["sha256"]
    assert (final / "tokenizer.json").is_file() or (final / "tokenizer_config.json").is_file()
    # retention: every 2 steps up to 6, the newest 2 kept
    kept = [p.name for p in checkpoints.complete_checkpoints(paths.stage_dir("sft"))]
    assert kept == ["checkpoint-4", "checkpoint-6"]
    records = [json.loads(line) for line in paths.metrics_log("sft").read_text().splitlines()]
    losses = [r["loss"] for r in records if r["kind"] == "step"]
    assert len(losses) == 8 and losses[-1] < losses[0]
    assert {"lr", "tokens_per_s", "grad_norm"} <= set(records[0])
    assert any(r["kind"] == "eval" for r in records)
    assert any(paths.tensorboard("sft").iterdir())
    # LoRA changed (B starts at zero), base weights did not
    tensors = _adapter_tensors(final)
    assert tensors and all(".lora_" in name for name in tensors)
    assert any(float(t.abs().max()) > 0 for name, t in tensors.items() if "lora_B" in name)
    from extensions.models.loading import load_adapter, load_base_model

    base = load_base_model(cfg.model, device="cpu")
    base_before = {k: v.clone() for k, v in base.state_dict().items()}
    trained = load_adapter(base, final, trainable=False)
    for name, value in trained.get_base_model().state_dict().items():
        if "lora_" not in name:
            key = name.replace(".base_layer", "")
            assert torch.equal(value, base_before[key]), name
    # a finished stage is skipped
    assert run_sft(cfg, progress=False).status == "skipped"


def test_validation_has_its_own_bar_and_the_stage_ends_with_a_summary(tmp_path, model_dir, capsys):
    from extensions.training.sft import run_sft

    cfg, _, _, _ = _write_run(tmp_path, model_dir, train_rows=_short_rows(8), val_rows=_short_rows(4, 50),
                              overrides=["sft.max_steps=2", "sft.eval_every_steps=0", "sft.save_every_steps=0"])
    assert run_sft(cfg, progress=True).status == "finished"
    captured = capsys.readouterr()
    assert "validation" in captured.err and "batch" in captured.err
    summary = [line for line in captured.out.splitlines() if line.startswith("[sft] done: 2 steps")]
    assert len(summary) == 1 and "eval loss" in summary[0] and "tokens/s" in summary[0]


RESUME_ROWS, RESUME_VAL = _short_rows(16), _short_rows(4, 50)
RESUME_SETTINGS = ["sft.max_steps=10", "sft.save_every_steps=3", "sft.eval_every_steps=4", "sft.keep_last_checkpoints=2"]


@pytest.fixture(scope="module")
def uninterrupted_adapter(tmp_path_factory, model_dir):
    """The final adapter of a run that was never interrupted."""
    from extensions.training.sft import run_sft

    cfg, paths, _, _ = _write_run(tmp_path_factory.mktemp("uninterrupted"), model_dir, train_rows=RESUME_ROWS,
                                  val_rows=RESUME_VAL, overrides=RESUME_SETTINGS)
    assert run_sft(cfg, progress=False).status == "finished"
    return _adapter_tensors(paths.final("sft"))


def _assert_same_adapter(got: dict, expected: dict) -> None:
    assert got.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=1e-6)


def test_save_signal_stops_with_a_checkpoint_and_resume_matches(tmp_path, model_dir, uninterrupted_adapter):
    from extensions.training.sft import run_sft

    cfg, paths, _, _ = _write_run(tmp_path, model_dir, train_rows=RESUME_ROWS, val_rows=RESUME_VAL,
                                  overrides=RESUME_SETTINGS)
    save_signal = SaveSignal.for_run(paths)

    class StopAfterFirstCheckpoint:
        """Asks for save-and-stop once checkpoint-3 exists, as a spot watcher would."""

        def save_requested(self):
            if checkpoints.is_complete(paths.sft_checkpoint(3)) and not save_signal.save_requested():
                save_signal.request("test", stop=True)
            return save_signal.save_requested()

        def __getattr__(self, name):
            return getattr(save_signal, name)

    outcome = run_sft(cfg, save_signal=StopAfterFirstCheckpoint(), progress=False)
    assert outcome.status == "stopped" and outcome.directory == str(paths.sft_checkpoint(3))
    assert not checkpoints.is_complete(paths.final("sft"))
    assert (paths.logs / "save_done.json").is_file()
    assert run_sft(cfg, progress=False).status == "finished"
    _assert_same_adapter(_adapter_tensors(paths.final("sft")), uninterrupted_adapter)


def test_sigkill_after_first_checkpoint_then_resume_gives_the_same_adapter(tmp_path, model_dir, uninterrupted_adapter):
    """A real process killed with SIGKILL right after its first complete checkpoint."""
    from extensions.training.sft import run_sft

    cfg, paths, overrides, _ = _write_run(tmp_path, model_dir, train_rows=RESUME_ROWS, val_rows=RESUME_VAL,
                                          overrides=RESUME_SETTINGS)
    command = [sys.executable, "-u", str(PROJECT_ROOT / "train_integrated.py"), "--smoke", "--stage", "sft", "--no-progress"]
    for assignment in overrides:
        command += ["--set", assignment]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"}, cwd=PROJECT_ROOT)
    output = []
    try:
        for line in proc.stdout:
            output.append(line)
            if "saved complete checkpoint" in line:
                proc.send_signal(signal.SIGKILL)
                break
    finally:
        proc.kill()
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "".join(output[-20:])
    assert checkpoints.newest_complete(paths.stage_dir("sft")) is not None
    assert not checkpoints.is_complete(paths.final("sft"))

    assert run_sft(cfg, progress=False).status == "finished"
    _assert_same_adapter(_adapter_tensors(paths.final("sft")), uninterrupted_adapter)
    assert json.loads((paths.final("sft") / "trainer_state.json").read_text())["step"] == 10
