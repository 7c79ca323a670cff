"""Plain data across the sandbox boundary: tensors in safetensors files, everything else in JSON.

Inputs, init inputs and outputs are (nested lists/tuples of) tensors and plain values. ``pack``
turns one into a JSON-able spec plus a flat ``{key: tensor}`` dict; ``unpack`` reverses it. Nothing
is ever unpickled: safetensors holds raw tensor bytes and JSON holds the structure, so a hostile
file can at worst be malformed, never run code.
"""
from __future__ import annotations

from typing import Any

JSON_SCALARS = (bool, int, float, str, type(None))


class TensorIOError(ValueError):
    """A value that cannot cross the boundary, or a malformed spec/file."""


def pack(value: Any, prefix: str, tensors: dict[str, Any]) -> dict[str, Any]:
    import torch

    if isinstance(value, torch.Tensor):
        key = f"{prefix}"
        if key in tensors:
            raise TensorIOError(f"duplicate tensor key {key}")
        tensors[key] = value.detach().to("cpu").contiguous().clone()
        return {"tensor": key}
    if isinstance(value, (list, tuple)):
        kind = "tuple" if isinstance(value, tuple) else "list"
        return {kind: [pack(v, f"{prefix}.{i}", tensors) for i, v in enumerate(value)]}
    if isinstance(value, JSON_SCALARS):
        return {"value": value}
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).replace("torch.", "")}
    raise TensorIOError(f"cannot transfer a value of type {type(value).__name__}")


def unpack(spec: Any, tensors: dict[str, Any], device: str | None = None) -> Any:
    import torch

    if not isinstance(spec, dict) or len(spec) != 1:
        raise TensorIOError(f"malformed value spec {str(spec)[:80]}")
    (kind, payload), = spec.items()
    if kind == "tensor":
        if payload not in tensors:
            raise TensorIOError(f"tensor {payload!r} missing from the file")
        tensor = tensors[payload]
        return tensor.to(device) if device else tensor
    if kind in ("list", "tuple"):
        if not isinstance(payload, list):
            raise TensorIOError(f"malformed {kind} spec")
        items = [unpack(v, tensors, device) for v in payload]
        return tuple(items) if kind == "tuple" else items
    if kind == "value":
        if not isinstance(payload, JSON_SCALARS):
            raise TensorIOError("malformed value spec")
        return payload
    if kind == "dtype":
        dtype = getattr(torch, str(payload), None)
        if not isinstance(dtype, torch.dtype):
            raise TensorIOError(f"unknown dtype {payload!r}")
        return dtype
    raise TensorIOError(f"unknown value kind {kind!r}")


def flatten_tensors(value: Any) -> list[Any]:
    """Every tensor in a nested output, in order (what the comparison walks)."""
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in flatten_tensors(v)]
    return []


def save_tensors(path: str, tensors: dict[str, Any]) -> None:
    from safetensors.torch import save_file

    save_file(tensors, path)


def tensor_bytes(tensors: dict[str, Any]) -> bytes:
    """The safetensors file of ``tensors`` as bytes (to hash exactly what is written)."""
    from safetensors.torch import save

    return save(tensors)


def load_tensors(path: str, max_bytes: int | None = None) -> dict[str, Any]:
    import os

    from safetensors.torch import load_file

    size = os.path.getsize(path)
    if max_bytes is not None and size > max_bytes:
        raise TensorIOError(f"tensor file is {size} bytes, more than the {max_bytes} allowed")
    try:
        return load_file(path)
    except Exception as exc:  # safetensors raises several types for malformed files
        raise TensorIOError(f"unreadable tensor file: {type(exc).__name__}: {str(exc)[:120]}") from None
