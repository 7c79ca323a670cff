"""The tensors of a model output: the one walk the timer and the verifier both use.

A leaf: it imports nothing of the project, so the verifier (a layer above the timer) and the timer
read an output the same way.
"""
from __future__ import annotations

from typing import Any


def flatten_tensors(value: Any) -> list[Any]:
    """Every tensor in a nested output (a tensor, or nested tuples/lists of them), in order."""
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in flatten_tensors(v)]
    return []
