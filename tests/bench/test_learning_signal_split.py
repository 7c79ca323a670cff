"""The learning-signal benchmark's task split: fixed, disjoint, and decontaminated."""
from __future__ import annotations

import json


def test_split_is_fixed_disjoint_and_balanced_by_level(learning_signal, kernelbench_jsonl):
    problems = learning_signal.read_problems(kernelbench_jsonl, (1, 2))
    split, heldout, rl = learning_signal.make_split(problems, heldout_per_level=6, rl_per_level=6, threshold=0.85)
    again, _, _ = learning_signal.make_split(list(reversed(problems)), heldout_per_level=6, rl_per_level=6, threshold=0.85)
    assert split == again  # the input order does not matter: the split is a function of the names
    assert not {p["name"] for p in heldout} & {p["name"] for p in rl}
    assert [sum(1 for p in heldout if p["level"] == level) for level in (1, 2)] == [6, 6]
    assert [sum(1 for p in rl if p["level"] == level) for level in (1, 2)] == [6, 6]
    json.dumps(split)  # saved with the results as it is


def test_rl_problems_near_a_heldout_one_are_dropped_and_counted(learning_signal, kernelbench_jsonl):
    problems = learning_signal.read_problems(kernelbench_jsonl, (1,))
    _, heldout, _ = learning_signal.make_split(problems, heldout_per_level=4, rl_per_level=4, threshold=0.85)
    # A renamed copy of a held-out problem is the same task: it must not be trained on while its
    # twin is held out (whichever of the two the hash puts first).
    original = heldout[0]["name"]
    twin = {**heldout[0], "name": "999_renamed_copy", "problem_id": 999}
    split, heldout, rl = learning_signal.make_split(problems + [twin], heldout_per_level=4, rl_per_level=100,
                                                    threshold=0.85)
    pair = {original, twin["name"]}
    assert pair & {p["name"] for p in heldout}
    assert not pair & {p["name"] for p in rl}
    assert any(d["rl"] in pair for d in split["dropped"]["rl_near_heldout"])


def test_token_budgets_are_measured_from_the_sft_pairs(learning_signal, tmp_path):
    """A run whose answers are longer than the answer budget loses them to the cut-off: the budgets
    come from the pairs, kept once so every resumed phase uses the same ones."""
    from extensions.config import load_config
    from extensions.models.loading import load_tokenizer
    from extensions.runtime.paths import RunPaths
    from extensions.models.tiny import save_tiny_model

    model = save_tiny_model(tmp_path / "model")
    cfg = load_config(learning_signal.Path(learning_signal.__file__).resolve().parent.parent / "configs" / "smoke.yaml",
                      [f"run.root={tmp_path / 'run'}", f"model.name_or_path={model}", "model.gguf_file=null"])
    paths = RunPaths.from_config(cfg)
    paths.processed.mkdir(parents=True)
    prompt = [{"role": "user", "content": "write relu"}]
    short, long = "x = 1\n", "y = 2\n" * 400
    rows = [{"prompt": prompt, "completion": short}] * 39 + [{"prompt": prompt, "completion": long}]
    paths.sft_train.write_text("".join(json.dumps(r) + "\n" for r in rows))
    budgets = learning_signal.measured_budgets(cfg, tmp_path)
    tokenizer = load_tokenizer(cfg.model)
    short_tokens = len(tokenizer(short, add_special_tokens=False)["input_ids"]) + 1
    long_tokens = len(tokenizer(long, add_special_tokens=False)["input_ids"]) + 1
    # 95% of the answers are the short one: the budget covers it, rounded up to 128, not the outlier.
    assert budgets["max_new_tokens"] == -(-short_tokens // 128) * 128 < long_tokens
    assert budgets["max_seq_len"] % 512 == 0 and budgets["pairs_measured"] == 40
    paths.sft_train.write_text("")
    assert learning_signal.measured_budgets(cfg, tmp_path) == budgets  # read back, not measured again


def test_quick_run_goes_through_every_phase(project_root, kernelbench_jsonl, tmp_path):
    """The benchmark's own code end to end on a CPU (tiny model, 2 + 2 tasks): split, data stage,
    base, SFT, one RL round, report; results resume-safe in the work directory."""
    import subprocess
    import sys

    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "bench/learning_signal.py", "--quick", "--kernelbench", str(kernelbench_jsonl),
                           "--work", str(tmp_path / "work"), "--out", str(out)],
                          cwd=project_root, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    results = json.loads((out / "learning_signal.json").read_text())
    assert results["model_order"] == ["base", "sft", "rl_round_1"]
    assert all(results["models"][name]["correct_rate"]["tasks"] == 2 for name in results["model_order"])
    assert "stops at" in (out / "learning_signal.md").read_text() and (out / "learning_signal.png").is_file()
    assert set(json.loads((tmp_path / "work" / "phase_seconds.json").read_text())) == {"data", "base", "sft", "sft_eval", "rl", "rl_eval"}
    # RL trains on the split's KernelBench problems and the data stage's share of the pairs' problems.
    assert results["rl_tasks"]["kernelbench"] == 2 and results["rl_tasks"]["synthesized"] >= 1
    rl_rows = [json.loads(line) for line in (tmp_path / "work" / "run").rglob("rl_tasks.jsonl").__next__().read_text().splitlines()]
    assert len(rl_rows) == sum(results["rl_tasks"].values()) == len({row["task_id"] for row in rl_rows})
    # Every answer is counted once in the failure breakdown; the RL round's own numbers are kept.
    for name in results["model_order"]:
        assert sum(results["models"][name]["failures"].values()) == 2 * 2, results["models"][name]["failures"]
    assert [r["round"] for r in results["rl_rounds"]] == [1] and results["rl_rounds"][0]["candidates"] >= 1
    assert "| RL round (on the RL tasks) |" in (out / "learning_signal.md").read_text()
    # The config's objective ran, and the held-out rates are also given per level.
    assert results["rl_rounds"][0]["algorithm"] == "grpo"
    assert set(results["models"]["sft"]["correct_rate_by_level"]) == {"1", "2"}
    assert "correct, level 1" in (out / "learning_signal.md").read_text()
    # Each model's answers and verdicts are kept with the results.
    for name in results["model_order"]:
        assert (out / "answers" / f"generations_{name}.jsonl.gz").is_file()
        assert (out / "answers" / f"eval_{name}.json.gz").is_file()
    decontamination = results["decontamination"]
    assert set(decontamination["split"]["counts"]) >= {"rl_near_heldout", "rl_same_computation_as_heldout"}
    assert "same_computation_as_eval_problem" in decontamination["sft_pairs"]["counts"]
    assert "| decontamination |" in (out / "learning_signal.md").read_text()

    # A later phase keeps the run's data as built, even when the verifier has changed since: its
    # pairs are not judged again (minutes of GPU) unless the data phase is asked for.
    report_file = next((tmp_path / "work" / "run").rglob("prepare_report.json"))
    report = json.loads(report_file.read_text())
    report["fingerprint"]["verifier"] = "0" * 64
    report_file.write_text(json.dumps(report))
    again = subprocess.run([sys.executable, "bench/learning_signal.py", "--quick", "--kernelbench", str(kernelbench_jsonl),
                            "--work", str(tmp_path / "work"), "--out", str(out), "--phases", "sft_eval,report"],
                           cwd=project_root, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert "the run's data as built (verifier 000000000000, today's " in again.stdout
    assert json.loads(report_file.read_text())["fingerprint"]["verifier"] == "0" * 64


def test_failure_breakdown_tells_raising_from_wrong_answers(learning_signal):
    """The stage alone hides why an answer fails: a name it never binds, raising in the wrapper and
    computing the wrong thing need different fixes, so the report counts them apart."""
    samples = [
        {"stage": "none", "error": "extract: no code block defines ModelNew"},
        {"stage": "extract", "error": "static: syntax error: '(' was never closed"},
        {"stage": "extract", "error": "static: line 40: name 's50' is neither defined in the module nor an allowed "
                                      "builtin; line 41: R0_BLOCK used inside Triton kernel k"},
        {"stage": "extract", "error": "static: no kernel[grid](...) launch reachable from ModelNew.forward"},
        {"stage": "static", "error": "compile: ..."},
        {"stage": "compile", "error": "tiny: exception: TypeError: call() takes 1 positional argument"},
        {"stage": "compile", "error": "tiny: mismatch: output: shape (2, 256, 512) != expected (2, 256, 256)"},
        {"stage": "compile", "error": "tiny: mismatch: output: 12 of 12288 values outside atol=0.0001"},
        {"stage": "tiny", "error": "full: mismatch: ..."},
        {"stage": "full", "correct": True},
    ]
    counts = learning_signal.failure_breakdown({"tasks": [{"samples": samples}]})
    assert list(counts) == list(learning_signal.FAILURE_KINDS)
    assert all(count == 1 for count in counts.values()), counts
