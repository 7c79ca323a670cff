"""Merge a trained LoRA adapter into its base model and save the result for serving.

    python -m extensions.export --adapter checkpoints/rl/final --out exported/rl-merged

The output is a plain Hugging Face model directory (config, safetensors weights, tokenizer) that
vLLM, TGI or ``AutoModelForCausalLM.from_pretrained`` load without peft, plus the pipeline's
``meta.json`` and ``manifest.json`` saying which adapter and base it came from.
"""
from .merge import ExportError, detach_gguf_quantizer, export_merged_model

__all__ = ["ExportError", "detach_gguf_quantizer", "export_merged_model"]
