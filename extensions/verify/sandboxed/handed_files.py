"""The worker's side of the file handover: every file the parent writes into the sandbox is read
once, checked against the SHA-256 the parent sent on the private control channel and deleted, and
only the checked bytes are used. Under process isolation other processes of the same user can
write the candidate's directory; a file changed in between is refused as a failure of the sandbox.
"""
from __future__ import annotations

import hashlib
import json
import os
import weakref
from typing import Any

CANDIDATE_FILE = "candidate.py"


class AlteredFile(Exception):
    """A file the parent wrote does not hash to what the parent sent: another process changed it.
    The sandbox failed, not the candidate."""


def read_checked(name: str, expected_sha: str) -> bytes:
    """The bytes of ``name``, read once and checked against the SHA-256 the parent sent on the
    private control channel (under process isolation other processes of this user can write the
    candidate's directory); the file is used only through these bytes."""
    with open(name, "rb") as fh:
        data = fh.read()
    if hashlib.sha256(data).hexdigest() != expected_sha:
        raise AlteredFile(f"{name} was altered by another process")
    return data


def read_checked_buffer(name: str, expected_sha: str) -> bytearray:
    """``read_checked`` into a writable buffer, for tensors used in place (``tensors_in_buffer``)."""
    data = bytearray(os.path.getsize(name))
    with open(name, "rb") as fh:
        if fh.readinto(data) != len(data) or fh.read(1):
            raise AlteredFile(f"{name} changed size while it was read")
    if hashlib.sha256(data).hexdigest() != expected_sha:
        raise AlteredFile(f"{name} was altered by another process")
    return data


def read_job(hashes: list[str]) -> tuple[dict, list, bytes]:
    """The job, the init inputs (both deleted once read: no input exists while the candidate is
    imported and built) and the candidate's checked bytes. ``hashes``: job, init, candidate."""
    from safetensors.torch import load as load_tensor_bytes

    from ..common.tensor_io import unpack

    if len(hashes) != 3:
        raise AlteredFile("the start command carries no file hashes")
    job_sha, init_sha, candidate_sha = hashes
    job = json.loads(read_checked("job.json", job_sha))
    tensors = load_tensor_bytes(read_checked(job["init_file"], init_sha))
    inits = [unpack(spec, tensors) for spec in job["inits"]]
    for name in ("job.json", job["init_file"]):
        os.remove(name)
    return job, inits, read_checked(CANDIDATE_FILE, candidate_sha)


def take_handed(stem: str, device: str, hashes: list[str]) -> tuple[list, dict]:
    """The values the parent handed over as ``stem``.safetensors + ``stem``.json (deleted once
    read: a set's inputs exist only from just before its run), and the JSON's other fields.
    ``hashes`` (tensors, JSON) came with the command that announced them."""
    from ..common.tensor_io import tensors_in_buffer, unpack

    if len(hashes) != 2:
        raise AlteredFile(f"no hashes came with {stem}")
    handed = json.loads(read_checked(stem + ".json", hashes[1]))
    tensors = tensors_in_buffer(read_checked_buffer(stem + ".safetensors", hashes[0]))
    for suffix in (".json", ".safetensors"):
        os.remove(stem + suffix)
    values = spaced_apart([unpack(spec, tensors, layouts=True) for spec in handed.pop("values")], device)
    return values, handed


# Inputs sit in one fresh buffer with a gap before and after each: one to 16 blocks of 512 bytes,
# drawn from the OS per tensor, holding all-ones bytes (NaN in every float dtype, -1 in the signed
# integer ones). Read straight from the handed file, a set's inputs would lie back to back, and a
# kernel reading past the end of one input would read the next one: a cat that copies 2n elements
# from its first input was judged correct on CPU. A gap of unknown size makes such a read NaN.
# Each input owns a storage of its own bytes (storage offset 0, as a fresh tensor): a view into
# the buffer would tell a kernel that it is being judged (``x.storage_offset() > 0``), and one
# right only then passed.
# All-ones bytes are also a tell of their own: a kernel that reads the element before or after its
# input finds NaN only when judged. So every other set has the gaps filled with values drawn from
# the input beside them instead (``fill_gaps``), and a kernel right only beside NaN, or only
# beside data, fails one of them. After each call the gaps must be as filled: a write there is a
# write into the caller's memory around its tensor (``gaps_intact``).
_GAP_BLOCK = 512


class _Placement:
    """The buffer one set's inputs were placed in, and its gaps: ``(start, end, values)`` in bytes,
    with the host values of the input beside each gap (the one before it; the first input for the
    first gap) that a data-like fill draws from."""

    def __init__(self, buffer, gaps: list):
        self.buffer, self.gaps = buffer, gaps


# The placement of every placed tensor still alive, by the tensor's id (dropped when it dies).
_PLACEMENTS: dict[int, _Placement] = {}


def _register(view, placement: _Placement) -> None:
    key = id(view)
    _PLACEMENTS[key] = placement
    weakref.finalize(view, _PLACEMENTS.pop, key, None)


def _byte_region(buffer, start: int, end: int, device: str):
    import torch

    return torch.empty(0, dtype=torch.uint8, device=device).set_(buffer[start:end])


def fill_gaps(values: Any, data_like: bool) -> list:
    """Fills the gaps around the placed tensors of ``values`` for the next call: all-ones bytes,
    or (``data_like``) elements drawn from the input beside each gap. Returns each gap with its
    contents, for ``gaps_intact``."""
    import torch

    from extensions.timing.tensors import flatten_tensors

    placements = {id(p): p for p in (_PLACEMENTS.get(id(t)) for t in flatten_tensors(values)) if p is not None}
    filled = []
    for placement in placements.values():
        device = placement.buffer.device.type
        for start, end, source in placement.gaps:
            region = _byte_region(placement.buffer, start, end, device)
            pool = source.reshape(-1)
            if not data_like or pool.numel() == 0 or (end - start) % pool.element_size():
                region.fill_(255)
            elif pool.dtype == torch.bool:
                region.copy_(torch.randint(0, 2, (end - start,), dtype=torch.uint8))
            else:
                elements = region.view(pool.dtype)
                elements.copy_(pool[torch.randint(0, pool.numel(), (elements.numel(),))])
            filled.append((region, region.clone()))
    return filled


def gaps_intact(filled: list) -> bool:
    """Whether every gap ``fill_gaps`` filled still holds what it was filled with."""
    import torch

    return all(torch.equal(region, expected) for region, expected in filled)


def spaced_apart(values: list, device: str) -> list:
    """``values`` with every tensor copied to ``device`` into a buffer of its own set, with gaps.
    Tensors that share a storage (``storage_units``: ``[x, x]``, two slices of one matrix) share
    one place in it, as they shared the problem's storage: the memory between one view's elements
    that another view holds is that view's, not a gap."""
    import torch

    from extensions.timing.tensors import flatten_tensors, map_tensors, views_over

    from ..common.tensor_io import memory_order, storage_units, stored_stretch

    tensors = flatten_tensors(values)  # strided host tensors, as read from the handed file
    if not tensors:
        return values
    units = storage_units(tensors)
    slots, end = [], 0  # each storage's (offset, bytes) in the buffer
    for positions, span in units:
        first = tensors[positions[0]]
        end += _GAP_BLOCK * (1 + os.urandom(1)[0] % 16)
        size = (span if span is not None else first.numel()) * first.element_size()
        slots.append((end, size))
        end += -(-size // _GAP_BLOCK) * _GAP_BLOCK
    end += _GAP_BLOCK * (1 + os.urandom(1)[0] % 16)
    buffer = torch.full((end,), 255, dtype=torch.uint8, device=device).untyped_storage()
    gaps, previous_end = [], 0
    for index, (offset, size) in enumerate(slots):
        beside = units[max(index - 1, 0)]
        gaps.append((previous_end, offset, _stored_values(tensors[beside[0][0]], beside[1])))
        previous_end = offset + size
    gaps.append((previous_end, end, _stored_values(tensors[units[-1][0][0]], units[-1][1])))
    placement = _Placement(buffer, [gap for gap in gaps if gap[1] > gap[0]])
    placed = {}
    for (positions, span), (offset, size) in zip(units, slots):
        first = tensors[positions[0]]
        # A slice of a storage is a storage of its own that keeps the buffer alive.
        own = torch.empty(0, dtype=torch.uint8, device=device).set_(buffer[offset:offset + size])
        view = own.view(first.dtype)
        if span is not None:
            # Slices, expanded views or views sharing one storage, with the stretch they reach
            # (``unpack`` gave it a storage of its own starting there): the stretch is copied
            # whole, then viewed alike.
            view.copy_(stored_stretch(first, span))
            for position, tensor_view in views_over(view, tensors, positions).items():
                placed.setdefault(id(tensors[position]), tensor_view)
        else:
            # The handed layout as it was packed (a permutation of a contiguous one, or contiguous).
            view = view.view(first.shape) if memory_order(first) is None else \
                view.as_strided(first.shape, first.stride())
            view.copy_(first)
            placed[id(first)] = view
    for view in {id(v): v for v in placed.values()}.values():
        _register(view, placement)
    return map_tensors(values, lambda t: placed[id(t)])


# How many of an input's values a gap's data-like fill draws from: a sample is kept, not the
# host tensor, which would otherwise live on beside its copy on the device for the whole run.
_GAP_POOL = 2048


def _stored_values(tensor, span):
    """A sample of the values a placed tensor's storage holds (the whole stretch ``span`` where
    it was stored as one)."""
    import torch

    from ..common.tensor_io import stored_stretch

    values = stored_stretch(tensor, span) if span is not None else tensor.reshape(-1)
    if values.numel() <= _GAP_POOL:
        return values.clone()
    return values[torch.randint(0, values.numel(), (_GAP_POOL,))]


def into_previous_tensors(previous: Any, inputs: Any) -> Any:
    """``inputs``' values in the tensor objects of the previous set when every tensor has the same
    shape, dtype, device and strides (and the other arguments are equal): a forward that keys a
    cache on the tensors' identity or address (``id(x)``, ``x.data_ptr()``) then answers a new set
    with an old output. Otherwise ``inputs`` itself.

    The previous tensors were in the candidate's hands, which may have given them instance
    attributes (``x.copy_ = f``): they are read and written through torch's own methods, called
    unbound, so nothing the candidate attached runs here, outside the audited call."""
    import torch

    from extensions.timing.tensors import storage_groups

    from ..common.tensor_io import overlaps_itself, stored_spans, stored_stretch

    base = torch._C.TensorBase
    if not isinstance(previous, list) or not isinstance(inputs, list) or len(previous) != len(inputs):
        return inputs
    if storage_groups(previous) != storage_groups(inputs):
        return inputs  # the previous tensors share storages otherwise than the new ones do
    for old, new in zip(previous, inputs):
        if type(old) is torch.Tensor and type(new) is torch.Tensor:
            if (old.shape, old.dtype, old.device, base.stride(old), base.storage_offset(old)) != (
                    new.shape, new.dtype, new.device, base.stride(new), base.storage_offset(new)):
                return inputs
            if overlaps_itself(list(old.shape), list(base.stride(old))):
                return inputs  # an expanded view cannot be written element by element
        elif isinstance(old, torch.Tensor) or isinstance(new, torch.Tensor) or type(old) is not type(new) or old != new:
            return inputs
    spans = stored_spans(inputs)
    with torch.no_grad():
        for old, new, span in zip(previous, inputs, spans):
            if type(old) is torch.Tensor:
                if span is None:
                    base.copy_(old, new)
                else:
                    # A slice: the memory between its elements is the new set's too (each set
                    # varies it as it varies the elements), not what the previous set had there;
                    # views of one storage get the whole stretch they share.
                    base.copy_(stored_stretch(old, span), stored_stretch(new, span))
    return previous
