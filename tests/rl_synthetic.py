"""A synthetic reward for the RL loop, and a command-line runner of the RL stage with it.

The reward is the share of vowels in the completion's text (saturating at ``VOWEL_TARGET`` vowels),
which a 2-layer random model can learn within a few dozen steps and which cannot be faked: it is
computed from the sampled text only. Verification is a no-op judge, so the loop runs exactly as
with the verifier, minus the verifier's cost.

    python tests/rl_synthetic.py RUN_ROOT MODEL_DIR [--set section.key=value ...]

With ``RL_SYNTHETIC_SOLVING_RANK=R`` the judge of rank R (``RANK``, 0 without a launcher) calls every
candidate correct. With ``RL_SYNTHETIC_CALLS=FILE`` every judged candidate (its label's task, sample and turn) and
every sampling call (its sequence count) is appended to FILE, so a test can tell what a run did.
With ``RL_SYNTHETIC_STREAMING=1`` the judge streams (``open_session``): the round hands it each
chunk as soon as it is sampled, and a thread judges the candidates one at a time.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
if str(PROJECT_ROOT) not in sys.path:
    sys.path.insert(0, str(PROJECT_ROOT))

VOWEL_TARGET = 8
# LoRA on the output projection too: with small random embeddings, the tiny model can only move
# its output distribution through lm_head.
LEARNING_LORA = "lora.target_modules=[q_proj,v_proj,o_proj,down_proj,lm_head]"


def vowel_reward(candidate) -> float:
    return min(1.0, sum(ch in "aeiou" for ch in candidate.text) / VOWEL_TARGET)


def judge_nothing(items):
    from extensions.verify.result import VerifyResult

    return [VerifyResult(candidate=request.label) for request in items]


def judge_all_correct(items):
    from extensions.verify.result import VerifyResult

    return [VerifyResult(candidate=request.label, correct=True, stage="full", reward=1.0) for request in items]


class StreamingJudge:
    """``judge`` as a verifier that streams: each session judges what it is handed on a thread."""

    def __init__(self, judge):
        self.judge = judge

    def __call__(self, items):
        return self.judge(items)

    def open_session(self, expected: int = 0):
        return _JudgeSession(self.judge)


class _JudgeSession:
    def __init__(self, judge):
        from concurrent.futures import ThreadPoolExecutor

        self.judge, self.pool = judge, ThreadPoolExecutor(max_workers=1)

    def submit_many(self, requests):
        return [self.pool.submit(lambda request: self.judge([request])[0], request) for request in requests]

    def close(self, *, stop: bool = False) -> None:
        self.pool.shutdown(wait=True, cancel_futures=stop)


def record_calls(path: Path, judge):
    """``judge`` and the RL sampler, each call appended to ``path`` as one JSON line."""
    from extensions.training import rollouts

    def write(entry: dict) -> None:
        with open(path, "a") as handle:
            handle.write(json.dumps(entry) + "\n")

    def judging(items):
        for request in items:
            _round, task_id, sample, *turn = request.label.split("/")
            write({"call": "judge", "key": [task_id, int(sample), *(int(t.removeprefix("turn")) for t in turn)]})
        return judge(items)

    sample = rollouts.sample_rollouts

    def sampling(model, tokenizer, prompts, n, params, **kwargs):
        write({"call": "sample", "sequences": len(prompts) * n})
        return sample(model, tokenizer, prompts, n, params, **kwargs)

    rollouts.sample_rollouts = sampling
    return judging


def tiny_rl_run(root: Path, model_dir: Path, settings, tasks: list[dict]):
    """The smoke config on the tiny model at ``model_dir`` under ``root``, with ``settings`` and
    ``tasks`` as the RL tasks: (config, run paths)."""
    from extensions.config import load_config
    from extensions.runtime.paths import RunPaths

    cfg = load_config(PROJECT_ROOT / "configs" / "smoke.yaml", [
        f"run.root={root}", f"model.name_or_path={model_dir}", "model.gguf_file=null", "model.dtype=float32",
        "rl.init=base", "prompt.mode=plain", "sft.max_seq_len=2048", *settings,
    ])
    paths = RunPaths.from_config(cfg)
    paths.processed.mkdir(parents=True, exist_ok=True)
    paths.rl_tasks.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    return cfg, paths


def synthetic_config(root: Path, model_dir: Path, overrides=()):
    """A config for a few fast rounds on the tiny model, with four short level-1 tasks."""
    from extensions.models.tiny import tiny_rl_tasks

    cfg, _ = tiny_rl_run(root, model_dir, [
        "rl.tasks_per_round=4", "rl.samples_per_task=8", "rl.max_new_tokens=8", "rl.temperature=1.0", "rl.top_p=1.0",
        "rl.generation_batch_size=32", "rl.per_device_batch_size=8", "rl.gradient_accumulation_steps=1",
        "rl.reward_threshold=0.0", "rl.top_k=2", "lora.r=8", "lora.dropout=0.0", LEARNING_LORA, *overrides,
    ], tiny_rl_tasks(4, levels=(1,)))
    return cfg


def round_rewards(cfg) -> list[float]:
    from extensions.runtime.paths import RunPaths

    rows = [json.loads(line) for line in RunPaths.from_config(cfg).metrics_log("rl").read_text().splitlines()]
    return [row["reward_mean"] for row in rows if row["kind"] == "round"]


def main(argv=None) -> int:
    import torch

    from extensions.runtime.interrupt import SaveSignal
    from extensions.runtime.paths import RunPaths
    from extensions.training.rl import run_rl

    argv = list(sys.argv[1:] if argv is None else argv)
    root, model_dir, rest = Path(argv[0]), Path(argv[1]), argv[2:]
    overrides = [rest[i + 1] for i in range(0, len(rest), 2) if rest[i] == "--set"]
    torch.set_num_threads(1)  # the same reduction order in every process, for exact comparisons
    judge = judge_nothing
    if os.environ.get("RL_SYNTHETIC_SOLVING_RANK", "-1") == os.environ.get("RANK", "0"):
        judge = judge_all_correct
    if os.environ.get("RL_SYNTHETIC_CALLS"):
        judge = record_calls(Path(os.environ["RL_SYNTHETIC_CALLS"]), judge)
    if os.environ.get("RL_SYNTHETIC_STREAMING") == "1":
        judge = StreamingJudge(judge)
    cfg = synthetic_config(root, model_dir, overrides)
    # As the stage runs for real: the ranks agree on save and stop requests at every check.
    outcome = run_rl(cfg, save_signal=SaveSignal.for_run(RunPaths.from_config(cfg)), progress=False,
                     verify_fn=judge, score_fn=vowel_reward)
    print(f"outcome {outcome.status}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
