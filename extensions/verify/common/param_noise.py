"""Constant-initialised parameters get the same random values in the reference and the candidate.

Norm layers start with weight = 1 and bias = 0 (``nn.LayerNorm``, ``nn.BatchNorm*``,
``nn.GroupNorm``), and many problems create ``nn.Parameter(torch.zeros(...))`` or ``torch.ones``:
at those values a kernel that never reads the parameter gives the right answer, and no input set
can tell. So right after construction, every floating-point parameter of the reference whose
elements are all equal is replaced by noise around its value, and the candidate's model gets the
same noise on its tensors of the same kind.

Pairing without names: a candidate may name, flatten, transpose-free copy or re-register a
parameter however it likes, so a tensor is identified by its *key*: element count and constant
value (``numel:value``). The noise for a key is drawn from the batch's secret seed and the key
alone, so every tensor of that key gets the same values (in row-major order) in either model,
whatever their order or names. The candidate side touches only keys the reference perturbed,
and looks at its parameters, buffers and plain tensor attributes of its modules (an honest
kernel may hold LayerNorm's weight as any of these), read through nn.Module's tables without
calling any of the candidate's methods (``model_tensors.py``).

Values stay near the original (``v + max(|v|, 1) * u``, ``u`` in [-0.5, 0.5)): ones stay
positive, zeros become small signed numbers, so a variance-like parameter keeps its sign.
"""
from __future__ import annotations

import hashlib
from typing import Any, Iterable

from .model_tensors import module_tensors


def _key(tensor) -> str | None:
    import torch

    if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point() or tensor.numel() == 0:
        return None
    flat = tensor.detach().reshape(-1)
    first = flat[0]
    if not bool((flat == first).all()):
        return None
    value = float(first)
    if value != value or value in (float("inf"), float("-inf")):
        return None
    return f"{tensor.numel()}:{value!r}"


def constant_parameter_keys(model) -> list[str]:
    """Keys of the reference's floating-point parameters whose elements are all equal."""
    keys = {_key(p) for p in model.parameters()}
    keys.discard(None)
    return sorted(keys)


def _noise(seed: int, key: str, like) -> Any:
    import torch

    digest = hashlib.sha256(f"{int(seed)}|{key}".encode()).digest()
    generator = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)
    numel, value = key.split(":", 1)
    base = float(value)
    u = torch.rand(int(numel), generator=generator, dtype=torch.float64) - 0.5
    values = base + max(abs(base), 1.0) * u
    return values.to(dtype=like.dtype).reshape(like.shape).to(like.device)


def apply_parameter_noise(model, seed: int, keys: Iterable[str], reference: bool) -> int:
    """Replace the values of ``model``'s tensors whose key is in ``keys``: the parameters of a
    reference model, or (``reference=False``) every parameter, buffer and tensor attribute of a
    candidate's modules. Returns how many tensors changed."""
    import torch

    wanted = set(keys)
    if not wanted:
        return 0
    # The candidate's model is read through nn.Module's tables, never its (overridable) methods.
    tensors = list(model.parameters()) if reference else module_tensors(model, attributes=True)
    changed = 0
    with torch.no_grad():
        for tensor in tensors:
            key = _key(tensor)
            if key in wanted:
                tensor.copy_(_noise(seed, key, tensor))
                changed += 1
    return changed
