"""Completion-only examples and the three ways to batch them for training.

An example is (chat prompt, completion). Its tokens are the chat template's rendering of the prompt
plus the assistant turn; the label of every prompt token is -100, so the loss covers the completion
and the template's end-of-turn token only.

``sft.batching``:

- ``packed``: examples are concatenated into rows of at most ``max_seq_len`` tokens (first fit over
  a shuffled order). Each example's ``position_ids`` restart at 0 and no attention mask is passed;
  the batch carries the examples' boundaries. On CUDA, attention runs per example through varlen
  flash attention (``packed_attention``); elsewhere transformers derives a block-diagonal causal
  mask from the position resets. Either way no token attends across an example boundary, and every
  example's first token is a masked prompt token, so no label crosses one either.
  The loss of a packed batch equals that of the same examples run one by one (tested).
- ``length_grouped``: examples of similar length share a padded batch (sorted within shuffled
  windows of 64 batches; batch order shuffled).
- ``padded``: shuffled examples padded to the longest of their batch (the baseline).

The plan of one epoch (which examples go in which micro-batch) depends only on the data, the seed and
the epoch, so every rank computes the same plan and a resumed run recomputes it exactly.
"""
from __future__ import annotations

import logging
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Optional, Sequence

from ..runtime.io import BadLine, read_jsonl
from .packed_attention import sequence_boundaries

log = logging.getLogger(__name__)

IGNORE_INDEX = -100
BATCHING_MODES = ("packed", "length_grouped", "padded")
_LENGTH_GROUP_WINDOW = 64


@dataclass
class TokenizedExample:
    input_ids: list[int]
    labels: list[int]  # IGNORE_INDEX on prompt tokens

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def num_target_tokens(self) -> int:
        return sum(1 for label in self.labels if label != IGNORE_INDEX)


@dataclass
class DropReport:
    """Why rows were not used; printed, never silent."""

    kept: int = 0
    dropped: Counter = field(default_factory=Counter)

    def add(self, reason: str) -> None:
        self.dropped[reason] += 1

    def summary(self, what: str, noun: str = "examples") -> str:
        total = self.kept + sum(self.dropped.values())
        if not self.dropped:
            return f"{what}: kept all {total} {noun}"
        reasons = ", ".join(f"{n} {reason}" for reason, n in self.dropped.most_common())
        return f"{what}: kept {self.kept} of {total} {noun}; dropped {reasons}"


def read_json_rows(path: Path, report: DropReport, what: str) -> Iterator[dict]:
    """The JSON objects of a JSONL file; a line that is not one is counted in ``report``, never fatal."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found: {path} (run prepare_data.py first)")

    def count(bad: BadLine) -> None:
        report.add("that are not valid JSON" if bad.json_error is not None else "that are not JSON objects")

    for _, row in read_jsonl(path, count, errors="strict"):
        yield row


def tokenize_example(tokenizer, prompt: list[dict], completion: str) -> TokenizedExample:
    """Tokens of prompt + assistant completion, with the prompt masked out of the labels."""
    prompt_text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    full_text = tokenizer.apply_chat_template(
        [*prompt, {"role": "assistant", "content": completion}], tokenize=False, add_generation_prompt=False
    )
    if not full_text.startswith(prompt_text):
        # Templates that rewrite earlier turns (e.g. strip reasoning) cannot be split this way.
        raise ValueError("the chat template renders the prompt differently once a reply follows it")
    prompt_ids = tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
    completion_ids = tokenizer(full_text[len(prompt_text):], add_special_tokens=False)["input_ids"]
    return TokenizedExample(
        input_ids=list(prompt_ids) + list(completion_ids),
        labels=[IGNORE_INDEX] * len(prompt_ids) + list(completion_ids),
    )


def tokenize_examples(tokenizer, pairs: Iterable[tuple[list[dict], str]], max_seq_len: int,
                      what: str = "examples", progress: bool = False) -> tuple[list[TokenizedExample], DropReport]:
    """Tokenize (prompt, completion) pairs; examples longer than ``max_seq_len`` are dropped, counted."""
    from tqdm.auto import tqdm

    report = DropReport()
    examples = []
    for prompt, completion in tqdm(list(pairs), desc=f"tokenizing {what}", disable=not progress):
        if not completion or not completion.strip():
            report.add("with an empty completion")
            continue
        try:
            example = tokenize_example(tokenizer, prompt, completion)
        except Exception as exc:  # a malformed row must not end the run
            report.add(f"that failed to tokenize ({type(exc).__name__})")
            continue
        if len(example) > max_seq_len:
            # Truncating would teach unfinished code; such rows are left out instead.
            report.add(f"longer than max_seq_len={max_seq_len}")
            continue
        if example.num_target_tokens == 0:
            report.add("with no completion tokens")
            continue
        examples.append(example)
        report.kept += 1
    return examples, report


def read_sft_jsonl(path: Path) -> tuple[list[tuple[list[dict], str]], DropReport]:
    """(prompt, completion) pairs of an sft_*.jsonl file; malformed rows are counted and skipped."""
    report = DropReport()
    pairs = []
    for row in read_json_rows(path, report, "SFT data"):
        prompt, completion = row.get("prompt"), row.get("completion")
        if not isinstance(prompt, list) or not all(isinstance(m, dict) and "role" in m and "content" in m for m in prompt):
            report.add("without a chat-message prompt")
            continue
        if not isinstance(completion, str):
            report.add("without a string completion")
            continue
        pairs.append((prompt, completion))
        report.kept += 1
    return pairs, report


# -- epoch plans --------------------------------------------------------------------------------------
def _pack_first_fit(order: Sequence[int], lengths: Sequence[int], max_seq_len: int) -> list[list[int]]:
    rows: list[list[int]] = []
    space: list[int] = []
    for index in order:
        length = lengths[index]
        for row, free in enumerate(space):
            if length <= free:
                rows[row].append(index)
                space[row] -= length
                break
        else:
            rows.append([index])
            space.append(max_seq_len - length)
    return rows


def plan_epoch(lengths: Sequence[int], *, mode: str, batch_size: int, max_seq_len: int, seed: int,
               epoch: int) -> list[list[list[int]]]:
    """Micro-batches for one epoch: each a list of rows, each row a list of example indices.

    Padded and length-grouped rows hold one example each; packed rows hold several.
    """
    if mode not in BATCHING_MODES:
        raise ValueError(f"unknown batching mode {mode!r}; expected one of {BATCHING_MODES}")
    if batch_size < 1:
        raise ValueError(f"batch size must be >= 1, got {batch_size}")
    rng = random.Random(f"{seed}:{epoch}")
    order = list(range(len(lengths)))
    rng.shuffle(order)
    if mode == "packed":
        rows = _pack_first_fit(order, lengths, max_seq_len)
    elif mode == "length_grouped":
        window = batch_size * _LENGTH_GROUP_WINDOW
        rows = []
        for start in range(0, len(order), window):
            chunk = sorted(order[start:start + window], key=lambda i: lengths[i])
            rows.extend([i] for i in chunk)
    else:
        rows = [[i] for i in order]
    batches = [rows[start:start + batch_size] for start in range(0, len(rows), batch_size)]
    if mode == "length_grouped":
        rng.shuffle(batches)
    return batches


def batch_target_tokens(batch: list[list[int]], examples: Sequence[TokenizedExample]) -> int:
    """Tokens the loss is computed on (labels != -100, after the causal shift)."""
    total = 0
    for row in batch:
        for index in row:
            labels = examples[index].labels
            total += sum(1 for label in labels[1:] if label != IGNORE_INDEX)
    return total


def batch_tokens(batch: list[list[int]], examples: Sequence[TokenizedExample]) -> int:
    return sum(len(examples[i]) for row in batch for i in row)


# -- collation ----------------------------------------------------------------------------------------
def collate(batch: list[list[int]], examples: Sequence[TokenizedExample], *, pad_token_id: int,
            packed: bool, pad_to_multiple_of: Optional[int] = None) -> dict:
    """Tensors for one micro-batch.

    Packed: ``input_ids``, ``labels``, ``position_ids`` (restarting per example), the examples'
    boundaries in the flattened batch (``cu_seq_lens_q/k``, ``max_length_q/k``), no attention mask.
    Otherwise: right-padded ``input_ids``, ``labels`` and an ``attention_mask``.
    """
    import torch

    rows_ids, rows_labels, rows_pos = [], [], []
    for row in batch:
        ids, labels, positions = [], [], []
        for index in row:
            example = examples[index]
            ids.extend(example.input_ids)
            # The first token is always a prompt token; masking it also guarantees that no label
            # crosses a packing boundary even for a template with an empty prompt rendering.
            labels.extend([IGNORE_INDEX] + example.labels[1:])
            positions.extend(range(len(example)))
        rows_ids.append(ids)
        rows_labels.append(labels)
        rows_pos.append(positions)
    width = max(len(ids) for ids in rows_ids)
    if pad_to_multiple_of:
        width = -(-width // pad_to_multiple_of) * pad_to_multiple_of
    input_ids = torch.full((len(batch), width), pad_token_id, dtype=torch.long)
    labels = torch.full((len(batch), width), IGNORE_INDEX, dtype=torch.long)
    for r, (ids, labs) in enumerate(zip(rows_ids, rows_labels)):
        input_ids[r, :len(ids)] = torch.tensor(ids, dtype=torch.long)
        labels[r, :len(labs)] = torch.tensor(labs, dtype=torch.long)
    if packed:
        position_ids = torch.zeros((len(batch), width), dtype=torch.long)
        for r, positions in enumerate(rows_pos):
            position_ids[r, :len(positions)] = torch.tensor(positions, dtype=torch.long)
            # The padding tail is its own (fully masked-out) sequence: its positions restart too.
            position_ids[r, len(positions):] = torch.arange(width - len(positions))
        cu_seqlens, longest = sequence_boundaries(position_ids)
        # Example boundaries under the names transformers' varlen attention paths read.
        return {"input_ids": input_ids, "labels": labels, "position_ids": position_ids,
                "cu_seq_lens_q": cu_seqlens, "cu_seq_lens_k": cu_seqlens,
                "max_length_q": longest, "max_length_k": longest}
    attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
    for r, ids in enumerate(rows_ids):
        attention_mask[r, :len(ids)] = 1
    return {"input_ids": input_ids, "labels": labels, "attention_mask": attention_mask}
