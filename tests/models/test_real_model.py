"""The real smoke-run coder end to end on a CPU: load Qwen2.5-Coder-0.5B, sample one answer to one
task with the project's prompt, and judge it with the verifier CLI as outside checks do (the same
path every smoke-run candidate takes).

Skipped (with the command that installs it) where the model has not been fetched.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from extensions import models
from extensions.data.bundled import bundled_eval_tasks

MODEL = "qwen2.5-coder-0.5b"
FUNNEL = ("none", "extract", "static", "compile", "tiny", "full", "timing")


@pytest.fixture(scope="module")
def coder():
    try:
        models.verified_path(MODEL)
    except (FileNotFoundError, models.ModelIntegrityError) as exc:
        pytest.skip(f"the {MODEL} model is not installed here ({exc})")
    import torch

    from extensions.config.sections import ModelConfig
    from extensions.models.loading import load_for_inference

    torch.set_num_threads(1)  # generation on a small CPU is fastest with one thread
    cfg = ModelConfig(name_or_path=f"fetch:{MODEL}", dtype="bfloat16")
    model, tokenizer, _ = load_for_inference(cfg.name_or_path, cfg, device="cpu")
    return model, tokenizer


@pytest.mark.slow
def test_the_real_coder_samples_an_answer_that_the_verifier_judges(coder, tmp_path, project_root):
    from extensions.prompting.templates import build_messages
    from extensions.generation.sampling import SamplingParams, sample_completions

    model, tokenizer = coder
    task = next(t for t in bundled_eval_tasks() if t.name == "softsign")
    [[response]] = sample_completions(model, tokenizer, [build_messages(task.code)], 1,
                                      SamplingParams(max_new_tokens=320, temperature=0.0, batch_size=1), progress=False)
    problem, candidate = tmp_path / "problem.py", tmp_path / "response.md"
    problem.write_text(task.code)
    candidate.write_text(response)
    result = subprocess.run(
        [sys.executable, "-m", "extensions.verify", "--problem", str(problem), "--candidate", str(candidate),
         "--device", "cpu", "--json"], cwd=project_root, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    [verdict] = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    assert response.strip() and "```" in response  # a real answer in the prompt's format, not an empty or cut-off text
    # Judged, whatever the verdict: a 0.5B model's greedy answer may be a kernel or a copy of the task.
    assert verdict["stage"] in FUNNEL and verdict["candidate"] == str(candidate)
    assert (not verdict["correct"] or verdict["stage"] in ("full", "timing")) and 0.0 <= verdict["reward"] <= 1.0
