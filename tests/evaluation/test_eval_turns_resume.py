"""``evaluate.py --turns T`` resumes: an evaluation interrupted after turn 1 goes on from turn 2 on
the next run, without sampling or judging turn 1 again, and a rerun of the command with more turns
keeps the saved ones (tiny random model, real verifier)."""
from __future__ import annotations

import json

import pytest

from extensions import verify
from extensions.generation import sampling
from test_evaluate_cli import build_tiny_model, write_tasks


@pytest.fixture()
def evaluation(tmp_path, project_root):
    from extensions.config import load_config
    from extensions.evaluation.commands import OutputFiles, evaluate_model
    from extensions.evaluation.inputs import load_tasks
    from extensions.evaluation.runner import EvalSettings
    from extensions.runtime.paths import RunPaths
    from extensions.prompting.builder import PromptBuilder

    model_dir = tmp_path / "tiny-model"
    build_tiny_model(model_dir)
    tasks_file = write_tasks(tmp_path / "tasks.jsonl", ["relu", "add_scaled"])
    tasks, _ = load_tasks(tasks_file)

    def run(max_new_tokens: int = 6):
        cfg = load_config(project_root / "configs" / "smoke.yaml", [
            f"run.root={tmp_path / 'run'}", f"model.name_or_path={model_dir}", "model.gguf_file=null",
            "model.dtype=float32", "prompt.mode=plain", f"eval.max_new_tokens={max_new_tokens}"])
        outputs = OutputFiles(RunPaths.from_config(cfg), tmp_path / "out")
        return evaluate_model(cfg, name="tiny", model_path=str(model_dir), tasks=tasks, tasks_file=tasks_file,
                              task_issues=[], outputs=outputs, settings=EvalSettings.from_config(cfg.eval, 1),
                              device="cpu", progress=False, turns=2, prompts=PromptBuilder())

    return run, tmp_path / "out" / "trajectories_tiny.jsonl"


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()[1:]]


def test_interrupted_evaluation_goes_on_from_the_next_turn(evaluation, monkeypatch):
    run, path = evaluation
    real_sample, real_verify = sampling.sample_completions, verify.verify_batch
    sampled, judged = [], []

    def interrupted_in_turn_two(model, tokenizer, prompts, n, params, **kwargs):
        if sampled:
            raise KeyboardInterrupt  # Ctrl-C while turn 2 samples
        sampled.append(len(prompts))
        return real_sample(model, tokenizer, prompts, n, params, **kwargs)

    monkeypatch.setattr(sampling, "sample_completions", interrupted_in_turn_two)
    with pytest.raises(KeyboardInterrupt):
        run()
    after_turn_one = _rows(path)
    assert [len(row["turns"]) for row in after_turn_one] == [1, 1]

    def counting_sample(model, tokenizer, prompts, n, params, **kwargs):
        sampled.append(len(prompts))
        return real_sample(model, tokenizer, prompts, n, params, **kwargs)

    def counting_verify(requests, *args, **kwargs):
        judged.extend(request.label for request in requests)
        return real_verify(requests, *args, **kwargs)

    monkeypatch.setattr(sampling, "sample_completions", counting_sample)
    monkeypatch.setattr(verify, "verify_batch", counting_verify)
    sampled.clear()
    report, _ = run()
    assert sampled == [2]  # one call: turn 2 of both trajectories
    assert sorted(judged) == ["add_scaled#0@turn2", "relu#0@turn2"]
    rows = _rows(path)
    assert [len(row["turns"]) for row in rows] == [2, 2]
    assert [row["turns"][0] for row in rows] == [row["turns"][0] for row in after_turn_one]
    assert [e["answered"] for e in report["turns"]["per_turn"]] == [2, 2]

    sampled.clear(), judged.clear()
    report, _ = run()  # finished: nothing to sample or judge, the same report
    assert sampled == [] and judged == [] and [e["answered"] for e in report["turns"]["per_turn"]] == [2, 2]

    run(max_new_tokens=5)  # other sampling settings: the saved turns are not theirs
    assert sampled == [2, 2] and path.with_name(path.name + ".old").is_file()


def test_cli_rerun_with_more_turns_keeps_the_saved_ones(tmp_path, project_root):
    from test_evaluate_cli import run_evaluate

    model_dir = tmp_path / "tiny-model"
    build_tiny_model(model_dir)
    tasks = write_tasks(tmp_path / "tasks.jsonl", ["relu", "add_scaled"])
    out = tmp_path / "out"
    args = ["--model_path", str(model_dir), "--tasks", str(tasks), "--name", "tiny", "--output_dir", str(out),
            "--smoke", "--set", f"run.root={tmp_path / 'run'}", "--set", "prompt.mode=plain",
            "--set", "eval.max_new_tokens=6"]
    first = run_evaluate([*args, "--turns", "2"], project_root, timeout=600)
    assert first.returncode == 0, first.stdout + first.stderr
    path = out / "trajectories_tiny.jsonl"
    two_turns = _rows(path)
    again = run_evaluate([*args, "--turns", "3"], project_root, timeout=600)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"reusing 4 saved turn(s) of 2 trajectories from {path}" in again.stdout
    rows = _rows(path)
    assert [len(row["turns"]) for row in rows] == [3, 3]
    assert [row["turns"][:2] for row in rows] == [row["turns"] for row in two_turns]
    report = json.loads((out / "eval_tiny.json").read_text())
    assert [e["answered"] for e in report["turns"]["per_turn"]] == [2, 2, 2]
