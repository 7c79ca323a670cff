"""Multi-turn evaluation: per-turn metrics from real verdicts (a scripted model that fixes its
kernel when told what was wrong), and ``evaluate.py --turns`` end to end with a tiny random model."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from extensions.config import VerifierConfig
from extensions.evaluation.records import EvalTask
from extensions.evaluation.turns import build_trajectories, format_turn_table, run_turns_evaluation, turns_block
from extensions.prompting.builder import PromptBuilder
from extensions.prompting.templates import build_messages
from extensions.verify import verify_batch
from test_evaluate_cli import FIXTURES, build_tiny_model, response, run_evaluate, write_tasks


def _task(name: str, level: int) -> EvalTask:
    return EvalTask(name, level, name, (FIXTURES / "tasks" / f"{name}.py").read_text())


@pytest.fixture(scope="module")
def outcome(tmp_path_factory):
    """relu: wrong at turn 1, fixed at turn 2; row_sum: never fixed; broken_reference: skipped."""
    tasks = [_task("relu", 1), _task("row_sum", 2), _task("broken_reference", 1)]
    config = VerifierConfig(device="cpu", timeout_s=90, workers=2, multi_input_num_tests=1)

    def generate(prompts, turn):
        answers = []
        for prompt in prompts:
            task_text = prompt[len(build_messages("")) - 1]["content"]  # the task, after the worked example
            if "torch.sum" in task_text:
                answers.append(response("row_sum_torch_fallback.py"))
            elif turn == 1:
                answers.append(response("relu_zeros.md"))
            else:
                assert "Verifier result:" in prompt[-1]["content"]  # the refinement turn carries feedback
                answers.append(response("relu_correct.md"))
        return answers

    def verify(requests):
        return verify_batch(requests, config, progress=False)

    path = tmp_path_factory.mktemp("turns") / "trajectories_scripted.jsonl"
    result = run_turns_evaluation(tasks, build_trajectories(tasks, 1, PromptBuilder()), generate=generate,
                                  verify=verify, count_tokens=lambda m: sum(len(x["content"]) for x in m),
                                  turns=3, max_prompt_tokens=None, trajectories_path=path, header={"turns": 3})
    return result, path


def test_per_turn_metrics_follow_the_trajectories(outcome):
    result, _path = outcome
    assert [s.task_id for s in result.verification.skipped_tasks] == ["broken_reference"]
    block = turns_block(result, False, "no timing on cpu")
    per_turn = block["per_turn"]
    assert [e["turn"] for e in per_turn] == [1, 2, 3]
    assert [e["correct_rate"] for e in per_turn] == [0.0, 50.0, 50.0]
    assert [e["solved_share"] for e in per_turn] == [0.0, 50.0, 50.0]
    assert [e["pass@1"] for e in per_turn] == [0.0, 50.0, 50.0]
    assert [e["answered"] for e in per_turn] == [2, 2, 1]  # relu stops once correct
    assert per_turn[0]["compiled_rate"] == 50.0  # relu's zeros kernel compiles; the fallback does not run
    assert all(e["fast_1"] is None for e in per_turn)  # no timing on CPU: never a fake 0
    assert block["success_rate"] == 50.0 and block["average_turns_used"] == 2.5
    table = format_turn_table(block)
    assert "tasks solved %" in table and "average turns used: 2.50" in table


def test_trajectories_file_holds_every_turn(outcome):
    _result, path = outcome
    lines = path.read_text().splitlines()
    assert json.loads(lines[0])["header"] == {"turns": 3}
    rows = {row["task_id"]: row for row in map(json.loads, lines[1:])}
    relu = rows["relu"]["turns"]
    assert [t["result"]["correct"] for t in relu] == [False, True]
    assert relu[0]["feedback"].startswith("Verifier result: numerical mismatch") or \
        relu[0]["feedback"].startswith("Verifier result: wrong output")
    assert len(rows["row_sum"]["turns"]) == 3


def test_evaluate_cli_with_turns_prints_table_and_writes_plot(tmp_path, project_root):
    """The smoke config as a new user runs it: RA-ICL prompts from the prepared run, two turns."""
    model_dir = tmp_path / "tiny-model"
    build_tiny_model(model_dir)
    tasks = write_tasks(tmp_path / "tasks.jsonl", ["relu", "add_scaled"])
    out = tmp_path / "out"
    run_root = ["--smoke", "--set", f"run.root={tmp_path / 'run'}"]
    args = ["--model_path", str(model_dir), "--tasks", str(tasks), "--turns", "2", "--name", "tiny",
            "--output_dir", str(out), *run_root, "--set", "eval.max_new_tokens=6"]
    unprepared = run_evaluate(args, project_root, timeout=120)
    assert unprepared.returncode == 2 and "run prepare_data.py" in unprepared.stderr
    prepared = subprocess.run([sys.executable, "prepare_data.py", *run_root, "--no_progress"], cwd=project_root,
                              capture_output=True, text=True, timeout=300)
    assert prepared.returncode == 0, prepared.stderr
    proc = run_evaluate(args, project_root, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "per turn" in proc.stdout and "tasks solved %" in proc.stdout
    assert "RA-ICL prompts:" in proc.stdout
    report = json.loads((out / "eval_tiny.json").read_text())
    assert [e["turn"] for e in report["turns"]["per_turn"]] == [1, 2]
    assert report["turns"]["per_turn"][1]["answered"] == 2  # random weights never solve: both refine
    assert report["metrics"]["num_samples"] == 2
    assert report["prompt"]["mode"] == "raicl" and report["prompt"]["retrieval"]["hit_rate"] == 1.0
    assert (out / "turns_tiny.png").stat().st_size > 0
    rows = [json.loads(line) for line in (out / "trajectories_tiny.jsonl").read_text().splitlines()[1:]]
    assert [len(row["turns"]) for row in rows] == [2, 2]
    assert all(turn["prompt_tokens"] > 0 for row in rows for turn in row["turns"])

    bad = run_evaluate(["--from_generations", str(out / "trajectories_tiny.jsonl"), "--name", "x", "--turns", "2",
                        "--smoke"], project_root, timeout=120)
    assert bad.returncode == 2 and "--turns needs a model" in bad.stderr


def test_compare_shows_per_turn_tables_and_curves(outcome, tmp_path):
    from extensions.evaluation.compare import compare_reports, write_comparison
    from extensions.evaluation.runner import build_report

    result, _path = outcome
    reports = {}
    for name in ("base", "sft"):
        report = build_report(name=name, model_path=name, tasks_file="t.jsonl", generations_file="g.jsonl",
                              generations_header=None, device="cpu", verifier_cfg=VerifierConfig(),
                              outcome=result.verification, input_issues=[], config_source=None)
        report["turns"] = turns_block(result, False, "no timing on cpu")
        reports[name] = json.loads(json.dumps(report))
    comparison = compare_reports(reports, bootstrap_samples=100)
    paths = {"json_path": tmp_path / "c.json", "md_path": tmp_path / "c.md", "png_path": tmp_path / "c.png"}
    write_comparison(comparison, reports, **paths)
    markdown = paths["md_path"].read_text()
    assert "## Per turn (multi-turn refinement)" in markdown
    assert "| sft | 2 | 50.0 | 50.0 | n/a | 50.0 | 50.0 |" in markdown
    assert paths["png_path"].stat().st_size > 0

    from PIL import Image

    with Image.open(paths["png_path"]) as image:
        # two panels: the funnel and the per-turn curves (no timing on CPU, so no empty speedup panel)
        assert 1300 < image.size[0] < 2000
