"""A verifier session judges candidates as they arrive (``extensions.verify.VerifierSession``).

What a user relies on (the RL round verifies one sampled batch while the next samples; the
synthesizer verifies each pair as soon as inductor has captured it): a verdict from a session is
the verdict ``verify_batch`` gives; candidates submitted later reuse the session's processes and
its verdicts for identical code; a problem's reference data is dropped once its candidates are
judged; and a session stopped mid-way cancels what waits, leaves no process or file behind, and
answers every future (nobody waits forever).
"""
from __future__ import annotations

import os
import textwrap
import time

import pytest

from extensions.config import VerifierConfig
from extensions.verify import VerifierError, VerifierSession, VerifyRequest, verify_batch

from project_paths import FIXTURES_DIR
from sandbox_support import adopting_orphans, descendants, processes_with, wait_no_descendants

PROBLEM = (FIXTURES_DIR / "eval" / "tasks" / "relu.py").read_text()

RELU = textwrap.dedent("""
    import torch
    import torch.nn as nn
    import triton
    import triton.language as tl

    @triton.jit
    def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask)
        tl.store(y_ptr + offs, tl.where(x > 0, x, 0.0), mask=mask)

    class ModelNew(nn.Module):
        def __init__(self):
            super().__init__()

        def forward(self, x):
            x = x.contiguous()
            y = torch.empty_like(x)
            relu_kernel[(triton.cdiv(x.numel(), 128),)](x, y, x.numel(), BLOCK=128)
            return y
""")

WRONG = RELU.replace("tl.where(x > 0, x, 0.0)", "tl.abs(x)")
STATIC_CHEAT = RELU.replace("import torch\n", "import torch\nimport subprocess\n", 1)
OTHER_PROBLEM = PROBLEM.replace("dim = 64", "dim = 24")


def _config(**overrides) -> VerifierConfig:
    settings = {"device": "cpu", "timeout_s": 60, "multi_input_num_tests": 1, "workers": 2,
                "isolation": "process", **overrides}
    return VerifierConfig(**settings)


def test_a_session_gives_the_batch_verdicts_and_reuses_them_across_submissions():
    config = _config()
    batch = verify_batch([VerifyRequest(PROBLEM, RELU, "a"), VerifyRequest(PROBLEM, WRONG, "b")], config,
                         device="cpu", progress=False)
    with VerifierSession(config, device="cpu") as session:
        first = session.submit_many([VerifyRequest(PROBLEM, RELU, "a"), VerifyRequest(PROBLEM, STATIC_CHEAT, "c")])
        assert first[1].done() and not first[1].result().correct  # screened at submission, no worker
        later = [session.submit(VerifyRequest(PROBLEM, WRONG, "b")), session.submit(VerifyRequest(PROBLEM, RELU, "d"))]
        results = [f.result(timeout=300) for f in first + later]
    assert [r.correct for r in batch] == [True, False]
    assert [(r.candidate, r.correct) for r in results] == [("a", True), ("c", False), ("b", False), ("d", True)]
    assert results[2].stage == batch[1].stage
    assert results[3].cached and not results[0].cached  # identical code for the same problem: judged once
    assert results[0].reward == batch[0].reward and results[3].reward == batch[0].reward


def test_default_labels_count_the_sessions_requests():
    with VerifierSession(_config(), device="cpu") as session:
        first = session.submit(VerifyRequest(PROBLEM, "no code here"))
        second = session.submit(VerifyRequest(PROBLEM, "still none"))
    assert [first.result().candidate, second.result().candidate] == ["candidate_0", "candidate_1"]


def test_reference_data_is_dropped_after_a_problems_last_candidate():
    with VerifierSession(_config(), device="cpu") as session:
        future = session.submit(VerifyRequest(PROBLEM, RELU))
        assert future.result(timeout=300).correct
        deadline = time.monotonic() + 10
        while session._problems and time.monotonic() < deadline:  # dropped right after the verdict
            time.sleep(0.05)
        assert not session._problems
        assert not [d for d in os.listdir(session.work_root) if d.startswith("problem-")]
        # A later candidate of the same problem gets a fresh build, and its own verdict.
        again = session.submit(VerifyRequest(PROBLEM, WRONG)).result(timeout=300)
    assert not again.correct and again.stage != "none"


def test_a_batch_of_many_problems_builds_references_only_a_few_ahead_of_the_workers():
    # A data stage verifies thousands of pairs, each a problem of its own: references built for all
    # of them at once, each holding its inputs and outputs in memory, filled a GPU host's memory.
    problems = [PROBLEM.replace("dim = 64", f"dim = {40 + i}") for i in range(12)]
    held = []
    with pytest.raises(KeyboardInterrupt):  # stopped after a few verdicts: the rest is not needed
        with VerifierSession(_config(workers=1), device="cpu") as session:
            futures = session.submit_many([VerifyRequest(p, RELU, str(i)) for i, p in enumerate(problems)])
            for future in futures[:3]:
                assert future.result(timeout=300).correct
                held.append(session.references_held)
                held.append(len([d for d in os.listdir(session.work_root) if d.startswith("problem-")]))
            raise KeyboardInterrupt
    read_ahead = 2  # twice the worker slots
    assert max(held) <= read_ahead + 1, held  # + the one a worker slot is judging


def test_a_slow_reference_holds_up_its_own_candidates_only():
    # A floor's reference takes tens of seconds (its ambiguity runs); a worker slot that waited
    # for it idled while candidates of ready problems queued behind it.
    slow_problem = PROBLEM.replace("super().__init__()", "super().__init__()\n        import time; time.sleep(40)")
    with pytest.raises(KeyboardInterrupt):  # the slow one is not waited for
        # More reference processes than slots, as a GPU host runs them.
        with VerifierSession(_config(workers=1, reference_processes=3), device="cpu") as session:
            slow, fast = session.submit_many([VerifyRequest(slow_problem, RELU, "slow"),
                                              VerifyRequest(OTHER_PROBLEM, RELU, "fast")])
            assert fast.result(timeout=35).correct  # judged on the one slot meanwhile
            assert not slow.done()
            raise KeyboardInterrupt


def test_reference_processes_bounds_the_reference_processes_at_once():
    # On a GPU each reference process is one more CUDA context: beside seven others a reference
    # that took a second alone took 39 s (bench/reference_profile.py). The setting is a bound.
    marker = "extensions.verify.reference.reference_worker"

    def references() -> set[str]:  # this session's: another run on the machine has its own
        return set(processes_with(marker)) & {str(pid) for pid in descendants()}

    slow = [PROBLEM.replace("dim = 64", f"dim = {40 + i}").replace(
        "super().__init__()", "super().__init__()\n        import time; time.sleep(1)") for i in range(3)]
    seen = 0
    with VerifierSession(_config(workers=3, reference_processes=2), device="cpu") as session:
        futures = session.submit_many([VerifyRequest(p, RELU, str(i)) for i, p in enumerate(slow)])
        while not all(f.done() for f in futures):
            seen = max(seen, len(references()))
            time.sleep(0.05)
        assert all(f.result().correct for f in futures)
    assert seen == 2, seen  # three problems ready at once, two processes building them


def test_a_stopped_session_cancels_what_waits_and_leaves_nothing_behind():
    with adopting_orphans():  # a worker whose fork server died is still counted
        _stop_a_session_mid_way()


def _stop_a_session_mid_way():
    before = set(descendants())
    problems = [PROBLEM.replace("dim = 64", f"dim = {40 + i}") for i in range(40)]
    session = VerifierSession(_config(workers=1), device="cpu")
    futures = session.submit_many([VerifyRequest(p, RELU, str(i)) for i, p in enumerate(problems)])
    root = session.work_root
    deadline = time.monotonic() + 60
    while not (session._launcher is not None and session._launcher.done() and any(f.running() for f in futures)):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(0.3)  # a worker and a reference are at work now
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        with session:
            raise KeyboardInterrupt  # Ctrl-C while the first candidates are being judged
    assert time.monotonic() - started < 30
    assert all(f.done() for f in futures), [f._state for f in futures]  # nobody waits forever
    assert any(f.cancelled() for f in futures), [f._state for f in futures]
    # None is a verdict made while its processes were killed (a cache would keep it as a failure).
    assert all(f.cancelled() or isinstance(f.exception(), VerifierError) for f in futures)
    assert not os.path.exists(root)
    assert set(wait_no_descendants()) <= before  # no worker, fork server or reference left
    with pytest.raises(VerifierError):
        session.submit(VerifyRequest(OTHER_PROBLEM, RELU))
