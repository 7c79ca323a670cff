"""rl.reward_fn: a plain callable (prompts, completions, verdicts, **kw) -> list[float] that a user
plugs in through the config; the verifier's verdict stays the gate."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from extensions.config import ConfigError
from extensions.training.rewards import gated_user_rewards, load_reward_fn, make_score_fn
from extensions.training.rollouts import Candidate
from extensions.config import load_config
from project_paths import PROJECT_ROOT



def _candidate(task_id, text, **verdict):
    return Candidate(task_id=task_id, level=1, sample_index=0, text=text, result=verdict)


def test_the_user_reward_is_used_within_the_verdicts_gate(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(
        "def shorter_is_better(prompts, completions, verdicts, **kw):\n"
        "    assert kw['task_ids'] and kw['levels'] and kw['turns']\n"
        "    return [10.0 - len(c) / 10 for c in completions]\n")
    monkeypatch.chdir(tmp_path)
    fn = load_reward_fn("my_rewards:shorter_is_better")
    score = make_score_fn(load_config(None).rl)
    candidates = [
        _candidate("a", "x" * 10, correct=True, stage="full", reward=0.7, flags=[]),        # 9.0: correct, the user's value
        _candidate("a", "x" * 20, correct=False, stage="compile", reward=0.3, flags=[]),    # 8.0 capped at the preset's 0.3
        _candidate("b", "x" * 5, correct=True, stage="full", reward=0.7, flags=["torch_compute"]),  # cheating: 0
    ]
    rewards = gated_user_rewards(fn, candidates, {"a": "problem a", "b": "problem b"}, score)
    assert rewards == [9.0, 0.3, 0.0]


@pytest.mark.parametrize("spec,message", [
    ("no_colon", "must look like module:function"),
    ("no_such_module_here:f", "cannot import no_such_module_here"),
    ("json:no_such_function", "json has no function no_such_function"),
])
def test_a_reward_fn_that_cannot_load_names_the_problem(spec, message):
    with pytest.raises(ConfigError, match=message):
        load_reward_fn(spec)


def test_a_reward_fn_that_returns_the_wrong_count_is_an_error(tmp_path, monkeypatch):
    (tmp_path / "bad_rewards.py").write_text("def f(prompts, completions, verdicts, **kw):\n    return [1.0]\n")
    monkeypatch.chdir(tmp_path)
    candidates = [_candidate("a", "x", correct=True, flags=[]), _candidate("a", "y", correct=True, flags=[])]
    with pytest.raises(ConfigError, match="1 rewards for 2 candidates"):
        gated_user_rewards(load_reward_fn("bad_rewards:f"), candidates, {}, lambda c: 0.0)


def test_rl_with_an_unloadable_reward_fn_stops_in_one_line_before_the_model(tmp_path):
    processed = tmp_path / "run" / "data" / "processed"
    processed.mkdir(parents=True)
    (processed / "rl_tasks.jsonl").write_text(json.dumps({"task_id": "t", "level": 1, "name": "t", "code": "x"}) + "\n")
    result = subprocess.run([sys.executable, "train_integrated.py", "--smoke", "--stage", "rl", "--no-progress",
                             "--set", f"run.root={tmp_path / 'run'}", "--set", "rl.init=base",
                             "--set", "rl.reward_fn=missing_module:f"],
                            cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert "cannot import missing_module" in result.stderr
