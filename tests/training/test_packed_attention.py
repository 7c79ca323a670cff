"""Packed SFT batches attend per example through varlen attention: same loss and gradients as the
block-diagonal mask, and padded batches keep SDPA's behaviour under the same implementation."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from extensions.training import packed_attention
from extensions.training.batching import IGNORE_INDEX, TokenizedExample, collate
from extensions.training.packed_attention import PACKED_ATTENTION, register, sequence_boundaries, use_packed_attention
from extensions.training.trainer import forward_loss_sum
from extensions.models.tiny import build_tiny_qwen2

VOCAB = 101


def examples(lengths, seed=0):
    generator = torch.Generator().manual_seed(seed)
    out = []
    for length in lengths:
        ids = torch.randint(1, VOCAB, (length,), generator=generator).tolist()
        prompt = length // 3
        out.append(TokenizedExample(input_ids=ids, labels=[IGNORE_INDEX] * prompt + ids[prompt:]))
    return out


def reference_varlen(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, scale=None, window_size=(-1, -1),
                     enable_gqa=False):
    """Per-sequence causal SDPA with varlen_attn's signature (the flash kernel is CUDA-only)."""
    assert window_size == (-1, 0) and torch.equal(cu_seq_q, cu_seq_k)
    pieces = []
    for start, end in zip(cu_seq_q[:-1].tolist(), cu_seq_q[1:].tolist()):
        q, k, v = (x[start:end].transpose(0, 1) for x in (query, key, value))
        pieces.append(F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=enable_gqa).transpose(0, 1))
    return torch.cat(pieces)


def reference_varlen_older_api(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, is_causal=False, scale=None):
    """The same with an earlier signature: ``is_causal`` and no grouped-query support."""
    assert is_causal and key.shape[1] == query.shape[1]
    return reference_varlen(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, scale=scale, window_size=(-1, 0))


def test_boundaries_cover_every_example_and_each_padding_tail():
    batch = collate([[0, 1], [2]], examples([5, 3, 4]), pad_token_id=0, packed=True)
    # Row 0: examples of 5 and 3 tokens; row 1: 4 tokens, then a padding tail of 4.
    assert batch["cu_seq_lens_q"].tolist() == [0, 5, 8, 12, 16]
    assert batch["max_length_q"] == 5 and batch["cu_seq_lens_q"].dtype == torch.int32
    cu, longest = sequence_boundaries(torch.tensor([[0, 1, 2, 0, 1, 2, 3, 4]]))
    assert cu.tolist() == [0, 3, 8] and longest == 5


@pytest.mark.parametrize("kernel", [reference_varlen, reference_varlen_older_api])
def test_packed_varlen_attention_gives_the_masked_loss_and_gradients(monkeypatch, kernel):
    calls = []

    def counted(*args, **kwargs):
        calls.append(args[3].tolist())
        return kernel(*args, **kwargs)

    counted.__signature__ = __import__("inspect").signature(kernel)
    monkeypatch.setattr(packed_attention, "_varlen_kernel", lambda: counted)
    data = examples([9, 4, 13, 6, 7])
    batch = collate([[0, 1, 2], [3, 4]], data, pad_token_id=0, packed=True)

    def loss_and_grads(implementation):
        model = build_tiny_qwen2(VOCAB, num_layers=2).to(torch.float64)
        model.config._attn_implementation = implementation
        loss = forward_loss_sum(model, batch)
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]

    register()
    masked_loss, masked_grads = loss_and_grads("sdpa")
    assert not calls
    varlen_loss, varlen_grads = loss_and_grads(PACKED_ATTENTION)
    assert calls and all(c == batch["cu_seq_lens_q"].tolist() for c in calls)  # one per layer, per pass
    torch.testing.assert_close(varlen_loss, masked_loss)
    for ours, reference in zip(varlen_grads, masked_grads):
        torch.testing.assert_close(ours, reference)
    # Attention across an example boundary would change the loss: the comparison can tell.
    crossing = {k: v for k, v in batch.items() if not k.startswith(("cu_seq", "max_length"))}
    crossing["position_ids"] = torch.arange(batch["input_ids"].shape[1]).expand_as(batch["input_ids"])
    model = build_tiny_qwen2(VOCAB, num_layers=2).to(torch.float64)
    assert not torch.allclose(forward_loss_sum(model, crossing).detach(), masked_loss)


def test_padded_batches_keep_their_mask_under_the_packed_implementation():
    register()
    data = examples([9, 4, 13])
    batch = collate([[0], [1], [2]], data, pad_token_id=0, packed=False)
    model = build_tiny_qwen2(VOCAB, num_layers=2).to(torch.float64)
    reference = forward_loss_sum(model, batch)
    model.config._attn_implementation = PACKED_ATTENTION
    torch.testing.assert_close(forward_loss_sum(model, batch), reference)


def test_the_switch_happens_only_where_varlen_attention_runs():
    model = build_tiny_qwen2(VOCAB, num_layers=1)
    model.config._attn_implementation = "sdpa"
    assert use_packed_attention(model, torch.device("cpu")) == "not a CUDA device"
    assert model.config._attn_implementation == "sdpa"
    model.config._attn_implementation = "eager"
    assert "not sdpa" in use_packed_attention(model, torch.device("cpu"))


@pytest.mark.gpu
def test_flash_varlen_matches_the_masked_loss_on_a_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    problem = packed_attention.packed_attention_problem(torch.device("cuda"))
    assert problem is None, problem
    data = examples([90, 40, 130, 60, 70])
    batch = collate([[0, 1, 2], [3, 4]], data, pad_token_id=0, packed=True)

    def loss_and_grads(implementation):
        model = build_tiny_qwen2(VOCAB, hidden_size=128, num_layers=2).to("cuda", torch.bfloat16)
        model.config._attn_implementation = implementation
        loss = forward_loss_sum(model, batch, "cuda")
        loss.backward()
        return loss.detach().float(), torch.cat([p.grad.float().flatten() for p in model.parameters() if p.grad is not None])

    register()
    masked_loss, masked_grads = loss_and_grads("sdpa")
    varlen_loss, varlen_grads = loss_and_grads(PACKED_ATTENTION)
    torch.testing.assert_close(varlen_loss, masked_loss, rtol=2e-2, atol=0)
    assert torch.nn.functional.cosine_similarity(varlen_grads, masked_grads, dim=0) > 0.99
