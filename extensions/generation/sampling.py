"""Batched sampling of completions: RL rollouts and evaluation generate through here.

All ``n`` samples of many prompts are decoded together, ``batch_size`` sequences at a time, sorted
by prompt length so left padding stays small. Decoding is ``extensions.generation.decoding.decode``: a static
KV cache and, on a GPU, one CUDA graph per step. Each batch is seeded with ``seed + batch index``,
so results are reproducible for a given seed and batch composition.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence


@dataclass
class SamplingParams:
    max_new_tokens: int = 512
    temperature: float = 0.8  # 0 -> greedy
    top_p: float = 0.95
    seed: int = 1234
    batch_size: int = 64  # sequences decoded together
    # Replay each decode step as a CUDA graph (single-GPU models); False runs every step eagerly.
    cuda_graphs: bool = True
    compile_step: bool = False  # torch.compile the decode step (GPU; compiles once per shape)


def _unwrap(model):
    # DDP / accelerate wrappers hide the model's config and cache layout; the wrapped module has them.
    return getattr(model, "module", model)


def render_prompt_ids(tokenizer, prompts: Sequence[list[dict]]) -> list[list[int]]:
    """Token ids of each chat prompt, ending with the assistant turn's opening."""
    ids = []
    for messages in prompts:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return ids


def eos_token_ids(model, tokenizer) -> list[int]:
    """The tokens that end an answer: the generation config's and the tokenizer's end-of-sequence."""
    model = _unwrap(model)
    eos = getattr(model.generation_config, "eos_token_id", None)
    ids = set(eos if isinstance(eos, (list, tuple)) else ([eos] if eos is not None else []))
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return sorted(ids)


def left_pad(rows: Sequence[list[int]], pad_token_id: int):
    """(input_ids, attention_mask) of token-id rows padded on the left to the longest."""
    import torch

    width = max(map(len, rows))
    input_ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    for row, ids in enumerate(rows):
        input_ids[row, width - len(ids):] = torch.tensor(ids, dtype=torch.long)
        attention[row, width - len(ids):] = 1
    return input_ids, attention


class SamplingStopped(Exception):
    """``should_stop`` ended sampling early. ``partial`` is the result in the usual shape, with
    None for every sequence that was not finished: whole batches done before the stop are kept."""

    def __init__(self, partial: list[list]):
        super().__init__("sampling stopped on request")
        self.partial = partial


class TokenProgress:
    """The sampling bar's token count and rate, refreshed at most twice a second."""

    REFRESH_S = 0.5

    def __init__(self, bar):
        self.bar = bar
        self.done_tokens = 0  # tokens of finished batches
        self.started = time.perf_counter()
        self._shown = 0.0

    def update(self, batch_tokens: int, *, final: bool = False) -> None:
        now = time.perf_counter()
        if not final and now - self._shown < self.REFRESH_S:
            return
        self._shown = now
        total = self.done_tokens + batch_tokens
        rate = total / max(now - self.started, 1e-9)
        self.bar.set_postfix_str(f"{total} tok, {rate:.0f} tok/s")
        if final:
            self.done_tokens = total


@dataclass
class SampledSequence:
    """One sampled continuation: its token ids (ending with the end-of-sequence token when the
    model stopped by itself) and each token's log-probability under the sampling policy
    (``extensions.generation.decoding``: tempered full distribution, before top-p truncation)."""

    token_ids: list[int]
    logprobs: list[float]
    stopped: bool  # ended with an end-of-sequence token (False: cut at max_new_tokens)


def sample_token_ids(model, prompt_ids: Sequence[list[int]], n: int, params: SamplingParams, *,
                     pad_token_id: int, eos_token_ids: Sequence[int], progress: bool = True,
                     stop_at_eos: bool = True, stats=None, with_logprobs: bool = False,
                     should_stop: Optional[Callable[[], bool]] = None) -> list[list]:
    """``n`` sampled continuations (token ids, eos and padding removed) for each prompt.

    The bar counts sequences and shows tokens produced and tokens/s while a batch decodes.
    ``should_stop`` is asked between decode steps; when it answers True, ``SamplingStopped`` carries
    what finished batches produced.

    ``stats`` (a ``DecodeStats``), when given, receives the last batch's decode statistics.
    ``with_logprobs`` returns ``SampledSequence`` objects instead, whose tokens keep the end of
    sequence token: a policy-gradient update must also train the decision to stop.
    """
    from tqdm.auto import tqdm

    from .decoding import DecodeStopped, decode

    model = _unwrap(model)
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if params.batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {params.batch_size}")
    jobs = [(p, s) for p in range(len(prompt_ids)) for s in range(n)]
    # Longest prompts first: similar lengths share a batch, and a memory problem shows at once.
    jobs.sort(key=lambda job: (-len(prompt_ids[job[0]]), job[0], job[1]))
    results: list[list[Optional[list[int]]]] = [[None] * n for _ in prompt_ids]
    was_training = model.training
    model.eval()
    eos_set = set(eos_token_ids)
    bar = tqdm(total=len(jobs), desc="sampling", unit="seq", disable=not progress)
    tokens_shown = TokenProgress(bar)
    try:
        for batch_index, start in enumerate(range(0, len(jobs), params.batch_size)):
            batch = jobs[start:start + params.batch_size]
            input_ids, attention = left_pad([prompt_ids[p] for p, _ in batch], pad_token_id)
            batch_tokens = [0]

            def on_tokens(_steps: int, tokens: int) -> None:
                batch_tokens[0] = tokens
                tokens_shown.update(tokens)

            try:
                decoded = decode(
                    model, input_ids, attention, params.max_new_tokens, temperature=params.temperature,
                    top_p=params.top_p, seed=params.seed + batch_index,
                    eos_token_ids=eos_token_ids if stop_at_eos else (), use_cuda_graph=params.cuda_graphs,
                    compile_step=params.compile_step, stats=stats, return_logprobs=with_logprobs,
                    on_tokens=on_tokens if progress else None, should_stop=should_stop,
                )
            except DecodeStopped:
                raise SamplingStopped(results) from None
            tokens_shown.update(batch_tokens[0], final=True)
            generated, logprobs = (decoded[0].tolist(), decoded[1].tolist()) if with_logprobs else (decoded.tolist(), None)
            for row, (p, s) in enumerate(batch):
                tokens = generated[row]
                cut = next((i for i, token in enumerate(tokens) if token in eos_set), None) if stop_at_eos else None
                if logprobs is not None:
                    end = len(tokens) if cut is None else cut + 1
                    results[p][s] = SampledSequence(tokens[:end], logprobs[row][:end], cut is not None)
                else:
                    results[p][s] = tokens if cut is None else tokens[:cut]
            bar.update(len(batch))
    finally:
        bar.close()
        if was_training:
            model.train()
    return results  # type: ignore[return-value]


@dataclass
class Completion:
    """One decoded answer: its text, how many tokens it took, and whether ``max_new_tokens`` cut it
    off (an answer that never ended, rather than one the model finished)."""

    text: str
    new_tokens: int
    cut_off: bool


def sample_answers(model, tokenizer, prompts: list[list[dict]], n: int, params: SamplingParams,
                   *, progress: bool = True) -> list[list[Completion]]:
    """``n`` decoded completions (assistant text only) for each chat prompt, with their lengths."""
    if not prompts:
        return []
    prompt_ids = render_prompt_ids(tokenizer, prompts)
    token_lists = sample_token_ids(
        model, prompt_ids, n, params, pad_token_id=tokenizer.pad_token_id,
        eos_token_ids=eos_token_ids(model, tokenizer), progress=progress,
    )

    def completion(tokens: list[int]) -> Completion:
        # The end-of-sequence token is cut off, so an answer the model ended is shorter than the
        # budget; one that fills it never ended.
        cut_off = len(tokens) >= params.max_new_tokens
        return Completion(tokenizer.decode(tokens, skip_special_tokens=True), len(tokens) + (0 if cut_off else 1),
                          cut_off)

    return [[completion(tokens) for tokens in per_prompt] for per_prompt in token_lists]


def sample_completions(model, tokenizer, prompts: list[list[dict]], n: int, params: SamplingParams,
                       *, progress: bool = True) -> list[list[str]]:
    """``n`` decoded completions (assistant text only) for each chat prompt."""
    return [[answer.text for answer in per_prompt]
            for per_prompt in sample_answers(model, tokenizer, prompts, n, params, progress=progress)]


def sample_rollouts(model, tokenizer, prompts: list[list[dict]], n: int, params: SamplingParams,
                    *, progress: bool = True, prompt_ids: Optional[list[list[int]]] = None,
                    should_stop: Optional[Callable[[], bool]] = None,
                    ) -> tuple[list[list[int]], list[list[tuple[str, SampledSequence]]]]:
    """RL rollouts: the prompts' token ids and, per prompt, ``n`` (text, ``SampledSequence``) pairs.

    The text is the decoded completion without special tokens (what the verifier judges); the
    sequence holds the exact sampled ids and their log-probabilities (what the update trains on).
    ``prompt_ids`` are the prompts as ``render_prompt_ids`` gives them, for a caller that already
    rendered them (the chat template is not cheap on long prompts); None renders them here.
    A stop (``should_stop``) raises ``SamplingStopped`` whose ``partial`` holds (text, sequence)
    pairs for the finished sequences and None for the rest.
    """
    if not prompts:
        return [], []
    if prompt_ids is None:
        prompt_ids = render_prompt_ids(tokenizer, prompts)
    elif len(prompt_ids) != len(prompts):
        raise ValueError(f"{len(prompt_ids)} rendered prompts for {len(prompts)} prompts")
    def text(seq: SampledSequence) -> str:
        ids = seq.token_ids[:-1] if seq.stopped else seq.token_ids
        return tokenizer.decode(ids, skip_special_tokens=True)

    try:
        sequences = sample_token_ids(
            model, prompt_ids, n, params, pad_token_id=tokenizer.pad_token_id,
            eos_token_ids=eos_token_ids(model, tokenizer), progress=progress, with_logprobs=True,
            should_stop=should_stop,
        )
    except SamplingStopped as stopped:
        raise SamplingStopped([[None if seq is None else (text(seq), seq) for seq in per_prompt]
                               for per_prompt in stopped.partial]) from None
    return prompt_ids, [[(text(seq), seq) for seq in per_prompt] for per_prompt in sequences]
