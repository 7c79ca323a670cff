"""The real smoke-run coder end to end on a CPU: load Qwen2.5-Coder-0.5B, sample one answer to one
task with the project's prompt, and judge it with the verifier CLI as outside checks do.

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
    from extensions.modeling import load_for_inference

    torch.set_num_threads(1)  # generation on a small CPU is fastest with one thread
    cfg = ModelConfig(name_or_path=f"fetch:{MODEL}", dtype="bfloat16")
    model, tokenizer, _ = load_for_inference(cfg.name_or_path, cfg, device="cpu")
    return model, tokenizer


@pytest.mark.slow
def test_the_real_coder_writes_a_kernel_that_the_verifier_judges(coder, tmp_path, project_root):
    from extensions.prompts import build_messages
    from extensions.sampling import SamplingParams, sample_completions

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
    # With the worked example in the prompt, the greedy answer to an elementwise task is a Triton
    # module that builds and runs: it reaches at least the compile stage.
    assert verdict["stage"] in FUNNEL[FUNNEL.index("compile"):], (verdict, response)
