"""Attention for packed SFT batches: variable-length flash attention instead of a dense mask.

A packed row holds several examples back to back. With SDPA, transformers turns the position-id
resets into a dense (row, 1, width, width) block-diagonal mask, so attention costs width² per row
whatever the examples' lengths, and runs a masked kernel. Given the examples' boundaries
(``cu_seq_lens_q``/``cu_seq_lens_k``/``max_length_q``/``max_length_k``, the keyword names
transformers' flash-attention path uses, added by ``collate``), ``packed_varlen_attention`` runs
``torch.nn.attention.varlen.varlen_attn`` over the flattened batch: each example attends causally
to itself only and the cost is the sum of the examples' squares.

Without boundaries (padded batches, evaluation, generation) the function is SDPA with the usual
mask, so the implementation can stay set on a model for a whole run, gradient-checkpoint
recomputation included. It is used on CUDA where ``varlen_attn`` runs forward and backward here
(``packed_attention_problem`` checks once per device).
"""
from __future__ import annotations

import functools
import inspect
import logging
from typing import Optional

log = logging.getLogger(__name__)

PACKED_ATTENTION = "kernel_rl_packed_varlen"
_PROBLEMS: dict[str, Optional[str]] = {}


def sequence_boundaries(position_ids) -> tuple:
    """(cu_seqlens int32 of shape (n+1,), longest length) of the flattened batch.

    Every example starts where its position id is 0, and so does every row (a packed row starts with
    an example; its padding tail restarts at 0 and is a sequence of its own).
    """
    import torch

    flat = position_ids.reshape(-1)
    starts = torch.nonzero(flat == 0).flatten()
    cu = torch.cat([starts, torch.tensor([flat.numel()], dtype=starts.dtype)]).to(torch.int32)
    return cu, int((cu[1:] - cu[:-1]).max())


def _varlen_kernel():
    from torch.nn.attention.varlen import varlen_attn

    return varlen_attn


@functools.lru_cache(maxsize=None)
def _varlen_options(kernel) -> tuple[dict, bool, bool]:
    """(causal keyword, takes ``scale``, takes ``enable_gqa``): the kernel's signature differs
    across torch versions; read once, not in every layer's forward."""
    params = inspect.signature(kernel).parameters
    if "is_causal" in params:
        causal = {"is_causal": True}
    elif "window_size" in params:
        causal = {"window_size": (-1, 0)}
    else:
        raise RuntimeError("varlen_attn takes neither is_causal nor window_size")
    return causal, "scale" in params, "enable_gqa" in params


def _call_varlen(q, k, v, cu, max_len: int, scale: Optional[float]):
    kernel = _varlen_kernel()
    causal, takes_scale, takes_gqa = _varlen_options(kernel)
    kwargs = dict(causal, **({"scale": scale} if takes_scale else {}))
    heads, kv_heads = q.shape[1], k.shape[1]
    if kv_heads != heads:
        if takes_gqa:
            kwargs["enable_gqa"] = True
        else:  # each kv head serves heads // kv_heads consecutive query heads
            group = heads // kv_heads
            k = k[:, :, None, :].expand(-1, kv_heads, group, -1).reshape(k.shape[0], heads, -1)
            v = v[:, :, None, :].expand(-1, kv_heads, group, -1).reshape(v.shape[0], heads, -1)
    return kernel(q, k, v, cu, cu, max_len, max_len, **kwargs)


def packed_varlen_attention(module, query, key, value, attention_mask, dropout: float = 0.0,
                            scaling: Optional[float] = None, cu_seq_lens_q=None, cu_seq_lens_k=None,
                            max_length_q: Optional[int] = None, max_length_k: Optional[int] = None, **kwargs):
    """``query`` (batch, heads, width, dim), ``key``/``value`` (batch, kv_heads, width, dim)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if cu_seq_lens_q is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    if dropout:
        raise ValueError("packed varlen attention does not apply attention dropout")
    if kwargs.get("sliding_window"):
        raise ValueError("packed varlen attention has no sliding window")
    batch, heads, width, dim = query.shape
    flat = lambda x: x.transpose(1, 2).reshape(batch * width, x.shape[1], x.shape[-1])  # noqa: E731
    out = _call_varlen(flat(query), flat(key), flat(value), cu_seq_lens_q, max_length_q, scaling)
    return out.reshape(batch, width, heads, -1), None


def register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    AttentionInterface.register(PACKED_ATTENTION, packed_varlen_attention)
    # Masks are built as for SDPA: padded batches need theirs; packed ones ignore it.
    AttentionMaskInterface.register(PACKED_ATTENTION, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])


def packed_attention_problem(device) -> Optional[str]:
    """None where varlen attention runs forward and backward on ``device``; else why not."""
    key = str(device)
    if key in _PROBLEMS:
        return _PROBLEMS[key]
    problem = None
    if getattr(device, "type", str(device)) != "cuda":
        problem = "not a CUDA device"
    else:
        try:
            import torch

            q = torch.randn(8, 4, 64, device=device, dtype=torch.bfloat16, requires_grad=True)
            kv = torch.randn(8, 2, 64, device=device, dtype=torch.bfloat16, requires_grad=True)
            cu = torch.tensor([0, 3, 8], dtype=torch.int32, device=device)
            _call_varlen(q, kv, kv, cu, 5, None).float().sum().backward()
            torch.cuda.synchronize(device)
        except Exception as exc:  # no kernel for this GPU or torch: packed batches use SDPA's mask
            problem = f"{type(exc).__name__}: {exc}"[:300]
    _PROBLEMS[key] = problem
    return problem


def use_packed_attention(model, device) -> Optional[str]:
    """Switch an SDPA model to packed varlen attention where it works; returns why not otherwise."""
    from ..models.loading import attention_configs

    configs = attention_configs(model)
    current = {c._attn_implementation for c in configs}
    if current != {"sdpa"}:
        return f"attention implementation is {sorted(map(str, current))}, not sdpa"
    problem = packed_attention_problem(device)
    if problem:
        return problem
    register()
    for config in configs:
        config._attn_implementation = PACKED_ATTENTION
    return None
