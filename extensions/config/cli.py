"""The config flags every entry point shares, and how the resolved config is shown.

    --config FILE        a YAML config (stage scripts: ``machine.default_config``, production with a GPU)
    --smoke              configs/smoke.yaml
    --set SECTION.KEY=V  one override, repeatable; ``--set SECTION.help`` lists a section's keys
    --print-config       print the resolved config as YAML and exit 0
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any, Iterable

from .errors import ConfigError
from .sections import PipelineConfig


def parse_flags(parser: argparse.ArgumentParser, argv=None) -> argparse.Namespace:
    """``parser.parse_args`` that takes a flag in either spelling: ``--no-progress`` and
    ``--no_progress``, ``--model-path`` and ``--model_path`` name the same flag."""
    argv = list(sys.argv[1:] if argv is None else argv)
    known = {option for action in parser._actions for option in action.option_strings}
    spelled = []
    for arg in argv:
        if arg == "--":
            spelled.extend(argv[len(spelled):])
            break
        name, sep, value = arg.partition("=")
        if name.startswith("--") and name not in known:
            for other in (name[:2] + name[2:].replace("-", "_"), name[:2] + name[2:].replace("_", "-")):
                if other in known:
                    name = other
                    break
        spelled.append(name + sep + value)
    return parser.parse_args(spelled)


def add_config_args(parser: argparse.ArgumentParser, *, stage_script: bool = False) -> None:
    """The shared config flags. ``stage_script``: a pipeline script started through
    ``extensions.runtime.entry_point``, which takes ``machine.default_config`` and handles ``--print-config``."""
    group = parser.add_argument_group("configuration")
    default = ("configs/default.yaml with a CUDA GPU, configs/smoke.yaml without" if stage_script
               else "configs/default.yaml")
    group.add_argument("--config", default=None, help=f"YAML config (default: {default})")
    group.add_argument("--smoke", action="store_true", help="use configs/smoke.yaml (CPU, small model)")
    group.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
        help="override one config value, e.g. --set rl.num_rounds=3 (repeatable); --set SECTION.help lists the keys",
    )
    if stage_script:
        group.add_argument("--print-config", action="store_true", help="print the resolved config as YAML and exit")


def config_from_args(args: argparse.Namespace, extra_overrides: Iterable[str] = (), *,
                     machine_default: bool = False):
    """The config the flags describe; raises ConfigError (or ConfigHelpRequested for ``--set X.help``).

    Without ``--config``/``--smoke``: the config ``machine.default_config`` picks when
    ``machine_default`` (the pipeline's stage scripts), else configs/default.yaml (tools such as the
    verifier CLI, whose checks must not depend on the machine they run on).
    """
    from .loader import load_config
    from .machine import DEFAULT_CONFIG, SMOKE_CONFIG, default_config

    if args.config and args.smoke:
        raise ConfigError("give --config or --smoke, not both")
    reason = None
    if args.smoke:
        path = SMOKE_CONFIG
    elif args.config:
        path = args.config
    elif machine_default:
        choice = default_config()
        path, reason = choice.path, f"{choice.reason} (--config or --smoke picks another)"
    else:
        path = DEFAULT_CONFIG
    cfg = load_config(path, [*getattr(args, "overrides", []), *extra_overrides])
    cfg.source_reason = reason
    return cfg


def config_yaml(cfg: PipelineConfig) -> str:
    """The full resolved config as YAML, loadable again with ``--config``."""
    import yaml

    data = dataclasses.asdict(cfg)
    data.pop("source", None)
    data.pop("source_reason", None)
    header = f"# resolved from {cfg.source}\n" if cfg.source else ""
    return header + yaml.safe_dump(data, sort_keys=False, default_flow_style=False, width=110)


def _changed(section: Any, defaults: Any, prefix: str = "") -> list[str]:
    items = []
    for f in dataclasses.fields(section):
        value, default = getattr(section, f.name), getattr(defaults, f.name)
        if dataclasses.is_dataclass(value):
            items += _changed(value, default, f"{prefix}{f.name}.")
        elif value != default:
            items.append(f"{prefix}{f.name}={value}")
    return items


def compact_config_lines(cfg: PipelineConfig) -> list[str]:
    """One line per section with the values that differ from the built-in defaults."""
    lines = []
    for f in dataclasses.fields(cfg):
        section = getattr(cfg, f.name)
        if not dataclasses.is_dataclass(section):
            continue
        changed = _changed(section, type(section)())
        lines.append(f"  {f.name}: {' '.join(changed) if changed else '(defaults)'}")
    return lines


def announce_config(cfg: PipelineConfig, prog: str, stream=None) -> None:
    """Print which config this run uses and how it differs from the defaults (stderr by default)."""
    from .fingerprint import config_fingerprint

    stream = stream or sys.stderr
    why = f" ({cfg.source_reason})" if cfg.source_reason else ""
    print(f"{prog}: config {cfg.source}{why}; fingerprint {config_fingerprint(cfg)}", file=stream)
    for line in compact_config_lines(cfg):
        print(f"{prog}: {line}", file=stream)
    stream.flush()
