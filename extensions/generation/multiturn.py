"""Multi-turn refinement: every live trajectory decodes together, turn by turn, each turn seeing its
previous kernels and the verifier's feedback on them.

A trajectory starts from a task's prompt (``PromptBuilder``). Turn t sends the chat so far, the
model answers, the verifier judges the answer, and the feedback (``extensions.prompting.feedback``) becomes
the next user turn. A trajectory stops at a correct kernel or after ``max_turns`` turns. When a
prompt would exceed ``max_prompt_tokens``, the oldest refinement turns are dropped first (the task
and the latest answer with its feedback always stay) and the drop is counted.

The driver knows neither the model nor the verifier: ``generate`` and ``verify`` are callables, so
evaluation and RL rollouts share it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from ..prompting.feedback import build_feedback
from ..prompting.templates import refinement_turns
from ..verify.api import VerifyRequest
from ..verify.result import VerifyResult

# generate(prompts, turn) -> one response per prompt; turn counts from 1.
Generate = Callable[[list[list[dict[str, str]]], int], list[str]]
# verify(requests) -> one verdict per request, in order (``extensions.verify.verify_batch``'s shape).
Verify = Callable[[list[VerifyRequest]], list[VerifyResult]]
CountTokens = Callable[[list[dict[str, str]]], int]


@dataclass
class Turn:
    response: str
    result: VerifyResult
    feedback: str
    prompt_tokens: Optional[int] = None
    turns_dropped: int = 0  # earlier refinement turns left out of this turn's prompt

    def to_dict(self) -> dict[str, Any]:
        return {"response": self.response, "result": self.result.to_dict(), "feedback": self.feedback,
                "prompt_tokens": self.prompt_tokens, "turns_dropped": self.turns_dropped}


@dataclass
class Trajectory:
    key: str  # unique label, e.g. "task#sample"
    task_code: str
    prompt: list[dict[str, str]]  # the first turn's messages
    turns: list[Turn] = field(default_factory=list)

    @property
    def solved(self) -> bool:
        return bool(self.turns) and self.turns[-1].result.correct

    def result_by_turn(self, turn: int) -> Optional[VerifyResult]:
        """The verdict standing after ``turn`` turns: the last answer given by then."""
        done = self.turns[:turn]
        return done[-1].result if done else None

    def messages(self, keep_last: Optional[int] = None) -> list[dict[str, str]]:
        """The next turn's prompt, with only the last ``keep_last`` refinement rounds (all: None)."""
        shown = self.turns if keep_last is None else self.turns[len(self.turns) - keep_last:] if keep_last else []
        messages = list(self.prompt)
        for turn in shown:
            messages += refinement_turns(turn.response, turn.feedback)
        return messages


def fit_prompt(trajectory: Trajectory, max_prompt_tokens: Optional[int],
               count_tokens: Optional[CountTokens]) -> tuple[list[dict[str, str]], Optional[int], int]:
    """(messages, their token count, refinement rounds dropped) under ``max_prompt_tokens``.

    Older rounds go first; the latest round always stays (without it the model would not see the
    feedback it must act on), even when the prompt is still over budget then.
    """
    rounds = len(trajectory.turns)
    if count_tokens is None:
        return trajectory.messages(), None, 0
    keep = rounds
    while True:
        messages = trajectory.messages(keep)
        tokens = count_tokens(messages)
        if max_prompt_tokens is None or tokens <= max_prompt_tokens or keep <= min(1, rounds):
            return messages, tokens, rounds - keep
        keep -= 1


@dataclass
class TurnStats:
    turn: int
    live: int  # trajectories that answered in this turn
    solved: int  # of them, correct in this turn
    prompts_over_budget: int = 0  # prompts still above max_prompt_tokens after dropping
    rounds_dropped: int = 0

    def to_dict(self) -> dict[str, int]:
        return dict(vars(self))


def live_trajectories(trajectories: Sequence[Trajectory], turn: int) -> list[Trajectory]:
    """The trajectories that answer in ``turn``: unsolved, with ``turn - 1`` turns done. ``run_turns``
    hands ``generate`` their prompts in this order, so a caller can tell which prompt is whose."""
    return [t for t in trajectories if len(t.turns) == turn - 1 and not t.solved]


def run_turns(trajectories: Sequence[Trajectory], generate: Generate, verify: Verify, max_turns: int, *,
              max_prompt_tokens: Optional[int] = None, count_tokens: Optional[CountTokens] = None,
              on_turn: Optional[Callable[[int, list[Trajectory]], None]] = None) -> list[TurnStats]:
    """Run up to ``max_turns`` turns over ``trajectories``.

    Turns a trajectory already holds (a resumed run) are kept, not asked again; it goes on from its
    next turn. ``stats`` covers the turns run by this call.
    """
    if max_turns < 1:
        raise ValueError(f"max_turns must be >= 1, got {max_turns}")
    stats: list[TurnStats] = []
    for turn in range(1, max_turns + 1):
        live = live_trajectories(trajectories, turn)
        if not live:
            continue  # every trajectory is solved or already past this turn (a resumed run)
        fitted = [fit_prompt(t, max_prompt_tokens, count_tokens) for t in live]
        responses = generate([messages for messages, _, _ in fitted], turn)
        if len(responses) != len(live):
            raise RuntimeError(f"generate returned {len(responses)} responses for {len(live)} prompts")
        results = verify([VerifyRequest(t.task_code, response, f"{t.key}@turn{turn}")
                           for t, response in zip(live, responses)])
        if len(results) != len(live):
            raise RuntimeError(f"verify returned {len(results)} verdicts for {len(live)} requests")
        turn_stats = TurnStats(turn, len(live), 0)
        for trajectory, (_, tokens, dropped), response, result in zip(live, fitted, responses, results):
            trajectory.turns.append(Turn(response, result, build_feedback(result).text(), tokens, dropped))
            turn_stats.solved += bool(result.correct)
            turn_stats.rounds_dropped += dropped
            turn_stats.prompts_over_budget += bool(max_prompt_tokens is not None and tokens is not None
                                                   and tokens > max_prompt_tokens)
        stats.append(turn_stats)
        if on_turn is not None:
            on_turn(turn, live)
    return stats


def discounted_returns(scores: Sequence[float], gamma: float) -> list[float]:
    """R_t = s_t + gamma * s_{t+1} + gamma^2 * s_{t+2} + ... for each turn of one trajectory."""
    returns: list[float] = []
    running = 0.0
    for score in reversed(scores):
        running = score + gamma * running
        returns.append(running)
    return returns[::-1]
