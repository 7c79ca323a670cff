"""The learning-signal benchmark's task split: fixed, disjoint, and decontaminated."""
from __future__ import annotations

import importlib.util
import json

import pytest


@pytest.fixture(scope="module")
def learning_signal(project_root):
    spec = importlib.util.spec_from_file_location("learning_signal", project_root / "bench" / "learning_signal.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
