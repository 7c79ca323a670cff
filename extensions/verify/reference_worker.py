"""Trusted reference process: build the input sets of one problem and the reference outputs.

    python -m extensions.verify.reference_worker JOB_DIR

Reads ``JOB_DIR/job.json`` and ``JOB_DIR/problem.py``; writes ``inputs.safetensors`` (init inputs
and every input set), ``expected.safetensors`` and, last, ``prepared.json``. It runs the problem's
own code (trusted) in its own process so that a hang or an out-of-memory in the reference cannot
take the verifier down; it never sees a candidate.

Input sets: ``tiny`` (batch-like constants set to 2), ``base`` (the problem's sizes, shrunk on CPU
to ``cpu_max_input_numel``), other shapes (module-level constants set to odd sizes, kept only
when ``get_init_inputs()`` is unchanged and the reference still runs) and other values (inputs
scaled by 1e-3 and 100, mapped to both signs, shifted off zero), each with its own seed.
A variation whose reference fails or turns non-finite is skipped and reported.
"""
from __future__ import annotations

import json
import os
import sys
import types
from typing import Any

from .problem_constants import find_size_constants, is_batch_name, odd_size, rewrite_constants, shrink_step
from .tensor_io import pack

# In order of value when few sets are asked for: both signs first (many problems draw inputs
# with torch.rand, all positive, where ReLU and identity agree), then small values (a near-zero
# output must fail), then large and shifted ones.
TIMING_INPUT_SETS = 4  # distinct input sets the timer rotates through (GPU only)

VALUE_TRANSFORMS = {
    "signed": lambda x: x * 4.0 - 2.0,
    "scale_down": lambda x: x * 1e-3,
    "scale_up": lambda x: x * 100.0,
    "shift": lambda x: x + 2.5,
}


def load_problem(source: str, name: str = "problem") -> types.ModuleType:
    module = types.ModuleType(name)
    module.__file__ = f"{name}.py"
    exec(compile(source, f"{name}.py", "exec"), module.__dict__)
    for required in ("Model", "get_inputs", "get_init_inputs"):
        if not hasattr(module, required):
            raise ValueError(f"problem defines no {required}")
    return module


def _numel(values: Any) -> int:
    import torch

    if isinstance(values, torch.Tensor):
        return values.numel()
    if isinstance(values, (list, tuple)):
        return sum(_numel(v) for v in values)
    return 0


def meta_numel(source: str) -> int:
    """Input + parameter elements of a problem, measured on the meta device (no memory used)."""
    import torch

    module = load_problem(source)
    init = module.get_init_inputs()
    with torch.device("meta"):
        inputs = module.get_inputs()
        model = module.Model(*init)
    return _numel(list(inputs)) + sum(p.numel() for p in model.parameters()) + sum(
        b.numel() for b in model.buffers())


def shrink_to_cap(source: str, cap: int) -> tuple[dict[str, int], list[str]]:
    """Constants that bring the problem under ``cap`` elements (halving the largest each step)."""
    values = {n: c.value for n, c in find_size_constants(source).items()}
    notes: list[str] = []
    if cap <= 0:
        return values, notes
    for _ in range(200):
        try:
            numel = meta_numel(rewrite_constants(source, values))
        except Exception as exc:  # noqa: BLE001 - a size the problem rejects; stop shrinking
            notes.append(f"shape check on meta failed ({type(exc).__name__}); kept sizes {values}")
            return values, notes
        if numel <= cap:
            return values, notes
        smaller = shrink_step(values)
        if smaller is None:
            notes.append(f"cannot shrink below {numel} elements (cap {cap})")
            return values, notes
        values = smaller
    return values, notes


def same_init(a: Any, b: Any) -> bool:
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
                and a.dtype == b.dtype and torch.equal(a, b))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_init(x, y) for x, y in zip(a, b))
    return a == b


def _to(value: Any, device: str) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (list, tuple)):
        return type(value)(_to(v, device) for v in value)
    return value


def _all_finite(value: Any) -> bool:
    import torch

    if isinstance(value, torch.Tensor):
        return not value.is_floating_point() or bool(torch.isfinite(value).all())
    if isinstance(value, (list, tuple)):
        return all(_all_finite(v) for v in value)
    return True


def _rms(value: Any) -> float:
    """Root-mean-square over every floating-point element of an output (tensor or nested tuple)."""
    import torch

    total, count = 0.0, 0
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor) and item.is_floating_point() and item.numel():
            finite = item[torch.isfinite(item)].double()
            total += float((finite * finite).sum())
            count += finite.numel()
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return (total / count) ** 0.5 if count else 0.0


def _transform(values: list, fn) -> list:
    import torch

    return [fn(v) if isinstance(v, torch.Tensor) and v.is_floating_point() else v for v in values]


class ReferenceBuilder:
    def __init__(self, source: str, job: dict):
        import torch

        self.job = job
        self.device = job["device"]
        self.seed = int(job["seed"])
        cap = int(job["max_input_numel"])
        self.values, self.notes = shrink_to_cap(source, cap)
        self.base_source = rewrite_constants(source, self.values)
        self.base = load_problem(self.base_source)
        torch.manual_seed(self.seed)
        self.init = list(self.base.get_init_inputs())
        torch.manual_seed(self.seed)
        self.model = self.base.Model(*self.init)
        self.model = self.model.to(self.device)
        self.sets: list[dict] = []
        self.base_output_rms = 0.0
        self.skipped: list[str] = []
        self.tensors: dict[str, Any] = {}
        self.expected: dict[str, Any] = {}

    def module_for(self, values: dict[str, int]) -> types.ModuleType | None:
        """The problem at other sizes, if those sizes leave the init inputs unchanged."""
        import torch

        module = load_problem(rewrite_constants(self.base_source, values))
        torch.manual_seed(self.seed)
        if not same_init(list(module.get_init_inputs()), self.init):
            return None
        return module

    def try_add(self, name: str, kind: str, module, seed: int, transform=None, timing: bool = False) -> bool:
        import torch

        try:
            torch.manual_seed(seed)
            inputs = list(module.get_inputs())
            if transform is not None:
                inputs = _transform(inputs, transform)
            with torch.no_grad():
                out = self.model(*_to(inputs, self.device))
            if self.device != "cpu":
                torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - the reference rejects this variation
            self.skipped.append(f"{name}: reference failed ({type(exc).__name__}: {str(exc)[:100]})")
            return False
        if not _all_finite(out) and kind != "base":
            self.skipped.append(f"{name}: reference output not finite")
            return False
        index = len(self.sets)
        # fp32 rounding error grows with the magnitudes involved: on a set whose values the
        # verifier scaled up, atol grows with the reference output (never shrinks below 1).
        atol_scale = 1.0
        if transform is not None and self.base_output_rms:
            atol_scale = max(1.0, _rms(out) / self.base_output_rms)
        if kind == "base":
            self.base_output_rms = _rms(out)
        self.sets.append({
            "name": name, "kind": kind, "seed": seed, "timing": timing, "atol_scale": atol_scale,
            "inputs": pack(inputs, f"s{index}.in", self.tensors),
            "expected": pack(out, f"s{index}.out", self.expected),
        })
        return True

    def build(self) -> None:
        job = self.job
        if job["tiny_first"]:
            batch = {n: min(v, 2) for n, v in self.values.items() if is_batch_name(n) and v > 2}
            module = self.module_for({**self.values, **batch}) if batch else None
            if module is None or not self.try_add("tiny", "tiny", module, self.seed):
                self.try_add("tiny", "tiny", self.base, self.seed + 1000)
        full_before = len(self.sets)
        if not self.try_add("base", "base", self.base, self.seed, timing=True):
            raise RuntimeError(self.skipped[-1])
        wanted = max(1, int(job["num_tests"])) if job["multi_input"] else 1
        values = list(VALUE_TRANSFORMS) if job["multi_input"] and job["value_variations"] else []
        variations = values[:1]
        if job["multi_input"] and job["shape_variations"]:
            variations.append("shape")
        variations += values[1:]
        seed = self.seed + 1
        for variation in variations:
            if len(self.sets) - full_before >= wanted:
                break
            if variation == "shape":
                self._add_shape_variation(seed)
            else:
                # Speed is measured on the problem's own value distribution, not on x100 inputs.
                self.try_add(variation, "values", self.base, seed, VALUE_TRANSFORMS[variation])
            seed += 1
        while job["multi_input"] and len(self.sets) - full_before < wanted and seed < self.seed + 50:
            self.try_add(f"seed_{seed}", "seed", self.base, seed, timing=True)
            seed += 1
        # Timing rotates through several distinct sets so a memoising candidate gains nothing.
        timed = sum(1 for s in self.sets if s["timing"])
        while self.device != "cpu" and timed < TIMING_INPUT_SETS and seed < self.seed + 50:
            timed += self.try_add(f"seed_{seed}", "seed", self.base, seed, timing=True)
            seed += 1

    def _add_shape_variation(self, seed: int) -> None:
        eligible = {n: odd_size(v) for n, v in self.values.items() if v >= 4 and odd_size(v) != v}
        attempts = [eligible] + [{n: v} for n, v in eligible.items()] if eligible else []
        for changed in attempts[:6]:
            try:
                module = self.module_for({**self.values, **changed})
            except Exception as exc:  # noqa: BLE001
                self.skipped.append(f"shape {changed}: problem failed to load ({type(exc).__name__})")
                continue
            if module is None:
                self.skipped.append(f"shape {changed}: changes get_init_inputs()")
                continue
            if self.try_add("shape_" + "_".join(f"{n}{v}" for n, v in changed.items()), "shape", module, seed):
                return
        if not attempts:
            self.skipped.append("shape: no module-level size constant to vary")


def run(job_dir: str) -> None:
    import torch

    from .tensor_io import save_tensors

    with open(os.path.join(job_dir, "job.json")) as fh:
        job = json.load(fh)
    with open(os.path.join(job_dir, "problem.py")) as fh:
        source = fh.read()
    torch.set_num_threads(max(1, int(job.get("threads", 1))))
    builder = ReferenceBuilder(source, job)
    builder.build()
    init_spec = pack(builder.init, "init", builder.tensors)
    save_tensors(os.path.join(job_dir, "inputs.safetensors"), builder.tensors)
    save_tensors(os.path.join(job_dir, "expected.safetensors"), builder.expected)
    prepared = {
        "problem_source": builder.base_source, "constants": builder.values, "notes": builder.notes,
        "init": init_spec, "sets": builder.sets, "skipped": builder.skipped,
    }
    tmp = os.path.join(job_dir, "prepared.json.tmp")
    with open(tmp, "w") as fh:
        json.dump(prepared, fh)
    os.replace(tmp, os.path.join(job_dir, "prepared.json"))


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: python -m extensions.verify.reference_worker JOB_DIR")
    try:
        run(sys.argv[1])
    except Exception as exc:  # noqa: BLE001 - reported to the parent in one line
        print(f"reference failed: {type(exc).__name__}: {str(exc)[:300]}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
