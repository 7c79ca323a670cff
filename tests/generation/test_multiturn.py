"""The multi-turn driver with the real verifier: trajectories decode together, see their previous
kernel and its feedback, stop when correct, and keep prompts under budget by dropping old rounds."""
from __future__ import annotations

import pytest

from extensions.config import VerifierConfig
from extensions.generation.multiturn import Trajectory, discounted_returns, fit_prompt, run_turns
from extensions.prompting.templates import build_messages
from extensions.verify import verify_batch
from extensions.verify.result import VerifyResult
from sandbox_support import PROBLEM as AFFINE_PROBLEM, affine_candidate

CORRECT = affine_candidate()
WRONG = affine_candidate(store="x * alpha")


def _verify(config):
    def verify(requests):
        return verify_batch(requests, config, progress=False)
    return verify


def test_trajectories_refine_on_feedback_and_stop_when_correct():
    config = VerifierConfig(device="cpu", timeout_s=90, workers=2, multi_input_num_tests=1)
    seen: list[tuple[int, list[list[dict]]]] = []

    def generate(prompts, turn):
        seen.append((turn, prompts))
        # The scripted model fixes its kernel once it is told the values are wrong.
        return [CORRECT if "numerical mismatch" in p[-1]["content"] or "solved" in p[-1]["content"]
                else WRONG for p in prompts]

    trajectories = [Trajectory("fixes#0", AFFINE_PROBLEM, build_messages(AFFINE_PROBLEM)),
                    Trajectory("first#0", AFFINE_PROBLEM, build_messages(AFFINE_PROBLEM + "\n# solved\n"))]
    stats = run_turns(trajectories, generate, _verify(config), max_turns=3)

    assert [(s.turn, s.live, s.solved) for s in stats] == [(1, 2, 1), (2, 1, 1)]
    assert [t.solved for t in trajectories] == [True, True]
    assert [len(t.turns) for t in trajectories] == [2, 1]  # no turn after a correct kernel
    turn_two_prompt = seen[1][1][0]
    first_prompt = build_messages(AFFINE_PROBLEM)
    assert [m["role"] for m in turn_two_prompt] == [m["role"] for m in first_prompt] + ["assistant", "user"]
    assert turn_two_prompt[len(first_prompt)]["content"] == WRONG  # its own previous kernel
    feedback = trajectories[0].turns[0].feedback
    assert feedback in turn_two_prompt[len(first_prompt) + 1]["content"] and "values outside atol" in feedback
    assert trajectories[0].result_by_turn(1).correct is False and trajectories[0].result_by_turn(2).correct


def test_prompts_drop_oldest_rounds_first_and_count_it():
    trajectory = Trajectory("t#0", "code", [{"role": "user", "content": "task"}])
    verdict = VerifyResult("c", stage="none", error="extract: no code defines ModelNew")
    from extensions.generation.multiturn import Turn

    for i in range(3):
        trajectory.turns.append(Turn(f"answer-{i}-" + "x" * 100, verdict, f"feedback-{i}"))

    def count(messages):
        return sum(len(m["content"]) for m in messages)

    full, tokens, dropped = fit_prompt(trajectory, None, count)
    assert dropped == 0 and tokens == count(full) and len(full) == 7
    budget = count(trajectory.messages(2))
    messages, tokens, dropped = fit_prompt(trajectory, budget, count)
    assert dropped == 1 and tokens <= budget
    assert "answer-0" not in str(messages) and "answer-1" in str(messages) and "answer-2" in str(messages)
    # Even a tiny budget keeps the task and the latest round: the model must see what to fix.
    messages, tokens, dropped = fit_prompt(trajectory, 1, count)
    assert dropped == 2 and messages[0]["content"] == "task" and "feedback-2" in messages[-1]["content"]


def test_driver_rejects_bad_turn_counts_and_mismatched_callables():
    trajectory = Trajectory("t#0", AFFINE_PROBLEM, build_messages(AFFINE_PROBLEM))
    with pytest.raises(ValueError, match="max_turns"):
        run_turns([trajectory], lambda p, t: [], lambda r: [], max_turns=0)
    with pytest.raises(RuntimeError, match="generate returned 0 responses for 1 prompts"):
        run_turns([trajectory], lambda p, t: [], lambda r: [], max_turns=1)


def test_discounted_returns():
    assert discounted_returns([0.3, 0.3, 1.0], 0.4) == pytest.approx([0.3 + 0.4 * 0.3 + 0.16, 0.3 + 0.4, 1.0])
    assert discounted_returns([], 0.4) == []


def test_driver_goes_on_from_the_turns_trajectories_already_hold():
    """A resumed run: turns already held are not asked again; each trajectory continues from its next."""
    from extensions.generation.multiturn import Turn

    wrong = VerifyResult("w", stage="compile", error="runtime: boom")
    ahead = Trajectory("ahead#0", "code", [{"role": "user", "content": "task"}], [Turn("first", wrong, "fix it")])
    fresh = Trajectory("fresh#0", "code", [{"role": "user", "content": "task"}])
    asked: list[tuple[int, int]] = []

    def generate(prompts, turn):
        asked.append((turn, len(prompts)))
        return [f"answer {turn}"] * len(prompts)

    stats = run_turns([ahead, fresh], generate, lambda requests: [wrong] * len(requests), max_turns=2)
    assert asked == [(1, 1), (2, 2)]  # turn 1 only for the fresh one
    assert [(s.turn, s.live) for s in stats] == [(1, 1), (2, 2)]
    assert [t.response for t in ahead.turns] == ["first", "answer 2"]
    assert [t.response for t in fresh.turns] == ["answer 1", "answer 2"]
