"""Trusted reference process: build the input sets of one problem and the reference outputs.

    python -m extensions.verify.reference_worker JOB_DIR      (first stdin line: the batch secret)

Reads ``JOB_DIR/job.json``, ``JOB_DIR/problem.py`` and, from stdin, the secret the parent drew for
this batch (input seed and value-transform parameters: never written to a file); writes
``inputs.safetensors`` (init inputs and every input set), ``expected.safetensors`` and, last,
``prepared.json``. It runs the problem's own code (trusted) in its own process so that a hang or an
out-of-memory in the reference cannot take the verifier down; it never sees a candidate.

Input sets: ``tiny`` (batch-like constants set to 2), ``base`` (the problem's sizes, shrunk on CPU
to ``cpu_max_input_numel``), other shapes (module-level constants set to odd sizes; constants that
feed ``get_init_inputs()`` included, so constructor sizes vary too and the model is rebuilt from
the same seed), other values (mapped to both signs, then large (the problem's own values with a
few outliers spread over many powers of ten, as far as the fp32 reference stays exact; else every
element times one factor), then whole lines along every axis negative (a few at secret places,
some far from zero; where the fp32 reference is not exact with them, every element), then small; exact zeros in some places
and the problem's Python float inputs varied, with parameters drawn per batch) and one ``wide``
set whose non-batch sizes exceed the problem's own (and, on CPU, whose elements exceed the cap).
A variation whose reference fails, or turns non-finite where its fp64 run does not (overflow), is
skipped and reported; non-finite values the fp64 run shares (masking, log of zero) are compared by
position.
"""
from __future__ import annotations

import json
import os
import sys
import time
import types
from typing import Any, Callable

from ..common.problem_constants import (find_scalar_constants, find_size_constants, grown_size, is_batch_name, odd_size,
                                rewrite_constants, shrink_step, varied_scalar)
from ..common.param_noise import apply_parameter_noise, constant_parameter_keys
from ..common.precision import pin_ieee_fp32
from ..common.problem_sizes import load_problem, meta_forward_runs, meta_input_numel, meta_numel, numel_of, shrink_to_cap
from ..common.tensor_io import map_tensors, pack

TIMING_INPUT_SETS = 4  # distinct input sets the timer rotates through (GPU only)
# The wide set may hold this many times the cap's elements: on CPU the interpreter's time grows
# with it; on CUDA its inputs cross the sandbox as files.
WIDE_CAP_MULTIPLE = {"cpu": 4, "cuda": 2}
# In order of value when few sets are asked for: both signs first (many problems draw inputs
# with torch.rand, all positive, where ReLU and identity agree), then large values (past the
# range of fp32 ``exp``, and past a threshold below 10^t, ``with_outliers``), then whole lines of
# negative values, some far from zero (a maximum or a softmax started at 0, an activation wrong
# below some threshold; ``with_negative_lines``), then small ones. The large values are few (``with_outliers``) and of either sign where the
# fp32 reference stays exact with them; the uniform factor that stands in elsewhere keeps the
# problem's signs: a sum of large terms of both signs cancels, and its rounding error outgrows
# any tolerance measured on the output.
VALUE_VARIATIONS = ("signed", "scale_up", "shift", "scale_down")
# Sets whose elements are also exactly zero in about this share of places (not ``shift``: a zero
# there would be the maximum a reduction started at 0 needs).
ZERO_SHARE = 1 / 16
WITH_ZEROS = ("signed", "scale_up", "scale_down")


def value_transforms(params: dict) -> dict[str, Callable]:
    """The value variations for one batch, from parameters the parent drew (see ``reference_data.draw_secret``):
    ``signed`` ``±(x*a - b)``, ``scale_down``/``scale_up`` ``x*s``, ``shift`` ``(x - max(x) - d) * s``
    (every element negative, far from zero: where ``with_negative_lines`` cannot be used)."""
    a, b, sign = params["signed"]
    down, up = float(params["scale_down"]), float(params["scale_up"])
    below, spread = float(params["shift"]), float(params["shift_scale"])

    def signed(x):
        return (x * a - b) * sign

    def shifted(x):
        return (x - x.max() - below) * spread if x.numel() else x

    return {
        "signed": signed,
        "scale_down": lambda x: x * down,
        "scale_up": lambda x: x * up,
        "shift": shifted,
    }


# Lines made wholly negative in the ``shift`` set, per axis at most (one on an axis shorter than 64:
# each line there is a large share of the tensor, and a peek would find one).
NEGATIVE_LINES_MAX = 3


def with_negative_lines(params: dict) -> Callable:
    """``shift`` as lines: the problem's own values, except whole lines along every axis (of two or
    more elements) at secret places, a few per axis, at ``(x - max(x) - d) * s``: the first line
    of each axis far from zero (``s`` the batch's ``shift_scale``, every element at -150 or
    below: exp underflows), the others at ``s = 10^u``, u in [0, 2.5], from -1.5 down. A line
    along one axis lies wholly in a line of another, so whatever axes a kernel reduces over
    (one row of a softmax, a pooling window, a channel of a LayerNorm), some of its reductions
    see only negative values, and a maximum started at 0 fails there. Few: where every element
    was shifted, one peeked element told the set apart, and a softmax without its row maximum
    took its exact path only there; here a peek sees the problem's own values (a share of about
    the lines per axis over the axis length: 3% of a 256 x 192 CPU set). A tensor with fewer than
    two such axes has one line, itself: all of it is shifted, and a peek tells."""
    below, far = float(params["shift"]), float(params["shift_scale"])

    def negative_lines(x):
        import torch

        axes = [axis for axis, size in enumerate(x.shape) if size >= 2]
        if len(axes) < 2:
            return (x - x.max() - below) * far if x.numel() else x
        scale = torch.zeros([1] * x.dim(), dtype=x.dtype, device=x.device)
        for axis in axes:
            size = x.shape[axis]
            count = max(1, min(NEGATIVE_LINES_MAX, size // 32))
            spreads = torch.pow(10.0, torch.rand(count, device=x.device) * 2.5).to(x.dtype)
            spreads[0] = far
            per_index = torch.zeros(size, dtype=x.dtype, device=x.device)
            per_index[torch.randperm(size, device=x.device)[:count]] = spreads
            shape = [1] * x.dim()
            shape[axis] = size
            scale = torch.maximum(scale, per_index.reshape(shape))
        return torch.where(scale > 0, (x - x.max() - below) * scale, x)

    return negative_lines


# Outliers per tensor at least (all of a smaller one), about half of each sign: a kernel wrong in
# some band of positive magnitudes (a ReLU that returns 0 between 3.5 and 7) meets about thirteen
# in a band of a factor two, one wrong above 10^5 about ten; one peeked element of a CPU set
# (49152 elements) is an outlier in 1% of batches, a sample of 16 in 15% (on CUDA's full sizes
# the secret share, 0.05-0.2% of the elements, decides).
OUTLIERS_MIN = 512


def with_outliers(params: dict, top: float, either_sign: bool) -> Callable:
    """``scale_up`` as outliers: the problem's own values, except a secret share of the elements
    (``scale_up_share``, at least ``OUTLIERS_MIN``) times ``10^(r·top)``, ``r`` uniform per
    element, and with ``either_sign`` times -1 for about half of them (the problem's
    ``torch.rand`` draws no negative value, and a LeakyReLU wrong below -2000 met none). A kernel
    right below some large threshold only (a sigmoid that returns 0 above 1500) is right on any
    set whose largest element stays below it; this set reaches ``10^top``. Few and
    at secret places: a kernel that samples a few dozen elements to choose between a fragile path
    and an exact one (a softmax without its maximum unless the sample looks large) sees the
    problem's own values and takes the fragile path; where every element is scaled, any sample
    shows it. Neither exact zeros nor other Python floats: they would tell the set from the base."""
    share = float(params["scale_up_share"])

    def outliers(x):
        import torch

        if not x.numel():
            return x
        count = min(x.numel(), max(OUTLIERS_MIN, round(share * x.numel())))
        flat = x.reshape(-1).double()
        if 4 * count >= x.numel():  # distinct places; on a large tensor a repeat or two costs nothing
            where = torch.randperm(x.numel(), device=x.device)[:count]
        else:
            where = torch.randint(0, x.numel(), (count,), device=x.device)
        factor = torch.pow(10.0, torch.rand(count, device=x.device, dtype=torch.float64) * top)
        if either_sign:
            factor = torch.where(torch.rand(count, device=x.device) < 0.5, -factor, factor)
        flat[where] = flat[where] * factor
        return flat.reshape(x.shape).to(x.dtype)

    return outliers


# The fp32 reference must match its own fp64 run within this share of each tolerance before
# ``scale_up``'s outliers are kept: the rest is left to a correct kernel's own rounding.
EXACTNESS_MARGIN = 0.25
# Where the problem accumulates (a GEMM, a convolution, attention, a sum, a scan), each output
# element may be off by this share of the fp64 model on |inputs| (for a sum, the sum of its terms'
# magnitudes): fp32 rounds every partial sum, and where terms of both signs cancel, two correct
# orders of summation differ by far more than atol at an output near zero. A tiled GEMM over
# K = 8192 zero-mean products differed from cuBLAS by 1.4e-3 (2.8 * 2^-24 of that sum; a naive
# sequential sum stays below ~4); 2^-20 leaves a fourfold margin. TF32 (operands rounded to
# 2^-11) stays outside it: its error is ~660 / sqrt(K) times this slack (rms), 7x at K = 8192.
ROUNDING_SLACK = 2.0 ** -20
# On ``scale_up``'s and ``shift``'s sets an outlier's product (or a far line's) dominates a sum,
# and every partial sum after it is that large: an order that adds K terms one at a time rounds
# ~sqrt(K) times at that size (sequential sums over K = 4096 were 1.3 times ROUNDING_SLACK off
# with outliers, over K = 8192 0.9 times with lines). 2^-14 covers a million terms added one by
# one and stays below rtol, which outputs as large as their terms have anyway. TF32 there
# (rejected on every other set) gets no room from it where the problem's own values are summed.
OUTLIER_ROUNDING_SLACK = 2.0 ** -14
# aten operators (name parts) whose outputs are sums of many terms.
ACCUMULATING_OPS = ("mm", "mv", "convolution", "dot", "linear", "einsum", "attention", "sum", "mean",
                    "var", "std", "norm", "avg_pool")
# The model on |inputs| measures a sum's terms only through linear steps: after an exp or a square
# it grows without bound (exp of the terms' magnitudes). Cancellation makes it at most about
# sqrt(K) times an output's typical magnitude, so it is capped at this many times |output| plus
# the median nonzero |output|: a sum over K = 2^20 zero-mean terms still fits, and a problem that
# blows the model up gets at most 2.4e-4 of (|output| + median) (1.6e-2 on the outliers' and
# lines' sets) instead of anything at all.
CANCELLATION_CAP = 256


# A slack below this share of an element's own tolerance (atol + rtol * |out|) everywhere moves
# no verdict and would double what the set stores (a GEMM on positive inputs, 4 GiB per set on
# KernelBench's 32768 x 32768 output): that output keeps its tolerance alone.
NEGLIGIBLE_SLACK = 1 / 64


def _capped_slack(magnitudes, out, share: float, atol: float, rtol: float):
    """Per element of ``out``: ``share`` times ``magnitudes`` (the fp64 model on |inputs|), at
    most ``CANCELLATION_CAP`` times (|out| + the median nonzero |out|); None for an output compared
    exactly, or where the slack is ``NEGLIGIBLE_SLACK`` of the tolerance ``atol`` + ``rtol`` |out|
    everywhere. float32, built in place: an output of 2^30 elements has room on the device for
    this and little more."""
    import torch

    if not out.is_floating_point():
        return None

    def sizes():
        return out.detach().abs().float().nan_to_num_(nan=0.0, posinf=0.0)

    size = sizes()
    flat = size.reshape(-1)
    sample = flat[::max(1, flat.numel() // (1 << 20))]
    nonzero = sample[sample > 0]
    typical = float(nonzero.median()) if nonzero.numel() else 0.0
    cap = size.add_(typical).mul_(CANCELLATION_CAP)
    terms = magnitudes.detach().float().abs_()  # the caller's own tensor: changed in place
    torch.minimum(terms.nan_to_num_(nan=0.0, posinf=float("inf")), cap, out=terms).mul_(share)
    del cap, size, flat, sample
    floor = sizes().mul_(rtol * NEGLIGIBLE_SLACK).add_(atol * NEGLIGIBLE_SLACK)
    negligible = bool(torch.le(terms, floor).all())
    del floor
    return None if negligible else terms


def same_init(a: Any, b: Any) -> bool:
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
                and a.dtype == b.dtype and torch.equal(a, b))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_init(x, y) for x, y in zip(a, b))
    return a == b


def _all_finite(value: Any) -> bool:
    import torch

    if isinstance(value, torch.Tensor):
        return not value.is_floating_point() or bool(torch.isfinite(value).all())
    if isinstance(value, (list, tuple)):
        return all(_all_finite(v) for v in value)
    return True


def _same_non_finite(value: Any, wide: Any) -> bool:
    """Whether ``wide`` (the fp64 run, not cast back) is NaN, +inf and -inf exactly where the
    floating-point tensors of ``value`` are, with the same nesting."""
    import torch

    if isinstance(value, torch.Tensor):
        if not isinstance(wide, torch.Tensor) or wide.shape != value.shape:
            return False
        if not value.is_floating_point():
            return True
        wide = wide.to(value.device)
        return all(torch.equal(test(value), test(wide)) for test in (torch.isnan, torch.isposinf, torch.isneginf))
    if isinstance(value, (list, tuple)):
        return (isinstance(wide, (list, tuple)) and len(wide) == len(value)
                and all(_same_non_finite(v, w) for v, w in zip(value, wide)))
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


def _with_zeros(x):
    """Exact zeros in about ``ZERO_SHARE`` of ``x``'s places (drawn from the set's seed): a kernel
    wrong at zero only (``tanh(0) = 1``) is right on every other value."""
    import torch

    return x.masked_fill(torch.rand(x.shape, device=x.device) < ZERO_SHARE, 0.0)


def _with_scalars_varied(values: list, factor: float) -> list:
    """The problem's Python float inputs (a scale written into ``get_inputs``) at other values,
    as the odd-shape set varies the constructor's: a kernel with ``s = 3.14`` written in is right
    at that value only."""
    return [varied_scalar(v, factor) if isinstance(v, float) else v for v in values]


def _scaled_tolerances(tolerances: dict, share: float) -> types.SimpleNamespace:
    """The comparison's tolerances, each ``share`` as wide (the norm below which only atol applies stays)."""
    scaled = {name: float(value) * share for name, value in tolerances.items() if name != "min_reference_norm"}
    return types.SimpleNamespace(**scaled, min_reference_norm=float(tolerances["min_reference_norm"]))


def _like(value: Any, reference: Any) -> Any:
    """``value`` (a nested output) with each tensor cast to the dtype of ``reference``'s at that place."""
    import torch

    if isinstance(reference, torch.Tensor):
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{type(value).__name__} where a tensor was")
        return value.to(reference.dtype)
    if isinstance(reference, (list, tuple)):
        if not isinstance(value, (list, tuple)) or len(value) != len(reference):
            raise ValueError("another number of outputs")
        return type(reference)(_like(v, r) for v, r in zip(value, reference))
    return value


class ReferenceBuilder:
    def __init__(self, source: str, job: dict, secret: dict):
        import torch

        self.job = job
        self.device = job["device"]
        self.seed = int(job["seed"])  # construction seed: both models are built right after it
        self.input_seed = int(secret["input_seed"])  # drawn per batch, never seen by a candidate
        self.transforms = value_transforms(secret["transforms"])
        # Each top with outliers of both signs, then of the problem's own (a log or a square root
        # of the inputs has no reference for negative ones).
        self.outliers = [(top, either, with_outliers(secret["transforms"], float(top), either))
                         for top in secret["transforms"]["scale_up_tops"] for either in (True, False)]
        self.negative_lines = with_negative_lines(secret["transforms"])
        self.exactness = _scaled_tolerances(job["tolerances"], EXACTNESS_MARGIN)
        self.judging = _scaled_tolerances(job["tolerances"], 1.0)  # the candidates' own (rounding slack)
        self.fp64_models: dict[int, Any] = {}
        # Per model (init index): whether its forward accumulates (None: no fp64 run on |inputs|).
        self.accumulates: dict[int, bool | None] = {}
        self.cap = int(job["max_input_numel"])
        self.original_values = {n: c.value for n, c in find_size_constants(source).items()}
        self.original_source = source
        self.scalar_factor = float(secret["scalar_factor"])
        self.values, self.notes = shrink_to_cap(source, self.cap)
        self.base_source = rewrite_constants(source, self.values)
        self.base = load_problem(self.base_source)
        torch.manual_seed(self.seed)
        init = list(self.base.get_init_inputs())
        torch.manual_seed(self.seed)
        # One (init inputs, model) per distinct constructor arguments; index 0 is the base.
        self.inits: list[list] = [init]
        self.param_seed = int(secret["param_seed"])
        self.param_keys: list[list[str]] = []  # per init index: the constant parameters perturbed
        self.models: list = [self._perturbed(self.base.Model(*init).to(self.device))]
        self.sets: list[dict] = []
        self.base_output_rms = 0.0
        self.base_input_rms = 0.0
        self.skipped: list[str] = []
        # Sets the reference failed or overflowed on (a retry under the same name may still add them)
        self.refused: set[str] = set()
        self.tensors: dict[str, Any] = {}
        self.expected: dict[str, Any] = {}

    def _perturbed(self, model):
        """``model`` with its constant-initialised parameters replaced by the batch's noise
        (``param_noise``); the keys are recorded so the candidate's tensors get the same."""
        keys = constant_parameter_keys(model)
        apply_parameter_noise(model, self.param_seed, keys, reference=True)
        self.param_keys.append(keys)
        return model

    @property
    def init(self) -> list:
        return self.inits[0]

    def module_at(self, values: dict[str, int]) -> types.ModuleType:
        return load_problem(rewrite_constants(self.original_source, values))

    def init_index(self, module: types.ModuleType) -> int:
        """The index of ``module``'s constructor arguments, building its reference model if new."""
        import torch

        torch.manual_seed(self.seed)
        init = list(module.get_init_inputs())
        for index, known in enumerate(self.inits):
            if same_init(known, init):
                return index
        torch.manual_seed(self.seed)
        model = self._perturbed(module.Model(*init).to(self.device))
        self.inits.append(init)
        self.models.append(model)
        return len(self.inits) - 1

    def draw_inputs(self, module: types.ModuleType, seed: int) -> list:
        """``module.get_inputs()`` right after ``seed``. On a GPU its tensors are created there (the
        device made the default for its factory calls): a draw of tens of millions of elements
        takes a tenth of a second on one CPU thread and well under a millisecond on the GPU. A
        problem whose inputs cannot be drawn there draws them on the host as written."""
        import torch

        if self.device != "cpu":
            torch.manual_seed(seed)
            try:
                with torch.device(self.device):
                    return list(module.get_inputs())
            except Exception:  # noqa: BLE001 - drawn on the host below
                pass
        torch.manual_seed(seed)
        return list(module.get_inputs())

    def try_add(self, name: str, kind: str, module, seed: int, transform=None, timing: bool = False,
                exact: bool = False, atol_scale: float | None = None, rounding: float = ROUNDING_SLACK) -> bool:
        """Add the set ``name``: ``module``'s inputs drawn after ``seed``, passed through
        ``transform`` (the whole input list). A set the reference rejects is left out and listed
        in ``skipped``; with ``exact``, so is one where the fp32 reference strays from its fp64 run.
        ``atol_scale``: the set's own, where its output's growth would overstate it. Where the
        problem accumulates, each output element's tolerance also has ``_rounding_slack`` (the
        share ``rounding`` of its terms' magnitudes)."""
        import torch

        try:
            init_index = self.init_index(module)
            inputs = self.draw_inputs(module, seed)
            if transform is not None:
                inputs = transform(inputs)
            with torch.no_grad():
                out = self.models[init_index](*map_tensors(inputs, lambda t: t.to(self.device)))
            if self.device != "cpu":
                torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - the reference rejects this variation
            self.skipped.append(f"{name}: reference failed ({type(exc).__name__}: {str(exc)[:100]})")
            self.refused.add(name)
            return False
        if not _all_finite(out) and kind != "base":
            why = self._overflowed(init_index, inputs, out)
            if why:
                self.skipped.append(f"{name}: reference output not finite ({why})")
                self.refused.add(name)
                return False
        index = len(self.sets)
        # fp32 rounding error grows with the magnitudes involved: on a set whose values the
        # verifier changed, atol grows with the reference output against the base set's (never
        # shrinks below 1). Where the base output is all zero (a ReLU after a subtraction) there
        # is nothing to measure against, and the inputs' growth stands in: a GEMM on inputs x1000
        # differs from another order of summation by ~1e-3 where its output crosses zero.
        if atol_scale is None:
            atol_scale = 1.0 if transform is None else self._growth(inputs, out)
        slack = self._rounding_slack(init_index, inputs, out, rounding, atol_scale)
        if exact:
            why = self._inexact(init_index, inputs, out, atol_scale, slack)
            if why:
                self.skipped.append(f"{name}: {why}")
                return False
        if kind == "base":
            self.base_output_rms, self.base_input_rms = _rms(out), _rms(inputs)
        self.sets.append({
            "name": name, "kind": kind, "timing": timing, "atol_scale": atol_scale, "init": init_index,
            "numel": numel_of(inputs),
            "inputs": pack(inputs, f"s{index}.in", self.tensors),
            "expected": pack(out, f"s{index}.out", self.expected),
        })
        if slack is not None:
            self.sets[-1]["slack"] = pack(slack, f"s{index}.slack", self.expected)
        return True

    @property
    def unanswered(self) -> list[str]:
        """The sets left out because the reference had no answer on them: their checks did not run
        (a variation the problem has no room for, or a fallback that ran instead, is not one)."""
        return sorted(self.refused - {s["name"] for s in self.sets})

    def _growth(self, inputs: list, out: Any) -> float:
        if self.base_output_rms:
            grown = _rms(out) / self.base_output_rms
        else:
            grown = _rms(inputs) / self.base_input_rms if self.base_input_rms else 1.0
        return max(1.0, grown)

    def build(self) -> None:
        job = self.job
        seed = self.input_seed
        if job["tiny_first"]:
            batch = {n: min(v, 2) for n, v in self.values.items() if is_batch_name(n) and v > 2}
            module = self.module_at({**self.values, **batch}) if batch else None
            if module is None or not self.try_add("tiny", "tiny", module, seed):
                self.try_add("tiny", "tiny", self.base, seed + 1000)
        full_before = len(self.sets)
        if not self.try_add("base", "base", self.base, seed, timing=True):
            raise RuntimeError(self.skipped[-1])
        wanted = max(1, int(job["num_tests"])) if job["multi_input"] else 1
        values = list(VALUE_VARIATIONS) if job["multi_input"] and job["value_variations"] else []
        variations = values[:1]
        if job["multi_input"] and job["shape_variations"]:
            variations.append("shape")
        variations += values[1:]
        seed += 1
        for variation in variations:
            if len(self.sets) - full_before >= wanted:
                break
            if variation == "shape":
                self._add_shape_variation(seed)
            else:
                self._add_value_set(variation, seed)
            seed += 1
        first_seed = self.input_seed
        while job["multi_input"] and len(self.sets) - full_before < wanted and seed < first_seed + 50:
            self.try_add(f"seed_{seed - first_seed}", "seed", self.base, seed, timing=True)
            seed += 1
        # Timing rotates through several distinct sets so a memoising candidate gains nothing.
        timed = sum(1 for s in self.sets if s["timing"])
        while self.device != "cpu" and timed < TIMING_INPUT_SETS and seed < first_seed + 50:
            timed += self.try_add(f"seed_{seed - first_seed}", "seed", self.base, seed, timing=True)
            seed += 1
        if job["multi_input"] and job["shape_variations"]:
            self._add_wide_set(seed)

    def _add_value_set(self, variation: str, seed: int) -> None:
        """One value variation (never timed: speed is measured on the problem's own values), with
        exact zeros and the Python float inputs varied too; where the reference rejects those (a
        division by an input, a probability above 1), the tensors' transform alone."""
        fn = self.transforms[variation]

        def everything(tensor_fn) -> Callable:
            def transform(inputs: list) -> list:
                varied = _transform(inputs, tensor_fn)
                if variation in WITH_ZEROS:
                    varied = _transform(varied, _with_zeros)
                return _with_scalars_varied(varied, self.scalar_factor)
            return transform

        if variation == "scale_up":
            # Highest top first; each kept only where the fp32 reference is still exact there (a
            # sum of squares overflows, a sum of outliers of both signs cancels): otherwise the
            # uniform factor. atol stays the base set's: all but the outliers are the problem's
            # own values, and a set-wide scale grown with the outliers would let a kernel wrong on
            # the values between (a ReLU that returns 0 between 3.5 and 7) pass; outliers are
            # held to rtol.
            reasons = []
            for top, either, outliers in self.outliers:
                label = f"1e{top:.1f}{' either sign' if either else ''}"
                if self.try_add(variation, "values", self.base, seed,
                                lambda inputs, outliers=outliers: _transform(inputs, outliers),
                                exact=True, atol_scale=1.0, rounding=OUTLIER_ROUNDING_SLACK):
                    self.sets[-1]["spread_top"] = round(top, 2)
                    self.sets[-1]["outlier_signs"] = "either" if either else "own"
                    return
                reasons.append(f"{label}: {self.skipped.pop().split(': ', 1)[-1]}")
            self.skipped.append(f"{variation}: one factor for every element (outliers {'; '.join(reasons)})")
        if variation == "shift":
            # Kept only where the fp32 reference is exact with lines far from the rest (a GEMM's
            # sum of a line of -1000s and the problem's values cancels): otherwise every
            # element shifted, as one peek can tell.
            if self.try_add(variation, "values", self.base, seed, everything(self.negative_lines),
                            exact=True, rounding=OUTLIER_ROUNDING_SLACK):
                self.sets[-1]["negative_lines"] = True
                return
            why = self.skipped.pop().split(": ", 1)[-1]
            self.skipped.append(f"{variation}: every element shifted (lines: {why})")
        if self.try_add(variation, "values", self.base, seed, everything(fn)):
            return
        why = self.skipped.pop().split(": ", 1)[-1]
        if self.try_add(variation, "values", self.base, seed, lambda inputs: _transform(inputs, fn)):
            self.skipped.append(f"{variation}: without exact zeros and varied float inputs ({why})")

    def model_bytes(self) -> int:
        """The largest reference model's parameters and buffers: a worker builds the model on the
        host before it moves it, and the candidate's is about as large (its memory cap allows for both)."""
        return max((sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
                    for model in self.models), default=0)

    def _fp64(self, init_index: int, inputs: list, magnitudes: bool = False) -> Any:
        """The model of ``init_index`` run in fp64 on ``inputs`` (their absolute values with
        ``magnitudes``); raises what the model raises."""
        import copy

        import torch

        if init_index not in self.fp64_models:
            self.fp64_models[init_index] = copy.deepcopy(self.models[init_index]).double()

        def widen(t):
            if not t.is_floating_point():
                return t.to(self.device)
            t = t.double()
            return (t.abs() if magnitudes else t).to(self.device)

        default = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)  # tensors the forward creates match its inputs
        try:
            with torch.no_grad():
                return self.fp64_models[init_index](*map_tensors(inputs, widen))
        finally:
            torch.set_default_dtype(default)

    def _rounding_slack(self, init_index: int, varied: list, out: Any, share: float, atol_scale: float) -> Any:
        """``share`` times the fp64 model on |varied|, capped (``CANCELLATION_CAP``), where
        the model runs an ``ACCUMULATING_OPS`` operator; None where it runs none, where it
        cannot run in fp64 on |varied| (noted once per model in ``skipped``), or where the slack
        is negligible against the tolerance (atol times ``atol_scale``) on every output."""
        from torch.utils._python_dispatch import TorchDispatchMode

        from ..common.compare import tolerances

        if self.accumulates.get(init_index) is False:
            return None

        class Accumulations(TorchDispatchMode):
            seen = False

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                self.seen = self.seen or any(part in func.__name__.split(".")[0] for part in ACCUMULATING_OPS)
                return func(*args, **(kwargs or {}))

        accumulations = Accumulations()
        try:
            with accumulations:
                magnitudes = _like(self._fp64(init_index, varied, True), out)
        except Exception as exc:  # noqa: BLE001 - an op without fp64, or a model that rejects |inputs|
            if init_index not in self.accumulates:
                self.skipped.append(f"rounding slack: no fp64 run on |inputs| ({type(exc).__name__})")
            self.accumulates[init_index] = None
            return None
        self.accumulates[init_index] = accumulations.seen
        if not accumulations.seen:
            return None
        pieces = iter(flatten_tensors(magnitudes))
        del magnitudes

        def slack_of(o):
            atol, rtol = tolerances(str(o.dtype).rsplit(".", 1)[-1], self.judging)
            return _capped_slack(next(pieces), o, share, atol * atol_scale, rtol)

        slack = map_tensors(out, slack_of)
        return slack if flatten_tensors(slack) else None

    def _overflowed(self, init_index: int, inputs: list, out: Any) -> str:
        """Why the non-finite values of the fp32 reference output ``out`` are not the function's own
        (fp32 overflow or a precision accident, which a correct kernel need not repeat), or ''.

        A masked softmax's -inf, a log of zero or of a negative number are non-finite in fp64 at the
        same places: such a set is kept and compared by position (``compare``: NaN, +inf and -inf
        exactly where the reference has them). Skipping it instead left masked problems with the
        base set only, where kernels that overflow or assume a row length passed."""
        try:
            wide = self._fp64(init_index, inputs)
        except Exception as exc:  # noqa: BLE001 - an op without fp64: nothing to tell them apart by
            return f"no fp64 run to tell overflow from the function's own ({type(exc).__name__})"
        return "" if _same_non_finite(out, wide) else "fp32 overflow: the fp64 run differs in where it is not finite"

    def _inexact(self, init_index: int, inputs: list, out: Any, atol_scale: float, slack: Any = None) -> str:
        """Why the fp32 reference output ``out`` is not exact enough on ``inputs`` (judged against
        the same model run in fp64 with ``EXACTNESS_MARGIN`` of the tolerances and of ``slack``), or ''."""
        from ..common.compare import compare_outputs

        try:
            exact = self._fp64(init_index, inputs)
        except Exception as exc:  # noqa: BLE001 - an op without fp64: no outliers
            return f"no fp64 reference ({type(exc).__name__})"
        try:
            exact = _like(exact, out)
        except (TypeError, ValueError) as exc:
            return f"fp64 reference differs in structure ({exc})"
        margin = map_tensors(slack, lambda t: t * EXACTNESS_MARGIN) if slack is not None else None
        mismatch = compare_outputs(out, exact, self.exactness, atol_scale=atol_scale, slack=margin)
        return f"fp32 reference off its fp64 run ({mismatch.reason})" if mismatch else ""

    def _constructor_arguments(self) -> dict[str, float | int]:
        """Constants that reach ``get_init_inputs()`` at other values: floats (a multiplier, a
        slope, clamp bounds; ``varied_scalar``) and integers below 4, which the odd sizes leave
        alone (kernel sizes, strides, paddings, dilations: one step away from zero). A kernel that
        writes the problem's values in instead of reading its constructor's arguments is right at
        those values only. Each change is kept only if the problem still
        runs on the meta device with the ones kept before it."""
        import torch

        def init_of(values: dict) -> list:
            torch.manual_seed(self.seed)
            return list(self.module_at(values).get_init_inputs())

        changes = [(n, varied_scalar(v, self.scalar_factor))
                   for n, v in find_scalar_constants(self.original_source).items()]
        # Not an axis (``dim``, ``axis``): a kernel tiled for the problem's axis is right on
        # another but can be many times slower in the CPU interpreter, past its time limit.
        changes += [(n, v + 1 if v >= 0 else v - 1) for n, v in self.values.items()
                    if -4 < v < 4 and not any(word in n.lower() for word in ("dim", "axis"))]
        varied: dict = {}
        try:
            base = init_of(self.values)
            check_meta = meta_forward_runs(rewrite_constants(self.original_source, self.values))
            for name, other in changes:
                trial = {**self.values, **varied, name: other}
                if same_init(base, init_of({**self.values, name: other})):
                    continue  # never reaches the constructor
                if check_meta and not meta_forward_runs(rewrite_constants(self.original_source, trial)):
                    continue
                varied[name] = other
        except Exception as exc:  # noqa: BLE001 - the problem rejects a value: keep what was kept
            self.skipped.append(f"constructor arguments: {type(exc).__name__}")
        return varied

    def _add_shape_variation(self, seed: int) -> None:
        eligible = {n: odd_size(v) for n, v in self.values.items() if v >= 4 and odd_size(v) != v}
        attempts = [eligible] + [{n: v} for n, v in eligible.items()] if eligible else []
        arguments = self._constructor_arguments()
        if arguments:
            attempts.insert(0, {**eligible, **arguments})
        for changed in attempts[:6]:
            try:
                module = self.module_at({**self.values, **changed})
            except Exception as exc:  # noqa: BLE001
                self.skipped.append(f"shape {changed}: problem failed to load ({type(exc).__name__})")
                continue
            label = "_".join(f"{n}{v:g}" if isinstance(v, float) else f"{n}{v}" for n, v in changed.items())
            if self.try_add("shape_" + label, "shape", module, seed):
                return
        if not attempts:
            self.skipped.append("shape: no module-level size constant to vary")

    def _wide_cap(self, base_numel: int) -> int:
        """Elements the wide set may hold: a multiple of the cap, or of the problem where uncapped
        (on CUDA also bounded by the free memory: inputs, outputs and the candidate's copies)."""
        import torch

        multiple = WIDE_CAP_MULTIPLE["cpu" if self.device == "cpu" else "cuda"]
        cap = multiple * (self.cap if self.cap > 0 else base_numel)
        if self.device != "cpu":
            free, _total = torch.cuda.mem_get_info()
            cap = min(cap, free // (4 * 8))
        return cap

    def _wide_candidates(self) -> list[dict[str, int]]:
        """Sizes above the problem's own: every non-batch constant grown (batch halved to fit),
        then each of the largest grown alone (the others shrunk to fit)."""
        growable = sorted((n for n, v in self.original_values.items() if v >= 4 and not is_batch_name(n)),
                          key=lambda n: -self.original_values[n])
        if not growable:
            return []
        grown = {n: grown_size(self.original_values[n]) for n in growable}
        attempts = [{**self.original_values, **grown}]
        attempts += [{**self.original_values, n: grown[n]} for n in growable[:3]]
        return attempts

    def _fit(self, values: dict[str, int], fixed: set[str], cap: int) -> dict[str, int] | None:
        for _ in range(200):
            try:
                numel = meta_numel(rewrite_constants(self.original_source, values))
            except Exception:  # noqa: BLE001 - a size combination the problem rejects
                return None
            if numel <= cap:
                return values
            batch = {n: v for n, v in values.items() if is_batch_name(n) and v > 1 and n not in fixed}
            if batch:
                name = max(batch, key=batch.get)
                values = {**values, name: max(1, values[name] // 2)}
                continue
            free = {n: v for n, v in values.items() if n not in fixed}
            smaller = shrink_step(free)
            if smaller is None:
                return None
            values = {**values, **smaller}
        return None

    def _add_wide_set(self, seed: int) -> None:
        base_numel = next(s["numel"] for s in self.sets if s["kind"] == "base")
        cap = self._wide_cap(base_numel)
        for attempt in self._wide_candidates():
            grown = {n for n, v in attempt.items() if v > self.original_values[n]}
            values = self._fit(attempt, grown, cap)
            if values is None:
                continue
            try:
                module = self.module_at(values)
            except Exception as exc:  # noqa: BLE001
                self.skipped.append(f"wide {values}: problem failed to load ({type(exc).__name__})")
                continue
            if self.try_add("wide_" + "_".join(f"{n}={values[n]}" for n in sorted(grown)), "wide", module, seed):
                self._mark_above_cap(values)
                return
        for values, name in self._long_candidates(cap):
            if self.try_add(f"long_{name}={values[name]}", "wide", self.module_at(values), seed):
                self._mark_above_cap(values)
                return
        if self.cap > 0 and self.values != self.original_values:
            # Nothing wider than the problem fits: at least more elements than the cap, along the
            # same halving path that shrank the base.
            values, _notes = shrink_to_cap(self.original_source, cap)
            if values != self.values and self.try_add("large", "wide", self.module_at(values), seed):
                self._mark_above_cap(values)
                return
        self.skipped.append("wide: no size above the problem's own fits")

    def _long_candidates(self, cap: int):
        """Nothing wider than the problem fits: one non-batch size as long as the wide set's
        elements allow (odd, at most the problem's own), batch sizes at 2, the other constants at
        the base's. Shrinking every constant by the same halving keeps each row shorter than the
        blocks kernels hard-code (a softmax over one block of 1024 columns passed every set)."""
        growable = sorted((n for n, v in self.original_values.items() if v >= 4 and not is_batch_name(n)),
                          key=lambda n: -self.original_values[n])
        batch = {n: min(v, 2) for n, v in self.values.items() if is_batch_name(n)}
        for name in growable[:3]:
            size = self.original_values[name]
            while size > 2 * self.values[name]:
                values = {**self.values, **batch, name: min(size | 1, self.original_values[name])}
                try:
                    fits = meta_numel(rewrite_constants(self.original_source, values)) <= cap
                except Exception:  # noqa: BLE001 - a size combination the problem rejects
                    break
                if fits:
                    yield values, name
                    break
                size //= 2

    def problem_numel(self) -> int:
        """The elements of the problem's own inputs (0 where they cannot be measured)."""
        try:
            return meta_input_numel(self.original_source)
        except Exception:  # noqa: BLE001 - a problem whose inputs need a real device
            return 0

    def _mark_above_cap(self, values: dict[str, int]) -> None:
        self.sets[-1]["above_cap"] = self.cap > 0 and meta_numel(
            rewrite_constants(self.original_source, values)) > self.cap


def run(job_dir: str, secret: dict, started: float) -> None:
    import torch

    from ..common.tensor_io import save_tensors

    phases = {"import": time.monotonic() - started}
    mark = time.monotonic()

    with open(os.path.join(job_dir, "job.json")) as fh:
        job = json.load(fh)
    with open(os.path.join(job_dir, "problem.py")) as fh:
        source = fh.read()
    torch.set_num_threads(max(1, int(job.get("threads", 1))))
    pin_ieee_fp32()  # cuDNN's convolutions default to TF32: an fp32 problem's reference is fp32
    builder = ReferenceBuilder(source, job, secret)
    builder.build()
    init_specs = [pack(init, f"init{i}", builder.tensors) for i, init in enumerate(builder.inits)]
    phases["build"], mark = time.monotonic() - mark, time.monotonic()
    save_tensors(os.path.join(job_dir, "inputs.safetensors"), builder.tensors)
    save_tensors(os.path.join(job_dir, "expected.safetensors"), builder.expected)
    phases["save"] = time.monotonic() - mark
    prepared = {
        "problem_source": builder.base_source, "constants": builder.values, "notes": builder.notes,
        "init": init_specs[0], "inits": init_specs, "sets": builder.sets, "skipped": builder.skipped,
        "unanswered": builder.unanswered,
        "param_keys": builder.param_keys,
        "model_bytes": builder.model_bytes(),
        "shrunk": builder.values != builder.original_values,
        "problem_numel": builder.problem_numel(),
        "phase_s": {name: round(seconds, 4) for name, seconds in phases.items()},
    }
    tmp = os.path.join(job_dir, "prepared.json.tmp")
    with open(tmp, "w") as fh:
        json.dump(prepared, fh)
    os.replace(tmp, os.path.join(job_dir, "prepared.json"))


def main() -> None:
    started = time.monotonic()
    if len(sys.argv) != 2:
        sys.exit("usage: python -m extensions.verify.reference_worker JOB_DIR")
    try:
        secret = json.loads(sys.stdin.readline() or "null")
        if not isinstance(secret, dict):
            raise ValueError("no batch secret on stdin")
        run(sys.argv[1], secret, started)
    except Exception as exc:  # noqa: BLE001 - reported to the parent in one line
        import traceback

        where = traceback.extract_tb(exc.__traceback__)[-1]
        print(f"reference failed: {type(exc).__name__}: {str(exc)[:300]} "
              f"({os.path.basename(where.filename)}:{where.lineno})", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
