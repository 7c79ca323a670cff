"""Compare a candidate's outputs with the reference's, in the trusted parent.

Checks, per output tensor (tuples are compared element-wise):

* same structure, exact shape and exact dtype;
* non-finite values: a NaN/Inf in the candidate passes only where the reference has the very same
  non-finite value at the same position (a reference that itself yields NaN there is matched);
* ``allclose`` on the finite positions with atol/rtol by dtype (fp32: 1e-4; fp16/bf16: 1e-2); on
  an input set the verifier scaled up, atol is multiplied by how much the reference output grew
  against the default set (``atol_scale`` >= 1), since rounding error grows with the magnitudes
  summed: a correct fp32 GEMM on inputs x100 differs from cuBLAS by ~5e-4 where the output
  crosses zero. rtol and the relative-norm check below are never scaled;
* relative error ``||out - ref|| / ||ref|| <= max_relative_error`` whenever ``||ref||`` is not ~0,
  so a near-zero output cannot hide under ``atol`` on small-valued references.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

LOW_PRECISION = ("float16", "bfloat16")


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
                    atol_scale: float = 1.0) -> Optional[Mismatch]:
    """None when ``candidate`` matches ``reference``; else the first mismatch, in one line."""
    import torch

    if isinstance(reference, torch.Tensor):
        if not isinstance(candidate, torch.Tensor):
            return Mismatch("structure", f"{where}: expected a tensor, got {_describe(candidate)}")
        return _compare_tensor(candidate, reference, config, where, atol_scale)
    if isinstance(reference, (list, tuple)):
        # A single-element tuple and a bare tensor are the same answer to most callers, but not
        # to the contract: the structure must match exactly.
        if not isinstance(candidate, (list, tuple)) or len(candidate) != len(reference):
            return Mismatch("structure", f"{where}: expected {_describe(reference)}, got {_describe(candidate)}")
        for i, (c, r) in enumerate(zip(candidate, reference)):
            mismatch = compare_outputs(c, r, config, f"{where}[{i}]", atol_scale)
            if mismatch:
                return mismatch
        return None
    if candidate != reference:
        return Mismatch("values", f"{where}: expected {reference!r}, got {str(candidate)[:40]}")
    return None


def _compare_tensor(out, ref, config, where: str, atol_scale: float = 1.0) -> Optional[Mismatch]:
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

    o, r = out.double(), ref.double()
    o_finite, r_finite = torch.isfinite(o), torch.isfinite(r)
    if not (bool(o_finite.all()) and bool(r_finite.all())):
        same_pattern = (torch.equal(torch.isnan(o), torch.isnan(r))
                        and torch.equal(torch.isposinf(o), torch.isposinf(r))
                        and torch.equal(torch.isneginf(o), torch.isneginf(r)))
        if not same_pattern:
            bad = int((~o_finite & r_finite).sum())
            return Mismatch("nan_or_inf", f"{where}: {bad} NaN/Inf values where the reference is finite"
                            if bad else f"{where}: NaN/Inf pattern differs from the reference")
    o, r = o[r_finite], r[r_finite]
    atol, rtol = tolerances(str(ref.dtype).replace("torch.", ""), config)
    atol *= max(1.0, atol_scale)
    diff = (o - r).abs()
    bad_mask = diff > atol + rtol * r.abs()
    if bool(bad_mask.any()):
        bad = int(bad_mask.sum())
        return Mismatch("values", f"{where}: {bad} of {o.numel()} values outside atol={atol:g} rtol={rtol:g} "
                                  f"(max abs diff {float(diff.max()):.3g})")
    ref_norm = float(r.norm())
    if ref_norm > config.min_reference_norm:
        rel = float((o - r).norm()) / ref_norm
        if rel > config.max_relative_error:
            return Mismatch("near_zero" if float(o.norm()) < 0.5 * ref_norm else "values",
                            f"{where}: relative error {rel:.3g} > {config.max_relative_error:g} "
                            f"(output norm {float(o.norm()):.3g}, reference norm {ref_norm:.3g})")
    return None


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
