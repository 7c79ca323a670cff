"""evaluate.py end to end as real subprocesses on CPU: saved generations re-verified with real Triton
kernels in the interpreter, and a tiny random model generating, saving and re-using its generations."""
import json
import os
import subprocess
import sys

import pytest

from extensions.evaluation.metrics import recompute_metrics
from project_paths import FIXTURES_DIR

FIXTURES = FIXTURES_DIR / "eval"
TASK_FILES = {"relu": 1, "add_scaled": 1, "row_sum": 2, "broken_reference": 1}

# (task, candidate fixture or literal response, is a correct Triton solution)
GENERATIONS = [
    ("relu", "relu_correct.md", True),
    ("relu", "relu_torch_fallback.md", False),  # PyTorch does the math
    ("relu", "relu_zeros.md", False),  # a Triton kernel that writes zeros
    ("relu", "garbage.txt", False),  # no code at all
    ("add_scaled", "add_scaled_correct.py", True),
    ("add_scaled", "add_scaled_correct.py", True),  # the same code twice: judged once, counted twice
    ("add_scaled", "syntax_error.md", False),
    ("add_scaled", "", False),  # empty response
    ("add_scaled", "add_scaled_zeros.py", False),  # torch.zeros_like as the answer
    ("row_sum", "row_sum_correct.md", True),
    ("row_sum", "row_sum_try_fallback.md", False),  # try/except around a PyTorch fallback
    ("row_sum", "row_sum_torch_fallback.py", False),
    ("row_sum", "garbage.txt", False),
    ("broken_reference", "relu_correct.md", False),  # the task itself cannot run
]


def write_tasks(path, names):
    with open(path, "w") as handle:
        for name in names:
            code = (FIXTURES / "tasks" / f"{name}.py").read_text()
            handle.write(json.dumps({"task_id": name, "level": TASK_FILES[name], "name": name, "code": code}) + "\n")
    return path


def response(candidate):
    return (FIXTURES / "candidates" / candidate).read_text() if candidate else ""


def run_evaluate(args, cwd, timeout=900):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "HF_TOKEN"))}
    env["TRITON_INTERPRET"] = "1"
    return subprocess.run([sys.executable, "evaluate.py", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_from_generations_scores_real_kernels_and_reports_bad_input(tmp_path, project_root):
    tasks = write_tasks(tmp_path / "tasks.jsonl", TASK_FILES)
    gens = tmp_path / "gens.jsonl"
    with open(gens, "w") as handle:
        handle.write(json.dumps({"header": {"model_path": "fixtures", "note": "hand-written"}}) + "\n")
        for task, candidate, _ in GENERATIONS:
            handle.write(json.dumps({"task_id": task, "response": response(candidate)}) + "\n")
        handle.write('{"task_id": "relu", "response": "unterminated\n')  # malformed: line 16
        handle.write(json.dumps({"task_id": "no_such_task", "response": response("relu_correct.md")}) + "\n")
    out = tmp_path / "out"
    proc = run_evaluate(["--from_generations", str(gens), "--tasks", str(tasks), "--device", "cpu", "--name", "fixture",
                         "--output_dir", str(out), "--smoke"], project_root)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 3, log  # something was skipped
    report = json.loads((out / "eval_fixture.json").read_text())

    scored = [g for g in GENERATIONS if g[0] != "broken_reference"]
    truly_correct = sum(ok for _, _, ok in scored)
    metrics = report["metrics"]
    assert metrics["num_tasks"] == 3 and metrics["num_samples"] == len(scored) == 13
    assert metrics["num_correct"] == truly_correct == 4, json.dumps(report["tasks"], indent=1)[:4000]
    assert metrics["correct_rate"] == pytest.approx(100 * 4 / 13)
    assert metrics["pass@1"] == pytest.approx((100 / 4 + 200 / 5 + 100 / 4) / 3)  # per task c/n, averaged
    assert metrics["fast_1"] is None and "cpu" in metrics["fast_p_note"]
    assert recompute_metrics(report) == metrics

    by_task = {t["task_id"]: t["samples"] for t in report["tasks"]}
    for task, candidate, ok in scored:
        index = [g for g in GENERATIONS if g[0] == task].index((task, candidate, ok))
        assert by_task[task][index]["correct"] is ok, (task, candidate, by_task[task][index])
    assert by_task["relu"][1]["flags"] and by_task["row_sum"][1]["flags"] and by_task["row_sum"][2]["flags"]
    assert by_task["add_scaled"][3]["error"] == "empty response" and by_task["add_scaled"][3]["stage"] == "none"
    assert by_task["relu"][3]["stage"] in ("none", "extract") and by_task["relu"][3]["error"]

    assert [s["task_id"] for s in report["skipped_tasks"]] == ["broken_reference"]
    assert "reference" in report["skipped_tasks"][0]["reason"]
    assert any("gens.jsonl:16" in row and "malformed" in row for row in report["skipped_rows"])
    assert any("no_such_task" in row for row in report["skipped_rows"])
    assert "broken_reference" in log and "no_such_task" in log


def build_tiny_model(directory):
    """A 2-layer random Qwen2 and a word-level tokenizer built here (no downloads)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    words = ["<pad>", "<unk>", "<|im_start|>", "<|im_end|>", "system", "user", "assistant", "```python",
             "```", "import", "torch", "triton", "class", "ModelNew", "def", "forward", "return", "x"]
    vocab = {w: i for i, w in enumerate(words)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", unk_token="<unk>",
                                        eos_token="<|im_end|>", bos_token="<|im_start|>")
    tokenizer.chat_template = ("{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> "
                               "{% endfor %}{% if add_generation_prompt %}<|im_start|> assistant {% endif %}")
    tokenizer.save_pretrained(directory)
    config = Qwen2Config(vocab_size=len(words), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096,
                         pad_token_id=0, eos_token_id=3, bos_token_id=2, tie_word_embeddings=True)
    import torch

    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(directory)


def test_model_path_generates_saves_before_verifying_and_reuses(tmp_path, project_root):
    model_dir = tmp_path / "tiny-model"
    build_tiny_model(model_dir)
    tasks = write_tasks(tmp_path / "tasks.jsonl", ["relu", "add_scaled", "row_sum"])
    out = tmp_path / "out"
    args = ["--model_path", str(model_dir), "--tasks", str(tasks), "--num_tasks", "2", "--samples_per_task", "2",
            "--name", "tiny", "--output_dir", str(out), "--smoke", "--set", "prompt.mode=plain",
            "--set", "eval.turns=1", "--set", "eval.max_new_tokens=6",
            "--set", "eval.temperature=0.9"]
    first = run_evaluate(args, project_root, timeout=600)
    assert first.returncode == 0, first.stdout + first.stderr
    lines = (out / "generations_tiny.jsonl").read_text().splitlines()
    header = json.loads(lines[0])["header"]
    assert header["model_path"] == str(model_dir) and header["sampling"]["samples_per_task"] == 2
    assert header["sampling"]["temperature"] == 0.9 and header["sampling"]["max_new_tokens"] == 6
    rows = [json.loads(line) for line in lines[1:]]
    assert [(r["task_id"], r["sample"]) for r in rows] == [("relu", 0), ("relu", 1), ("add_scaled", 0), ("add_scaled", 1)]
    report = json.loads((out / "eval_tiny.json").read_text())
    assert report["metrics"]["num_samples"] == 4 and report["metrics"]["correct_rate"] == 0.0  # random weights
    assert report["config"]["eval"]["max_new_tokens"] == 6 and report["config"]["eval"]["temperature"] == 0.9
    assert report["config_fingerprint"] and report["eval_fingerprint"] and report["tasks_file_sha256"]
    assert report["complete"] and recompute_metrics(report) == report["metrics"]
    # Each answer's length is kept, and the report counts the ones the 6-token budget cut off.
    assert all(1 <= r["new_tokens"] <= 6 and r["cut_off"] == (r["new_tokens"] == 6) for r in rows)
    lengths = report["answer_lengths"]
    assert lengths["answers"] == 4 and lengths["cut_off"] == sum(r["cut_off"] for r in rows)
    assert lengths["new_tokens_max"] == max(r["new_tokens"] for r in rows)
    assert f"answers: {lengths['cut_off']} of 4 cut off at max_new_tokens (6)" in first.stdout

    # A re-run reuses the saved generations: put a real kernel in one and it is judged, nothing regenerated.
    rows[0]["response"] = response("relu_correct.md")
    (out / "generations_tiny.jsonl").write_text("\n".join([lines[0], *map(json.dumps, rows)]) + "\n")
    second = run_evaluate(args, project_root, timeout=600)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "reusing saved generations for 2 of 2 tasks" in second.stdout
    report = json.loads((out / "eval_tiny.json").read_text())
    assert report["metrics"]["correct_rate"] == 25.0 and report["metrics"]["per_level"]["1"]["pass@1"] == 25.0


def test_generation_split_over_worker_processes_matches_one_process(tmp_path):
    """One process per GPU: the same chunks with the same seeds, so the same rows as one process."""
    from extensions.config import ModelConfig
    from extensions.evaluation.inputs import read_generations
    from extensions.evaluation.records import EvalTask
    from extensions.evaluation.runner import EvalSettings, generate_responses

    model_dir = tmp_path / "tiny-model"
    build_tiny_model(model_dir)
    tasks = [EvalTask(f"t{i}", 1, f"t{i}", (FIXTURES / "tasks" / "relu.py").read_text()) for i in range(4)]
    settings = EvalSettings(samples_per_task=2, temperature=0.9, max_new_tokens=5, generation_batch_size=2)
    model_cfg = ModelConfig(name_or_path=str(model_dir), dtype="float32")

    def rows(workers: int) -> list[tuple]:
        path = tmp_path / f"generations_{workers}.jsonl"
        generate_responses(str(model_dir), tasks, settings, model_cfg, path, progress=False,
                           log=lambda *_: None, workers=workers)
        return sorted((r.task_id, r.sample, r.response) for r in read_generations(path).rows)

    single, split = rows(1), rows(2)
    assert len(single) == 8 and [(t, s) for t, s, _ in single] == [(f"t{i}", s) for i in range(4) for s in (0, 1)]
    assert split == single
