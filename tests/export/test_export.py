"""Adapter export: a LoRA checkpoint merged into its base and saved as a plain model directory that
loads without peft and computes what base + adapter computed, with its model card; --push-to-hub
uploads it to a hub stand-in on 127.0.0.1 (every other address refused). Tiny random Qwen2, real files."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest
import torch
import yaml

from extensions.runtime import checkpoints
from extensions.config import ModelConfig, load_config
from extensions.export import detach_gguf_quantizer
from extensions.models.loading import attach_lora, model_meta
from extensions.models.tiny import save_tiny_model

from hub_testing import FakeHub, folder_files, hub_env, loopback_only_env
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


def export(adapter, out, *extra, env=None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "extensions.export", "--adapter", str(adapter), "--out", str(out), "--smoke", *extra]
    return subprocess.run(command, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=600,
                          env=env or {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)})


def hub_export_env(hub: FakeHub, tmp_path, **changes) -> dict:
    """The export's environment: the hub stand-in, a token, an empty HF_HOME, loopback only."""
    env = hub_env(hub, {**os.environ, "HF_HOME": str(tmp_path / "hf_home")})
    env = {k: v for k, v in {**env, **changes}.items() if v is not None}
    guarded = loopback_only_env(tmp_path / "guard", env)
    return {**guarded, "PYTHONPATH": f"{guarded['PYTHONPATH']}:{PROJECT_ROOT}"}


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
    # The card: a merged model of a local base that records no hub id, named without its path.
    card = (out / "README.md").read_text()
    header = yaml.safe_load(card.split("---\n", 2)[1])
    assert header["library_name"] == "transformers" and "base_model" not in header
    assert "merged into its weights (float32; loads without peft)" in card and "`base`" in card
    assert "supervised fine-tuning (SFT), 6 optimizer steps" in card and str(trained_adapter["root"]) not in card

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


def test_export_pushes_the_merged_model_with_its_card(trained_adapter, tmp_path):
    out = tmp_path / "merged"
    with FakeHub() as hub:
        result = export(trained_adapter["adapter"], out, "--push_to_hub", "--hub-model-id", "alice/tiny-merged",
                        env=hub_export_env(hub, tmp_path))
    assert result.returncode == 0, result.stderr
    assert "pushed" in result.stdout and "alice/tiny-merged" in result.stdout
    assert hub.repos == [{"name": "tiny-merged", "organization": "alice", "visibility": "private", "type": "model"}]
    assert hub.files["alice/tiny-merged"] == folder_files(out) and not hub.unexpected
    assert 'AutoModelForCausalLM.from_pretrained("alice/tiny-merged", dtype="auto")' in (out / "README.md").read_text()
    assert checkpoints.is_complete(out, verify_hashes=True)


def test_failed_push_is_one_error_line_and_keeps_the_merged_model(trained_adapter, tmp_path):
    out = tmp_path / "merged"
    with FakeHub(refuse=401) as hub:
        refused = export(trained_adapter["adapter"], out, "--push-to-hub", "--hub_model_id", "alice/tiny-merged",
                         env=hub_export_env(hub, tmp_path))
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error")]
    assert len(errors) == 1 and errors[0].startswith("error: push to hub failed: HTTP 401 from http://127.0.0.1:")
    assert errors[0].endswith(f"; the merged model is at {out}")
    assert checkpoints.is_complete(out, verify_hashes=True) and not hub.files

    # No token at all: said before anything is sent.
    with FakeHub() as hub:
        tokenless = export(trained_adapter["adapter"], out, "--force", "--push-to-hub", "--hub-model-id", "alice/x",
                           env=hub_export_env(hub, tmp_path, HF_TOKEN=None))
    assert tokenless.returncode == 2 and not hub.requests
    assert [line for line in tokenless.stderr.splitlines() if line.startswith("error")] == [
        f"error: push to hub failed: no Hugging Face token: set HF_TOKEN or run `hf auth login`; "
        f"the merged model is at {out}"]
    assert checkpoints.is_complete(out, verify_hashes=True)


def test_push_without_a_repository_is_refused_before_the_merge(trained_adapter, tmp_path):
    result = export(trained_adapter["adapter"], tmp_path / "out", "--push-to-hub")
    assert result.returncode == 2 and not (tmp_path / "out").exists()
    assert result.stderr.strip().splitlines()[-1].startswith(
        "error: checkpoint.push_to_hub is true but checkpoint.hub_model_id is not set")
