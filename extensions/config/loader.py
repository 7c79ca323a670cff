"""Typed YAML config loading: dataclasses in, dataclasses out, unknown keys are errors.

Every section of the pipeline config is a dataclass. ``build`` turns a plain mapping (read from
YAML) into that dataclass, checking every key and coercing every value to the annotated type, so a
typo in a YAML file or a ``--set`` override fails at start-up with the full dotted name instead of
being ignored for an eight-hour run.
"""
from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Literal, Union


class ConfigError(ValueError):
    """A config file or override that does not match the typed config."""


def _type_name(tp: Any) -> str:
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
        raise ConfigError(f"{where}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{where}: expected a string, got {value!r}")
    raise ConfigError(f"{where}: unsupported config type {_type_name(tp)}")


def build(cls: type, data: dict[str, Any] | None, where: str = "") -> Any:
    """Build dataclass ``cls`` from ``data``; missing keys keep their defaults."""
    data = dict(data or {})
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        prefix = f"{where}." if where else ""
        raise ConfigError(
            f"unknown config key(s) {', '.join(prefix + k for k in unknown)}; "
            f"{cls.__name__} accepts: {', '.join(sorted(names))}"
        )
    kwargs = {}
    for name, value in data.items():
        kwargs[name] = _coerce(value, hints[name], f"{where}.{name}" if where else name)
    return cls(**kwargs)


def override(cfg: Any, assignment: str) -> None:
    """Apply one ``section.key=value`` override in place; the value is parsed as YAML."""
    import yaml

    if "=" not in assignment:
        raise ConfigError(f"override {assignment!r} must look like section.key=value")
    dotted, raw = assignment.split("=", 1)
    parts = dotted.strip().split(".")
    target = cfg
    for i, part in enumerate(parts[:-1]):
        if not dataclasses.is_dataclass(target) or part not in {f.name for f in dataclasses.fields(target)}:
            raise ConfigError(f"override {dotted!r}: no config section {'.'.join(parts[: i + 1])!r}")
        target = getattr(target, part)
    key = parts[-1]
    if not dataclasses.is_dataclass(target) or key not in {f.name for f in dataclasses.fields(target)}:
        raise ConfigError(f"override {dotted!r}: unknown config key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {dotted!r}: value {raw!r} is not valid YAML ({exc})") from exc
    hint = typing.get_type_hints(type(target))[key]
    if hint is str and not isinstance(value, str):
        value = raw  # `--set model.name_or_path=123` means the string
    setattr(target, key, _coerce(value, hint, dotted))


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)
