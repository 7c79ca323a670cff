"""Plain data across the sandbox boundary: tensors in safetensors files, everything else in JSON.

Inputs, init inputs and outputs are (nested lists/tuples of) tensors and plain values. ``pack``
turns one into a JSON-able spec plus a flat ``{key: tensor}`` dict; ``unpack`` reverses it. Nothing
is ever unpickled: safetensors holds raw tensor bytes and JSON holds the structure, so a hostile
file can at worst be malformed, never run code.
"""
from __future__ import annotations

import math
from typing import Any

from extensions.timing.tensors import (flatten_tensors, group_span, map_tensors, storage_groups, stored_stretch,
                                       view_span, views_over)

JSON_SCALARS = (bool, int, float, str, type(None))


class TensorIOError(ValueError):
    """A value that cannot cross the boundary, or a malformed spec/file."""


def pack(value: Any, prefix: str, tensors: dict[str, Any], copy: bool = True,
         layouts: bool = False, _shared: dict | None = None) -> dict[str, Any]:
    """``value``'s spec; its tensors go into ``tensors`` as contiguous host tensors, copies of the
    originals (``copy=False``: a tensor already contiguous on the host is taken as it is, for data
    that is serialized at once and never changed).

    A tensor laid out as a permutation of a contiguous one (a transposed view, channels-last) keeps
    its layout: it is stored in its own memory order and ``unpack`` permutes it back. A problem whose
    inputs are column-major hands the candidate column-major inputs, as its own forward gets them:
    a kernel that ignores strides is wrong there, and one written for that layout is right.

    With ``layouts`` (a problem's inputs), every other strided layout keeps its strides and
    storage offset too (a column slice ``h[:, 1:]``, a broadcast ``expand``): the stretch of
    storage the view reaches is stored, the values between its elements included, and ``unpack``
    views it as it was. A kernel that reads such an input as dense reads the problem's other
    memory, as it would on the problem's own inputs. Candidates' outputs cross without it: a view
    reaching far through a large storage would make the file that large.

    With ``layouts``, tensors of ``value`` that share one storage (``storage_groups``: ``[x, x]``,
    two slices of one matrix) cross as views of one stored stretch, which ``unpack`` rebuilds as
    one storage: the candidate meets the aliasing the problem's inputs have, and a reference that
    writes into one of them changes the other, as it does on the problem's own call."""
    import torch

    if layouts and _shared is None:
        _shared = _shared_stretches(value)
    if isinstance(value, torch.Tensor):
        key = f"{prefix}"
        if key in tensors:
            raise TensorIOError(f"duplicate tensor key {key}")
        shared = _shared.get(id(value)) if _shared else None
        if shared is not None:
            if shared[0] is None:  # the first view of the storage stores the stretch for them all
                shared[0] = key
                reach = stored_stretch(value, shared[1])
                tensors[key] = host_copy(reach) if copy else _on_host(reach)
            base = torch._C.TensorBase
            return {"strided": [shared[0], list(value.shape), list(base.stride(value)), base.storage_offset(value)]}
        layout = strided_layout(value) if layouts else None
        if layout is not None:
            shape, stride, offset, span = layout
            reach = stored_stretch(value, span)
            tensors[key] = host_copy(reach) if copy else _on_host(reach)
            return {"strided": [key, shape, stride, offset]}
        order = memory_order(value)
        stored = value if order is None else value.permute(order)
        tensors[key] = host_copy(stored) if copy else _on_host(stored)
        return {"tensor": key} if order is None else {"permuted": [key, order]}
    if isinstance(value, (list, tuple)):
        kind = "tuple" if isinstance(value, tuple) else "list"
        return {kind: [pack(v, f"{prefix}.{i}", tensors, copy, layouts, _shared) for i, v in enumerate(value)]}
    if isinstance(value, JSON_SCALARS):
        return {"value": value}
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).replace("torch.", "")}
    raise TensorIOError(f"cannot transfer a value of type {type(value).__name__}")


def _shared_stretches(value: Any) -> dict[int, list]:
    """Per tensor of ``value`` that shares its storage with another (by ``id``): ``[key, span]``,
    one list per storage, its key set by the first view ``pack`` stores."""
    tensors = flatten_tensors(value)
    shared: dict[int, list] = {}
    for members in storage_groups(tensors):
        record = [None, group_span(tensors, members)]
        for position in members:
            shared[id(tensors[position])] = record
    return shared


def storage_units(tensors: list) -> list[tuple[list[int], int | None]]:
    """How the tensors of a problem's input list (``flatten_tensors`` order; other values are
    passed over) are stored and placed:
    per storage, the positions of the tensors viewing it and the elements of it stored from its
    start (a ``storage_groups`` group's ``group_span``; a slice's or an expanded view's span), or
    None for a tensor stored as itself (contiguous, or a permutation of a contiguous one)."""
    import torch

    groups = storage_groups(tensors)
    first = {members[0]: members for members in groups}
    grouped = {position for members in groups for position in members}
    units: list[tuple[list[int], int | None]] = []
    for position, tensor in enumerate(tensors):
        if position in first:
            units.append((first[position], group_span(tensors, first[position])))
        elif position not in grouped and isinstance(tensor, torch.Tensor):
            layout = strided_layout(tensor)
            units.append(([position], layout[3] if layout is not None else None))
    return units


def stored_spans(tensors: list) -> list[int | None]:
    """Per tensor of ``tensors``: the stretch of its storage ``pack`` stores for it (``storage_units``),
    or None where it stores the tensor alone. The stretch is what a check reads back after a call:
    a write between a slice's elements, or into another input's view of the same storage, is a
    write into the caller's tensors."""
    spans: list[int | None] = [None] * len(tensors)
    for positions, span in storage_units(tensors):
        for position in positions:
            spans[position] = span
    return spans


def own_copies(values: Any, device: Any = None, convert=None) -> Any:
    """``values`` with every tensor in a storage of its own (``own_copy``, on ``device``), the
    tensors that shared a storage (``storage_groups``) sharing one copy of it, and one tensor
    passed twice copied once: whatever a call does to them leaves ``values`` as they were, and a
    forward that writes into one input sees the other change, as on the problem's own call.
    ``convert(tensor)``: the copy instead of ``own_copy``, made of a flat stretch for shared
    storages (element by element: a dtype change, absolute values)."""
    convert = convert or (lambda t: own_copy(t, device))
    tensors = flatten_tensors(values)
    made: dict[int, Any] = {}
    for members in storage_groups(tensors):
        stretch = convert(stored_stretch(tensors[members[0]], group_span(tensors, members)))
        for position, view in views_over(stretch, tensors, members).items():
            made[id(tensors[position])] = view

    def copy(tensor):
        if id(tensor) not in made:
            made[id(tensor)] = convert(tensor)
        return made[id(tensor)]

    return map_tensors(values, copy)


def memory_order(tensor: Any) -> list[int] | None:
    """The dimension order (outermost first) in which ``tensor``'s elements lie in memory, when it
    is a permutation of a contiguous tensor other than the identity; None for a contiguous tensor
    and for every other layout (expanded, sliced, overlapping), which crosses as a contiguous copy."""
    import torch

    if tensor.layout != torch.strided or tensor.dim() < 2 or tensor.is_contiguous():
        return None
    strides = torch._C.TensorBase.stride(tensor)
    order = sorted(range(tensor.dim()), key=lambda d: (-strides[d], -tensor.shape[d], d))
    if order == list(range(tensor.dim())) or not tensor.permute(order).is_contiguous():
        return None
    return order


def strided_layout(tensor: Any) -> tuple[list[int], list[int], int, int] | None:
    """``(shape, strides, storage offset, span)`` of a tensor laid out neither contiguously nor as
    a permutation of a contiguous one (a slice with gaps, an expanded or overlapping view), where
    ``span`` is how many elements of its storage it reaches from the storage's start; None for
    the other layouts and for an empty tensor."""
    import torch

    if tensor.layout != torch.strided or tensor.numel() == 0 or tensor.is_contiguous() \
            or memory_order(tensor) is not None:
        return None
    strides = list(torch._C.TensorBase.stride(tensor))
    if any(s < 0 for s in strides):
        return None
    offset = torch._C.TensorBase.storage_offset(tensor)
    return list(tensor.shape), strides, offset, view_span(list(tensor.shape), strides, offset)


def stored_reaches(spec: Any) -> list[str | None]:
    """For each tensor a ``pack`` spec holds, in order (``flatten_tensors``'s order of the value),
    the key of the storage stretch it stored for a strided view, or None for a tensor stored
    without one."""
    if not isinstance(spec, dict) or len(spec) != 1:
        raise TensorIOError(f"malformed value spec {str(spec)[:80]}")
    (kind, payload), = spec.items()
    if kind in ("list", "tuple") and isinstance(payload, list):
        return [key for item in payload for key in stored_reaches(item)]
    if kind == "strided" and isinstance(payload, list) and payload:
        return [payload[0]]
    if kind in ("tensor", "permuted"):
        return [None]
    return []


def own_copy(tensor: Any, device: Any = None) -> Any:
    """A copy of ``tensor`` (on ``device``, or where it is) in a storage of its own, laid out
    alike: a permuted layout keeps its strides, a slice or an expanded view keeps its strides and
    storage offset with the stretch of storage it reaches. Whatever is done to it leaves
    ``tensor`` as it was."""
    layout = strided_layout(tensor)
    if layout is None:
        return tensor.to(tensor.device if device is None else device, copy=True)
    shape, stride, offset, span = layout
    stretch = stored_stretch(tensor, span)
    return stretch.to(stretch.device if device is None else device, copy=True).as_strided(shape, stride, offset)


def overlaps_itself(shape: list[int], strides: list[int]) -> bool:
    """Whether two elements of a view of ``shape`` and ``strides`` may share a memory location
    (an expanded dimension, or strides too small for the sizes inside them): such a view cannot
    be written element by element."""
    reach = 0
    for size, stride in sorted(((n, s) for n, s in zip(shape, strides) if n > 1), key=lambda d: d[1]):
        if stride <= reach:
            return True
        reach += (size - 1) * stride
    return False


def _on_host(tensor: Any) -> Any:
    """``tensor`` contiguous in host memory: itself where it already is, else one copy."""
    tensor = tensor.detach()
    if tensor.device.type == "cpu":
        return tensor.contiguous()
    return host_copy(tensor)


def host_copy(tensor: Any) -> Any:
    """A contiguous host copy of ``tensor`` that shares no memory with it. From a GPU the copy
    lands in page-locked memory (one DMA transfer, several times faster than into pageable memory,
    and the block is reused by the next copy of the same size)."""
    import torch

    tensor = tensor.detach()
    if tensor.device.type == "cpu":
        contiguous = tensor.contiguous()
        return contiguous.clone() if contiguous.data_ptr() == tensor.data_ptr() else contiguous
    if tensor.layout == torch.strided and tensor.device.type == "cuda":
        try:
            pinned = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            pinned.copy_(tensor)
            return pinned
        except RuntimeError:  # no page-locked memory to be had: the ordinary copy
            pass
    return tensor.to("cpu").contiguous()


def unpack(spec: Any, tensors: dict[str, Any], device: str | None = None, layouts: bool = False,
           _storages: dict | None = None) -> Any:
    """The value ``pack`` described. ``layouts``: a spec the reference side wrote for a problem's
    inputs, whose strided views are rebuilt; a spec from the candidate's side may not hold one (a
    view of a huge shape over a few stored elements would be materialized by the comparisons).
    Views of one stored stretch share one storage, and views of it with one shape, strides and
    offset are one tensor (``[x, x]`` arrives as one object twice)."""
    import torch

    if _storages is None:
        _storages = {}

    if not isinstance(spec, dict) or len(spec) != 1:
        raise TensorIOError(f"malformed value spec {str(spec)[:80]}")
    (kind, payload), = spec.items()
    if kind == "tensor":
        if payload not in tensors:
            raise TensorIOError(f"tensor {payload!r} missing from the file")
        tensor = tensors[payload]
        return tensor.to(device) if device else tensor
    if kind == "permuted":
        if (not isinstance(payload, list) or len(payload) != 2 or payload[0] not in tensors
                or not isinstance(payload[1], list) or sorted(payload[1]) != list(range(tensors[payload[0]].dim()))
                or not all(type(d) is int for d in payload[1])):
            raise TensorIOError("malformed permuted tensor spec")
        key, order = payload
        inverse = sorted(range(len(order)), key=order.__getitem__)
        tensor = tensors[key].permute(inverse)
        return tensor.to(device) if device else tensor
    if kind == "strided":
        if not layouts:
            raise TensorIOError("a strided view where only plain tensors may be")
        if (not isinstance(payload, list) or len(payload) != 4 or not isinstance(payload[0], str)
                or payload[0] not in tensors or not isinstance(payload[1], list) or not isinstance(payload[2], list)
                or len(payload[1]) != len(payload[2])
                or not all(type(v) is int and v >= 0 for v in [*payload[1], *payload[2], payload[3]])):
            raise TensorIOError("malformed strided tensor spec")
        key, shape, stride, offset = payload
        reach = tensors[key]
        if reach.dim() != 1 or 0 in shape or view_span(shape, stride, offset) > reach.numel():
            raise TensorIOError("strided tensor spec reaches past its stored elements")
        # A storage of its own, starting where the stored stretch starts, as the problem's did;
        # one for every view of the stretch (inputs that shared a storage share this one).
        if key not in _storages:
            _storages[key] = ((reach.to(device, copy=True) if device else reach.clone()), {})
        own, views = _storages[key]
        geometry = (tuple(shape), tuple(stride), offset)
        if geometry not in views:
            views[geometry] = own.as_strided(shape, stride, offset)
        return views[geometry]
    if kind in ("list", "tuple"):
        if not isinstance(payload, list):
            raise TensorIOError(f"malformed {kind} spec")
        items = [unpack(v, tensors, device, layouts, _storages) for v in payload]
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


# safetensors' names of the dtypes written by ``_safetensors_parts`` (others go through safetensors).
_SAFETENSORS_DTYPES = {
    "float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64", "int32": "I32",
    "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL",
}


def _safetensors_parts(tensors: dict[str, Any]) -> list | None:
    """The safetensors file of ``tensors`` as a list of buffers (the header, then each tensor's own
    memory, not copied), or None when a tensor is of a dtype or kind not handled here."""
    import json

    import torch

    header: dict[str, Any] = {}
    views, offset = [], 0
    # Larger elements first (as safetensors orders them): every tensor then starts aligned to its
    # element size, so a reader can use the buffer in place.
    for name in sorted(tensors, key=lambda n: (-tensors[n].element_size(), n)):
        tensor = tensors[name]
        code = _SAFETENSORS_DTYPES.get(str(tensor.dtype).replace("torch.", ""))
        if code is None or tensor.device.type != "cpu" or tensor.layout != torch.strided \
                or not tensor.is_contiguous():
            return None
        size = tensor.numel() * tensor.element_size()
        header[name] = {"dtype": code, "shape": list(tensor.shape), "data_offsets": [offset, offset + size]}
        if size:
            views.append(memoryview(tensor.reshape(-1).view(torch.uint8).numpy()))
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    return [len(text).to_bytes(8, "little"), text, *views]


def save_tensors(path: str, tensors: dict[str, Any]) -> None:
    """Write ``tensors`` as a safetensors file, straight from the tensors' memory."""
    with open(path, "wb") as fh:
        for part in tensor_parts(tensors):
            fh.write(part)


def tensor_parts(tensors: dict[str, Any]) -> list:
    """The safetensors file of ``tensors`` as buffers to write one after another: views of the
    tensors' own memory where ``_safetensors_parts`` handles them, else one serialized copy."""
    parts = _safetensors_parts(tensors)
    if parts is None:
        from safetensors.torch import save

        return [save(tensors)]
    return parts


def tensor_bytes(tensors: dict[str, Any]) -> bytes:
    """The safetensors file of ``tensors`` as bytes (to hash exactly what is written)."""
    return b"".join(tensor_parts(tensors))


def tensors_in_buffer(data: bytearray) -> dict[str, Any]:
    """The tensors of a safetensors file read into ``data``, as views of it (no copy); a file this
    module did not write (another dtype, unaligned data) is parsed by safetensors instead."""
    import json

    import torch

    try:
        length = int.from_bytes(data[:8], "little")
        header = json.loads(bytes(data[8:8 + length]))
        start = 8 + length
        names = {code: name for name, code in _SAFETENSORS_DTYPES.items()}
        tensors = {}
        for key, entry in header.items():
            if key == "__metadata__":
                continue
            dtype = getattr(torch, names.get(entry["dtype"], ""), None)
            begin, end = (int(v) for v in entry["data_offsets"])
            shape = [int(v) for v in entry["shape"]]
            if not isinstance(dtype, torch.dtype) or not 0 <= begin <= end <= len(data) - start:
                raise ValueError(key)
            size = torch.empty((), dtype=dtype).element_size()
            count = (end - begin) // size
            if (start + begin) % size or count * size != end - begin or count != math.prod(shape):
                raise ValueError(key)
            flat = torch.frombuffer(data, dtype=dtype, offset=start + begin, count=count) if count \
                else torch.empty(0, dtype=dtype)
            tensors[key] = flat.view(shape)
        return tensors
    except (ValueError, KeyError, TypeError, RuntimeError):
        from safetensors.torch import load

        try:
            return load(bytes(data))
        except Exception as exc:  # safetensors raises several types for malformed files
            raise TensorIOError(f"unreadable tensor data: {type(exc).__name__}: {str(exc)[:120]}") from None


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
