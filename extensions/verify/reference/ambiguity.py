"""Output elements the reference itself cannot decide: a step function's value where its argument
lies within rounding of a step.

``floor(relu(x) * sigmoid(y) * sigmoid(z) * 1.46)`` computed in another order than the reference is
a few ulps off it before the floor; where the product lies that close to a whole number, the two
floors differ by 1, and a correct kernel was rejected on one element of 65,536. The same holds for
``round``, ``trunc``, ``sign``, a division with a rounding mode, ``remainder``, a comparison cast to
float, an ``argmax`` between near-equal values: at such an element the true answer is ambiguous at
fp32 precision.

Used by the builder (``builder.py``), in the trusted reference process only. Where the problem's
forward runs a step operator (``step_watch``), the fp32 reference is run again on its inputs times
(1 + d u) and (1 - d u), u uniform in [-1, 1] per element, for a few magnitudes d around 1e-6..1e-5
(``PERTURBATIONS``). An element is ambiguous where one side of such a pair jumps and the other does
not: ``|f(x + h) + f(x - h) - 2 f(x)|`` beyond the element's tolerance. A continuous output moves by
about the same amount both ways; an integer or bool output is ambiguous wherever a perturbed run
changes it. An ill-conditioned continuous output (a difference of two large, nearly equal numbers)
is the exception: the fp32 runs' own rounding (of the perturbed inputs and of the forward) leaves a
second difference of a few ulps of the large terms, beyond the tolerance of the small result. So
where the model runs in fp64, a float element counts only where the same pair, drawn in fp64 and
run in fp64, jumps too (a step is the function's, not the precision's), or where the fp32 and fp64
references themselves differ beyond the tolerance (fp32 rounding crossed the step). At an
ambiguous element the parent accepts any of the values the reference gave there (the fp32 run, the fp64 run, each perturbed
run); everywhere else the comparison is unchanged. More ambiguous elements than
``compare.ambiguous_limit`` allows in one output and none are kept: a reference that cannot decide
a broad share of its output is judged as it was.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from extensions.timing.tensors import flatten_tensors, map_tensors

from ..common.compare import ambiguous_limit

# aten operators (name parts, in-place forms included) whose output jumps where the argument
# crosses a step; comparisons, casts to integers, argmax/argmin and sort indices are found by their
# integral output instead (``step_watch``).
STEP_OPS = frozenset(("floor", "ceil", "round", "trunc", "fix", "frac", "sign", "sgn", "heaviside", "remainder",
                      "fmod", "floor_divide", "hardshrink", "threshold", "histc", "bucketize", "searchsorted"))
# Relative perturbations of the inputs: (1 + d u) and (1 - d u) per magnitude d. A correct kernel's
# intermediates are a few ulps (2^-24 ~ 6e-8 each) off the reference's; the largest d moves an
# argument tens of ulps either way, the smallest catches an element with two steps within reach of
# the largest (both sides jump, the second difference cancels).
PERTURBATIONS = (1e-5, 3e-6, 1e-6)
# The same magnitudes where a step is decided in fp16 or bf16, or an input is one, in units of that
# dtype's eps (2^-10, 2^-7). fp32's d, rounded back to fp16, moves nothing: the reference computes
# op by op in the low precision, each op rounding by up to half an ulp, so a correct kernel that
# computes in fp32 sees a comparison's two sides a few such ulps from the reference's and takes
# the other branch where they lie that close. Tens of ulps, as for fp32, would reach percents of
# an argument and mark a broad share of the output (over the cap: none kept); a few ulps reach the
# reference's own rounding and mark about as many elements as a reordered kernel actually flips.
LOW_PRECISION_ULPS = (4.0, 2.0, 1.0)


def step_watch():
    """A dispatch mode that records (``.seen``) whether a forward ran a step operator: one of
    ``STEP_OPS``, a division with a rounding mode, or any operator that turns floating-point
    arguments into integers or bools (``x > y``, ``argmax``, a cast to ``long``), and
    (``.coarsest``) the floating-point dtype of least precision among such operators' tensor
    arguments (a forward that casts to fp16 decides its steps in fp16, whatever its inputs). torch
    is imported here, not with the module: the reference process times its own import of torch."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class StepWatch(TorchDispatchMode):
        seen = False
        coarsest = None

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            result = func(*args, **kwargs)
            if _is_step(func, args, kwargs, result):
                self.seen = True
                self.coarsest = coarsest_dtype([self.coarsest, *(a.dtype for a in _tensors(args, kwargs)
                                                                if a.is_floating_point())])
            return result

    return StepWatch()


def _tensors(args, kwargs) -> list:
    import torch
    from torch.utils._pytree import tree_leaves

    return [leaf for leaf in tree_leaves((args, kwargs)) if isinstance(leaf, torch.Tensor)]


def coarsest_dtype(dtypes) -> Any:
    """The floating-point dtype of ``dtypes`` with the largest eps (None among them ignored)."""
    import torch

    floating = [d for d in dtypes if d is not None and d.is_floating_point]
    return max(floating, key=lambda d: torch.finfo(d).eps, default=None)


def steps_decided_coarsely(step_dtype, inputs: list) -> bool:
    """Whether the reference decides its steps in fp16/bf16: its steps are seen in such a dtype
    (``step_dtype``, from ``step_watch``), or the inputs it computes from are one."""
    import torch

    coarsest = coarsest_dtype([step_dtype, *(v.dtype for v in flatten_tensors(inputs) if v.is_floating_point())])
    return coarsest is not None and torch.finfo(coarsest).eps > torch.finfo(torch.float32).eps


def perturbation(level: int, dtype, step_dtype=None) -> float:
    """The relative magnitude of perturbation ``level`` for an input of ``dtype`` where the steps
    are decided in ``step_dtype`` (None: unknown): ``PERTURBATIONS`` where both are fp32 or
    wider, else ``LOW_PRECISION_ULPS`` of the coarser one's eps (an fp16 input moves by whole
    ulps of fp16 or not at all)."""
    import torch

    coarsest = coarsest_dtype([dtype, step_dtype])
    eps = torch.finfo(coarsest).eps
    if eps <= torch.finfo(torch.float32).eps:
        return PERTURBATIONS[level]
    return LOW_PRECISION_ULPS[level] * eps


def _is_step(func, args, kwargs, result) -> bool:
    import torch

    name = func.__name__.split(".")[0].rstrip("_")
    if name in STEP_OPS or (name == "div" and kwargs.get("rounding_mode") is not None):
        return True
    floating_in = any(isinstance(a, torch.Tensor) and a.is_floating_point() for a in args)
    outputs = result if isinstance(result, (list, tuple)) else (result,)
    integral_out = any(isinstance(o, torch.Tensor) and not (o.is_floating_point() or o.is_complex()) for o in outputs)
    return floating_in and integral_out


def perturbed_inputs(inputs: list, level: int, seed: int, wide: bool = False, step_dtype=None) -> list[list]:
    """``inputs`` with every floating-point tensor times (1 + d u) and (1 - d u), d its
    ``perturbation`` at ``level``, u uniform in [-1, 1] per element, drawn from ``seed`` (the
    batch's secret): the pair of input lists. ``wide``: the same pair kept in fp64 (not rounded
    back to the inputs' dtypes)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    plus, minus = [], []
    for value in inputs:
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            scale = perturbation(level, value.dtype, step_dtype)
            u = (torch.rand(value.shape, generator=generator, dtype=torch.float64) * 2 - 1).to(value.device)
            dtype = torch.float64 if wide else value.dtype
            plus.append((value.double() * (1 + scale * u)).to(dtype))
            minus.append((value.double() * (1 - scale * u)).to(dtype))
        else:
            plus.append(value)
            minus.append(value)
    return [plus, minus]


def ambiguous_outputs(out: Any, rerun: Callable[[list], Any], inputs: list, wide: Any, seed: int,
                      judging, atol_scale: float, slack: Any,
                      rerun_wide: Optional[Callable[[list], Any]] = None, step_dtype=None) -> tuple[Any, int]:
    """The ambiguous elements of each tensor of ``out`` (the fp32 reference on ``inputs``):
    ``(flat indices int64, alternatives)`` per tensor, the alternatives ``[n, k]`` in the output's
    dtype, column 0 the reference's own value; None for a tensor with none or with more than
    ``ambiguous_limit``. ``rerun(inputs)`` is the fp32 model on other inputs; ``wide`` the fp64
    run cast to the output's dtypes (None: none); ``rerun_wide(inputs)`` the fp64 model on other
    (fp64) inputs, cast alike (None, or failing: float elements are decided by the fp32 runs
    alone). ``step_dtype``: the dtype the forward's steps are decided in (``step_watch``), which
    sizes the perturbations with the inputs' own. Also returns how many tensors had too many."""
    import torch

    references = flatten_tensors(out)
    if not references:
        return None, 0
    over_cap = 0
    pairs = _perturbed_runs(rerun, inputs, seed, step_dtype=step_dtype)
    wides = flatten_tensors(wide) if wide is not None else []
    wide_pairs = []
    if rerun_wide is not None and wides:
        try:
            wide_pairs = _perturbed_runs(rerun_wide, inputs, seed, wide=True, step_dtype=step_dtype)
        except Exception:  # noqa: BLE001 - an op without fp64: the fp32 runs decide alone
            wide_pairs = []
    slacks = tensor_places(slack) if slack is not None else []
    decided_coarsely = steps_decided_coarsely(step_dtype, inputs)
    entries = []
    for position, ref in enumerate(references):
        runs = [(p[position], m[position]) for p, m in pairs
                if position < min(len(p), len(m))
                and p[position].shape == ref.shape == m[position].shape and p[position].dtype == ref.dtype]
        if len(runs) != len(pairs) or ref.numel() == 0:
            entries.append(None)
            continue
        own_slack = slacks[position] if len(slacks) == len(references) else None
        unsettled = _unsettled(ref, runs, judging, atol_scale, own_slack)
        off_truth = None
        if ref.is_floating_point() and position < len(wides) and wides[position].shape == ref.shape:
            wide_runs = [(p[position], m[position]) for p, m in wide_pairs
                         if position < min(len(p), len(m))
                         and p[position].shape == ref.shape == m[position].shape]
            wide_ref = wides[position].to(ref.dtype).to(ref.device)
            if wide_pairs and len(wide_runs) == len(wide_pairs):
                unsettled &= (_unsettled(wide_ref, wide_runs, judging, atol_scale, own_slack)
                              | _apart(ref, wide_ref, judging, atol_scale, own_slack))
            if decided_coarsely:
                # A step decided in fp16/bf16 takes the other branch wherever its two sides lie
                # within that dtype's rounding of each other; perturbations find such an element
                # only by chance (an input moved by whole ulps or not at all), the fp64 model
                # finds every one: it is the value a correct kernel computing wider gives there.
                off_truth = _apart(ref, wide_ref, judging, atol_scale, own_slack)
                unsettled |= off_truth
        elif decided_coarsely and position < len(wides) and wides[position].shape == ref.shape:
            # An integer or bool output of such a step (a comparison returned as is, a floor cast
            # to long): the fp64 model's own integers, where they differ, are the other answer.
            off_truth = _off_truth(ref, wides[position], judging, atol_scale, own_slack)
            unsettled |= off_truth
        count = int(unsettled.sum())
        limit = ambiguous_limit(ref.numel(), ref.dtype, coarse=decided_coarsely)
        if count > limit and off_truth is not None and 0 < int(off_truth.sum()) <= limit:
            # Over the cap with the perturbations' marks: the elements where the reference is off
            # the fp64 model are the ones a correct wider kernel is sure to differ at.
            unsettled, count = off_truth, int(off_truth.sum())
        if count == 0 or count > limit:
            over_cap += count > 0
            entries.append(None)
            continue
        index = unsettled.reshape(-1).nonzero().reshape(-1)
        columns = [ref.reshape(-1)[index]]
        if position < len(wides) and wides[position].shape == ref.shape:
            columns.append(wides[position].to(ref.dtype).reshape(-1)[index].to(ref.device))
        for plus, minus in runs:
            columns += [plus.reshape(-1)[index], minus.reshape(-1)[index]]
        values = torch.stack(columns, dim=1)
        if values.is_floating_point():
            # A non-finite value the reference did not give there is no answer to accept.
            values = torch.where(torch.isfinite(values), values, values[:, :1].expand_as(values))
        entries.append((index.to("cpu"), values.to("cpu").contiguous()))
    if all(entry is None for entry in entries):
        return None, over_cap
    pieces = iter(entries)
    return map_tensors(out, lambda _tensor: next(pieces)), over_cap


def outputs_off_the_function(out: Any, wide: Any, judging, atol_scale: float, slack: Any,
                             coarse: bool = False) -> int:
    """How many tensors of ``out`` (the fp32 reference) lie off ``wide`` (the fp64 model's run, cast
    alike) beyond the element's tolerance, or differ as integers, at more elements than
    ``ambiguous_limit`` (``coarse``: the steps are decided in fp16/bf16)."""
    references, wides = flatten_tensors(out), flatten_tensors(wide)
    slacks = tensor_places(slack) if slack is not None else []
    over = 0
    for position, (ref, other) in enumerate(zip(references, wides)):
        if other.shape != ref.shape or ref.numel() == 0:
            continue
        own_slack = slacks[position] if len(slacks) == len(references) else None
        off = _off_truth(ref, other, judging, atol_scale, own_slack)
        over += int(off.sum()) > ambiguous_limit(ref.numel(), ref.dtype, coarse=coarse)
    return over


def _off_truth(ref, wide, judging, atol_scale: float, slack: Optional[Any]):
    """Where the fp32 reference is off the fp64 model's run (``wide``, cast to its dtype here):
    beyond the element's tolerance for a float output, any difference for an integer or bool one."""
    wide = wide.to(ref.dtype).to(ref.device)
    if ref.is_floating_point():
        return _apart(ref, wide, judging, atol_scale, slack)
    return ref != wide


def _perturbed_runs(rerun: Callable[[list], Any], inputs: list, seed: int, wide: bool = False,
                    step_dtype=None) -> list:
    """``rerun`` on each perturbed pair (each level of ``PERTURBATIONS``, seeds ``seed + i``;
    ``wide``: the pairs kept in fp64): per magnitude, the flat output tensors of its plus and
    minus runs."""
    import torch

    pairs = []
    for i in range(len(PERTURBATIONS)):
        plus, minus = perturbed_inputs(inputs, i, seed + i, wide=wide, step_dtype=step_dtype)
        with torch.no_grad():
            pairs.append((flatten_tensors(rerun(plus)), flatten_tensors(rerun(minus))))
    return pairs


def _bound(ref, judging, atol_scale: float, slack: Optional[Any]):
    """Each element's tolerance: atol (scaled) + rtol |ref|, plus its rounding slack."""
    from ..common.compare import tolerances

    atol, rtol = tolerances(str(ref.dtype).replace("torch.", ""), judging)
    bound = atol * max(1.0, atol_scale) + rtol * ref.double().abs()
    if slack is not None and slack.shape == ref.shape:
        bound = bound + slack.double().abs().to(ref.device)
    return bound


def _apart(ref, other, judging, atol_scale: float, slack: Optional[Any]):
    """Where two finite runs of one output differ beyond the element's tolerance."""
    import torch

    r, o = ref.double(), other.double()
    return torch.isfinite(r) & torch.isfinite(o) & ((r - o).abs() > _bound(ref, judging, atol_scale, slack))


def tensor_places(value: Any) -> list:
    """The tensors of a value shaped as an output, with None kept where a tensor of the output has
    none (the slack of an integer output)."""
    import torch

    if value is None or isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensor_places(v)]
    return []


def _unsettled(ref, runs: list, judging, atol_scale: float, slack: Optional[Any]):
    """Where one side of a perturbed pair jumps and the other does not (float outputs), or where
    any perturbed run differs (integer and bool outputs)."""
    import torch

    if not (ref.is_floating_point() or ref.is_complex()):
        unsettled = torch.zeros(ref.shape, dtype=torch.bool, device=ref.device)
        for plus, minus in runs:
            unsettled |= (plus != ref) | (minus != ref)
        return unsettled
    r = ref.double()
    bound = _bound(ref, judging, atol_scale, slack)
    finite = torch.isfinite(r)
    unsettled = torch.zeros(ref.shape, dtype=torch.bool, device=ref.device)
    for plus, minus in runs:
        p, m = plus.double(), minus.double()
        both = finite & torch.isfinite(p) & torch.isfinite(m)
        second_difference = (p + m - 2 * r).abs()
        unsettled |= both & (second_difference > bound)
    return unsettled
