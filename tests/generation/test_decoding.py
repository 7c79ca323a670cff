"""The rollout decoder: same tokens as ``generate``, exact sampling, seeds, early stop, CUDA graphs."""
from __future__ import annotations

import pytest
import torch

from extensions.generation import decoding
from extensions.generation.decoding import (
    DECODE_ATTENTION,
    DecodeStats,
    attention_implementation,
    decode,
    grouped_decode_attention,
    sorted_nucleus_mask,
    pick_tokens,
)

VOCAB = 97


def tiny_model(dtype=torch.float64, device="cpu", hidden_size=64, num_layers=2):
    """A random Qwen2 with grouped-query attention whose greedy output depends on its whole context
    (untied embeddings and a wide initialisation, so it does not just repeat its last token)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=VOCAB, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                         num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=1024, tie_word_embeddings=False, initializer_range=0.3,
                         eos_token_id=None, pad_token_id=0, bos_token_id=None)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(device=device, dtype=dtype).eval()
    model.generation_config.eos_token_id = None
    return model


def left_padded(prompts, pad=0):
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    attention = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.tensor(prompt)
        attention[row, width - len(prompt):] = 1
    return ids, attention


PROMPTS = [[5, 17, 33, 2, 8, 91, 40], [12, 3], [60, 61, 62, 63, 64]]


def generate_greedy(model, prompt, new_tokens):
    ids = torch.tensor([prompt], device=next(model.parameters()).device)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def test_greedy_decode_of_a_left_padded_batch_equals_generate_per_prompt():
    model = tiny_model()
    ids, attention = left_padded(PROMPTS)
    stats = DecodeStats()
    out = decode(model, ids, attention, 12, temperature=0.0, top_p=1.0, seed=0, stats=stats)
    assert out.shape == (3, 12) and stats.steps == 12 and not stats.graph_used
    for row, prompt in enumerate(PROMPTS):
        assert out[row].tolist() == generate_greedy(model, prompt, 12)


def test_grouped_decode_attention_matches_sdpa_with_a_padding_mask():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    torch.manual_seed(0)
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal = 3, True
    query = torch.randn(4, 6, 1, 8, dtype=torch.float64)
    key, value = (torch.randn(4, 2, 10, 8, dtype=torch.float64) for _ in range(2))
    mask = torch.rand(4, 1, 1, 10) > 0.4
    mask[:, :, :, 0] = True
    ours, _ = grouped_decode_attention(module, query, key, value, mask, scaling=0.3)
    reference, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.3)
    torch.testing.assert_close(ours, reference)
    # Masked keys do not matter, whatever they hold.
    key[~mask[:, 0, 0, :][:, None, :].expand(-1, 2, -1)] = 1e6
    torch.testing.assert_close(grouped_decode_attention(module, query, key, value, mask, scaling=0.3)[0], ours)


def test_attention_implementation_is_restored_after_use_and_after_an_error():
    model = tiny_model()
    before = model.config._attn_implementation
    with pytest.raises(RuntimeError):
        with attention_implementation(model, DECODE_ATTENTION):
            assert model.config._attn_implementation == DECODE_ATTENTION
            raise RuntimeError("boom")
    assert model.config._attn_implementation == before


def test_nucleus_sampling_follows_the_renormalised_distribution():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log().expand(40_000, -1).clone()
    generator = torch.Generator().manual_seed(0)
    tokens = pick_tokens(logits, temperature=1.0, top_p=0.9, generator=generator)
    counts = torch.bincount(tokens, minlength=4).double() / tokens.numel()
    # top_p=0.9 keeps 0.5, 0.3 and 0.15 (0.95 >= 0.9); the 0.05 tail is never drawn.
    assert counts[3] == 0
    torch.testing.assert_close(counts[:3], torch.tensor([0.5, 0.3, 0.15], dtype=torch.float64) / 0.95, atol=0.01, rtol=0)
    full = torch.bincount(pick_tokens(logits, 1.0, 1.0, generator), minlength=4).double() / tokens.numel()
    torch.testing.assert_close(full, probs.double(), atol=0.01, rtol=0)
    # Temperature sharpens: at T=0.5 the weights are probs**2, renormalised.
    sharp = torch.bincount(pick_tokens(logits, 0.5, 1.0, generator), minlength=4).double() / tokens.numel()
    torch.testing.assert_close(sharp, (probs.double() ** 2) / (probs.double() ** 2).sum(), atol=0.01, rtol=0)
    assert pick_tokens(logits[:3], 0.0, 0.9, generator).tolist() == [0, 0, 0]
    assert pick_tokens(logits[:3], 1.0, 1e-6, generator).tolist() == [0, 0, 0]


def sorted_nucleus(logits, temperature, top_p):
    """The textbook nucleus: sort, keep the prefix whose mass before each token is below top_p."""
    probs = torch.softmax(logits.double() / temperature, dim=-1)
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    keep_sorted = (sorted_probs.cumsum(-1) - sorted_probs) < top_p
    return torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)


@pytest.mark.parametrize("temperature,top_p,spread", [(0.8, 0.95, 1.0), (1.0, 0.5, 4.0), (0.3, 0.9, 8.0), (1.0, 0.999, 0.01)])
def test_nucleus_mask_matches_a_float64_reference(temperature, top_p, spread):
    torch.manual_seed(0)
    logits = torch.randn(64, 3000) * spread  # from nearly flat (huge nucleus) to peaked (a few tokens)
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ours = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, order, sorted_nucleus_mask(sorted_logits, temperature, top_p))
    reference = sorted_nucleus(logits, temperature, top_p)
    assert ours.gather(-1, logits.argmax(-1, keepdim=True)).all()
    # float32 sums against a float64 reference: a row may differ by its one boundary token, and
    # only where the mass sits within float32 rounding of top_p.
    probs = torch.softmax(logits.double() / temperature, dim=-1)
    differing = (ours ^ reference).sum(-1)
    assert differing.max() <= 1 and (differing > 0).sum() <= 2
    for row in differing.nonzero().flatten():
        assert abs((probs[row] * ours[row]).sum() - top_p) < 1e-6


def test_sampling_is_reproducible_from_its_seed_and_ignores_the_global_rng():
    model = tiny_model(torch.float32)
    ids, attention = left_padded(PROMPTS)
    first = decode(model, ids, attention, 10, temperature=1.0, top_p=0.95, seed=3)
    torch.manual_seed(12345)
    assert torch.equal(decode(model, ids, attention, 10, temperature=1.0, top_p=0.95, seed=3), first)
    assert not torch.equal(decode(model, ids, attention, 10, temperature=1.0, top_p=0.95, seed=4), first)


def test_samples_of_one_prompt_share_its_prefill_and_match_separate_prefills(monkeypatch):
    model = tiny_model()  # float64: shared and separate prefills agree to the last bit that matters
    prompts = [PROMPTS[0], PROMPTS[1], PROMPTS[0], PROMPTS[2], PROMPTS[0], PROMPTS[1]]
    ids, attention = left_padded(prompts)
    prefill_rows = []
    forward = model.forward

    def counting_forward(*args, **kwargs):
        if kwargs["input_ids"].shape[1] > 1:
            prefill_rows.append(kwargs["input_ids"].shape[0])
        return forward(*args, **kwargs)

    monkeypatch.setattr(model, "forward", counting_forward)
    shared = decode(model, ids, attention, 10, temperature=1.0, top_p=0.95, seed=5, return_logprobs=True)
    assert prefill_rows == [3], "one prefill row per distinct prompt"
    monkeypatch.setattr(decoding, "_distinct_rows", lambda input_ids: (input_ids, None))
    separate = decode(model, ids, attention, 10, temperature=1.0, top_p=0.95, seed=5, return_logprobs=True)
    assert prefill_rows == [3, 6]
    assert torch.equal(shared[0], separate[0])
    assert torch.allclose(shared[1], separate[1], atol=1e-6)
    greedy = decode(model, ids, attention, 8, temperature=0.0, top_p=1.0, seed=0)
    for row, prompt in enumerate(prompts):
        assert greedy[row].tolist() == generate_greedy(model, prompt, 8)


def test_decoding_stops_early_once_every_row_has_ended():
    model = tiny_model(torch.float32)
    ids, attention = left_padded(PROMPTS)
    greedy = decode(model, ids, attention, 3, temperature=0.0, top_p=1.0, seed=0)
    ends = set(greedy[:, 0].tolist())  # every row's first greedy token counts as its end
    stats = DecodeStats()
    out = decode(model, ids, attention, 200, temperature=0.0, top_p=1.0, seed=0, eos_token_ids=ends, stats=stats)
    assert stats.steps < 200 and out.shape == (3, stats.steps)
    assert torch.equal(out[:, :3], greedy)


@pytest.mark.gpu
def test_cuda_graph_decoding_gives_the_eager_tokens():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    model = tiny_model(torch.float32, device="cuda", hidden_size=128, num_layers=3)
    ids, attention = left_padded(PROMPTS * 4)
    graphed, eager = DecodeStats(), DecodeStats()
    with_graph = decode(model, ids, attention, 40, temperature=0.0, top_p=1.0, seed=0, stats=graphed)
    without = decode(model, ids, attention, 40, temperature=0.0, top_p=1.0, seed=0, use_cuda_graph=False, stats=eager)
    assert graphed.graph_used, graphed.graph_error
    assert not eager.graph_used and eager.graph_error == "disabled"
    assert torch.equal(with_graph, without)
    sampled = [decode(model, ids, attention, 40, temperature=0.8, top_p=0.95, seed=7) for _ in range(2)]
    assert torch.equal(sampled[0], sampled[1])
    compiled = DecodeStats()
    assert torch.equal(decode(model, ids, attention, 40, temperature=0.0, top_p=1.0, seed=0, compile_step=True,
                              stats=compiled), without)
    assert compiled.compiled and compiled.graph_used, compiled
    compiled_samples = decode(model, ids, attention, 40, temperature=0.8, top_p=0.95, seed=7, compile_step=True)
    assert compiled_samples.shape == sampled[0].shape
    for row, prompt in enumerate(PROMPTS):
        assert with_graph[row].tolist() == generate_greedy(model, prompt, 40)


def full_sort_choice(logits, temperature, top_p, seed):
    """The token the sampler draws when it sorts the whole vocabulary (no candidate prefilter)."""
    generator = torch.Generator().manual_seed(seed)
    original = decoding.NUCLEUS_CANDIDATES
    decoding.NUCLEUS_CANDIDATES = logits.shape[-1]
    try:
        return pick_tokens(logits, temperature, top_p, generator)
    finally:
        decoding.NUCLEUS_CANDIDATES = original


@pytest.mark.parametrize("temperature,top_p,spread", [(0.8, 0.95, 6.0), (0.3, 0.9, 8.0), (1.0, 0.5, 4.0)])
def test_candidate_prefilter_draws_the_same_tokens_as_a_full_sort(temperature, top_p, spread, monkeypatch):
    torch.manual_seed(1)
    # Peaked rows, as a code model's are: every nucleus fits in the candidates.
    logits = torch.randn(32, 5000) * spread
    monkeypatch.setattr(decoding, "NUCLEUS_CANDIDATES", 256)
    probs = torch.softmax(logits / temperature, dim=-1)
    assert (probs.topk(256, dim=-1).values.sum(-1) >= top_p).all()
    for seed in range(5):
        prefiltered = pick_tokens(logits, temperature, top_p, torch.Generator().manual_seed(seed))
        assert torch.equal(prefiltered, full_sort_choice(logits, temperature, top_p, seed))


def test_a_nucleus_wider_than_the_candidates_falls_back_to_the_full_sort(monkeypatch):
    torch.manual_seed(2)
    logits = torch.randn(8, 4000) * 6.0
    logits[3] = torch.randn(4000) * 0.01  # nearly flat: its nucleus holds ~95% of the vocabulary
    monkeypatch.setattr(decoding, "NUCLEUS_CANDIDATES", 64)
    scores = logits / 0.8
    probs = torch.softmax(scores, dim=-1)
    assert probs[3].topk(64).values.sum() < 0.95 and (probs.topk(64, dim=-1).values.sum(-1) >= 0.95).sum() == 7
    seen_outside = False
    for seed in range(20):
        tokens = pick_tokens(logits, 0.8, 0.95, torch.Generator().manual_seed(seed))
        assert torch.equal(tokens, full_sort_choice(logits, 0.8, 0.95, seed))
        seen_outside |= bool(tokens[3] not in logits[3].topk(64).indices)
    assert seen_outside  # the flat row drew tokens the candidates alone could never give


def test_nucleus_mask_of_a_prefix_matches_the_mask_of_the_whole_sorted_row():
    torch.manual_seed(3)
    logits = torch.randn(16, 3000) * 5.0
    sorted_logits, _ = logits.sort(dim=-1, descending=True)
    log_norm = torch.logsumexp(logits / 0.7, dim=-1, keepdim=True)
    whole = sorted_nucleus_mask(sorted_logits, 0.7, 0.9)
    assert torch.equal(sorted_nucleus_mask(sorted_logits[:, :200], 0.7, 0.9, log_norm), whole[:, :200])
    assert not whole[:, 200:].any()
