"""Config keys of earlier releases, read under the keys that hold their values now.

``sections.DEPRECATED_KEYS`` names a key and its new keys (one old value may fill several), and
``sections.MOVED_SECTIONS`` a nested section that moved as a whole. Both the YAML file and
``--set`` go through here before the config is built; each use prints one line on stderr saying
which key to write instead. A key that is neither old nor current stays an error.
"""
from __future__ import annotations

import sys
from typing import Any, Iterable, Optional

from .errors import ConfigError
from .sections import DEPRECATED_KEYS, MOVED_SECTIONS


def new_keys(dotted: str) -> Optional[tuple[str, ...]]:
    """The current keys for the old key ``dotted``; None when it is not an old key."""
    if dotted in DEPRECATED_KEYS:
        return DEPRECATED_KEYS[dotted]
    for old, new in MOVED_SECTIONS.items():
        if dotted.startswith(old + "."):
            return (new + dotted[len(old):],)
    return None


def _warn(old: str, new: Iterable[str]) -> None:
    print(f"config: {old} is deprecated; set {', '.join(new)} instead", file=sys.stderr)


def _pop(data: dict, dotted: str) -> tuple[bool, Any]:
    parts = dotted.split(".")
    node = data
    for part in parts[:-1]:
        node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            return False, None
    if parts[-1] not in node:
        return False, None
    return True, node.pop(parts[-1])


def _put(data: dict, dotted: str, value: Any, old: str) -> None:
    parts = dotted.split(".")
    node = data
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{'.'.join(parts[:-1])}: expected a mapping (it holds {old})")
    if parts[-1] in node:
        raise ConfigError(f"{old} and {dotted} name the same key; keep one")
    node[parts[-1]] = value


def translate_file(data: dict) -> dict:
    """The file's mapping with every old key moved to its new keys (``data`` is changed)."""
    for old, new in MOVED_SECTIONS.items():
        found, value = _pop(data, old)
        if found:
            if not isinstance(value, dict):
                raise ConfigError(f"{old}: expected a mapping, got {value!r}")
            _warn(old, [new])
            for key, item in value.items():
                _put(data, f"{new}.{key}", item, f"{old}.{key}")
    for old, new in DEPRECATED_KEYS.items():
        found, value = _pop(data, old)
        if found:
            _warn(old, new)
            for key in new:
                _put(data, key, value, old)
    return data


def translate_override(assignment: str) -> list[str]:
    """``section.key=value`` in current keys: one assignment per new key of an old key."""
    dotted, sep, value = assignment.partition("=")
    targets = new_keys(dotted.strip()) if sep else None
    if targets is None:
        return [assignment]
    _warn(dotted.strip(), targets)
    return [f"{target}={value}" for target in targets]
