"""What leaves a run: a merged model for serving, the model card, a push to the Hugging Face hub.

    python -m extensions.export --adapter checkpoints/rl/final --out exported/rl-merged [--push-to-hub]

The merged output is a plain Hugging Face model directory (config, safetensors weights, tokenizer)
that vLLM, TGI or ``AutoModelForCausalLM.from_pretrained`` load without peft, plus the pipeline's
``meta.json`` and ``manifest.json`` saying which adapter and base it came from. Trained adapters
(``final/`` of each stage) and merged models carry a model card (``model_card``: README.md naming
the base model's hub id, the data, the verifier, the training and the evaluation); ``hub`` pushes
either to a hub repository.
"""
from .hub import HubPushError, push_final_adapter, push_folder
from .merge import ExportError, detach_gguf_quantizer, export_merged_model
from .model_card import base_model_for, build_model_card, write_model_card

__all__ = ["ExportError", "HubPushError", "base_model_for", "build_model_card", "detach_gguf_quantizer",
           "export_merged_model", "push_final_adapter", "push_folder", "write_model_card"]
