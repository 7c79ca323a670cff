"""A problem's sizes: its elements counted on the meta device (no memory used), and the module-level
size constants that bring it under an element cap, shrunk so that its reference still runs."""
from __future__ import annotations

import types
from typing import Any

from .problem_constants import find_size_constants, is_batch_name, rewrite_constants, shrink_step


def load_problem(source: str, name: str = "problem") -> types.ModuleType:
    module = types.ModuleType(name)
    module.__file__ = f"{name}.py"
    exec(compile(source, f"{name}.py", "exec"), module.__dict__)
    for required in ("Model", "get_inputs", "get_init_inputs"):
        if not hasattr(module, required):
            raise ValueError(f"problem defines no {required}")
    return module


def numel_of(values: Any) -> int:
    import torch

    if isinstance(values, torch.Tensor):
        return values.numel()
    if isinstance(values, (list, tuple)):
        return sum(numel_of(v) for v in values)
    return 0


def meta_input_numel(source: str) -> int:
    """Elements of a problem's inputs (``get_inputs()``), measured on the meta device."""
    import torch

    module = load_problem(source)
    with torch.device("meta"):
        return numel_of(list(module.get_inputs()))


def meta_numel(source: str) -> int:
    """A problem's size against the element cap, measured on the meta device (no memory used): its
    input + parameter elements, or its output's where that is more. An output much larger than the
    inputs (a matmul over a small inner dimension, an outer product) is what every candidate writes
    back for every input set; uncapped, one problem's answers fill a disk."""
    import torch

    module = load_problem(source)
    init = module.get_init_inputs()
    with torch.device("meta"):
        inputs = module.get_inputs()
        model = module.Model(*init)
        held = numel_of(list(inputs)) + sum(p.numel() for p in model.parameters()) + sum(
            b.numel() for b in model.buffers())
        try:
            produced = numel_of(model(*inputs))
        except Exception:  # noqa: BLE001 - an op without a meta kernel: the inputs' count stands
            produced = 0
    return max(held, produced)


def meta_forward_runs(source: str) -> bool:
    """Whether the problem's reference forward accepts its own inputs, on the meta device (shapes
    only: group counts that divide channels, broadcasts between inputs, kernel sizes that fit)."""
    import torch

    try:
        module = load_problem(source)
        init = module.get_init_inputs()
        with torch.device("meta"):
            module.Model(*init)(*module.get_inputs())
    except Exception:  # noqa: BLE001 - any failure means these sizes do not make a valid problem
        return False
    return True


def _shrink_options(values: dict[str, int]) -> list[dict[str, int]]:
    """Smaller sizes to try, in order: the largest constant halved; every constant above the
    kernel-size range halved together (ratios kept: channels stay divisible by groups); another
    constant halved alone; batch-like constants set to 1 (inputs that broadcast against the batch)."""
    options = [shrink_step(values)]
    big = sorted((n for n, v in values.items() if v >= 9), key=lambda n: -values[n])
    options.append({**values, **{n: max(1, values[n] // 2) for n in big}})
    options += [{**values, n: max(1, values[n] // 2)} for n in big[1:]]
    batch = {n: 1 for n, v in values.items() if is_batch_name(n) and v > 1}
    options.append({**values, **batch} if batch else None)
    return [o for o in options if o is not None and o != values]


def shrink_to_cap(source: str, cap: int) -> tuple[dict[str, int], list[str]]:
    """Constants that bring the problem under ``cap`` elements, halving the largest each step. Where
    the problem's forward runs on the meta device, every step must keep it running: halving one
    size alone can break a problem whose sizes are tied (an input that broadcasts against the batch,
    channels divisible by groups), and a base whose reference fails rejects every candidate."""
    values = {n: c.value for n, c in find_size_constants(source).items()}
    notes: list[str] = []
    if cap <= 0:
        return values, notes
    checked = meta_forward_runs(source)
    for _ in range(200):
        try:
            numel = meta_numel(rewrite_constants(source, values))
        except Exception as exc:  # noqa: BLE001 - a size the problem rejects; stop shrinking
            notes.append(f"shape check on meta failed ({type(exc).__name__}); kept sizes {values}")
            return values, notes
        if numel <= cap:
            return values, notes
        options = _shrink_options(values)
        if checked:
            options = [o for o in options if meta_forward_runs(rewrite_constants(source, o))][:1]
        if not options:
            notes.append(f"cannot shrink below {numel} elements (cap {cap})")
            return values, notes
        values = options[0]
    return values, notes
