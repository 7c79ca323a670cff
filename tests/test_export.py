"""Adapter export: a LoRA checkpoint merged into its base and saved as a plain model directory that
loads without peft and computes what base + adapter computed. Tiny random Qwen2, real files."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest
import torch

from extensions import checkpoints
from extensions.config import ModelConfig, load_config
from extensions.export import detach_gguf_quantizer
from extensions.modeling import attach_lora, model_meta
from extensions.training.tiny import save_tiny_model

from s3_testing import PROJECT_ROOT


@pytest.fixture(scope="module")
def trained_adapter(tmp_path_factory):
    """A complete sft checkpoint whose LoRA weights are non-zero (a fresh adapter merges to a no-op)."""
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("export")
    base_dir = save_tiny_model(root / "base")
    model_cfg = ModelConfig(name_or_path=str(base_dir), dtype="float32")
    cfg = load_config(PROJECT_ROOT / "configs" / "smoke.yaml")
    model = attach_lora(AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32), cfg.lora)
    torch.manual_seed(1)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.2)
    adapter_dir = root / "checkpoints" / "sft" / "final"
    model.save_pretrained(adapter_dir)
    checkpoints.write_meta(adapter_dir, stage="sft", config="test", base_model=str(base_dir), data={"train": "x"},
                           step=6, model=model_meta(model_cfg), lora=dataclasses.asdict(cfg.lora))
    checkpoints.finalize(adapter_dir)
    model.eval()
    return {"root": root, "base": base_dir, "adapter": adapter_dir, "peft_model": model}


def export(adapter, out, *extra) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "extensions.export", "--adapter", str(adapter), "--out", str(out), "--smoke", *extra]
    return subprocess.run(command, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(PROJECT_ROOT)})


def test_merged_model_loads_without_peft_and_matches_base_plus_adapter(trained_adapter, tmp_path):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "merged"
    result = export(trained_adapter["adapter"], out, "--dtype", "float32")
    assert result.returncode == 0, result.stderr
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "meta.json", "manifest.json"} <= names
    assert "adapter_config.json" not in names and not any(n.startswith(".") for n in names)
    assert checkpoints.is_complete(out, verify_hashes=True)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["stage"] == "export" and meta["adapter_stage"] == "sft" and meta["adapter_step"] == 6
    assert meta["base_model"] == str(trained_adapter["base"])

    merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    base = AutoModelForCausalLM.from_pretrained(trained_adapter["base"], dtype=torch.float32).eval()
    tokens = torch.tensor([[5, 17, 42, 99, 3, 250, 7]])
    with torch.no_grad():
        expected = trained_adapter["peft_model"](input_ids=tokens).logits
        got = merged(input_ids=tokens).logits
        untouched = base(input_ids=tokens).logits
    assert torch.allclose(got, expected, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(got, untouched, atol=1e-3)  # the adapter really was folded in


def test_incomplete_adapter_and_occupied_output_are_refused_in_one_line(trained_adapter, tmp_path):
    incomplete = tmp_path / "checkpoint-4"
    incomplete.mkdir()
    for path in trained_adapter["adapter"].iterdir():
        if path.name != checkpoints.MANIFEST:
            (incomplete / path.name).write_bytes(path.read_bytes())
    result = export(incomplete, tmp_path / "out")
    assert result.returncode == 2 and "incomplete checkpoint" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "out").exists()

    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "keep.txt").write_text("mine")
    result = export(trained_adapter["adapter"], occupied)
    assert result.returncode == 2 and "--force" in result.stderr
    assert (occupied / "keep.txt").read_text() == "mine"


def test_gguf_quantizer_is_detached_so_the_model_can_be_saved(trained_adapter, tmp_path):
    """A GGUF load leaves transformers' GGUF quantizer on the (dequantized) model, which makes
    save_pretrained refuse; detaching it lets the float weights be saved as they are."""
    from transformers import AutoModelForCausalLM
    from transformers.quantizers.quantizer_gguf import GgufHfQuantizer
    from transformers.utils.quantization_config import GgufConfig

    model = AutoModelForCausalLM.from_pretrained(trained_adapter["base"], dtype=torch.float32)
    model.hf_quantizer = GgufHfQuantizer(GgufConfig())
    model.config.quantization_config = GgufConfig()
    with pytest.raises(ValueError, match="not serializable"):
        model.save_pretrained(tmp_path / "refused")
    assert detach_gguf_quantizer(model)
    model.save_pretrained(tmp_path / "saved")
    assert "quantization_config" not in json.loads((tmp_path / "saved" / "config.json").read_text())
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "saved", dtype=torch.float32)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), reloaded.state_dict().values()))
    assert not detach_gguf_quantizer(reloaded)  # nothing attached: nothing done


def test_dtype_flag_sets_the_saved_precision(trained_adapter, tmp_path):
    from safetensors import safe_open

    out = tmp_path / "merged-bf16"
    result = export(trained_adapter["adapter"], out, "--dtype", "bfloat16")
    assert result.returncode == 0, result.stderr
    with safe_open(str(out / "model.safetensors"), framework="pt") as weights:
        dtypes = {weights.get_tensor(name).dtype for name in weights.keys()}
    assert dtypes == {torch.bfloat16}
    assert json.loads((out / "meta.json").read_text())["dtype"] == "bfloat16"


def test_export_says_which_config_it_took(tmp_path):
    """Without --config or --smoke the machine's default is taken, as by the stage scripts, and named."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("on a GPU machine the default is configs/default.yaml")
    result = subprocess.run([sys.executable, "-m", "extensions.export", "--adapter", str(tmp_path / "none"),
                             "--out", str(tmp_path / "out"), "--set", "model.dtype=float16"],
                            cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    line = next(l for l in result.stderr.splitlines() if l.startswith("export: config "))
    assert "smoke.yaml" in line and "no CUDA GPU" in line and "dtype float16" in line
