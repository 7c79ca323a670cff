"""python -m extensions.export --adapter CHECKPOINT --out DIR [--device cpu|cuda] [--dtype D] [--force]
                           [--push-to-hub [--hub-model-id OWNER/NAME]] [--config F | --smoke]

Merges a LoRA adapter written by train_integrated.py (sft/final, rl/final, a checkpoint-N or
round-NNN) into the base model its meta.json names and saves a standalone model directory with its
model card (README.md). --push-to-hub then uploads that directory to --hub-model-id (default:
checkpoint.hub_model_id), private unless checkpoint.hub_private is false. Exit status: 0 exported
(and pushed), 2 bad input or a failed push (one line says why; the merged model stays on disk). See
docs/training.md.
"""
from __future__ import annotations

import argparse
import sys

from ..config import ConfigError, add_config_args, config_from_args, config_yaml, parse_flags
from .hub import HubPushError, push_folder
from .merge import ExportError, export_merged_model


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m extensions.export", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--adapter", required=True, help="a complete adapter checkpoint directory")
    parser.add_argument("--out", required=True, help="where the merged model is written")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where the merge runs (default cpu)")
    parser.add_argument("--dtype", choices=("auto", "bfloat16", "float16", "float32"),
                        help="weights' dtype for the merge and the saved model (default: model.dtype; auto is "
                             "bf16 on a GPU, fp32 on the CPU)")
    parser.add_argument("--force", action="store_true", help="replace a non-empty --out")
    parser.add_argument("--push-to-hub", action="store_true",
                        help="upload the merged model to the hub (token: HF_TOKEN or `hf auth login`)")
    parser.add_argument("--hub-model-id", metavar="OWNER/NAME",
                        help="the repository to push to (default: checkpoint.hub_model_id)")
    add_config_args(parser, stage_script=True)
    return parse_flags(parser, argv)


def _overrides(args: argparse.Namespace) -> list[str]:
    """The flags as config overrides, so the config's own checks judge them (an owner/name id)."""
    overrides = [f"model.dtype={args.dtype}"] if args.dtype else []
    if args.hub_model_id is not None:
        overrides.append(f"checkpoint.hub_model_id={args.hub_model_id}")
    if args.push_to_hub:
        overrides.append("checkpoint.push_to_hub=true")
    return overrides


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        # The same default as the stage scripts (the machine's), said out loud: the merge's dtype and
        # base model come from it.
        cfg = config_from_args(args, _overrides(args), machine_default=True)
        if args.print_config:
            print(config_yaml(cfg), end="")
            return 0
        print(f"export: config {cfg.source}" + (f" ({cfg.source_reason})" if cfg.source_reason else "")
              + f"; base model {cfg.model.name_or_path}, dtype {cfg.model.dtype}", file=sys.stderr, flush=True)
        hub = cfg.checkpoint
        out = export_merged_model(args.adapter, args.out, cfg.model, config_source=cfg.source, device=args.device,
                                  overwrite=args.force, repo_id=hub.hub_model_id)
    except (ExportError, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"merged model written to {out} (load it with AutoModelForCausalLM.from_pretrained)")
    if args.push_to_hub:
        try:
            url = push_folder(out, hub.hub_model_id, hub.hub_private)
        except HubPushError as exc:
            print(f"error: push to hub failed: {exc}; the merged model is at {out}", file=sys.stderr)
            return 2
        print(f"pushed {out} to {hub.hub_model_id} ({url})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
