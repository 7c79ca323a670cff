"""The merge itself: load base + adapter, fold the LoRA weights in, save with ``save_pretrained``,
write the model card."""
from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Optional

from ..models.loading import is_adapter_dir, load_for_inference
from ..runtime.checkpoints import MANIFEST, finalize, is_complete, read_meta, write_meta
from ..runtime.paths import RunPaths
from .model_card import write_model_card


class ExportError(RuntimeError):
    """The adapter cannot be exported (missing, incomplete, quantized base, output in the way)."""


def detach_gguf_quantizer(model) -> bool:
    """Let ``save_pretrained`` write a model that was loaded from a GGUF file.

    transformers dequantizes GGUF tensors on load but keeps its GGUF quantizer attached, and then
    refuses to save ("quantized with gguf and is not serializable"). The weights in memory are
    ordinary float tensors, so dropping the quantizer and the config's quantization entry is exact.
    Returns True when something was detached; any other quantizer is left alone.
    """
    quantizer = getattr(model, "hf_quantizer", None)
    method = getattr(getattr(quantizer, "quantization_config", None), "quant_method", None)
    if quantizer is None or str(getattr(method, "value", method)).lower() != "gguf":
        return False
    model.hf_quantizer = None
    for attribute, value in (("is_quantized", False), ("quantization_method", None)):
        if hasattr(model, attribute):
            try:
                setattr(model, attribute, value)
            except AttributeError:  # a read-only property in some versions: it reads hf_quantizer then
                pass
    config = model.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    if getattr(config, "_is_quantized", False):
        config._is_quantized = False
    return True


def _check_adapter(adapter_dir: Path) -> dict:
    if not adapter_dir.is_dir():
        raise ExportError(f"adapter not found: {adapter_dir}")
    if not is_adapter_dir(adapter_dir):
        raise ExportError(f"{adapter_dir} holds no LoRA adapter (adapter_config.json missing)")
    try:
        meta = read_meta(adapter_dir)
    except (FileNotFoundError, ValueError) as exc:
        raise ExportError(f"{adapter_dir}: {exc}") from None
    if not is_complete(adapter_dir, verify_hashes=True):
        raise ExportError(f"{adapter_dir} is an incomplete checkpoint (its manifest is missing or does not match "
                          "the files): export a complete one")
    return meta


def export_merged_model(adapter_dir: Path, out_dir: Path, model_cfg, *, config_source: Optional[str] = None,
                        device: str = "cpu", overwrite: bool = False, repo_id: Optional[str] = None,
                        log=print) -> Path:
    """Merge ``adapter_dir`` (a complete checkpoint of this pipeline) into its base and save it to
    ``out_dir``; written to a staging directory first, so ``out_dir`` is whole or absent. The model
    card names ``repo_id`` (where it will be pushed) in its loading example."""
    adapter_dir, out_dir = Path(adapter_dir), Path(out_dir)
    adapter_meta = _check_adapter(adapter_dir)
    if out_dir.exists() and any(out_dir.iterdir()) and not overwrite:
        raise ExportError(f"{out_dir} exists and is not empty (pass --force to replace it)")
    if model_cfg.quantization != "none":
        # Merging into 8/4-bit weights would round the LoRA update away; the base is loaded unquantized.
        model_cfg = dataclasses.replace(model_cfg, quantization="none")
    model_cfg = dataclasses.replace(model_cfg, device_map=None)

    log(f"loading {adapter_dir} on its base model ({adapter_meta.get('base_model')}) ...")
    model, tokenizer, info = load_for_inference(str(adapter_dir), model_cfg, device=device, merge=True)
    if not info.merged:
        raise ExportError(f"{adapter_dir}: the adapter could not be merged into its base model")
    if detach_gguf_quantizer(model):
        log(f"base weights came from the GGUF file {info.gguf_file}: saved dequantized, as {info.dtype}")

    staging = out_dir.with_name(f".{out_dir.name}.exporting")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    manifest = (adapter_dir / MANIFEST).read_text()
    write_meta(staging, stage="export", config=config_source, base_model=info.base_model,
               data=adapter_meta.get("data"), adapter=str(adapter_dir.resolve()),
               adapter_stage=adapter_meta.get("stage"), adapter_step=adapter_meta.get("step"),
               adapter_round=adapter_meta.get("round"), adapter_manifest_sha256=_sha256(manifest),
               gguf_file=info.gguf_file, dtype=info.dtype)
    # The card reads the run around the adapter (prepare_report.json, compare.json) when there is one.
    write_model_card(staging, adapter_dir=adapter_dir, paths=RunPaths.of_checkpoint(adapter_dir), repo_id=repo_id,
                     merged_dtype=info.dtype)
    finalize(staging)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    staging.rename(out_dir)
    return out_dir


def _sha256(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()
