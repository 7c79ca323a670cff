"""The calling context of an input set: the module's mode (``training``), grad mode and
inference mode.

A harness that always calls forward in one context (training mode, grad off) judges a constant a
candidate can read: ``self.training``, or ``requires_grad`` of a clone of one of its parameters
(true exactly when grad mode is on). A kernel exact only in that context was accepted, and is
wrong where a user calls it in eval mode or with grad on. So a few sets run in the other contexts
(``CONTEXTS``), the reference in the same one as the candidate (``reference.builder``).

The mode is set as a user's ``model.eval()`` sets it, through ``nn.Module.train`` (unbound:
torch's own method, which a candidate may not redefine), so whatever a candidate's module reads
to tell its mode reads what it would read in a user's call. The flags as constructed are read from
each module's instance dictionary (no method of the candidate's runs) and put back after the call.
A user's inference call is as often made under ``torch.inference_mode()`` as under ``no_grad``,
and a tensor made there says so (``is_inference()``): a kernel exact except there was accepted,
so inference mode is a context of its own.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

# (eval mode, grad mode on, inference mode) of the sets run outside the harness's own context
# (training mode, grad off): a user's inference call under no_grad and under inference_mode, a
# user's training call, and the pair a kernel keyed on both module and grad flags at once would
# otherwise be judged in alone.
CONTEXTS = ((True, False, False), (True, False, True), (False, True, False), (True, True, False))
OWN_CONTEXT = (False, False, False)


def as_dict(context: tuple) -> dict:
    eval_mode, grad, inference = context
    return {"eval": eval_mode, "grad": grad, "inference": inference}


def describe(context: dict | None) -> str:
    """``eval mode, grad on`` for a set's context; '' for the harness's own."""
    if not context:
        return ""
    parts = (("eval mode", context.get("eval")), ("grad on", context.get("grad")),
             ("inference mode", context.get("inference")))
    return ", ".join(part for part, on in parts if on)


def training_flags(model: Any) -> list[tuple[Any, Any]]:
    """Every module reachable through nn.Module's ``_modules`` tables (pre-order) with its
    ``training`` entry as its instance dictionary holds it."""
    flags: list[tuple[Any, Any]] = []
    seen: set[int] = set()
    pending = [model]
    while pending:
        module = pending.pop()
        if id(module) in seen:
            continue
        seen.add(id(module))
        state = object.__getattribute__(module, "__dict__")
        flags.append((module, dict.get(state, "training", True)))
        children = dict.get(state, "_modules")
        if type(children) is dict:
            pending.extend(m for m in reversed(list(dict.values(children))) if m is not None)
    return flags


def _set_training(flags: list[tuple[Any, Any]]) -> None:
    import torch

    # Pre-order: a module's call sets its whole subtree, the later entries set each descendant.
    for module, flag in flags:
        torch.nn.Module.train(module, bool(flag))


@contextlib.contextmanager
def _inputs_need_grad(inputs: list) -> Iterator[None]:
    """The floating-point tensors of ``inputs`` (the harness's own) require grad inside the block,
    as a layer's inputs do in a user's training call (an earlier layer's activations): with grad
    on and inputs that never required it, a kernel keyed on ``x.requires_grad`` was accepted and
    wrong in exactly that call. The flag is cleared after it, so the harness's refill of the
    inputs for the next set is no in-place write into a leaf that requires grad."""
    import torch

    marked = []
    for tensor in inputs:
        if type(tensor) is torch.Tensor and tensor.is_floating_point() and not tensor.requires_grad:
            torch.Tensor.requires_grad_(tensor, True)
            marked.append(tensor)
    try:
        yield
    finally:
        for tensor in marked:
            torch.Tensor.requires_grad_(tensor, False)


@contextlib.contextmanager
def judged_context(model: Any, context: dict | None, inputs: list | None = None) -> Iterator[None]:
    """Call ``model`` in ``context`` (``{"eval": bool, "grad": bool, "inference": bool}``; None:
    training mode as constructed, grad off) inside the block; the modules' flags are put back after
    it. With grad on, the floating-point tensors of ``inputs`` require grad in the block."""
    import torch

    context = context or {}
    if context.get("inference"):
        grad = torch.inference_mode()
    else:
        grad = torch.enable_grad() if context.get("grad") else torch.no_grad()
    needs_grad = _inputs_need_grad(inputs or []) if context.get("grad") else contextlib.nullcontext()
    if not context.get("eval"):
        with grad, needs_grad:
            yield
        return
    flags = training_flags(model)
    torch.nn.Module.train(model, False)
    try:
        with grad, needs_grad:
            yield
    finally:
        _set_training(flags)
