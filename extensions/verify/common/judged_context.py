"""The calling context of an input set: the module's mode (``training``) and grad mode.

A harness that always calls forward in one context (training mode, grad off) judges a constant a
candidate can read: ``self.training``, or ``requires_grad`` of a clone of one of its parameters
(true exactly when grad mode is on). A kernel exact only in that context was accepted, and is
wrong where a user calls it in eval mode or with grad on. So a few sets run in the other contexts
(``CONTEXTS``), the reference in the same one as the candidate (``reference.builder``).

The mode is set as a user's ``model.eval()`` sets it, through ``nn.Module.train`` (unbound:
torch's own method, which a candidate may not redefine), so whatever a candidate's module reads
to tell its mode reads what it would read in a user's call. The flags as constructed are read from
each module's instance dictionary (no method of the candidate's runs) and put back after the call.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

# (eval mode, grad mode on) of the sets run outside the harness's own context (training mode, grad
# off): a user's inference call, a user's training call, and the pair a kernel keyed on both
# flags at once would otherwise be judged in alone.
CONTEXTS = ((True, False), (False, True), (True, True))


def describe(context: dict | None) -> str:
    """``eval, grad on`` for a set's context; '' for the harness's own."""
    if not context:
        return ""
    return ", ".join(part for part, on in (("eval mode", context.get("eval")), ("grad on", context.get("grad"))) if on)


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
def judged_context(model: Any, context: dict | None) -> Iterator[None]:
    """Call ``model`` in ``context`` (``{"eval": bool, "grad": bool}``; None: training mode as
    constructed, grad off) inside the block; the modules' flags are put back after it."""
    import torch

    context = context or {}
    grad = torch.enable_grad() if context.get("grad") else torch.no_grad()
    if not context.get("eval"):
        with grad:
            yield
        return
    flags = training_flags(model)
    torch.nn.Module.train(model, False)
    try:
        with grad:
            yield
    finally:
        _set_training(flags)
