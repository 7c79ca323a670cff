"""Typed YAML config loading: dataclasses in, dataclasses out, unknown keys are errors.

Every section of the pipeline config is a dataclass. ``build`` turns a plain mapping (read from
YAML) into that dataclass, checking every key and coercing every value to the annotated type, so a
typo in a YAML file or a ``--set`` override fails at start-up with the full dotted name instead of
being ignored for an eight-hour run. ``load_config`` reads a whole config file that way, then
applies the command line's overrides.
"""
from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from pathlib import Path
from typing import Any, Iterable, Literal, Union

from .deprecated import translate_file, translate_override
from .errors import ConfigError, ConfigHelpRequested
from .machine import DEFAULT_CONFIG
from .sections import PipelineConfig

# YAML 1.2 (core schema) floats: unlike PyYAML's YAML 1.1 resolver, the mantissa needs no dot and
# the exponent sign is optional, so `1e-4` and `5E3` are numbers as in every other YAML/JSON tool.
YAML12_FLOAT = re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$|^[-+]?\.(inf|Inf|INF)$|^\.(nan|NaN|NAN)$")


def _yaml_loader():
    import yaml

    class Yaml12NumberLoader(yaml.SafeLoader):
        """SafeLoader reading numbers by YAML 1.2 rules."""

    Yaml12NumberLoader.add_implicit_resolver("tag:yaml.org,2002:float", YAML12_FLOAT, list("-+0123456789."))
    return Yaml12NumberLoader


def yaml_load(text: str) -> Any:
    """``yaml.safe_load`` with YAML 1.2 number rules (``1e-4`` is a float)."""
    import yaml

    return yaml.load(text, Loader=_yaml_loader())


def _type_name(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in args)
    if origin in (Union, types.UnionType):
        return " | ".join("null" if a is type(None) else _type_name(a) for a in args)
    if origin in (list, tuple, dict):
        return f"{origin.__name__}[{', '.join(_type_name(a) for a in args)}]"
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)

    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, where)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(f"{where}: {value!r} does not fit {_type_name(tp)}")
    if origin is Literal:
        if value in args:
            return value
        raise ConfigError(f"{where}: {value!r} is not one of {list(args)}")
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping for section {tp.__name__}, got {value!r}")
        return build(tp, value, where)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        item_tp = args[0] if args else Any
        items = [_coerce(v, item_tp, f"{where}[{i}]") for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        val_tp = args[1] if len(args) == 2 else Any
        return {str(k): _coerce(v, val_tp, f"{where}.{k}") for k, v in value.items()}
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected true/false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str) and YAML12_FLOAT.match(value.strip()):
            return float(value.strip().replace(".inf", "inf").replace(".Inf", "inf").replace(".INF", "inf")
                         .replace(".nan", "nan").replace(".NaN", "nan").replace(".NAN", "nan"))
        raise ConfigError(f"{where}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{where}: expected a string, got {value!r}")
    raise ConfigError(f"{where}: unsupported config type {_type_name(tp)}")


def key_aliases(cls: type) -> dict[str, tuple[str, Any]]:
    """Another library's names for a section's keys (``KEY_ALIASES``: alias -> (key, value map))."""
    return getattr(cls, "KEY_ALIASES", {}) or {}


def resolve_alias(cls: type, key: str, value: Any, where: str) -> tuple[str, Any]:
    """An aliased key and its value in this config's terms; other keys come back as they are."""
    aliases = key_aliases(cls)
    if key not in aliases:
        return key, value
    target, translate = aliases[key]
    if translate is None:
        return target, value
    lookup = value.lower() if isinstance(value, str) else value
    if lookup not in translate:
        raise ConfigError(f"{where + '.' if where else ''}{key}: {value!r} has no equivalent here "
                          f"(accepted: {', '.join(repr(v) for v in translate)}); set {target} instead")
    return target, translate[lookup]


def build(cls: type, data: dict[str, Any] | None, where: str = "") -> Any:
    """Build dataclass ``cls`` from ``data``; missing keys keep their defaults. A key another
    library names differently (``KEY_ALIASES``) is read under its name here."""
    data = dict(data or {})
    for alias in [k for k in data if k in key_aliases(cls)]:
        target, value = resolve_alias(cls, alias, data.pop(alias), where)
        if target in data:
            raise ConfigError(f"{where + '.' if where else ''}{alias} and {target} name the same key; keep one")
        data[target] = value
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(unknown_key_message(cls, where, unknown[0]))
    kwargs = {}
    for name, value in data.items():
        kwargs[name] = _coerce(value, hints[name], f"{where}.{name}" if where else name)
    return cls(**kwargs)


def override(cfg: Any, assignment: str) -> None:
    """Apply one ``section.key=value`` override in place; the value is parsed as YAML."""
    import yaml

    dotted = assignment.split("=", 1)[0].strip()
    parts = dotted.split(".")
    target, where = cfg, ""
    for part in parts[:-1]:
        if not dataclasses.is_dataclass(target) or part not in _field_names(target):
            raise ConfigError(unknown_key_message(type(target), where, part, override=True))
        target = getattr(target, part)
        where = f"{where}.{part}" if where else part
    key = parts[-1]
    if key == "help" and "=" not in assignment:
        raise ConfigHelpRequested(describe_section(target, where))
    if "=" not in assignment:
        raise ConfigError(f"--set {assignment!r} must look like section.key=value "
                          f"(--set SECTION.help lists a section's keys)")
    raw = assignment.split("=", 1)[1]
    aliased = dataclasses.is_dataclass(target) and key in key_aliases(type(target))
    if not dataclasses.is_dataclass(target) or (key not in _field_names(target) and not aliased):
        raise ConfigError(unknown_key_message(type(target), where, key, override=True))
    try:
        value = yaml_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"--set {dotted}: value {raw!r} is not valid YAML ({first_line})") from None
    if aliased:
        key, value = resolve_alias(type(target), key, value, where)
        dotted = f"{where}.{key}" if where else key
    hint = typing.get_type_hints(type(target))[key]
    if hint is str and not isinstance(value, str):
        value = raw  # `--set model.name_or_path=123` means the string
    setattr(target, key, _coerce(value, hint, dotted))


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def _field_names(cls_or_obj: Any) -> list[str]:
    return [f.name for f in dataclasses.fields(cls_or_obj)] if dataclasses.is_dataclass(cls_or_obj) else []


def _dotted_keys(cls: type, prefix: str = "") -> list[str]:
    """Every settable dotted key below ``cls`` (nested sections expanded)."""
    keys = []
    hints = typing.get_type_hints(cls)
    for name in _field_names(cls):
        dotted = f"{prefix}{name}"
        if dataclasses.is_dataclass(hints[name]):
            keys += _dotted_keys(hints[name], dotted + ".")
        else:
            keys.append(dotted)
    return keys


def _root_of(cls: type) -> type:
    """The top-level config class, so a near miss in one section can point at a key in another."""
    return PipelineConfig if cls in _section_classes(PipelineConfig) else cls


def _section_classes(cls: type) -> set[type]:
    found = {cls}
    hints = typing.get_type_hints(cls)
    for name in _field_names(cls):
        if dataclasses.is_dataclass(hints[name]):
            found |= _section_classes(hints[name])
    return found


def nearest_key(cls: type, where: str, key: str) -> str | None:
    """The valid dotted key(s) closest to ``where.key``: same section first, then the whole config."""
    dotted = f"{where}.{key}" if where else key
    # `--set learning_rate=...` or a key under the wrong section: the same name in other sections.
    elsewhere = [k for k in _dotted_keys(_root_of(cls)) if k.rsplit(".", 1)[-1] == key and k != dotted]
    same_section = [f"{where}.{name}" if where else name for name in _field_names(cls)]
    match = difflib.get_close_matches(dotted, same_section, n=1, cutoff=0.6)
    if match:
        return match[0]
    if elsewhere:
        return " or ".join(elsewhere)
    match = difflib.get_close_matches(dotted, _dotted_keys(_root_of(cls)), n=1, cutoff=0.75)
    return match[0] if match else None


def unknown_key_message(cls: type, where: str, key: str, override: bool = False) -> str:
    dotted = f"{where}.{key}" if where else key
    what = "section or key" if not where else "key"
    guess = nearest_key(cls, where, key)
    hint = f" (did you mean {guess}?)" if guess else ""
    listing = f"--set {where}.help" if where else "--set help"
    return f"unknown config {what} {dotted}{hint}; {listing} lists the valid keys"


def describe_section(section: Any, where: str) -> str:
    """The keys of one section with their types and current values, for ``--set SECTION.help``."""
    hints = typing.get_type_hints(type(section))
    title = f"keys of section {where}" if where else "config sections"
    lines = [f"{title} (set with --set {where + '.' if where else ''}KEY=VALUE):"]
    for name in _field_names(section):
        value = getattr(section, name)
        if dataclasses.is_dataclass(value):
            lines.append(f"  {name}: (section; --set {where + '.' if where else ''}{name}.help)")
        else:
            lines.append(f"  {name}: {_type_name(hints[name])} = {value!r}")
    return "\n".join(lines)


def load_config(path: str | Path | None = None, overrides: Iterable[str] = ()) -> PipelineConfig:
    """Read ``path`` (default: configs/default.yaml) and apply ``section.key=value`` overrides."""
    import yaml

    path = Path(path) if path is not None else DEFAULT_CONFIG
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = yaml_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" (line {where.line + 1})" if where is not None else ""
        raise ConfigError(f"{path}: not valid YAML{line}: {getattr(exc, 'problem', None) or exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping of sections")
    for reserved in ("source", "source_reason"):
        if reserved in data:
            raise ConfigError(f"{path}: '{reserved}' is set by the loader, not by the file")
    try:
        cfg = build(PipelineConfig, translate_file(data))
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    cfg.source = str(path)
    for assignment in overrides:
        for current in translate_override(assignment):
            override(cfg, current)
    check_sections(cfg)
    return cfg


def check_sections(cfg: PipelineConfig) -> None:
    """Each section's checks across its keys (``check``), once the file and the overrides are in."""
    for f in dataclasses.fields(cfg):
        check = getattr(getattr(cfg, f.name), "check", None)
        if callable(check):
            check(f.name)

