"""The per-round candidate log (JSONL): every sampled response and every verdict, on disk as soon as
it is known, so an interrupted round resumes without sampling or verifying anything twice.

Records, one JSON object per line:

- ``{"type": "round", "round", "task_ids", "policy", "samples_per_task", "sampling"}``: first line;
  which tasks the round samples, a fingerprint of the adapter it samples from and the sampling
  settings (temperature, top_p, max_new_tokens) its log-probs hold for. A log whose header
  disagrees with the round being run is set aside (renamed ``*.stale-N``), never reused.
- ``{"type": "sample", "task_id", "sample_index", "text", "sha1", "token_ids", "logprobs"}``: the
  decoded text, and the exact sampled token ids with their log-probabilities under the sampling
  policy (floats survive JSON exactly), so a resumed round trains on the very same rollouts
- ``{"type": "verdict", "task_id", "sample_index", "sha1", "result": VerifyResult.to_dict()}``;
  applies only to the sample with the same ``sha1``.

With ``rl.max_turns`` > 1 a sample is one turn of a trajectory (task, sample index): sample and
verdict records carry ``"turn"`` (from 1), and a sample record also holds the chat ``prompt`` that
turn was sampled from (the task, the trajectory's earlier answers and the verifier's feedback on
them, less any ``turns_dropped`` to fit ``prompt.max_prompt_tokens``) and its ``prompt_tokens``. The
header then holds ``"turns"`` (``max_turns``, ``max_prompt_tokens``), which decide those prompts.

Each record is written with one ``write`` on an ``O_APPEND`` descriptor and fsynced, so records of
several ranks appending to the same file do not interleave and a crash loses at most a partial last
line, which the reader counts and skips.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional

from ..runtime.io import BadLine, read_jsonl


def text_sha1(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


@dataclass
class LogContents:
    header: Optional[dict] = None
    samples: dict[tuple[str, int], str] = field(default_factory=dict)
    # (token_ids, logprobs) of each sample that has them
    sequences: dict[tuple[str, int], tuple[list[int], list[float]]] = field(default_factory=dict)
    verdicts: dict[tuple[str, int], dict] = field(default_factory=dict)
    # Multi-turn records, by (task_id, sample_index, turn): the sample record, and its verdict.
    turn_samples: dict[tuple[str, int, int], dict] = field(default_factory=dict)
    turn_verdicts: dict[tuple[str, int, int], dict] = field(default_factory=dict)
    damaged_lines: int = 0


class CandidateLog:
    def __init__(self, path: Path):
        self.path = Path(path)

    def append(self, records: Iterable[dict[str, Any]]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            for record in records:
                os.write(fd, (json.dumps(record, default=str) + "\n").encode("utf-8"))
            os.fsync(fd)
        finally:
            os.close(fd)

    def read(self) -> LogContents:
        contents = LogContents()
        if not self.path.is_file():
            return contents
        sample_sha: dict[tuple, str] = {}
        pending_verdicts = []

        def count_damage(_bad: BadLine) -> None:
            contents.damaged_lines += 1

        for _, record in read_jsonl(self.path, count_damage):
            if "type" not in record:
                contents.damaged_lines += 1
                continue
            kind = record["type"]
            if kind == "round" and contents.header is None:
                contents.header = record
            elif kind == "sample" and "turn" in record:
                key = turn_key(record)
                contents.turn_samples[key] = record
                sample_sha[key] = record.get("sha1") or text_sha1(record["text"])
            elif kind == "sample":
                key = (str(record["task_id"]), int(record["sample_index"]))
                contents.samples[key] = record["text"]
                if isinstance(record.get("token_ids"), list) and isinstance(record.get("logprobs"), list):
                    contents.sequences[key] = (record["token_ids"], record["logprobs"])
                else:
                    contents.sequences.pop(key, None)
                sample_sha[key] = record.get("sha1") or text_sha1(record["text"])
            elif kind == "verdict":
                pending_verdicts.append(record)
        for record in pending_verdicts:
            multi_turn = "turn" in record
            key = turn_key(record) if multi_turn else (str(record["task_id"]), int(record["sample_index"]))
            if key in sample_sha and record.get("sha1") == sample_sha[key]:
                (contents.turn_verdicts if multi_turn else contents.verdicts)[key] = record["result"]
        return contents

    def set_aside(self) -> Path:
        """Rename a log that belongs to another policy or task list; returns the new name."""
        n = 1
        while (stale := self.path.with_name(f"{self.path.name}.stale-{n}")).exists():
            n += 1
        os.replace(self.path, stale)
        return stale


def sample_record(task_id: str, sample_index: int, text: str, token_ids: Optional[list[int]] = None,
                  logprobs: Optional[list[float]] = None) -> dict:
    record = {"type": "sample", "task_id": task_id, "sample_index": sample_index, "text": text, "sha1": text_sha1(text)}
    if token_ids is not None:
        record.update(token_ids=list(token_ids), logprobs=[float(x) for x in logprobs or []])
    return record


def turn_key(record: dict) -> tuple[str, int, int]:
    return str(record["task_id"]), int(record["sample_index"]), int(record["turn"])


def turn_sample_record(task_id: str, sample_index: int, turn: int, text: str, token_ids: list[int],
                       logprobs: list[float], prompt: list[dict], prompt_tokens: int, turns_dropped: int) -> dict:
    return {**sample_record(task_id, sample_index, text, token_ids, logprobs), "turn": turn, "prompt": prompt,
            "prompt_tokens": prompt_tokens, "turns_dropped": turns_dropped}


def verdict_record(task_id: str, sample_index: int, text: str, result: dict, turn: Optional[int] = None) -> dict:
    record = {"type": "verdict", "task_id": task_id, "sample_index": sample_index, "sha1": text_sha1(text), "result": result}
    if turn is not None:
        record["turn"] = turn
    return record
