"""Deterministic splits by hashing row ids: the same id always lands in the same split, whatever
else is in the data, so adding rows never moves existing ones between train, val and RL."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Sequence


def unit_hash(salt: str, key: str) -> float:
    """A uniform number in [0, 1) fixed by ``salt`` and ``key``."""
    digest = hashlib.sha256(f"{salt}:{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


@dataclass
class Split:
    train: list[str] = field(default_factory=list)
    val: list[str] = field(default_factory=list)
    rl: list[str] = field(default_factory=list)


def _ensure_one(source: list[str], target: list[str], salt: str, min_source: int) -> None:
    """Move the id with the smallest hash for ``salt`` when ``target`` came out empty, so a small
    dataset still gets a validation row and an RL task."""
    if not target and len(source) >= min_source:
        chosen = min(source, key=lambda key: unit_hash(salt, key))
        source.remove(chosen)
        target.append(chosen)


def split_ids(ids: Sequence[str], *, val_fraction: float, rl_fraction: float,
              rl_ids: Sequence[str] = ()) -> Split:
    """RL tasks take ``rl_fraction`` of all ids plus every id in ``rl_ids``; validation takes
    ``val_fraction`` of the rest."""
    for name, value in (("val_fraction", val_fraction), ("rl_fraction", rl_fraction)):
        if not 0.0 <= value < 1.0:
            raise ValueError(f"data.{name} must be in [0, 1), got {value}")
    split = Split()
    pinned = set(rl_ids)
    for key in ids:
        if key in pinned or unit_hash("rl", key) < rl_fraction:
            split.rl.append(key)
        elif unit_hash("val", key) < val_fraction:
            split.val.append(key)
        else:
            split.train.append(key)
    if rl_fraction > 0 or pinned:
        _ensure_one(split.train, split.rl, "rl", min_source=3)
    if val_fraction > 0:
        _ensure_one(split.train, split.val, "val", min_source=2)
    return split
