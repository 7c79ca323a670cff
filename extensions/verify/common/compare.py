"""Compare a candidate's outputs with the reference's, in the trusted parent.

Checks, per output tensor (tuples are compared element-wise):

* same structure, exact shape and exact dtype;
* non-finite values: a NaN/Inf in the candidate passes only where the reference has the very same
  non-finite value at the same position (a reference that itself yields NaN there is matched);
* ``allclose`` on the finite positions with atol/rtol by dtype (fp32: 1e-4; fp16/bf16: 1e-2); on
  an input set the verifier scaled up, atol is multiplied by how much the reference output grew
  against the default set, or the inputs where its output is all zero (``atol_scale`` >= 1,
  ``reference_worker``), since rounding error grows with the magnitudes
  summed: a correct fp32 GEMM on inputs x100 differs from cuBLAS by ~5e-4 where the output
  crosses zero. rtol and the relative-norm check below are never scaled;
* relative error ``||out - ref|| / ||ref|| <= max_relative_error`` whenever ``||ref||`` is not ~0,
  so a near-zero output cannot hide under ``atol`` on small-valued references;
* ``slack``: a per-element addition to the tolerance that the reference computed for its set
  where the problem accumulates (a GEMM, a convolution, a sum): a few fp32 roundings of the sum
  of each output's terms' magnitudes, which another correct order of summation may differ by
  where those terms cancel (``reference.tolerances.ROUNDING_SLACK``);
* ``toward``: on an output computed in fp16/bf16 by a problem without step functions, the signed step from each
  reference element to the fp64 model's value there (``reference.tolerances.toward_exact``): the
  eager forward rounds every step to the low precision, and a kernel that keeps fp32 between
  steps is nearer the exact value. The candidate is measured from the stretch between the two,
  element-wise and in the relative-norm check alike; one beyond the reference on the other side
  is measured from the reference as before;
* ``ambiguous``: where the problem runs a step function (floor, round, sign, a comparison, argmax),
  the few output elements the reference itself cannot decide (``reference.ambiguity``), each with
  the values the reference gave there in fp32, in fp64 and on inputs perturbed by ~1e-6..1e-5; at
  those elements alone the candidate is compared with the nearest of them. At most
  ``ambiguous_limit`` elements per output (the reference keeps to it; a malformed set, or one
  larger than ``ambiguous_bound``, is not used).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

LOW_PRECISION = ("float16", "bfloat16")
# The config fields the comparison reads (the reference process gets them to judge its own exactness).
TOLERANCE_FIELDS = ("atol_fp32", "rtol_fp32", "atol_low_precision", "rtol_low_precision",
                    "max_relative_error", "min_reference_norm")
# Ambiguous elements an output may have: a small share of it, and never more than a fixed count
# (a reference that cannot decide a broad share of its output is judged as if none were).
AMBIGUOUS_SHARE = 1e-3
AMBIGUOUS_MAX = 16384
# The share for an fp16 or bf16 output. Its reference decides every step after rounding each op to
# 2^-11 (fp16) or 2^-8 (bf16) relative, 2^13 or 2^16 times fp32's half ulp, so a comparison's two
# sides lie within that rounding of each other far more often, and a correct kernel computing in
# fp32 takes the other branch there: bf16 `where(log1p(|x|) > hardtanh(y), ...)` differs so at 2
# of 600 elements of one set (3.3e-3), the perturbations of an fp16 `where(...)` then GELU mark up
# to 3.4e-3 of an output and of a bf16 one up to 1.1e-2. Each such element is still compared with
# values the trusted reference gave there (its own, the fp64 model's, its perturbed runs').
AMBIGUOUS_SHARE_LOW_PRECISION = 1e-2


def ambiguous_limit(numel: int, dtype=None, *, coarse: bool = False) -> int:
    """How many elements of an output of ``numel`` may be ambiguous (one at least, for tiny
    outputs): the low-precision share where the output is fp16/bf16 (``dtype``) or its steps are
    decided in one (``coarse``: the reference computes from such inputs or casts to one; a floor
    returned as integers, or a comparison as bools, has as many ties as the fp16 values it came
    from), the default share otherwise."""
    low = coarse or str(dtype).replace("torch.", "") in LOW_PRECISION
    return min(AMBIGUOUS_MAX, max(1, int(numel * (AMBIGUOUS_SHARE_LOW_PRECISION if low else AMBIGUOUS_SHARE))))


def ambiguous_bound(numel: int) -> int:
    """The most ambiguous elements any output of ``numel`` elements may carry, whatever decided its
    steps: what a set's ambiguous elements, or a candidate's disagreements put to the parent, are
    checked against as well-formed. The trusted reference keeps each output to its own
    ``ambiguous_limit``; every element is still judged against its alternatives."""
    return ambiguous_limit(numel, coarse=True)


def localised_bound(numel: int, dtype=None) -> int:
    """The most elements a timed call may disagree with the reference run beside it at and still be
    put to the parent (``disagreeing_elements``), per output of ``numel`` elements. The reference's
    ambiguous elements, and on an fp16/bf16 output also its own rounding: the eager reference is
    off the exact value at a share of elements where a kernel keeping fp32 is not, and only the
    parent knows the exact values (``tolerances.toward_exact``). Bounded by
    ``AMBIGUOUS_MAX`` (what crosses back); the parent judges every such element."""
    bound = ambiguous_bound(numel)
    if str(dtype).replace("torch.", "") in LOW_PRECISION:
        bound = max(bound, min(AMBIGUOUS_MAX, numel // 4))
    return bound


@dataclass
class Mismatch:
    reason: str  # short tag: structure, shape, dtype, nan_or_inf, values, near_zero
    message: str


def tolerances(dtype_name: str, config) -> tuple[float, float]:
    if dtype_name in LOW_PRECISION:
        return config.atol_low_precision, config.rtol_low_precision
    return config.atol_fp32, config.rtol_fp32


def _describe(value: Any) -> str:
    import torch

    if isinstance(value, torch.Tensor):
        return f"tensor{tuple(value.shape)}"
    if isinstance(value, (list, tuple)):
        return f"{type(value).__name__} of {len(value)}"
    return type(value).__name__


def compare_outputs(candidate: Any, reference: Any, config, where: str = "output",
                    atol_scale: float = 1.0, slack: Any = None, ambiguous: Any = None,
                    toward: Any = None) -> Optional[Mismatch]:
    """None when ``candidate`` matches ``reference``; else the first mismatch, in one line.
    ``slack``: None, or per-element tolerance shaped as ``reference`` (tensors where it has them).
    ``toward``: None, or the per-element step to the exact value, shaped as ``reference``.
    ``ambiguous``: None, or shaped as ``reference`` with a pair (flat indices, alternatives
    ``[n, k]``) or None where it has a tensor (``reference.ambiguity``)."""
    import torch

    if isinstance(reference, torch.Tensor):
        if not isinstance(candidate, torch.Tensor):
            return Mismatch("structure", f"{where}: expected a tensor, got {_describe(candidate)}")
        if ambiguous is not None and tuple(candidate.shape) == tuple(reference.shape):
            reference = with_nearest_alternatives(candidate, reference, ambiguous)
        return _compare_tensor(candidate, reference, config, where, atol_scale,
                               slack if isinstance(slack, torch.Tensor) else None,
                               toward if isinstance(toward, torch.Tensor) else None)
    if isinstance(reference, (list, tuple)):
        # A single-element tuple and a bare tensor are the same answer to most callers, but not
        # to the contract: the structure must match exactly.
        if not isinstance(candidate, (list, tuple)) or len(candidate) != len(reference):
            return Mismatch("structure", f"{where}: expected {_describe(reference)}, got {_describe(candidate)}")
        slacks = slack if isinstance(slack, (list, tuple)) and len(slack) == len(reference) else [None] * len(reference)
        ambiguities = (ambiguous if isinstance(ambiguous, (list, tuple)) and len(ambiguous) == len(reference)
                       else [None] * len(reference))
        towards = toward if isinstance(toward, (list, tuple)) and len(toward) == len(reference) else [None] * len(reference)
        for i, (c, r, s, a, t) in enumerate(zip(candidate, reference, slacks, ambiguities, towards)):
            mismatch = compare_outputs(c, r, config, f"{where}[{i}]", atol_scale, s, a, t)
            if mismatch:
                return mismatch
        return None
    if candidate != reference:
        return Mismatch("values", f"{where}: expected {reference!r}, got {str(candidate)[:40]}")
    return None


def with_nearest_alternatives(out, ref, ambiguous):
    """``ref`` with each ambiguous element replaced by the alternative nearest to ``out`` there;
    ``ref`` itself where ``ambiguous`` is not a well-formed pair for it (or the output has more
    ambiguous elements than ``ambiguous_bound``). ``out`` and ``ref`` have the same shape."""
    import torch

    if not (isinstance(ambiguous, (list, tuple)) and len(ambiguous) == 2):
        return ref
    index, values = ambiguous
    if not (isinstance(index, torch.Tensor) and isinstance(values, torch.Tensor)):
        return ref
    count = index.numel()
    if (index.dtype != torch.int64 or index.dim() != 1 or values.dim() != 2 or values.shape[0] != count
            or values.dtype != ref.dtype or out.dtype != ref.dtype or count == 0
            or count > ambiguous_bound(ref.numel())):
        return ref
    index = index.to(ref.device)
    if bool((index < 0).any()) or bool((index >= ref.numel()).any()):
        return ref
    values = values.to(ref.device)
    given = out.reshape(-1)[index].double()
    distance = (values.double() - given[:, None]).abs().nan_to_num(nan=float("inf"))
    if out.is_floating_point():
        # A NaN answer is matched by a NaN alternative only (the comparison checks NaN by position).
        both_nan = torch.isnan(values) & torch.isnan(given)[:, None]
        distance = torch.where(both_nan, torch.zeros_like(distance), distance)
    nearest = values.gather(1, distance.argmin(dim=1, keepdim=True)).reshape(-1)
    adjusted = ref.reshape(-1).clone()
    adjusted[index] = nearest
    return adjusted.reshape(ref.shape)


def _compare_tensor(out, ref, config, where: str, atol_scale: float = 1.0, slack=None,
                    toward=None) -> Optional[Mismatch]:
    import torch

    if tuple(out.shape) != tuple(ref.shape):
        return Mismatch("shape", f"{where}: shape {tuple(out.shape)} != expected {tuple(ref.shape)}")
    if out.dtype != ref.dtype:
        return Mismatch("dtype", f"{where}: dtype {str(out.dtype).replace('torch.', '')} != expected "
                                 f"{str(ref.dtype).replace('torch.', '')}")
    if out.numel() == 0:
        return None
    if not (out.dtype.is_floating_point or out.dtype.is_complex):
        if torch.equal(out, ref):
            return None
        bad = int((out != ref).sum())
        return Mismatch("values", f"{where}: {bad} of {out.numel()} values differ (exact dtype)")

    atol, rtol = tolerances(str(ref.dtype).replace("torch.", ""), config)
    atol *= max(1.0, atol_scale)
    if slack is not None and slack.shape != ref.shape:
        slack = None
    if toward is not None and (toward.shape != ref.shape or not toward.is_floating_point()):
        toward = None
    totals = _float_totals(out.reshape(-1), ref.reshape(-1), atol, rtol,
                           None if slack is None else slack.reshape(-1),
                           None if toward is None else toward.reshape(-1))
    if not totals.same_non_finite:
        bad = totals.non_finite_where_finite
        return Mismatch("nan_or_inf", f"{where}: {bad} NaN/Inf values where the reference is finite"
                        if bad else f"{where}: NaN/Inf pattern differs from the reference")
    if totals.outside:
        widened = "".join(part for part, used in ((" + slack", slack), (" of the stretch to the exact value", toward))
                          if used is not None)
        return Mismatch("values", f"{where}: {totals.outside} of {totals.compared} values outside atol={atol:g} "
                                  f"rtol={rtol:g}{widened} (max abs diff {totals.max_diff:.3g})")
    ref_norm = math.sqrt(totals.ref_sq)
    if ref_norm > config.min_reference_norm:
        rel = math.sqrt(totals.diff_sq) / ref_norm
        out_norm = math.sqrt(totals.out_sq)
        if rel > config.max_relative_error:
            return Mismatch("near_zero" if out_norm < 0.5 * ref_norm else "values",
                            f"{where}: relative error {rel:.3g} > {config.max_relative_error:g} "
                            f"(output norm {out_norm:.3g}, reference norm {ref_norm:.3g})")
    return None


def disagreeing_elements(candidate: Any, reference: Any, config) -> Optional[list]:
    """Where two outputs of one structure disagree element by element (outside atol + rtol |ref|,
    a NaN or infinity at another place, an integer that differs): per tensor of the output, the
    flat indices (None where it has none). None when the structure, a shape or a dtype differs,
    when nothing disagrees element-wise, or when a tensor has more than ``localised_bound`` such
    elements: only a disagreement small enough to be the reference's own ambiguous elements or
    rounding is worth telling apart (``timing``'s localised mismatches, judged by the parent)."""
    import torch

    from extensions.timing.tensors import flatten_tensors

    cands, refs = flatten_tensors(candidate), flatten_tensors(reference)
    if len(cands) != len(refs) or not refs:
        return None
    places, found = [], False
    for out, ref in zip(cands, refs):
        if tuple(out.shape) != tuple(ref.shape) or out.dtype != ref.dtype:
            return None
        atol, rtol = tolerances(str(ref.dtype).replace("torch.", ""), config)
        flat_out, flat_ref = out.detach().reshape(-1), ref.detach().reshape(-1)
        pieces = []
        for begin in range(0, flat_ref.numel(), _CHUNK):
            o, r = flat_out[begin:begin + _CHUNK], flat_ref[begin:begin + _CHUNK]
            if o.dtype.is_floating_point:
                o64, r64 = o.double(), r.double()
                finite = torch.isfinite(o64) & torch.isfinite(r64)
                close = finite & ((o64 - r64).abs() <= atol + rtol * r64.abs())
                same_non_finite = ~torch.isfinite(r64) & ((o64 == r64) | (torch.isnan(o64) & torch.isnan(r64)))
                bad = ~(close | same_non_finite)
            else:
                bad = o != r
            pieces.append(bad.nonzero().reshape(-1) + begin)
        index = torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.long)
        if index.numel() > localised_bound(flat_ref.numel(), ref.dtype):
            return None
        found = found or index.numel() > 0
        places.append(index if index.numel() else None)
    return places if found else None


# Elements per float64 slice: a full-size float64 copy of a 2^25-element output is 256 MB per
# temporary, and the comparison makes several; slices this size stay in cache and reuse memory.
_CHUNK = 1 << 20


@dataclass
class _FloatTotals:
    same_non_finite: bool = True  # NaN/+Inf/-Inf at exactly the reference's positions
    non_finite_where_finite: int = 0
    compared: int = 0  # positions where the reference is finite
    outside: int = 0  # of those, outside atol + rtol * |ref|
    max_diff: float = 0.0
    diff_sq: float = 0.0  # sums of squares over the compared positions, in float64
    ref_sq: float = 0.0
    out_sq: float = 0.0


def _float_totals(out, ref, atol: float, rtol: float, slack=None, toward=None) -> _FloatTotals:
    """Every figure the float comparison needs, in one pass of float64 slices. A difference is the
    distance from the reference, or with ``toward`` from the stretch between the reference and
    the exact value. Each slice's figures are read back together, one wait for the device."""
    import torch

    totals = _FloatTotals()
    for start in range(0, out.numel(), _CHUNK):
        o = out[start:start + _CHUNK].double()
        r = ref[start:start + _CHUNK].double()
        r_finite = torch.isfinite(r)
        pattern_differs = ((torch.isnan(o) != torch.isnan(r)) | (torch.isposinf(o) != torch.isposinf(r))
                           | (torch.isneginf(o) != torch.isneginf(r)))
        # Compared where the reference is finite; elsewhere both sides count as zero.
        o_c = torch.where(r_finite, o, 0.0)
        r_c = torch.where(r_finite, r, 0.0)
        if toward is None:
            diff = (o_c - r_c).abs()
        else:
            step = torch.where(r_finite, toward[start:start + _CHUNK].double(), 0.0).nan_to_num_(0.0, 0.0, 0.0)
            diff = torch.maximum(torch.minimum(r_c, r_c + step) - o_c, o_c - torch.maximum(r_c, r_c + step)).clamp_(min=0.0)
        bound = atol + rtol * r_c.abs()
        if slack is not None:
            bound = bound + torch.where(r_finite, slack[start:start + _CHUNK].double().abs(), 0.0)
        figures = torch.stack([
            pattern_differs.any().double(),
            (torch.isfinite(o).logical_not() & r_finite).sum().double(),
            r_finite.sum().double(),
            ((diff > bound) & r_finite).sum().double(),
            diff.max().nan_to_num(nan=float("inf"), posinf=float("inf")) if diff.numel() else diff.new_zeros(()),
            torch.dot(diff, diff), torch.dot(r_c, r_c), torch.dot(o_c, o_c),
        ]).tolist()
        differs, non_finite_where_finite, compared, outside, max_diff, diff_sq, ref_sq, out_sq = figures
        totals.same_non_finite = totals.same_non_finite and not differs
        totals.non_finite_where_finite += int(non_finite_where_finite)
        if not compared:
            continue
        totals.compared += int(compared)
        totals.outside += int(outside)
        totals.max_diff = max(totals.max_diff, max_diff)
        totals.diff_sq += diff_sq
        totals.ref_sq += ref_sq
        totals.out_sq += out_sq
    return totals


def inputs_unchanged(after: Any, before: Any) -> bool:
    """Bitwise equality of every tensor (NaN == NaN at the same place)."""
    import torch

    if isinstance(before, torch.Tensor):
        if not isinstance(after, torch.Tensor) or after.shape != before.shape or after.dtype != before.dtype:
            return False
        a, b = after.contiguous(), before.contiguous()
        if a.is_floating_point():
            same_nan = torch.isnan(a) == torch.isnan(b)
            return bool(same_nan.all()) and bool(((a == b) | torch.isnan(b)).all())
        return torch.equal(a, b)
    if isinstance(before, (list, tuple)):
        return isinstance(after, (list, tuple)) and len(after) == len(before) and all(
            inputs_unchanged(a, b) for a, b in zip(after, before))
    return True
