"""Constant-initialised parameters get the same random values in the reference and the candidate.

Norm layers start with weight = 1 and bias = 0 (``nn.LayerNorm``, ``nn.BatchNorm*``,
``nn.GroupNorm``), and many problems create ``nn.Parameter(torch.zeros(...))`` or ``torch.ones``:
at those values a kernel that never reads the parameter gives the right answer, and no input set
can tell. So right after construction, every floating-point parameter of the reference whose
elements are all equal is replaced by noise around its value, and the candidate's model gets the
same noise on its tensors of the same kind.

Pairing without names: a candidate may name, flatten, transpose-free copy or re-register a
parameter however it likes, so a tensor is identified by its *key*: element count and constant
value (``numel:value``). The candidate side touches only keys the reference perturbed, and looks
at its parameters, buffers and plain tensor attributes of its modules (an honest kernel may hold
LayerNorm's weight as any of these), read through nn.Module's tables without calling any of the
candidate's methods (``model_tensors.py``).

A key held by one reference parameter: its noise is drawn from the batch's secret seed and the key
alone, and every candidate tensor of that key gets it (in row-major order), whatever its name.

A key held by several reference parameters (*tied*: two ``nn.LayerNorm(96)``, ``BatchNorm2d(128)``
beside ``GroupNorm(8, 128)``): one noise for all of them would let a kernel use one where the
other belongs (the first norm's weight twice) and pass. So each member gets noise of its own
(seed, key and its index in the reference's registration order), and the candidate's tensors of
that key are paired with the members:

1. Tensors that share memory (a parameter and a view of it held as an attribute) are one tensor.
2. One that carries a reference parameter's name (module path and attribute, ``norm1.weight``,
   under any of its names, as a parameter, buffer or attribute) takes that member's noise.
3. One that carries the name of a reference *buffer* of the same key and no parameter's name
   (BatchNorm's ``running_var`` beside a LayerNorm weight) is that buffer's counterpart: the
   reference did not perturb it, and it is left alone.
4. The rest take the members not yet paired, both in registration order (the candidate's walk is
   ``model.modules()``'s pre-order, per module its parameters, then buffers, then attributes).
5. Tensors left over keep their initial value; members left over gave their noise to nobody.

Why no shared noise, ever, for a tied key: any rule that falls back to one noise where the pairing
is unclear hands that fallback to an adversary, who reaches it by renaming, by adding a spare
tensor of the same key, or simply by holding one tensor where the reference has two (the natural
shape of the cheat). Under the rule above every candidate tensor holds at most one member's noise
and no member's noise reaches two of them, whatever names and order the candidate picks, so a
kernel that reads one stored tensor in two roles sees, in one of them, values the reference's
parameter does not hold. A kernel that swaps two tensors while keeping the reference's names is
paired by name and fails; one that renames them is paired by order, and a swap under new names is
an honest relabelling, right by the only account of the roles the verifier has. Varying per input
set which member gets which noise was the other option; it still needs a pairing to give the
candidate the matching values, so it adds nothing to this one.

Limits (false rejects of an honest kernel): tied tensors both renamed *and* held in another order
than the reference registers them (also a buffer ahead of a parameter in one module, since the
walk lists parameters first); a same-key helper of its own (a clone of a weight, a ``torch.ones``
of the same size) under a new name ahead of the real ones in the walk; a tied parameter packed with
others into one tensor (as for any key, it keeps its initial value).

Values stay near the original (``v + max(|v|, 1) * u``, ``u`` in [-0.5, 0.5)): ones stay
positive, zeros become small signed numbers, so a variance-like parameter keeps its sign.

``constant_parameter_keys`` gives one entry per key: the key itself for a key of one parameter,
``{"key", "names", "buffers"}`` (the members' names in registration order, the reference's
buffers of that key) for a tied key; the entries travel as JSON to the candidate's worker.
"""
from __future__ import annotations

import hashlib
from typing import Any, Iterable

from .model_tensors import named_module_tensors


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


def constant_parameter_keys(model) -> list:
    """One entry per key of the reference's floating-point parameters whose elements are all
    equal, sorted by key: the key (a string) where one parameter holds it, else the tied group
    ``{"key": key, "names": [...], "buffers": [...]}``."""
    members: dict[str, list[str]] = {}
    for name, parameter in model.named_parameters():
        key = _key(parameter)
        if key is not None:
            members.setdefault(key, []).append(name)
    buffers: dict[str, list[str]] = {}
    for name, buffer in model.named_buffers():
        key = _key(buffer)
        if key in members:
            buffers.setdefault(key, []).append(name)
    entries: list = []
    for key in sorted(members):
        names = members[key]
        entries.append(key if len(names) == 1 else {"key": key, "names": names, "buffers": buffers.get(key, [])})
    return entries


def _noise(seed: int, key: str, like, member: int = 0) -> Any:
    import torch

    label = f"{int(seed)}|{key}" if member == 0 else f"{int(seed)}|{key}|{member}"
    digest = hashlib.sha256(label.encode()).digest()
    generator = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)
    numel, value = key.split(":", 1)
    base = float(value)
    u = torch.rand(int(numel), generator=generator, dtype=torch.float64) - 0.5
    values = base + max(abs(base), 1.0) * u
    return values.to(dtype=like.dtype).reshape(like.shape).to(like.device)


def _entries(keys: Iterable) -> tuple[set[str], dict[str, dict]]:
    single: set[str] = set()
    tied: dict[str, dict] = {}
    for entry in keys:
        if isinstance(entry, str):
            single.add(entry)
        elif isinstance(entry, dict) and isinstance(entry.get("key"), str):
            tied[entry["key"]] = {"names": [str(n) for n in entry.get("names") or []],
                                  "buffers": {str(n) for n in entry.get("buffers") or []}}
    return single, tied


def pair_tied(names: list[str], buffers: set[str], held: list[list[str]]) -> tuple[list[int | None], str]:
    """For each candidate tensor of a tied key (the names it is held under, in walk order), the
    index of the reference member whose noise it takes, or None; and how the pairing was made
    (``names``, ``order``, ``names+order``; ``+unpaired`` where a tensor or a member is left)."""
    pairs: list[int | None] = [None] * len(held)
    taken: set[int] = set()
    by_name = {name: index for index, name in enumerate(names)}
    counterparts: set[int] = set()
    for position, held_names in enumerate(held):
        matches = [by_name[n] for n in held_names if n in by_name and by_name[n] not in taken]
        if matches:
            pairs[position] = matches[0]
            taken.add(matches[0])
        elif any(n in buffers for n in held_names):
            counterparts.add(position)
    named = len(taken)
    free = iter(i for i in range(len(names)) if i not in taken)
    for position in range(len(held)):
        if pairs[position] is None and position not in counterparts:
            index = next(free, None)
            if index is None:
                break
            pairs[position] = index
            taken.add(index)
    how = "names" if named == len(taken) else ("order" if named == 0 else "names+order")
    left = sum(1 for p, pair in enumerate(pairs) if pair is None and p not in counterparts)
    if left or len(taken) < len(names):
        how += "+unpaired"
    return pairs, how


def apply_parameter_noise(model, seed: int, keys: Iterable, reference: bool, report: dict | None = None) -> int:
    """Replace the values of ``model``'s tensors whose key is among ``keys`` (the entries of
    ``constant_parameter_keys``): the parameters of a reference model, or (``reference=False``)
    the parameters, buffers and tensor attributes of a candidate's modules, a tied key's by the
    pairing above. ``report`` gets, per tied key, how its tensors were paired. Returns how many
    tensors changed."""
    import torch

    single, tied = _entries(keys)
    if not single and not tied:
        return 0
    changed = 0
    with torch.no_grad():
        if reference:
            for name, tensor in model.named_parameters():
                key = _key(tensor)
                if key in single:
                    tensor.copy_(_noise(seed, key, tensor))
                    changed += 1
                elif key in tied and name in tied[key]["names"]:
                    tensor.copy_(_noise(seed, key, tensor, tied[key]["names"].index(name)))
                    changed += 1
            return changed
        # The candidate's model is read through nn.Module's tables, never its (overridable) methods.
        groups: dict[str, list[tuple[list[str], list[Any]]]] = {}
        shared: dict[tuple, tuple[list[str], list[Any]]] = {}
        for names, tensor in named_module_tensors(model, attributes=True):
            key = _key(tensor)
            if key in single:
                tensor.copy_(_noise(seed, key, tensor))
                changed += 1
            elif key in tied:
                memory = (key, tensor.data_ptr(), tensor.device.type)
                if memory in shared:  # another view of a tensor already listed: one tensor
                    shared[memory][0].extend(names)
                    shared[memory][1].append(tensor)
                    continue
                shared[memory] = (list(names), [tensor])
                groups.setdefault(key, []).append(shared[memory])
        for key, held in groups.items():
            pairs, how = pair_tied(tied[key]["names"], tied[key]["buffers"], [names for names, _ in held])
            if report is not None:
                report[key] = how
            for (_names, tensors), index in zip(held, pairs):
                if index is not None:
                    # Through a contiguous view where there is one: row-major as the reference's.
                    target = next((t for t in tensors if t.is_contiguous()), tensors[0])
                    target.copy_(_noise(seed, key, target, index))
                    changed += 1
        for key in tied.keys() - groups.keys():
            if report is not None:
                report[key] = "unpaired"
    return changed
