"""The model card of a trained adapter: the base model by its hub id for every form model.name_or_path
takes (hub id, fetch:, local directory, pkg:), never a local path; the run's data counts, verifier
digest, training stage and evaluation table. A fake run directory, no model, no network."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from extensions.runtime import checkpoints
from extensions.data.pair_verification import verifier_digest
from extensions.export.model_card import CARD, base_model_for, build_model_card, write_model_card
from extensions.runtime.paths import RunPaths
from project_paths import PROJECT_ROOT

PREPARE_REPORT = {
    "fingerprint": {"verifier": "f" * 64},
    "sources": {"kernelbook": {"source": "GPUMODE/KernelBook", "read": 1200, "kept": 950, "dropped": {"x": 250}},
                "kernelbench": {"source": "ScalingIntelligence/KernelBench", "read": 250, "kept": 250, "dropped": {}}},
    "outputs": {"sft_train": 700, "sft_val": 37, "rl_tasks": 180, "eval_tasks": 250, "difficulty_labels": 917},
    "verification": {"pairs": 950, "passed": 917, "failed": 33, "cached": 0, "devices": ["cuda"]},
}


def _front_matter(card: str) -> dict:
    assert card.startswith("---\n")
    return yaml.safe_load(card.split("---\n", 2)[1])


def _fake_adapter(run: Path, base_model: str, *, stage: str = "rl") -> Path:
    """A final adapter directory as training leaves it, with PEFT's template card."""
    directory = RunPaths(run).final(stage)
    directory.mkdir(parents=True)
    (directory / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "/home/me/cache/base"}))
    (directory / "adapter_model.safetensors").write_bytes(b"weights of " + stage.encode())
    (directory / CARD).write_text("---\nbase_model: /home/me/cache/base\n---\n# Model Card for Model ID\n")
    config = {"rl": {"init": "sft", "algorithm": "grpo", "reward_preset": "correctness", "num_rounds": 3}}
    extra = ({"round_index": 3, "algorithm": "grpo", "reward_preset": "correctness",
              "round_summary": {"correct": 5, "judged": 64}} if stage == "rl"
             else {"step": 120, "final_eval_loss": 0.4321})
    checkpoints.write_meta(directory, stage=stage, config="test", base_model=base_model,
                           data={"train_examples": 700}, lora={"r": 16, "alpha": 32, "dropout": 0.05,
                                                               "target_modules": ["q_proj", "v_proj"]}, **extra)
    meta = json.loads((directory / "meta.json").read_text())
    meta["config"] = config  # what a resolved config holds of the keys the card reads
    (directory / "meta.json").write_text(json.dumps(meta))
    return directory


def _fake_run(tmp_path: Path, base_model: str) -> tuple[Path, Path]:
    run = tmp_path / "run"
    paths = RunPaths(run)
    paths.processed.mkdir(parents=True)
    paths.prepare_report.write_text(json.dumps(PREPARE_REPORT))
    sft = _fake_adapter(run, base_model, stage="sft")
    checkpoints.finalize(sft)
    adapter = _fake_adapter(run, base_model)
    paths.outputs.mkdir(parents=True)
    paths.compare_json.write_text(json.dumps({
        "inputs": {"models": {"base": {"model": base_model}, "sft": checkpoints.adapter_content_hash(sft),
                              "rl": checkpoints.adapter_content_hash(adapter)}},
        "model_order": ["base", "sft", "rl"], "paired_tasks": 250,
        "models": {name: {"correct_rate": rate, "compiled_rate": rate + 20, "geomean_speedup": speed, "fast_1": None,
                          "timing": True, "num_tasks": 250}
                   for name, rate, speed in (("base", 4.0, None), ("sft", 12.5, 1.07), ("rl", 20.0, 1.31))},
    }))
    return run, adapter


def _local_model_dir(parent: Path, name: str, recorded: str | None) -> Path:
    directory = parent / name
    directory.mkdir(parents=True)
    config = {"model_type": "qwen2"} if recorded is None else {"model_type": "qwen2", "_name_or_path": recorded}
    (directory / "config.json").write_text(json.dumps(config))
    return directory


@pytest.fixture
def base_forms(tmp_path, monkeypatch):
    """name_or_path of each form -> (hub id the card must name or None, the name it must show)."""
    recorded = _local_model_dir(tmp_path / "models", "qwen-7b-copy", "Qwen/Qwen2.5-Coder-7B-Instruct")
    anonymous = _local_model_dir(tmp_path / "models", "my-base", None)
    snapshot = _local_model_dir(tmp_path / "hf" / "models--Qwen--Qwen2.5-Coder-1.5B-Instruct" / "snapshots",
                                "0123abcd", None)
    package = tmp_path / "site" / "kernel_rl_fake_model"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "config.json").write_text(json.dumps({"_name_or_path": "HuggingFaceTB/SmolLM2-135M-Instruct"}))
    monkeypatch.syspath_prepend(str(package.parent))
    return {
        "Qwen/Qwen2.5-Coder-7B-Instruct": ("Qwen/Qwen2.5-Coder-7B-Instruct", "Qwen/Qwen2.5-Coder-7B-Instruct"),
        "fetch:qwen2.5-coder-0.5b": ("Qwen/Qwen2.5-Coder-0.5B-Instruct", "Qwen/Qwen2.5-Coder-0.5B-Instruct"),
        str(recorded): ("Qwen/Qwen2.5-Coder-7B-Instruct", "Qwen/Qwen2.5-Coder-7B-Instruct"),
        str(snapshot): ("Qwen/Qwen2.5-Coder-1.5B-Instruct", "Qwen/Qwen2.5-Coder-1.5B-Instruct"),
        str(anonymous): (None, "my-base"),
        "pkg:kernel_rl_fake_model": ("HuggingFaceTB/SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"),
    }


def test_every_base_model_form_is_named_by_hub_id_never_by_path(base_forms, tmp_path):
    for name_or_path, (hub_id, shown) in base_forms.items():
        base = base_model_for(name_or_path)
        assert (base.hub_id, base.name) == (hub_id, shown), name_or_path
        run, adapter = _fake_run(tmp_path / f"case{len(list(tmp_path.iterdir()))}", name_or_path)
        card = build_model_card(adapter, paths=RunPaths.of_checkpoint(adapter), repo_id="alice/qwen-triton")
        header = _front_matter(card)
        assert str(tmp_path) not in card and "/home/me" not in card, name_or_path
        assert header["library_name"] == "peft" and header["pipeline_tag"] == "text-generation"
        assert {"lora", "triton", "kernel-generation", "sft", "reinforcement-learning"} <= set(header["tags"])
        if hub_id is None:
            assert "base_model" not in header and f"`{shown}`" in card and "not a model on the hub" in card
            assert 'from_pretrained("path/to/my-base"' in card
        else:
            assert header["base_model"] == hub_id and f"base_model:adapter:{hub_id}" in header["tags"]
            assert f'AutoModelForCausalLM.from_pretrained("{hub_id}", dtype="auto")' in card
        assert 'PeftModel.from_pretrained(base, "alice/qwen-triton")' in card
    # The licence is known for the catalogue's models only; unknown, it is left out.
    assert _front_matter(build_model_card(
        _fake_run(tmp_path / "licensed", "fetch:qwen2.5-coder-0.5b")[1], paths=None))["license"] == "apache-2.0"
    assert "license" not in _front_matter(build_model_card(
        _fake_run(tmp_path / "unlicensed", "Qwen/Qwen2.5-Coder-7B-Instruct")[1], paths=None))


def test_card_holds_data_verifier_training_and_evaluation(tmp_path):
    run, adapter = _fake_run(tmp_path, "fetch:qwen2.5-coder-0.5b")
    card = build_model_card(adapter, paths=RunPaths.of_checkpoint(adapter))
    assert "dequantized on load" in card and "`python -m extensions.models fetch qwen2.5-coder-0.5b`" in card
    # data, from prepare_report.json
    assert "| kernelbook (GPUMODE/KernelBook) | 1200 | 950 |" in card
    assert "| kernelbench (ScalingIntelligence/KernelBench) | 250 | 250 |" in card
    assert "700 SFT training pairs, 37 SFT validation pairs, 180 RL tasks, 250 evaluation tasks" in card
    assert "Verified: 917 of 950 kept pairs passed the verifier (cuda)" in card
    # the verifier's code digest (the data stage's own helper) and the one the pairs were verified with
    assert f"`{verifier_digest()[:16]}`" in card and f"`{'f' * 16}`" in card
    # the stage, from meta.json (RL after SFT, whose steps come from sft/final)
    assert "3 rounds of `grpo` (reward preset `correctness`), starting from the SFT adapter (120 SFT steps)" in card
    assert "5 of 64 sampled kernels correct" in card and "r=16, alpha=32" in card
    # evaluation, from compare.json, this adapter's row marked
    assert "| model | correct % | compiled % | fast_1 % | geomean speedup |" in card
    assert "| rl (this model) | 20.0 | 40.0 | n/a | 1.31x |" in card and "| base | 4.0 | 24.0 | n/a | n/a |" in card

    sft_card = build_model_card(RunPaths(run).final("sft"), paths=RunPaths(run))
    assert "supervised fine-tuning (SFT), 120 optimizer steps on 700 pairs; final validation loss 0.4321" in sft_card
    assert "reinforcement-learning" not in _front_matter(sft_card)["tags"]
    assert "| sft (this model) | 12.5 |" in sft_card


def test_missing_or_foreign_run_records_are_said_not_guessed(tmp_path):
    run, adapter = _fake_run(tmp_path, "Qwen/Qwen2.5-Coder-7B-Instruct")
    paths = RunPaths(run)
    paths.prepare_report.unlink()
    comparison = json.loads(paths.compare_json.read_text())
    comparison["inputs"]["models"]["rl"] = "0" * 64  # evaluated an earlier rl/final
    paths.compare_json.write_text(json.dumps(comparison))
    card = build_model_card(adapter, paths=paths)
    assert "`data/processed/prepare_report.json` was not found, so the data counts are not available" in card
    assert "evaluated other adapters than this one" in card and "| rl" not in card
    paths.compare_json.unlink()
    assert "No evaluation yet" in build_model_card(adapter, paths=paths)
    assert "does not lie in a run directory" in build_model_card(adapter, paths=None)


def test_written_card_replaces_peft_template_before_the_manifest(tmp_path):
    run, adapter = _fake_run(tmp_path, "fetch:qwen2.5-coder-0.5b")
    write_model_card(adapter, paths=RunPaths(run), repo_id="alice/qwen-triton")
    checkpoints.finalize(adapter)
    assert checkpoints.is_complete(adapter, verify_hashes=True)
    text = (adapter / CARD).read_text()
    assert "Model Card for Model ID" not in text
    assert _front_matter(text)["base_model"] == "Qwen/Qwen2.5-Coder-0.5B-Instruct"
    assert json.loads((adapter / checkpoints.MANIFEST).read_text())["files"][CARD]["size"] == len(text.encode())


def test_card_module_imports_nothing_heavy():
    import subprocess

    code = ("import sys, extensions.export.model_card, extensions.export.hub; "
            "print(sorted(m for m in ('torch', 'transformers', 'peft', 'huggingface_hub') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            cwd=PROJECT_ROOT)
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stderr
