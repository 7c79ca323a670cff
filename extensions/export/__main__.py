"""python -m extensions.export --adapter CHECKPOINT --out DIR [--device cpu|cuda] [--dtype D] [--force] [--config F | --smoke]

Merges a LoRA adapter written by train_integrated.py (sft/final, rl/final, a checkpoint-N or
round-NNN) into the base model its meta.json names and saves a standalone model directory. Exit
status: 0 exported, 2 bad input (one line says why). See docs/training.md.
"""
from __future__ import annotations

import argparse
import sys

from ..config import ConfigError, add_config_args, config_from_args, config_yaml, parse_flags
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
    add_config_args(parser, stage_script=True)
    return parse_flags(parser, argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        # The same default as the stage scripts (the machine's), said out loud: the merge's dtype and
        # base model come from it.
        cfg = config_from_args(args, [f"model.dtype={args.dtype}"] if args.dtype else [], machine_default=True)
        if args.print_config:
            print(config_yaml(cfg), end="")
            return 0
        print(f"export: config {cfg.source}" + (f" ({cfg.source_reason})" if cfg.source_reason else "")
              + f"; base model {cfg.model.name_or_path}, dtype {cfg.model.dtype}", file=sys.stderr, flush=True)
        out = export_merged_model(args.adapter, args.out, cfg.model, config_source=cfg.source, device=args.device,
                                  overwrite=args.force)
    except (ExportError, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"merged model written to {out} (load it with AutoModelForCausalLM.from_pretrained)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
