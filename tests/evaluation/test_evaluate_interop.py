"""evaluate.py and KernelBench's run-folder layout (level_L_problem_P_sample_S_kernel.py), and a
--model_path that is not a model: real subprocesses, real kernels in the Triton interpreter."""
from __future__ import annotations

import json
import re
from pathlib import Path

from extensions.evaluation.kernelbench_runs import KERNEL_FILE

from test_evaluate_cli import FIXTURES, response, run_evaluate

# Our KernelBench task ids are L{level}_{name}; the name's number is KernelBench's problem id.
TASKS = [("L1_19_ReLU", 1, "19_ReLU", "relu"), ("L1_7_add_scaled", 1, "7_add_scaled", "add_scaled"),
         ("bundled_row_sum", 2, "row_sum", "row_sum")]
GENERATIONS = [
    ("L1_19_ReLU", "relu_correct.md"), ("L1_19_ReLU", "relu_torch_fallback.md"),
    ("L1_7_add_scaled", "add_scaled_correct.py"), ("L1_7_add_scaled", "garbage.txt"),
    ("bundled_row_sum", "row_sum_correct.md"),
]


def write_tasks(path: Path) -> Path:
    with open(path, "w") as handle:
        for task_id, level, name, fixture in TASKS:
            code = (FIXTURES / "tasks" / f"{fixture}.py").read_text()
            handle.write(json.dumps({"task_id": task_id, "level": level, "name": name, "code": code}) + "\n")
    return path


def verdicts(report: dict) -> dict:
    return {task["task_id"]: sorted(s["correct"] for s in task["samples"]) for task in report["tasks"]}


def test_generations_round_trip_through_a_kernelbench_run_folder(tmp_path, project_root):
    tasks = write_tasks(tmp_path / "tasks.jsonl")
    gens = tmp_path / "gens.jsonl"
    gens.write_text("".join(json.dumps({"task_id": t, "response": response(c)}) + "\n" for t, c in GENERATIONS))
    kb_run = tmp_path / "kb_run"
    out = tmp_path / "out"
    common = ["--tasks", str(tasks), "--device", "cpu", "--output_dir", str(out), "--smoke"]

    exported = run_evaluate(["--from_generations", str(gens), "--name", "jsonl", "--export-kernelbench",
                             str(kb_run), *common], project_root)
    assert exported.returncode == 3, exported.stdout + exported.stderr  # two samples have no file: reported
    files = sorted(p.name for p in kb_run.iterdir())
    assert files == ["level_1_problem_19_sample_0_kernel.py", "level_1_problem_19_sample_1_kernel.py",
                     "level_1_problem_7_sample_0_kernel.py"]
    assert all(KERNEL_FILE.match(name) for name in files)
    kernel = (kb_run / "level_1_problem_19_sample_0_kernel.py").read_text()
    assert "class ModelNew" in kernel and "```" not in kernel  # code, not the markdown response
    assert "3 kernel file(s)" in exported.stdout and "not written (2)" in exported.stdout
    assert "bundled_row_sum sample 0: not a KernelBench task" in exported.stdout
    assert "L1_7_add_scaled sample 1: no code in the response" in exported.stdout

    # A stray file of a problem we do not have, as another tool's run folder may hold.
    (kb_run / "level_1_problem_99_sample_0_kernel.py").write_text(kernel)
    (kb_run / "generation_config.yaml").write_text("run_name: x\n")
    reread = run_evaluate(["--from_generations", str(kb_run), "--name", "folder", *common], project_root)
    assert reread.returncode == 3, reread.stdout + reread.stderr  # the stray file is a skipped row
    by_jsonl = verdicts(json.loads((out / "eval_jsonl.json").read_text()))
    by_folder = json.loads((out / "eval_folder.json").read_text())
    assert verdicts(by_folder) == {"L1_19_ReLU": [False, True], "L1_7_add_scaled": [True]}
    assert by_jsonl["L1_19_ReLU"] == [False, True] and by_jsonl["L1_7_add_scaled"] == [False, True]
    assert any("problem number 99" in row for row in by_folder["skipped_rows"])


def test_folder_without_kernel_files_is_a_usage_error(tmp_path, project_root):
    tasks = write_tasks(tmp_path / "tasks.jsonl")
    (tmp_path / "empty_run").mkdir()
    result = run_evaluate(["--from_generations", str(tmp_path / "empty_run"), "--tasks", str(tasks),
                           "--name", "x", "--output_dir", str(tmp_path / "out"), "--smoke"], project_root)
    assert result.returncode == 2
    assert "no level_L_problem_P_sample_S_kernel.py files" in result.stderr


def test_model_path_that_is_not_a_model_fails_in_one_line_and_leaves_no_file(tmp_path, project_root):
    tasks = write_tasks(tmp_path / "tasks.jsonl")
    out = tmp_path / "out"
    not_a_model = tmp_path / "notes"
    not_a_model.mkdir()
    (not_a_model / "README.txt").write_text("my notes\n")
    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text(json.dumps({"model_type": "no-such-architecture"}))
    for folder in (not_a_model, broken):
        result = run_evaluate(["--model_path", str(folder), "--tasks", str(tasks), "--name", folder.name,
                               "--output_dir", str(out), "--smoke", "--set", "prompt.mode=plain"], project_root,
                              timeout=300)
        output = result.stdout + result.stderr
        assert result.returncode == 3, output
        assert "Traceback" not in output
        errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and str(folder) in errors[0], output
        assert not (out / f"generations_{folder.name}.jsonl").exists()
    assert "is not a model directory" in run_evaluate(
        ["--model_path", str(not_a_model), "--tasks", str(tasks), "--output_dir", str(out), "--smoke"],
        project_root).stderr
