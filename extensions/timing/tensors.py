"""The tensors of a model output: the one walk the timer and the verifier both use.

A leaf: it imports nothing of the project, so the verifier (a layer above the timer) and the timer
read an output the same way.

A model's output is the candidate's object. Its methods (``detach``, ``cpu``, ``numel``,
``data_ptr``) are looked up on its class and on the object itself, so a tensor subclass, or a
plain tensor given an instance attribute ``detach``, runs the candidate's code wherever the reader
calls one, after forward has returned and outside every audited region. ``plain_output`` is
therefore the first thing done with an output: it accepts torch's own tensor types only and hands
back fresh aliases (same storage, no attributes) made by an unbound call of torch's own
``detach``; everything after it reads those.
"""
from __future__ import annotations

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
