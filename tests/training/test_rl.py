"""Best-of-N RL: top-K selection, round statistics, the candidate log and resuming a broken round."""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from extensions.runtime import checkpoints
from extensions.runtime.paths import RunPaths
from extensions.training import rl as rl_module
from extensions.training.candidates import CandidateLog, sample_record, verdict_record
from extensions.training import rollouts as rollouts_module
from extensions.training.objectives.best_of_n import select_top_k
from extensions.training.round_stats import round_statistics
from extensions.training.rollouts import Candidate
from extensions.models.tiny import save_tiny_model, tiny_rl_tasks, tiny_solution_code, tiny_task_code
from extensions.verify.result import VerifyResult
from rl_synthetic import tiny_rl_run



def _cand(task, index, reward, text=None, level=1, correct=None):
    result = {"reward": reward, "correct": reward >= 0.5 if correct is None else correct, "stage": "full" if reward >= 0.5 else "compile"}
    return Candidate(task, level, index, text if text is not None else f"{task}-{index}", result)


# -- selection and statistics ----------------------------------------------------------------------------
def test_top_k_above_threshold_with_deterministic_ties():
    candidates = [
        _cand("a", 0, 0.3), _cand("a", 1, 0.7), _cand("a", 2, 0.5), _cand("a", 3, 0.7), _cand("a", 4, 1.0),
        _cand("b", 0, 0.0), _cand("b", 1, 0.29),  # nothing reaches the threshold
        _cand("c", 0, 0.5), _cand("c", 1, 0.5, text="c-0"), _cand("c", 2, 0.3),  # c-1 repeats c-0
    ]
    kept = select_top_k(candidates, top_k=3, threshold=0.3)
    assert [(c.task_id, c.sample_index) for c in kept] == [("a", 4), ("a", 1), ("a", 3), ("c", 0), ("c", 2)]
    assert select_top_k(list(reversed(candidates)), top_k=3, threshold=0.3) == kept
    assert [(c.task_id, c.sample_index) for c in select_top_k(candidates, top_k=1, threshold=0.6)] == [("a", 4)]
    unjudged = Candidate("d", 1, 0, "x", None)
    assert select_top_k([unjudged], top_k=3, threshold=0.0) == []


def test_round_statistics():
    candidates = [_cand("a", 0, 0.7, level=1), _cand("a", 1, 0.3, level=1), _cand("b", 0, 0.0, level=2, correct=False)]
    candidates[2].result["stage"] = "static"
    stats = round_statistics(candidates)
    assert stats["judged"] == 3 and stats["correct"] == 1
    assert stats["reward_mean"] == pytest.approx(1.0 / 3)
    assert stats["correct_rate_by_level"] == {"1": 0.5, "2": 0.0}
    assert stats["stage_pass_rate"]["static"] == 1.0
    assert stats["stage_pass_rate"]["compile"] == pytest.approx(2 / 3)
    assert stats["stage_pass_rate"]["full"] == pytest.approx(1 / 3)


def test_candidate_log_skips_a_torn_line_and_stale_verdicts(tmp_path):
    log = CandidateLog(tmp_path / "round.jsonl")
    log.append([{"type": "round", "round": 1, "task_ids": ["t"], "policy": "p"},
                sample_record("t", 0, "old"), verdict_record("t", 0, "old", {"reward": 0.3}),
                sample_record("t", 0, "new"), sample_record("t", 1, "other")])
    with open(log.path, "a") as handle:
        handle.write('{"type": "verdict", "task_id": "t", "sam')  # torn by a crash
    contents = log.read()
    assert contents.samples == {("t", 0): "new", ("t", 1): "other"}
    assert contents.verdicts == {}  # the verdict was for the replaced text
    assert contents.damaged_lines == 1
    stale = log.set_aside()
    assert stale.name.endswith(".stale-1") and not log.path.exists()


# -- whole rounds on a tiny model ------------------------------------------------------------------------
def fake_verify(items):
    """Deterministic rewards from the candidate text, so selection is reproducible."""
    results = []
    for request in items:
        text, label = request.candidate_text, request.label
        bucket = int(hashlib.sha1(text.encode()).hexdigest(), 16) % 4
        reward = [0.0, 0.3, 0.5, 0.7][bucket]
        results.append(VerifyResult(candidate=label, correct=reward >= 0.5, reward=reward,
                                    stage=["static", "compile", "tiny", "full"][bucket]))
    return results


class CountingVerifier:
    def __init__(self, fail_on_call: int | None = None):
        self.calls, self.items, self.fail_on_call = 0, 0, fail_on_call

    def __call__(self, items):
        self.calls += 1
        if self.fail_on_call is not None and self.calls == self.fail_on_call:
            raise KeyboardInterrupt("simulated crash during verification")
        self.items += len(items)
        return fake_verify(items)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny_model"))


def _rl_config(root: Path, model_dir: Path, extra=()):
    return tiny_rl_run(root, model_dir, [
        "rl.num_rounds=2", "rl.tasks_per_round=3", "rl.samples_per_task=3", "rl.top_k=2", "rl.max_new_tokens=12",
        "rl.generation_batch_size=6", "rl.verify_chunk_size=4", "rl.per_device_batch_size=2",
        "rl.gradient_accumulation_steps=1", "rl.learning_rate=0.001", "lora.r=4", *extra,
    ], tiny_rl_tasks(6))


def _log_records(paths: RunPaths, round_index: int) -> list[dict]:
    return [json.loads(line) for line in paths.rl_candidates_log(round_index).read_text().splitlines()]


def test_rl_rounds_checkpoint_log_and_finish(tmp_path, model_dir, capsys):
    cfg, paths = _rl_config(tmp_path, model_dir)
    outcome = rl_module.run_rl(cfg, progress=False, verify_fn=fake_verify)
    assert outcome.status == "finished"
    printed = capsys.readouterr().out.splitlines()
    summary = [line for line in printed if line.startswith("[rl] done:")]
    assert len(summary) == 1 and "2 round(s) in this run" in summary[0]
    # Each round says where its time went.
    rounds = [line for line in printed if line.startswith("[rl] round ") and "reward mean" in line]
    assert len(rounds) == 2 and all(re.search(r"sampling \d+s, verifying \d+s, waiting \d+s, training \d+s$", line) for line in rounds)
    assert "round 1: reward" in summary[0] and "round 2: reward" in summary[0] and "/9 correct" in summary[0]
    for r in (1, 2):
        round_dir = paths.rl_round(r)
        assert checkpoints.is_complete(round_dir, verify_hashes=True)
        meta = checkpoints.read_meta(round_dir)
        assert meta["stage"] == "rl" and meta["round"] == r and meta["data"]["start"] == "base+fresh-lora"
        metrics = json.loads((round_dir / "round_metrics.json").read_text())
        assert metrics["candidates"] == 9 and metrics["judged"] == 9
        assert set(metrics["seconds"]) >= {"sampling_s", "verifying_s", "waiting_s", "training_s"}
        records = _log_records(paths, r)
        assert records[0]["type"] == "round" and len(records[0]["task_ids"]) == 3
        kinds = [rec["type"] for rec in records[1:]]
        assert kinds.count("sample") == 9 and kinds.count("verdict") == 9
        assert kinds.index("verdict") > max(i for i, k in enumerate(kinds) if k == "sample")  # samples first
        # the kept set is exactly the top-K selection over the logged verdicts
        candidates = [Candidate(rec["task_id"], 1, rec["sample_index"], rec["text"]) for rec in records if rec["type"] == "sample"]
        verdicts = {(rec["task_id"], rec["sample_index"]): rec["result"] for rec in records if rec["type"] == "verdict"}
        for c in candidates:
            c.result = verdicts[(c.task_id, c.sample_index)]
        assert metrics["kept"] == len(select_top_k(candidates, cfg.rl.top_k, cfg.rl.reward_threshold))
        assert all(len(rec["token_ids"]) == len(rec["logprobs"]) > 0 for rec in records if rec["type"] == "sample")
    assert checkpoints.is_complete(paths.final("rl"))
    assert checkpoints.read_meta(paths.final("rl"))["round"] == 2
    rounds = [json.loads(line) for line in paths.metrics_log("rl").read_text().splitlines()]
    assert [r["round"] for r in rounds if r["kind"] == "round"] == [1, 2]
    curriculum = json.loads((paths.rl_round(2) / "curriculum.json").read_text())
    assert len(curriculum["history"]) == 2
    assert rl_module.run_rl(cfg, progress=False, verify_fn=fake_verify).status == "skipped"


def test_interrupted_round_resumes_without_resampling_or_reverifying(tmp_path, model_dir, monkeypatch):
    from extensions.runtime.interrupt import SaveSignal

    cfg, paths = _rl_config(tmp_path, model_dir, ["rl.num_rounds=1"])
    sampled_prompts = []
    real_sample = rollouts_module.sample_rollouts

    signal = SaveSignal.for_run(paths)
    stop_after_first_batch = [True]

    def counting_sample(model, tokenizer, prompts, n, params, *, progress=True, **kwargs):
        sampled_prompts.append(len(prompts))
        sampled = real_sample(model, tokenizer, prompts, n, params, progress=progress, **kwargs)
        if stop_after_first_batch[0]:
            signal.request("test", stop=True)  # as a SIGTERM arriving while the batch decoded
        return sampled

    monkeypatch.setattr(rollouts_module, "sample_rollouts", counting_sample)

    # 1. stop (as SIGTERM would) after the first generate batch: 2 of 3 tasks sampled
    outcome = rl_module.run_rl(cfg, save_signal=signal, progress=False, verify_fn=CountingVerifier())
    assert outcome.status == "stopped" and sampled_prompts == [2]
    assert sum(rec["type"] == "sample" for rec in _log_records(paths, 1)) == 6

    # 2. crash during the second verification chunk: only the missing task is sampled
    stop_after_first_batch[0] = False
    sampled_prompts.clear()
    crashing = CountingVerifier(fail_on_call=2)
    with pytest.raises(KeyboardInterrupt):
        rl_module.run_rl(cfg, progress=False, verify_fn=crashing)
    assert sampled_prompts == [1] and crashing.items == 4
    assert sum(rec["type"] == "verdict" for rec in _log_records(paths, 1)) == 4

    # 3. resume: nothing sampled, only the 5 unjudged candidates verified, round completes
    sampled_prompts.clear()
    verifier = CountingVerifier()
    assert rl_module.run_rl(cfg, progress=False, verify_fn=verifier).status == "finished"
    assert sampled_prompts == [] and verifier.items == 5
    metrics = json.loads((paths.rl_round(1) / "round_metrics.json").read_text())
    assert metrics["reused_from_candidate_log"] == {"samples": 9, "verdicts": 4}
    assert metrics["rollout_tokens"] == 0 and metrics["rollout_tokens_per_s"] is None
    records = _log_records(paths, 1)
    assert sum(rec["type"] == "sample" for rec in records) == 9
    assert len({(rec["task_id"], rec["sample_index"]) for rec in records if rec["type"] == "verdict"}) == 9
    assert checkpoints.is_complete(paths.final("rl"))


def test_real_verifier_judges_a_correct_triton_candidate():
    verify = pytest.importorskip("extensions.verify")
    if not hasattr(verify, "verify_batch"):
        pytest.skip("extensions.verify.verify_batch is not available")
    from extensions.config import VerifierConfig

    verify_fn = rl_module.make_verify_fn(VerifierConfig(device="cpu", multi_input_num_tests=2), "cpu", progress=False)
    good, bad = tiny_solution_code(0), "no code here"
    from extensions.verify import VerifyRequest

    results = verify_fn([VerifyRequest(tiny_task_code(0), f"```python\n{good}\n```", "good"),
                         VerifyRequest(tiny_task_code(0), bad, "bad")])
    assert results[0].correct and results[0].reward >= 0.5
    assert not results[1].correct and results[1].reward == 0.0


def test_log_sampled_at_another_temperature_is_set_aside(tmp_path, model_dir):
    from extensions.runtime.interrupt import SaveSignal

    cfg, paths = _rl_config(tmp_path, model_dir, ["rl.num_rounds=1"])
    signal = SaveSignal.for_run(paths)
    signal.request("test", stop=True)
    assert rl_module.run_rl(cfg, save_signal=signal, progress=False, verify_fn=fake_verify).status == "stopped"
    first = _log_records(paths, 1)
    assert first[0]["sampling"]["temperature"] == cfg.rl.temperature
    hotter, _ = _rl_config(tmp_path, model_dir, ["rl.num_rounds=1", "rl.temperature=1.3"])
    assert rl_module.run_rl(hotter, progress=False, verify_fn=fake_verify).status == "finished"
    stale = paths.rl_candidates_log(1).with_name(paths.rl_candidates_log(1).name + ".stale-1")
    assert stale.read_text().splitlines()[0] == json.dumps(first[0])  # the old log, kept aside whole
    assert _log_records(paths, 1)[0]["sampling"]["temperature"] == 1.3


def test_raicl_rounds_sample_and_train_on_the_retrieved_prompt(tmp_path, model_dir, monkeypatch):
    """prompt.mode raicl reaches RL: the sampler and the update see the same retrieved examples."""
    from extensions.data.retrieval import Example, build_index

    cfg, paths = _rl_config(tmp_path, model_dir, ["prompt.mode=raicl", "prompt.raicl_k=1", "rl.num_rounds=1"])
    marker = "retrieved_example_marker_kernel"
    build_index([Example(f"kb_{i}", tiny_task_code(i), tiny_solution_code(i).replace("def ", f"def {marker}_", 1))
                 for i in range(3)], paths.retrieval_index)
    seen: list[list[dict]] = []
    original = rollouts_module.sample_rollouts

    def recording_sampler(model, tokenizer, conversations, *args, **kwargs):
        seen.extend(conversations)
        return original(model, tokenizer, conversations, *args, **kwargs)

    monkeypatch.setattr(rollouts_module, "sample_rollouts", recording_sampler)
    outcome = rl_module.run_rl(cfg, progress=False, verify_fn=fake_verify)
    assert outcome.status == "finished"
    assert seen and all(any(marker in m["content"] for m in conversation) for conversation in seen)
    header = _log_records(paths, 1)[0]
    assert header["prompt"]["mode"] == "raicl" and header["prompt"]["k"] == 1
