"""The bundled starter set: enough pairs and tasks, well formed, and every Triton solution correct."""
from __future__ import annotations

import pytest
import torch

from extensions.data.bundled import bundled_eval_tasks, bundled_pairs
from extensions.data.dedup import code_shingles, jaccard
from extensions.data.kernelbook import normalise_row


def _cases():
    """(label, task code, solution code) for every pair (normalised) and every eval task."""
    cases = []
    for row in bundled_pairs():
        pair = normalise_row(row)
        cases.append((f"pair:{row['module_name']}", pair.task_code, pair.solution_code))
    for task in bundled_eval_tasks():
        cases.append((f"eval:{task.name}", task.code, task.solution))
    return cases


def test_set_size_and_form():
    pairs = bundled_pairs()
    tasks = bundled_eval_tasks()
    assert len(pairs) >= 30 and len(tasks) >= 10
    assert len({row["uuid"] for row in pairs}) == len(pairs)
    for row in pairs:
        assert row["repo_name"] == "bundled"
        assert f"class {row['entry_point']}New(" in row["triton_code"]
        assert "get_init_inputs" in row["python_code"] and "@triton.jit" in row["triton_code"]
    assert {task.level for task in tasks} == {1, 2, 3}


def test_eval_tasks_are_distinct_from_training_pairs():
    pair_shingles = {row["module_name"]: code_shingles(normalise_row(row).task_code) for row in bundled_pairs()}
    for task in bundled_eval_tasks():
        task_shingles = code_shingles(task.code)
        closest = max(pair_shingles, key=lambda name: jaccard(task_shingles, pair_shingles[name]))
        assert jaccard(task_shingles, pair_shingles[closest]) < 0.85, (task.name, closest)


def _run_in_interpreter(task_code: str, solution_code: str, seed: int):
    task_ns, solution_ns = {}, {}
    exec(compile(task_code, "task", "exec"), task_ns)
    exec(compile(solution_code, "solution", "exec"), solution_ns)
    torch.manual_seed(seed)
    inputs = task_ns["get_inputs"]()
    init_inputs = task_ns["get_init_inputs"]()
    torch.manual_seed(1234)
    reference = task_ns["Model"](*init_inputs)
    torch.manual_seed(1234)
    candidate = solution_ns["ModelNew"](*init_inputs)
    with torch.no_grad():
        return reference(*inputs), candidate(*inputs)


@pytest.mark.parametrize("label,task_code,solution_code", _cases(), ids=lambda v: v if isinstance(v, str) and ":" in v else "")
def test_solution_matches_pytorch_in_interpreter(label, task_code, solution_code, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    # As in the verifier's worker: Triton 3.6 with NumPy 2.4+ cannot read a scalar argument as an
    # int without it (restored after the test).
    from triton.runtime import interpreter

    from extensions.verify.sandboxed.interpreter_compat import index_with_one_element_arrays

    monkeypatch.setattr(interpreter, "_patch_lang_tensor", interpreter._patch_lang_tensor)
    index_with_one_element_arrays()
    for seed in (0, 1):
        expected, actual = _run_in_interpreter(task_code, solution_code, seed)
        assert actual.shape == expected.shape and actual.dtype == expected.dtype, label
        torch.testing.assert_close(actual, expected, atol=1e-4, rtol=1e-4, msg=label)


def test_every_solution_passes_the_verifier():
    from extensions.config import load_config

    verify = pytest.importorskip("extensions.verify", reason="the verifier package is not present")
    VerifyRequest, summarize_results, verify_batch = verify.VerifyRequest, verify.summarize_results, verify.verify_batch

    cfg = load_config(None, ["verifier.device=cpu"])
    cases = _cases()
    requests = [VerifyRequest(problem_code=task, candidate_text=solution, label=label)
                for label, task, solution in cases]
    results = verify_batch(requests, cfg.verifier, device="cpu", progress=False)
    failures = [(r.candidate, r.stage, r.error, r.flags) for r in results if not r.correct]
    assert not failures, f"{len(failures)} bundled solutions rejected: {failures}"
    assert summarize_results(results)["correct"] == len(cases)
