"""The learning-signal report: per-level correct rates and what each RL round trained on."""
from __future__ import annotations

import pytest


def eval_report(correct_by_task: dict[str, tuple[int, int]]) -> dict:
    """An evaluation report of the fields the report reads: task -> (correct, samples)."""
    tasks = []
    for task_id, (correct, samples) in correct_by_task.items():
        tasks.append({"task_id": task_id, "level": int(task_id[1]), "name": task_id[3:],
                      "samples": [{"correct": i < correct, "compiled": True, "stage": "full" if i < correct else "compile"}
                                  for i in range(samples)]})
    return {"tasks": tasks}


def test_level_rates_and_paired_differences_are_per_level(learning_signal):
    sft = eval_report({"L1_a": (4, 8), "L1_b": (0, 8), "L2_c": (0, 8), "L2_d": (0, 8)})
    rl = eval_report({"L1_a": (8, 8), "L1_b": (4, 8), "L2_c": (0, 8), "L2_d": (0, 8)})
    grouped = learning_signal.scores_by_level(rl, "correct_rate")
    assert grouped == {1: {"L1_a": 100.0, "L1_b": 50.0}, 2: {"L2_c": 0.0, "L2_d": 0.0}}

    rows = learning_signal.level_differences({"sft": sft, "rl": rl}, [("sft", "rl")], resamples=200)
    by_level = {row["level"]: row for row in rows}
    # Level 1 rose by 50 points on both tasks; level 2 did not move: the overall +25 hides that.
    assert by_level[1]["mean"] == pytest.approx(50.0) and by_level[1]["tasks"] == 2 and by_level[1]["significant"]
    assert by_level[2]["mean"] == 0.0 and not by_level[2]["significant"]
    assert {row["label"] for row in rows} == {"correct %, level 1", "correct %, level 2"}


def test_a_task_one_model_lacks_is_left_out_of_the_pairing(learning_signal):
    sft = eval_report({"L1_a": (0, 8), "L1_b": (0, 8)})
    rl = eval_report({"L1_a": (8, 8)})
    (row,) = learning_signal.level_differences({"sft": sft, "rl": rl}, [("sft", "rl")], resamples=200)
    assert row["tasks"] == 1 and row["mean"] == pytest.approx(100.0)


def test_round_rows_say_what_each_objective_trained_on(learning_signal):
    best_of_n = {"kept": 19, "kept_tasks": 10}
    grpo = {"kept": None, "trained_samples": 112, "groups": 32, "zero_spread_groups": 18}
    assert learning_signal.trained_on(best_of_n) == "19 kept (10 tasks)"
    assert learning_signal.trained_on(grpo) == "112 samples, 14 of 32 groups with a reward spread"
    assert learning_signal.trained_on({}) == "n/a"
