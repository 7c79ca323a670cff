"""Batched decoding for rollouts: a static KV cache, grouped-query decode attention, CUDA graphs.

``generate()`` spends most of a decode step in Python (tens of milliseconds for a 24-layer model,
whatever the batch), and with a padding mask it copies every key and value ``heads / kv_heads``
times before attention. This loop removes both:

- the KV cache is a ``StaticCache`` sized to prompt + new tokens, so a step has fixed shapes;
- the n samples of one prompt share its prefill: it runs once and the cache rows are copied;
- one-token steps attend through ``grouped_decode_attention``, which reads each cached key and value
  once for all the query heads of its group (prefill still goes through SDPA);
- on a single CUDA device the step (the model forward) is captured once as a CUDA graph and
  replayed, so a step costs its GPU time only. Where capture is impossible (several devices, a
  cache layer with a sliding window, an operation that cannot be captured) the same step runs
  eagerly and ``DecodeStats.graph_error`` says why;
- optionally (``compile_step``), ``torch.compile`` fuses the step's many small elementwise kernels
  (normalisation, rotary embedding, activations) before it is captured; it compiles once per
  shape and falls back to the plain step if compiling fails.

Sampling (temperature, nucleus, greedy) runs on the logits between steps with its own seeded
generator, so a seed gives the same tokens whatever else uses the global RNG.

With ``return_logprobs`` each chosen token also gets its log-probability under the sampling policy's
tempered full distribution, ``log_softmax(logits / temperature)`` (temperature 1 when greedy), before
any top-p truncation. That is the probability a training forward at the same temperature computes,
so the ratio of the two is the importance ratio of policy-gradient RL with no second forward for the
"old" policy. The nucleus renormalisation is left out on purpose: the training forward cannot
reproduce it, and it only shifts the log-probability of kept tokens by the log of the kept mass.
"""
from __future__ import annotations

import contextlib
import logging
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

log = logging.getLogger(__name__)

DECODE_ATTENTION = "kernel_rl_grouped_decode"
EOS_CHECK_EVERY = 16  # steps between the host syncs that stop a batch once every row has ended


@dataclass
class DecodeStats:
    steps: int = 0
    graph_used: bool = False
    graph_error: Optional[str] = None
    compiled: bool = False  # the step ran through torch.compile


def grouped_decode_attention(module, query, key, value, attention_mask, dropout: float = 0.0,
                             scaling: Optional[float] = None, **kwargs):
    """Attention for one new token per row; longer queries (prefill) go to SDPA unchanged.

    ``query`` is (batch, heads, 1, dim), ``key``/``value`` (batch, kv_heads, cache_len, dim) and
    ``attention_mask`` a boolean (batch, 1, 1, cache_len) mask, True where a row may attend.
    """
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if query.shape[2] != 1 or kwargs.get("sliding_window") or attention_mask is None or attention_mask.dtype != torch.bool:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    batch, heads, _, dim = query.shape
    kv_heads = key.shape[1]
    scale = scaling if scaling is not None else dim ** -0.5
    grouped = (query * scale).view(batch, kv_heads, heads // kv_heads, dim)
    scores = torch.matmul(grouped, key.transpose(-1, -2)).float()  # (batch, kv_heads, group, cache_len)
    scores = scores.masked_fill(~attention_mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(value.dtype)
    out = torch.matmul(probs, value)  # (batch, kv_heads, group, dim)
    return out.reshape(batch, 1, heads, dim), None


@contextmanager
def attention_implementation(model, name: str):
    """Run ``model`` with the registered attention function ``name``, restoring the previous one."""
    from ..models.loading import attention_configs

    configs = attention_configs(model)
    previous = [config._attn_implementation for config in configs]
    try:
        for config in configs:
            config._attn_implementation = name
        yield
    finally:
        for config, implementation in zip(configs, previous):
            config._attn_implementation = implementation


def register_decode_attention() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(DECODE_ATTENTION, grouped_decode_attention)


# Candidates the nucleus is searched in before falling back to a full sort. A code model's nucleus
# at the usual temperatures holds a few to a few dozen tokens; a wider one is handled exactly too.
NUCLEUS_CANDIDATES = 256


def pick_tokens(logits, temperature: float, top_p: float, generator, *, compiled: bool = False):
    """One token per row: greedy for temperature 0, else a sample from the nucleus (exact).

    ``argmax(w / E)`` over the kept tokens, with unnormalised weights ``w`` and ``E ~ Exp(1)``,
    draws token i with probability w_i / sum(w): a categorical sample with no renormalising. Each
    vocabulary entry has its own ``E``, so the same seed draws the same token whichever way the
    nucleus is found.

    The nucleus is looked for among the ``NUCLEUS_CANDIDATES`` most likely tokens (a top-k, no
    scan over the vocabulary); a row whose candidates hold less than ``top_p`` of the mass has a
    wider nucleus, and then the batch is sorted in full. ``compiled`` fuses the choice among the
    candidates with ``torch.compile``.
    """
    import torch

    if temperature <= 0:
        return logits.argmax(dim=-1)
    races = torch.empty(logits.shape, dtype=torch.float32, device=logits.device).exponential_(generator=generator)
    if top_p >= 1.0:
        return _race(logits.float() / temperature, races)
    # The log of the softmax denominator over the whole vocabulary: a reduction, not a scan.
    log_norm = torch.logsumexp(logits.float() / temperature, dim=-1, keepdim=True)
    vocab = logits.shape[-1]
    if NUCLEUS_CANDIDATES < vocab:
        top_logits, top_ids = logits.topk(NUCLEUS_CANDIDATES, dim=-1)  # sorted, descending
        choice, fits = _choose(top_logits, log_norm, races.gather(-1, top_ids), temperature, top_p, compiled)
        # One host sync per step; the decode step it waits for is replayed from a graph anyway.
        if bool(fits.all()):
            return top_ids.gather(-1, choice[:, None]).squeeze(-1)
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    choice, _ = _nucleus_choice(sorted_logits, log_norm, races.gather(-1, order), temperature, top_p)
    return order.gather(-1, choice[:, None]).squeeze(-1)


def sorted_nucleus_mask(sorted_logits, temperature: float, top_p: float, log_norm=None):
    """For logits sorted in descending order: True for the shortest prefix whose mass reaches top_p.

    ``sorted_logits`` may be only the first entries of the sorted vocabulary when ``log_norm``
    (logsumexp of all logits / temperature) is given; the mask is then that of those entries.
    """
    import torch

    scores = sorted_logits.float() / temperature
    if log_norm is None:
        log_norm = torch.logsumexp(scores, dim=-1, keepdim=True)
    probs = torch.exp(scores - log_norm)
    return (probs.cumsum(dim=-1) - probs) < top_p  # the best token always stays


def _race(scores, races):
    import torch

    weights = torch.exp(scores - scores.amax(dim=-1, keepdim=True))
    return (weights / races.clamp(min=torch.finfo(torch.float32).tiny)).argmax(dim=-1)


def _nucleus_choice(sorted_logits, log_norm, races, temperature: float, top_p: float):
    """(position chosen in ``sorted_logits``, whether each row's nucleus lies within them)."""
    import torch

    scores = sorted_logits.float() / temperature
    fits = torch.exp(scores - log_norm).sum(dim=-1) >= top_p
    weights = torch.exp(scores - scores[:, :1]) * sorted_nucleus_mask(sorted_logits, temperature, top_p, log_norm)
    return (weights / races.clamp(min=torch.finfo(torch.float32).tiny)).argmax(dim=-1), fits


_COMPILED = {}  # compiled functions, built on first use; None once compiling one has failed


def _compiled(fn, **options):
    """``fn`` through ``torch.compile``, built once; None after compiling it has failed."""
    import torch

    if fn.__name__ not in _COMPILED:
        _COMPILED[fn.__name__] = torch.compile(fn, **options)
    return _COMPILED[fn.__name__]


def _give_up_compiling(fn, exc: Exception) -> None:
    # Compiling happens on the first call, before anything runs: ``fn`` can then run as written.
    log.warning("running %s without torch.compile: %s: %s", fn.__name__, type(exc).__name__, str(exc)[:300])
    _COMPILED[fn.__name__] = None


def _choose(top_logits, log_norm, races, temperature: float, top_p: float, compiled: bool):
    # Static shapes: the batch size rarely changes, and dynamic shapes hit a compiler bug.
    choose = _compiled(_nucleus_choice, dynamic=False) if compiled else None
    if choose is not None:
        try:
            return choose(top_logits, log_norm, races, temperature, top_p)
        except Exception as exc:  # a compiler failure
            _give_up_compiling(_nucleus_choice, exc)
    return _nucleus_choice(top_logits, log_norm, races, temperature, top_p)


def _graph_blocker(model, cache) -> Optional[str]:
    if next(model.parameters()).device.type != "cuda":
        return "not a CUDA device"
    if len({p.device for p in model.parameters()}) > 1:
        return "the model spans several devices"
    if any(getattr(layer, "is_sliding", False) for layer in getattr(cache, "layers", [])):
        return "a cache layer has a sliding window"
    return None


def _prefill_mask(attention, cache_len: int):
    """Boolean (batch, 1, width, cache_len) mask: causal, padding keys hidden, nothing past the prompt.

    A padding query attends to itself only, so its (unused) output stays finite and no NaN reaches
    the cache.
    """
    import torch

    batch, width = attention.shape
    device = attention.device
    rows = torch.arange(width, device=device)
    causal = rows[:, None] >= rows[None, :]
    mask = causal[None] & attention.bool()[:, None, :]
    mask |= torch.eye(width, dtype=torch.bool, device=device)[None]
    full = torch.zeros((batch, 1, width, cache_len), dtype=torch.bool, device=device)
    full[:, 0, :, :width] = mask
    return full


class DecodeStopped(Exception):
    """``should_stop`` answered True: the batch was abandoned between two steps."""


def decode(model, input_ids, attention, max_new_tokens: int, *, temperature: float, top_p: float,
           seed: int, eos_token_ids: Sequence[int] = (), use_cuda_graph: bool = True,
           compile_step: bool = False, stats: Optional[DecodeStats] = None, return_logprobs: bool = False,
           on_tokens: Optional[Callable[[int, int], None]] = None,
           should_stop: Optional[Callable[[], bool]] = None):
    """Generate ``max_new_tokens`` tokens for each left-padded row of ``input_ids``.

    Returns a (batch, steps) tensor of new token ids on the CPU; ``steps`` is shorter than
    ``max_new_tokens`` only when every row has produced one of ``eos_token_ids``. Rows keep going
    after their own end of sequence; the caller cuts them. ``compile_step`` runs the decode step
    through ``torch.compile`` (fused elementwise kernels; compiled once per shape, on a GPU only).
    ``return_logprobs`` returns ``(tokens, logprobs)``: a float32 (batch, steps) tensor of each
    chosen token's log-probability under the tempered full distribution (see the module docstring).

    ``on_tokens(steps, tokens)`` is called every ``EOS_CHECK_EVERY`` steps and at the end with the
    steps taken and the tokens produced by rows that had not ended yet (what progress reports).
    ``should_stop()`` is asked before every step; True abandons the batch with ``DecodeStopped``, so
    a Ctrl-C does not wait for hundreds of steps.
    """
    import torch
    from transformers import StaticCache

    stats = stats if stats is not None else DecodeStats()
    device = next(model.parameters()).device
    input_ids, attention = input_ids.to(device), attention.to(device)
    batch, width = input_ids.shape
    cache_len = width + max_new_tokens
    cache = StaticCache(config=model.config, max_cache_len=cache_len)
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    eos = torch.tensor(sorted(set(eos_token_ids)), dtype=torch.long, device=device)
    tokens = torch.empty((batch, max_new_tokens), dtype=torch.long, device=device)
    finished = torch.zeros(batch, dtype=torch.bool, device=device)
    # Counted on the device: reading it is a host sync, done only where one happens anyway.
    live_tokens = torch.zeros((), dtype=torch.long, device=device)
    token_logprobs = torch.zeros((batch, max_new_tokens), dtype=torch.float32, device=device) if return_logprobs else None
    logprob_temperature = temperature if temperature > 0 else 1.0

    positions = (attention.long().cumsum(-1) - 1).clamp(min=0)
    step_mask = torch.zeros((batch, 1, 1, cache_len), dtype=torch.bool, device=device)
    step_mask[:, 0, 0, :width] = attention.bool()
    step_ids = torch.zeros((batch, 1), dtype=torch.long, device=device)
    step_positions = positions[:, -1:].clone()

    compiled_step = _compiled(_model_step) if compile_step and device.type == "cuda" else None
    compiling = compiled_step is not None

    def forward_step():
        nonlocal compiling
        if compiling:
            try:
                return compiled_step(model, step_ids, step_mask, step_positions, cache)
            except Exception as exc:  # a compiler failure
                _give_up_compiling(_model_step, exc)
                compiling = False
        return _model_step(model, step_ids, step_mask, step_positions, cache)

    # Streams and graph capture belong to the current CUDA device: make it the model's.
    on_device = torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
    register_decode_attention()
    with on_device, torch.no_grad(), attention_implementation(model, DECODE_ATTENTION):
        logits = _prefill(model, input_ids, attention, positions, cache, cache_len)
        graph = None
        graph_logits = None
        blocker = None if use_cuda_graph else "disabled"
        if blocker is None:
            blocker = _graph_blocker(model, cache)
        warmup_steps = 2  # eager steps before capture: they load kernels and size the allocator
        steps = 0
        for t in range(max_new_tokens):
            if should_stop is not None and should_stop():
                raise DecodeStopped(f"stopped after {steps} of at most {max_new_tokens} steps")
            token = pick_tokens(logits, temperature, top_p, generator, compiled=compiling)
            tokens[:, t] = token
            if token_logprobs is not None:
                token_logprobs[:, t] = chosen_logprobs(logits, token, logprob_temperature)
            steps = t + 1
            live_tokens += batch - finished.sum()
            if eos.numel():
                finished |= torch.isin(token, eos)
            if steps % EOS_CHECK_EVERY == 0:
                if on_tokens is not None:
                    on_tokens(steps, int(live_tokens))
                if eos.numel() and bool(finished.all()):
                    break
            if steps == max_new_tokens:
                break
            step_ids.copy_(token[:, None])
            step_positions.add_(1)
            step_mask[:, 0, 0, width + t] = True
            if graph is None and blocker is None and t >= warmup_steps:
                graph, graph_logits, blocker = _capture(forward_step)
                if blocker:
                    log.warning("decoding without a CUDA graph: %s", blocker)
            if graph is not None:
                graph.replay()
                logits = graph_logits
            elif blocker is None:
                logits = _on_side_stream(forward_step)
            else:
                logits = forward_step()
        if on_tokens is not None and steps % EOS_CHECK_EVERY:
            on_tokens(steps, int(live_tokens))
        stats.steps = steps
        stats.graph_used = graph is not None
        stats.compiled = compiling
        stats.graph_error = None if graph is not None else blocker
    if token_logprobs is not None:
        return tokens[:, :steps].cpu(), token_logprobs[:, :steps].cpu()
    return tokens[:, :steps].cpu()


def _prefill(model, input_ids, attention, positions, cache, cache_len: int):
    """Run the prompt through the model into ``cache``; the last position's logits per row.

    Rows with the same prompt (the n samples of one task) are computed once and their cache rows
    copied: prefill is most of a short rollout's cost on a CPU, and the copies are exact.
    """
    unique_ids, source_row = _distinct_rows(input_ids)
    shared = source_row is not None and _cache_rows_copyable(cache)
    if shared:
        first = _first_occurrence(source_row, unique_ids.shape[0])
        input_ids, attention, positions = unique_ids, attention[first], positions[first]
    out = model(input_ids=input_ids, attention_mask=_prefill_mask(attention, cache_len),
                position_ids=positions, past_key_values=cache, use_cache=True, logits_to_keep=1)
    logits = out.logits[:, -1, :]
    if shared:
        _copy_cache_rows(cache, source_row)
        logits = logits.index_select(0, source_row)
    return logits


def _distinct_rows(input_ids):
    """(distinct rows, index of each row's distinct row), or (input_ids, None) when all differ."""
    import torch

    unique_ids, source_row = torch.unique(input_ids, dim=0, return_inverse=True)
    if unique_ids.shape[0] == input_ids.shape[0]:
        return input_ids, None
    return unique_ids, source_row


def _first_occurrence(source_row, count: int):
    import torch

    rows = torch.arange(source_row.shape[0], device=source_row.device)
    first = torch.full((count,), source_row.shape[0], dtype=torch.long, device=source_row.device)
    return first.scatter_reduce(0, source_row, rows, reduce="amin")


def _cache_rows_copyable(cache) -> bool:
    layers = getattr(cache, "layers", None)
    return bool(layers) and all(hasattr(layer, "lazy_initialization") for layer in layers)


def _copy_cache_rows(cache, source_row) -> None:
    """Grow each cache layer from its distinct rows to one row per sequence."""
    import torch

    for layer in cache.layers:
        rows = source_row.to(layer.keys.device)
        layer.keys = layer.keys.index_select(0, rows)
        layer.values = layer.values.index_select(0, rows)
        if hasattr(layer, "batch_size"):
            layer.batch_size = rows.shape[0]
        if layer.keys.is_cuda:  # CUDA graphs and torch.compile need the new tensors' addresses fixed
            torch._dynamo.mark_static_address(layer.keys)
            torch._dynamo.mark_static_address(layer.values)


def chosen_logprobs(logits, token, temperature: float):
    """log_softmax(logits / temperature)[row, token[row]] in fp32: the training forward's formula."""
    import torch

    scaled = logits.float() / temperature
    return scaled.gather(-1, token[:, None]).squeeze(-1) - torch.logsumexp(scaled, dim=-1)


def _model_step(model, ids, mask, positions, cache):
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True)
    return out.logits[:, -1, :]


def _on_side_stream(fn):
    # CUDA's documented warm-up before a capture: the first runs happen on a side stream.
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        result = fn()
    torch.cuda.current_stream().wait_stream(side)
    return result


def _capture(forward_step):
    """(graph, its output tensor, None), or (None, None, reason) when the step cannot be captured."""
    import torch

    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            logits = forward_step()
    except Exception as exc:  # the step then runs eagerly; the reason is reported
        torch.cuda.synchronize()
        return None, None, f"capture failed: {type(exc).__name__}: {exc}"[:300]
    return graph, logits, None
