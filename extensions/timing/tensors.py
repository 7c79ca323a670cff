"""Tensors as the timer and the verifier both read them: the walk over a model output, and the
stretch of storage a strided view reaches.

A leaf: it imports nothing of the project, so the verifier (a layer above the timer) and the timer
read an output, and lay out an input, the same way.

A model's output is the candidate's object. Its methods (``detach``, ``cpu``, ``numel``,
``data_ptr``) are looked up on its class and on the object itself, so a tensor subclass, or a
plain tensor given an instance attribute ``detach``, runs the candidate's code wherever the reader
calls one, after forward has returned and outside every audited region. ``plain_output`` is
therefore the first thing done with an output: it accepts torch's own tensor types only and hands
back fresh aliases (same storage, no attributes) made by an unbound call of torch's own
``detach``; everything after it reads those.
"""
from __future__ import annotations

import functools
from typing import Any


class ForeignTensorType(TypeError):
    """A tensor whose type is not one of torch's own (a subclass a candidate defined): its methods
    are the candidate's code, so nothing is read through them."""


def flatten_tensors(value: Any) -> list[Any]:
    """Every tensor in a nested output (a tensor, or nested tuples/lists of them), in order."""
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in flatten_tensors(v)]
    return []


def map_tensors(value: Any, fn) -> Any:
    """``value`` with every tensor of a nested list or tuple replaced by ``fn(tensor)``."""
    import torch

    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, (list, tuple)):
        return type(value)(map_tensors(v, fn) for v in value)
    return value


def with_elements(value: Any, places: list) -> Any:
    """``value`` with, per tensor (``flatten_tensors`` order), the elements at flat indices set:
    ``places`` holds None (the tensor as it is) or ``(flat indices, values)`` for each tensor, and
    each such tensor becomes a contiguous copy with those values there."""
    import torch

    rebuilt = []
    for tensor, place in zip(flatten_tensors(value), places):
        if place is None:
            rebuilt.append(tensor)
            continue
        index, values = place
        flat = torch.Tensor.clone(tensor, memory_format=torch.contiguous_format).reshape(-1)
        flat[index] = values
        rebuilt.append(flat.view(tensor.shape))
    pieces = iter(rebuilt)
    return map_tensors(value, lambda _tensor: next(pieces))


def own_tensor_types() -> tuple:
    """The tensor types whose methods are all torch's: ``torch.Tensor`` and ``nn.Parameter``."""
    import torch

    return (torch.Tensor, torch.nn.Parameter)


def plain_tensor(value: Any, what: str = "a tensor") -> Any:
    """A new ``torch.Tensor`` object over ``value``'s data (same storage, offset, shape and
    strides; no instance attributes), made without calling anything ``value`` or its class
    defines. ``value`` must be exactly ``torch.Tensor`` or ``nn.Parameter``; any other type
    raises ``ForeignTensorType`` (``what`` names the value in the message)."""
    import torch

    kind = type(value)
    if kind not in own_tensor_types():
        raise ForeignTensorType(f"{what} of type {kind.__name__}: only torch.Tensor is accepted "
                                "(a tensor subclass's methods would run when the verifier reads it)")
    return torch._C.TensorBase.detach(value)


def plain_output(value: Any, what: str = "output") -> Any:
    """``value`` (a tensor, or nested lists/tuples of tensors and plain values) with every tensor
    replaced by its ``plain_tensor`` alias and every list or tuple by a plain list or tuple, read
    through the base classes' own iteration (a tuple subclass's methods are never called)."""
    import torch

    if isinstance(value, torch.Tensor):
        return plain_tensor(value, f"{what} tensor")
    if isinstance(value, list):
        return [plain_output(v, what) for v in list.__iter__(value)]
    if isinstance(value, tuple):
        return tuple(plain_output(v, what) for v in tuple.__iter__(value))
    return value


@functools.lru_cache(maxsize=None)
def _lone_counts(aliases: int) -> tuple[int, int]:
    """(storage use count, Python references of its storage object) of a storage that nothing but
    ``aliases`` plain aliases holds, as ``held_elsewhere`` reads them: measured here rather than
    assumed, since torch's preservation of storage objects has changed these numbers between
    versions. Once per alias count and process: they depend on the torch build alone."""
    import sys

    import torch

    base = torch.empty(1)
    group = [torch._C.TensorBase.detach(base) for _ in range(aliases)]
    del base
    storage = torch.Tensor.untyped_storage(group[0])
    return torch._C._storage_Use_Count(storage._cdata), sys.getrefcount(storage)


def _held(groups: dict) -> set[int]:
    import sys

    import torch

    held = set()
    for address, group in groups.items():
        uses, references = _lone_counts(len(group))
        storage = torch.Tensor.untyped_storage(next(iter(group.values())))
        if torch._C._storage_Use_Count(storage._cdata) > uses or sys.getrefcount(storage) > references:
            held.add(address)
    return held


def held_elsewhere(value: Any, exclude: frozenset | set = frozenset()) -> set[int]:
    """Storage addresses of the tensors in ``value`` (plain aliases only: nothing of the model's is
    called) that something besides those aliases still holds once forward has returned: a tensor
    or a view the model keeps (in itself, a module-level table, a closure, a default argument), or
    the storage object itself. Such an output is a buffer the model can write again, so a caller's
    result changes under a later call; a ring of buffers longer than the calls a check makes is
    seen at its first call. Storages in ``exclude`` (the inputs', the weights': flagged on their
    own) are skipped."""
    import gc

    import torch

    groups: dict[int, dict[int, Any]] = {}
    for tensor in flatten_tensors(value):
        if isinstance(tensor, torch.Tensor) and tensor.numel() > 0:
            address = torch.Tensor.untyped_storage(tensor).data_ptr()
            if address not in exclude:
                groups.setdefault(address, {})[id(tensor)] = tensor
    held = _held(groups)
    if held:
        # Garbage is not a holder: Triton's interpreter leaves every launch's arguments in a
        # reference cycle (a recursive closure over its table of storages) until the collector
        # runs, and honest code can make cycles too. Nothing collected runs a candidate's code:
        # its classes may define no finaliser. The young generations first (about a millisecond;
        # a full collection takes a tenth of a second where torch is loaded).
        for generation in (1, 2):
            gc.collect(generation)
            held = _held({address: groups[address] for address in held})
            if not held:
                break
    return held


def view_span(shape: list[int], strides: list[int], offset: int) -> int:
    """How many elements of its storage, from the storage's start, a non-empty view with
    non-negative strides reaches."""
    return offset + 1 + sum((n - 1) * s for n, s in zip(shape, strides))


def stored_stretch(tensor: Any, span: int) -> Any:
    """The first ``span`` elements of ``tensor``'s storage as one flat view: a strided view's
    elements and the memory between them (``view_span``), what the verifier stores and places for
    a sliced or expanded input and what the timer copies into its fixed buffers. Read without
    calling anything the tensor's object carries."""
    import torch

    return torch.as_strided(torch._C.TensorBase.detach(tensor), (span,), (1,), 0)


def storage_groups(values: Any) -> list[list[int]]:
    """The positions in ``values`` (a list) of the tensors that share a storage with another of
    them, one list per storage, in order of first appearance: ``[x, x]``, or two column slices of
    one matrix. A problem's forward gets its inputs so; a copy per tensor would judge a kernel on
    separate storages it never meets, and a forward writing into one of them would not change the
    other. Tensors of one storage viewed as different dtypes are left out (their element offsets
    do not compare), as are empty ones. Read without calling anything the tensors carry."""
    import torch

    by_storage: dict[tuple, list[int]] = {}
    for position, tensor in enumerate(values):
        if (isinstance(tensor, torch.Tensor) and tensor.layout == torch.strided
                and torch._C.TensorBase.numel(tensor) > 0):
            storage = torch.Tensor.untyped_storage(tensor)
            by_storage.setdefault((str(tensor.device), storage.data_ptr()), []).append(position)
    return [members for members in by_storage.values()
            if len(members) > 1 and len({values[p].dtype for p in members}) == 1]


def group_span(values: Any, members: list[int]) -> int:
    """How many elements of their common storage, from its start, the tensors of ``values`` at
    ``members`` (a ``storage_groups`` group) reach together."""
    import torch

    base = torch._C.TensorBase
    return max(view_span(list(values[p].shape), list(base.stride(values[p])), base.storage_offset(values[p]))
               for p in members)


def views_over(stretch: Any, values: Any, members: list[int]) -> dict[int, Any]:
    """Per position in ``members`` (a ``storage_groups`` group of ``values``): its tensor viewed on
    ``stretch`` (a flat storage standing for theirs from its start) with its own shape, strides
    and offset; one view per tensor object, so a tensor passed twice stays one tensor."""
    import torch

    base = torch._C.TensorBase
    by_object: dict[int, Any] = {}
    views: dict[int, Any] = {}
    for position in members:
        tensor = values[position]
        if id(tensor) not in by_object:
            by_object[id(tensor)] = stretch.as_strided(tensor.shape, base.stride(tensor), base.storage_offset(tensor))
        views[position] = by_object[id(tensor)]
    return views
