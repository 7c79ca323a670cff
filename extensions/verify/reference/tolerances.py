"""The reference's fp64 tolerance arithmetic: how far an fp32 reference may be from its own fp64 run,
the rounding slack a sum's terms earn an output element, and the checks that tell fp32 overflow
from a function's own non-finite values.

Used by the builder (``builder.py``) only: the parent compares with the tolerances and slack the
builder stored beside each set (``common/compare.py``).
"""
from __future__ import annotations

import types
from typing import Any

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
# How far a low-precision forward's rounding can move an output: this many units (the coarsest
# low-precision dtype's eps) of the largest magnitude the forward computes. A step to the fp64
# run's value beyond it is no rounding: the fp64 run computed another function there (a constant
# taken from ``torch.finfo(x.dtype)``, a branch on the dtype), and the step is cut to it.
ROUNDING_UNITS = 8


def capped_slack(magnitudes, out, share: float, atol: float, rtol: float):
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


def toward_exact(out, exact, atol: float, rtol: float, reach: float = float("inf")):
    """Per element of an output ``out`` computed in low precision (fp16/bf16): the signed step from it to
    ``exact`` (the fp64 model on the same inputs), at least as long, in ``out``'s dtype; None where
    that stays ``NEGLIGIBLE_SLACK`` of the tolerance ``atol`` + ``rtol`` |out| everywhere. The
    eager forward rounds every step to the low precision, and where a step's larger intermediate
    cancels (``(x + y) - y``, ``exp(x) - 1``) the reference is several of the output's ulps off; a
    kernel that keeps fp32 between steps, as torch inductor's do, is nearer the exact value by as
    much. The comparison then measures a candidate from the stretch between the reference and
    the exact value (``compare``): a kernel on the far side of the reference gains nothing. No
    step is longer than ``reach``, what rounding can explain (``ROUNDING_UNITS``)."""
    import torch

    step = exact.detach().to(out.device, torch.float64) - out.detach().double()
    step = step.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0).clamp_(min=-reach, max=reach).float()
    sizes = out.detach().abs().float().nan_to_num_(nan=0.0, posinf=0.0)
    floor = sizes.mul_(rtol * NEGLIGIBLE_SLACK).add_(atol * NEGLIGIBLE_SLACK)
    if bool(torch.le(step.abs(), floor).all()):
        return None
    # Kept in the output's own dtype (half what fp32 would store beside a large output), lengthened:
    # to nearest moves a value by at most 2^-9 of it (bf16), so a 2^-7 margin never shortens it
    # (except below fp16's smallest subnormal, 6e-8, far under any tolerance).
    largest = torch.finfo(out.dtype).max
    return step.mul_(1 + 2 ** -7).clamp_(min=-largest, max=largest).to(out.dtype)


def all_finite(value: Any) -> bool:
    import torch

    if isinstance(value, torch.Tensor):
        return not value.is_floating_point() or bool(torch.isfinite(value).all())
    if isinstance(value, (list, tuple)):
        return all(all_finite(v) for v in value)
    return True


def same_non_finite(value: Any, wide: Any) -> bool:
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
                and all(same_non_finite(v, w) for v, w in zip(value, wide)))
    return True


def rms(value: Any) -> float:
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


def scaled_tolerances(tolerances: dict, share: float) -> types.SimpleNamespace:
    """The comparison's tolerances, each ``share`` as wide (the norm below which only atol applies stays)."""
    scaled = {name: float(value) * share for name, value in tolerances.items() if name != "min_reference_norm"}
    return types.SimpleNamespace(**scaled, min_reference_norm=float(tolerances["min_reference_norm"]))


def like(value: Any, reference: Any) -> Any:
    """``value`` (a nested output) with each tensor cast to the dtype of ``reference``'s at that place."""
    import torch

    if isinstance(reference, torch.Tensor):
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{type(value).__name__} where a tensor was")
        return value.to(reference.dtype)
    if isinstance(reference, (list, tuple)):
        if not isinstance(value, (list, tuple)) or len(value) != len(reference):
            raise ValueError("another number of outputs")
        return type(reference)(like(v, r) for v, r in zip(value, reference))
    return value
