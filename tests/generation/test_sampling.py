"""Batched sampling: shapes, reproducibility, greedy equivalence with unbatched generation."""
from __future__ import annotations

import pytest
import torch

from extensions.models.loading import prepare_tokenizer
from extensions.generation.sampling import (SamplingParams, SamplingStopped, render_prompt_ids, sample_answers,
                                 sample_completions, sample_rollouts, sample_token_ids)
from extensions.models.tiny import build_tiny_qwen2, build_tiny_tokenizer


@pytest.fixture(scope="module")
def tiny():
    tokenizer = build_tiny_tokenizer()
    prepare_tokenizer(tokenizer)
    model = build_tiny_qwen2(len(tokenizer), eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    model.eval()
    return model, tokenizer


PROMPTS = [
    [{"role": "user", "content": "relu"}],
    [{"role": "system", "content": "You write Triton."}, {"role": "user", "content": "softmax over the last dim please"}],
    [{"role": "user", "content": "matmul " * 12}],
]


def test_n_completions_per_prompt_reproducible_for_a_seed(tiny):
    model, tokenizer = tiny
    params = SamplingParams(max_new_tokens=8, temperature=1.0, seed=5, batch_size=4)
    first = sample_completions(model, tokenizer, PROMPTS, 3, params, progress=False)
    assert len(first) == 3 and all(len(per_prompt) == 3 and all(isinstance(t, str) for t in per_prompt) for per_prompt in first)
    assert sample_completions(model, tokenizer, PROMPTS, 3, params, progress=False) == first
    other = sample_completions(model, tokenizer, PROMPTS, 3, SamplingParams(max_new_tokens=8, temperature=1.0, seed=6, batch_size=4),
                               progress=False)
    assert other != first
    assert sample_completions(model, tokenizer, [], 3, params) == []


def test_greedy_batched_equals_one_prompt_at_a_time(tiny):
    """Left padding and batching must not change what the model generates."""
    model, tokenizer = tiny
    prompt_ids = render_prompt_ids(tokenizer, PROMPTS)
    params = SamplingParams(max_new_tokens=10, temperature=0.0, batch_size=8)
    batched = sample_token_ids(model, prompt_ids, 2, params, pad_token_id=tokenizer.pad_token_id,
                               eos_token_ids=[tokenizer.eos_token_id], progress=False)
    for p, ids in enumerate(prompt_ids):
        with torch.no_grad():
            out = model.generate(input_ids=torch.tensor([ids]), max_new_tokens=10, do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
        single = out[0, len(ids):].tolist()
        if tokenizer.eos_token_id in single:
            single = single[:single.index(tokenizer.eos_token_id)]
        assert batched[p][0] == single and batched[p][1] == single


def test_generation_stops_at_eos_and_strips_it(tiny):
    model, tokenizer = tiny
    eos = tokenizer.eos_token_id
    # A forward hook makes the model predict eos at every position: every continuation is empty.
    biased = build_tiny_qwen2(len(tokenizer), eos_token_id=eos, pad_token_id=tokenizer.pad_token_id)
    biased.eval()

    def always_eos(module, args, output):
        logits = torch.full_like(output.logits, -1e9)
        logits[..., eos] = 0.0
        output.logits = logits
        return output

    handle = biased.register_forward_hook(always_eos)
    try:
        texts = sample_completions(biased, tokenizer, PROMPTS[:2], 2, SamplingParams(max_new_tokens=6, temperature=0.7),
                                   progress=False)
        ended = sample_answers(biased, tokenizer, PROMPTS[:1], 1, SamplingParams(max_new_tokens=6), progress=False)
    finally:
        handle.remove()
    assert texts == [["", ""], ["", ""]]
    # An answer the model ended is not cut off; its length counts the end-of-sequence token.
    assert [(a.text, a.new_tokens, a.cut_off) for a in ended[0]] == [("", 1, False)]
    # When the model never ends, the budget does: cut off, at its full length.
    def never_eos(module, args, output):
        output.logits[..., eos] = -1e9
        return output

    handle = model.register_forward_hook(never_eos)
    try:
        never_ends = sample_answers(model, tokenizer, PROMPTS[:1], 2, SamplingParams(max_new_tokens=5, temperature=1.0),
                                    progress=False)
    finally:
        handle.remove()
    assert [(a.new_tokens, a.cut_off) for a in never_ends[0]] == [(5, True), (5, True)]


def test_bad_arguments_are_rejected(tiny):
    model, tokenizer = tiny
    with pytest.raises(ValueError, match="n must be"):
        sample_completions(model, tokenizer, PROMPTS, 0, SamplingParams())
    with pytest.raises(ValueError, match="batch_size"):
        sample_completions(model, tokenizer, PROMPTS, 1, SamplingParams(batch_size=0))
    with pytest.raises(ValueError, match="2 rendered prompts for 3 prompts"):
        sample_rollouts(model, tokenizer, PROMPTS, 1, SamplingParams(),
                        prompt_ids=render_prompt_ids(tokenizer, PROMPTS[:2]))


def test_a_stop_between_decode_steps_keeps_the_finished_batches(tiny):
    """A Ctrl-C lands in the middle of a batch: sampling returns at the next decode step, not after
    max_new_tokens, and what earlier batches finished is handed back."""
    model, tokenizer = tiny
    params = SamplingParams(max_new_tokens=40, temperature=1.0, seed=3, batch_size=2)
    asked = []

    def stop_in_second_batch() -> bool:
        asked.append(1)
        return len(asked) > params.max_new_tokens + 5  # the first batch runs all its steps

    prompt_ids = render_prompt_ids(tokenizer, PROMPTS)
    with pytest.raises(SamplingStopped) as stopped:
        sample_token_ids(model, prompt_ids, 1, params, pad_token_id=tokenizer.pad_token_id, eos_token_ids=[],
                         progress=False, stop_at_eos=False, should_stop=stop_in_second_batch)
    assert len(asked) == params.max_new_tokens + 6  # asked once per step; stopped at the first True
    partial = stopped.value.partial
    finished = [per_prompt[0] for per_prompt in partial if per_prompt[0] is not None]
    assert len(finished) == 2 and all(len(tokens) == params.max_new_tokens for tokens in finished)
    assert sum(per_prompt[0] is None for per_prompt in partial) == 1
    # The finished rows are what an uninterrupted run gives them.
    whole = sample_token_ids(model, prompt_ids, 1, params, pad_token_id=tokenizer.pad_token_id, eos_token_ids=[],
                             progress=False, stop_at_eos=False)
    assert [w for w, p in zip(whole, partial) if p[0] is not None] == [p for p in partial if p[0] is not None]

    with pytest.raises(SamplingStopped) as rollout_stop:
        sample_rollouts(model, tokenizer, PROMPTS, 1, params, progress=False, should_stop=lambda: True)
    assert rollout_stop.value.partial == [[None], [None], [None]]


def test_the_bar_shows_tokens_and_tokens_per_second(tiny, capsys):
    model, tokenizer = tiny
    params = SamplingParams(max_new_tokens=20, temperature=1.0, seed=3, batch_size=3)
    prompt_ids = render_prompt_ids(tokenizer, PROMPTS)
    sample_token_ids(model, prompt_ids, 2, params, pad_token_id=tokenizer.pad_token_id, eos_token_ids=[],
                     progress=True, stop_at_eos=False)
    err = capsys.readouterr().err
    # 6 sequences x 20 tokens, none ended early: the last refresh counts every token.
    assert "6/6" in err and "120 tok" in err and "tok/s" in err
