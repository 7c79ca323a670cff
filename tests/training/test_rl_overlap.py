"""An RL round verifies while it samples: each sampled chunk goes to one verifier session at once,
its verdicts reach the candidate log as they arrive, and the round ends as the sequential one did.

On the tiny model: a streaming fake that records when it is handed candidates, against when each
chunk samples; the project verifier (Triton interpreter) with overlap on and off, to the same log
and adapter; a round stopped while a chunk is judged, resumed without judging anything twice; and
a stop while the verifier's processes run (during sampling, and while waiting for the last
verdicts), which leaves none of them behind.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from extensions.models.tiny import save_tiny_model, tiny_rl_tasks
from extensions.runtime.interrupt import SaveSignal
from extensions.runtime.paths import RunPaths
from extensions.training import rollouts as rollouts_module
from extensions.training.rl import run_rl
from extensions.verify.result import VerifyResult
from rl_synthetic import tiny_rl_run, vowel_reward
from sandbox_support import adopting_orphans

# In the command line of every process the verifier starts: fork servers and the workers forked
# from them, workers, reference processes, the Triton cache's warm-up.
VERIFIER_MODULES = b"extensions.verify."
SANDBOXED = b"extensions.verify.sandboxed."  # fork servers, workers


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny_model"))


def _config(root: Path, model_dir: Path, extra=()):
    """Three tasks of two samples, one task per sampled chunk: three chunks a round."""
    return tiny_rl_run(root, model_dir, [
        "rl.num_rounds=1", "rl.tasks_per_round=3", "rl.samples_per_task=2", "rl.top_k=1", "rl.max_new_tokens=12",
        "rl.generation_batch_size=2", "rl.verify_chunk_size=4", "rl.per_device_batch_size=2",
        "rl.gradient_accumulation_steps=1", "rl.learning_rate=0.001", "lora.r=4", *extra,
    ], tiny_rl_tasks(6))


def _records(paths: RunPaths) -> list[dict]:
    return [json.loads(line) for line in paths.rl_candidates_log(1).read_text().splitlines()]


def _keys(records: list[dict], kind: str) -> list[tuple[str, int]]:
    return [(r["task_id"], r["sample_index"]) for r in records if r["type"] == kind]


def _key_of(label: str) -> tuple[str, int]:
    _round, task_id, sample = label.split("/")
    return task_id, int(sample)


class Events:
    """What happened when, in one list: chunks sampled, candidates submitted, judged."""

    def __init__(self):
        self.lock = threading.Lock()
        self.items: list[tuple[float, str, object]] = []

    def mark(self, what: str, detail=None) -> None:
        with self.lock:
            self.items.append((time.perf_counter(), what, detail))

    def times(self, what: str, detail=None) -> list[float]:
        return [t for t, w, d in self.items if w == what and (detail is None or d == detail)]

    def details(self, what: str) -> list:
        return [d for _, w, d in self.items if w == what]


def record_sampling(monkeypatch, events: Events, before=None, after=None) -> None:
    """Each sampled chunk's start and end in ``events``; ``before(i)``/``after(i, rollouts)`` around chunk i."""
    real = rollouts_module.sample_rollouts
    count = [0]

    def sampling(model, tokenizer, prompts, n, params, **kwargs):
        index, count[0] = count[0], count[0] + 1
        if before is not None:
            before(index)
        events.mark("sample start", index)
        try:
            result = real(model, tokenizer, prompts, n, params, **kwargs)
        finally:
            events.mark("sample end", index)
        return after(index, prompts, result) if after is not None else result

    monkeypatch.setattr(rollouts_module, "sample_rollouts", sampling)


def fake_verdict(label: str, text: str) -> VerifyResult:
    bucket = int(hashlib.sha1(text.encode()).hexdigest(), 16) % 4
    reward = [0.0, 0.3, 0.5, 0.7][bucket]
    return VerifyResult(candidate=label, correct=reward >= 0.5, reward=reward,
                        stage=["static", "compile", "tiny", "full"][bucket])


class StreamingJudge:
    """A verifier that streams: one thread judges what each session is handed, ``delay_s`` a
    candidate; a stop ends the candidate being judged with a verdict of its own (as a killed worker
    would) and cancels the rest."""

    def __init__(self, events: Events, delay_s: float = 0.0):
        self.events, self.delay_s = events, delay_s
        self.judged: list[tuple[str, int]] = []
        self.closed: list[bool] = []

    def __call__(self, requests):  # the list call a non-streaming round makes
        self.events.mark("list call", len(requests))
        return [fake_verdict(r.label, r.candidate_text) for r in requests]

    def open_session(self, expected: int = 0):
        return _JudgeSession(self)


class _JudgeSession:
    def __init__(self, judge: StreamingJudge):
        self.judge = judge
        self.pool = ThreadPoolExecutor(max_workers=1)
        self.stopping = threading.Event()

    def submit_many(self, requests):
        self.judge.events.mark("submit", [_key_of(r.label) for r in requests])
        return [self.pool.submit(self._judge, r) for r in requests]

    def _judge(self, request) -> VerifyResult:
        self.judge.events.mark("judge start", _key_of(request.label))
        if self.stopping.wait(self.judge.delay_s):
            return VerifyResult(candidate=request.label, stage="compile", error="killed by the stop")
        self.judge.judged.append(_key_of(request.label))
        return fake_verdict(request.label, request.candidate_text)

    @contextlib.contextmanager
    def device_in_use(self):  # the sampler's decode: the verifier times nothing meanwhile
        self.judge.events.mark("gpu held")
        try:
            yield
        finally:
            self.judge.events.mark("gpu released")

    def close(self, *, stop: bool = False) -> None:
        if stop:
            self.stopping.set()
        self.pool.shutdown(wait=True, cancel_futures=stop)
        self.judge.closed.append(stop)


def _wait_for(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    return condition()


# -- overlap ---------------------------------------------------------------------------------------------
def test_first_chunk_is_judged_while_later_chunks_sample(tmp_path, model_dir, monkeypatch, capsys):
    cfg, paths = _config(tmp_path, model_dir)
    events = Events()
    record_sampling(monkeypatch, events)
    judge = StreamingJudge(events)
    assert run_rl(cfg, progress=False, verify_fn=judge).status == "finished"

    assert len(events.times("sample start")) == 3 and not events.times("list call")
    first_chunk = events.details("submit")[0]
    assert len(first_chunk) == 2 and len(set(first_chunk)) == 2  # the first task's two samples
    # Handed over before the second chunk samples, judged before the last chunk has sampled.
    assert events.times("submit")[0] < events.times("sample start", 1)[0]
    assert events.times("judge start", first_chunk[0])[0] < events.times("sample end", 2)[0]
    assert sorted(judge.judged) == sorted(k for keys in events.details("submit") for k in keys)
    assert judge.closed == [False]
    # Each chunk decodes while the session knows the GPU is in use (no kernel is timed beside it).
    held, released = events.times("gpu held"), events.times("gpu released")
    assert len(held) == len(released) == 3
    for i in range(3):
        assert held[i] < events.times("sample start", i)[0] < events.times("sample end", i)[0] < released[i]
    records = _records(paths)
    kinds = [r["type"] for r in records]
    assert kinds.count("sample") == kinds.count("verdict") == 6
    last_sample = max(i for i, kind in enumerate(kinds) if kind == "sample")
    assert kinds.index("verdict") < last_sample  # verdicts logged while the round still sampled
    # The round's time split: sampling, verifying (the session had work), waiting, training.
    seconds = json.loads((paths.rl_round(1) / "round_metrics.json").read_text())["seconds"]
    assert {"sampling_s", "verifying_s", "waiting_s", "training_s"} <= set(seconds)
    assert 0.0 <= seconds["waiting_s"] <= seconds["verifying_s"] + 0.5
    line = [line for line in capsys.readouterr().out.splitlines() if "reward mean" in line][0]
    assert re.search(r"; sampling \d+s, verifying \d+s, waiting \d+s, training \d+s$", line)


def test_overlapped_rounds_give_the_sequential_rounds_results(tmp_path, model_dir):
    """The project verifier with overlap on and off: the same samples, verdicts and adapter."""
    from safetensors.torch import load_file

    results = {}
    for overlap in (True, False):
        cfg, paths = _config(tmp_path / f"overlap-{overlap}", model_dir,
                             ["rl.num_rounds=2", "rl.algorithm=grpo", "rl.learning_rate=0.02",
                              f"rl.overlap_verification={str(overlap).lower()}"])
        assert run_rl(cfg, progress=False, score_fn=vowel_reward).status == "finished"
        logs = [[json.loads(line) for line in paths.rl_candidates_log(r).read_text().splitlines()] for r in (1, 2)]
        metrics = [json.loads(line) for line in paths.metrics_log("rl").read_text().splitlines()]
        rounds = [{k: v for k, v in row.items() if k not in ("seconds", "rollout_tokens_per_s", "train_tokens_per_s", "time")}
                  for row in metrics if row["kind"] == "round"]
        results[overlap] = (logs, rounds, load_file(str(paths.final("rl") / "adapter_model.safetensors")))

    (overlapped, rounds_on, adapter_on), (sequential, rounds_off, adapter_off) = results[True], results[False]
    for on, off in zip(overlapped, sequential):
        assert on[0] == off[0]  # the same header
        assert sorted(map(json.dumps, on[1:])) == sorted(map(json.dumps, off[1:]))
        kinds_on, kinds_off = [r["type"] for r in on], [r["type"] for r in off]
        assert kinds_on.count("verdict") == 6
        assert kinds_off.index("verdict") > max(i for i, k in enumerate(kinds_off) if k == "sample")
        assert kinds_on.index("verdict") < max(i for i, k in enumerate(kinds_on) if k == "sample")
    assert rounds_on == rounds_off and rounds_on[0]["train_steps"] >= 1
    assert adapter_on.keys() == adapter_off.keys()
    assert all(adapter_on[name].equal(adapter_off[name]) for name in adapter_on)


# -- resume --------------------------------------------------------------------------------------------
def test_a_resumed_round_judges_nothing_twice(tmp_path, model_dir, monkeypatch):
    cfg, paths = _config(tmp_path, model_dir)
    signal = SaveSignal.for_run(paths)
    events = Events()
    judge = StreamingJudge(events, delay_s=0.5)

    def stop_before_the_last_chunk(index: int) -> None:
        if index == 2:  # once the first chunk is judged, while the second is being judged
            _wait_for(lambda: len(judge.judged) >= 2, 30)
            signal.request("test", stop=True)

    record_sampling(monkeypatch, events, before=stop_before_the_last_chunk)
    assert run_rl(cfg, save_signal=signal, progress=False, verify_fn=judge).status == "stopped"
    assert judge.closed == [True]
    first = _records(paths)
    sampled, judged_first = _keys(first, "sample"), _keys(first, "verdict")
    assert len(sampled) == 4 and set(sampled[:2]) <= set(judged_first)  # the first chunk's verdicts stayed
    assert set(judged_first) == set(judge.judged)  # what the stop cut short was not logged
    assert all(r["result"]["error"] != "killed by the stop" for r in first if r["type"] == "verdict")

    events = Events()
    monkeypatch.undo()
    record_sampling(monkeypatch, events)
    again = StreamingJudge(events)
    assert run_rl(cfg, progress=False, verify_fn=again).status == "finished"
    # Only the last chunk samples; the logged samples without a verdict are handed over before it.
    assert len(events.times("sample start")) == 1
    assert events.times("submit")[0] < events.times("sample start")[0]
    assert not set(again.judged) & set(judged_first)
    assert len(again.judged) == len(set(again.judged)) == 6 - len(judged_first)
    records = _records(paths)
    assert Counter(_keys(records, "verdict")) == Counter(set(_keys(records, "sample")))  # one verdict each
    assert len(set(_keys(records, "sample"))) == 6
    metrics = json.loads((paths.rl_round(1) / "round_metrics.json").read_text())
    assert metrics["reused_from_candidate_log"] == {"samples": 4, "verdicts": len(judged_first)}


# -- stopping while the verifier works -----------------------------------------------------------------
SOLUTION = '''import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_scale_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, tl.where(x > 0, x, 0.0) * {scale}, mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        out = torch.empty_like(x)
        n = x.numel()
        relu_scale_kernel[(triton.cdiv(n, 256),)](x, out, n, BLOCK=256)
        return out
'''


def _answer_correctly(index, prompts, result):
    """The tiny model's samples, their texts replaced by a correct kernel for the prompt's task
    (one per sample, so none is a copy judged once): the verifier starts real workers for them."""
    prompt_ids, rollouts = result
    answered = []
    for messages, task_rollouts in zip(prompts, rollouts):
        scale = re.search(r"torch\.relu\(x\) \* (\d+)", messages[-1]["content"]).group(1)
        answered.append([None if rollout is None else
                         (f"```python\n{SOLUTION.format(scale=float(scale))}# sample {i}\n```", rollout[1])
                         for i, rollout in enumerate(task_rollouts)])
    return prompt_ids, answered


@pytest.fixture
def orphans_stay_here():
    """A verifier process left behind as an orphan stays among this test's descendants, where the
    test looks, instead of going to init."""
    with adopting_orphans():
        yield


def _verifier_processes(module: bytes = VERIFIER_MODULES) -> set[int]:
    """The verifier's live processes among this test's descendants (not another run's)."""
    from extensions.verify.common.proctree import live_descendants

    found = set()
    for pid in live_descendants(os.getpid()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                if module in handle.read():
                    found.add(pid)
        except OSError:
            continue
    return found


@pytest.mark.parametrize("phase", ["sampling", "waiting"])
def test_a_stop_while_candidates_are_judged_leaves_no_verifier_process(tmp_path, model_dir, monkeypatch,
                                                                        orphans_stay_here, phase):
    cfg, paths = _config(tmp_path, model_dir, ["rl.tasks_per_round=2", "verifier.timeout_s=120"])
    signal = SaveSignal.for_run(paths)
    assert not _verifier_processes()
    seen: list[set[int]] = []
    asked: list[float] = []

    def stop_when_judging() -> None:  # once a sandbox runs beside the reference processes
        _wait_for(lambda: bool(_verifier_processes(SANDBOXED)), 120)
        seen.append(_verifier_processes(SANDBOXED))
        asked.append(time.monotonic())
        signal.request("test", stop=True)

    def before_chunk(index: int) -> None:
        if phase == "sampling" and index == 1:  # the first chunk is being judged
            stop_when_judging()

    def after_chunk(index: int, prompts, result):
        if phase == "waiting" and index == 1:  # sampling is over: the round waits for verdicts
            threading.Thread(target=stop_when_judging, daemon=True).start()
        return _answer_correctly(index, prompts, result)

    record_sampling(monkeypatch, Events(), before=before_chunk, after=after_chunk)
    outcome = run_rl(cfg, save_signal=signal, progress=False)
    stopped_after = time.monotonic() - asked[0]
    assert outcome.status == "stopped"
    assert seen and seen[0]  # the verifier's processes were running when the stop came
    assert stopped_after < 60
    assert _wait_for(lambda: not _verifier_processes(), 30), _verifier_processes()
    records = _records(paths)
    assert len(_keys(records, "sample")) == (2 if phase == "sampling" else 4)
    assert len(_keys(records, "verdict")) < len(_keys(records, "sample"))  # cut short, not waited out
    # Whatever was logged is a verdict on the candidate, never the end of a killed worker.
    assert all(r["result"]["correct"] for r in records if r["type"] == "verdict")
