"""Multi-turn RL rollouts (``rl.max_turns`` > 1): each sample is a trajectory that refines its kernel
on the verifier's feedback, through the shared turn driver (``extensions.generation.multiturn.run_turns``).

Turn by turn, the live trajectories of this rank (unsolved, not yet at ``max_turns``) are sampled
together, ``generation_batch_size`` sequences per decode call, longest prompts first, and judged
``verify_chunk_size`` at a time. Every sampled turn (its prompt, token ids and log-probs) and every
verdict goes to the round's candidate log as soon as its batch is done. A resumed round rebuilds
each trajectory from the log: logged turns are neither sampled nor judged again, only what is
missing is (with fresh tokens where a batch was cut short).

Each turn becomes one ``Candidate`` (``turn``, ``prompt``), so the objectives train on every turn's
answer after the prompt it was sampled from.
"""
from __future__ import annotations

import dataclasses
import json
import time
from typing import Sequence

from ..generation.multiturn import Trajectory, Turn, discounted_returns, fit_prompt, live_trajectories, run_turns
from ..generation.sampling import SamplingParams, render_prompt_ids
from ..prompting.feedback import build_feedback
from ..verify import VerifyRequest
from ..verify.result import VerifyResult
from . import rollouts
from .candidates import CandidateLog, LogContents, turn_sample_record, verdict_record
from .rollouts import Candidate, RoundContext, check_signal, result_dict

TurnKey = tuple[str, int, int]  # (task_id, sample_index, turn)
# Signal checks per turn (after sampling, after judging): the same count on every rank, so the
# collective that agrees on a stop pairs up even where one rank's trajectories finish early.
CHECKS_PER_TURN = 2


class RoundTrajectories:
    """One rank's trajectories of a round, with the ``generate`` and ``verify`` the driver calls."""

    def __init__(self, ctx: RoundContext, model, round_index: int, tasks: Sequence[dict], log: CandidateLog,
                 contents: LogContents):
        self.ctx, self.model, self.round_index, self.log = ctx, model, round_index, log
        self.rl = ctx.cfg.rl
        self.logged_samples = contents.turn_samples
        self.logged_verdicts = contents.turn_verdicts
        self.owner: dict[str, tuple[str, int]] = {}  # trajectory key -> (task_id, sample_index)
        self.trajectories: list[Trajectory] = []
        for task in tasks:
            first_prompt = ctx.messages(task)
            for sample in range(self.rl.samples_per_task):
                trajectory = Trajectory(f"{task['task_id']}#{sample}", task["code"], first_prompt)
                self.owner[trajectory.key] = (task["task_id"], sample)
                self.trajectories.append(trajectory)
        self.by_owner = {self.owner[t.key]: t for t in self.trajectories}
        self.sampled: dict[TurnKey, dict] = {}  # this round's turns: text, token ids, log-probs, prompt
        self.verdicts: dict[TurnKey, dict] = {}
        self.current: list[TurnKey] = []  # keys of the turn being run, in the driver's order
        # This turn's prompts as token ids, by content: fitting a prompt to the budget, ordering the
        # prompts by length and sampling all read the one rendering (and samples of a task share it).
        self.rendered: dict[str, list[int]] = {}
        self.stats = {"sampling_s": 0.0, "verifying_s": 0.0, "sampled_tokens": 0}
        self.checks = 0

    # -- resuming ------------------------------------------------------------------------------------------
    def restore_logged_turns(self) -> int:
        """Give each trajectory its logged, judged turns (in order, up to the first gap); returns how many."""
        restored = 0
        for trajectory in self.trajectories:
            task_id, sample = self.owner[trajectory.key]
            for turn in range(1, self.rl.max_turns + 1):
                key = (task_id, sample, turn)
                record, verdict = self.logged_samples.get(key), self.logged_verdicts.get(key)
                if record is None or verdict is None or not _has_sequence(record):
                    break
                if record.get("prompt") != self.fitted_prompt(trajectory):
                    break  # logged from another dialogue: this turn and the rest are redone
                result = VerifyResult.from_dict(verdict)
                trajectory.turns.append(Turn(record["text"], result, build_feedback(result).text(),
                                             record.get("prompt_tokens"), int(record.get("turns_dropped", 0))))
                self.sampled[key], self.verdicts[key] = record, verdict
                restored += 1
                if result.correct:
                    break
        return restored

    def fitted_prompt(self, trajectory: Trajectory) -> list[dict]:
        """The prompt the driver sends for ``trajectory``'s next turn."""
        return fit_prompt(trajectory, self.ctx.cfg.prompt.max_prompt_tokens, self.count_tokens)[0]

    # -- the driver's callables ----------------------------------------------------------------------------
    def count_tokens(self, messages: list[dict]) -> int:
        return len(self.prompt_ids(messages))

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        """``messages`` rendered through the chat template, once per turn."""
        key = json.dumps(messages, sort_keys=True)
        if key not in self.rendered:
            self.rendered[key] = render_prompt_ids(self.ctx.tokenizer, [messages])[0]
        return self.rendered[key]

    def generate(self, prompts: list[list[dict]], turn: int) -> list[str]:
        live = live_trajectories(self.trajectories, turn)
        self.current = [(*self.owner[t.key], turn) for t in live]
        missing = []
        for key, messages in zip(self.current, prompts):
            record = self.logged_samples.get(key)
            if record is not None and _has_sequence(record) and record.get("prompt") == messages:
                self.sampled[key] = record  # sampled before the interruption, from this very prompt
            else:
                missing.append((key, messages))
        started = time.perf_counter()
        self._sample(missing, turn)
        self.stats["sampling_s"] += time.perf_counter() - started
        self.rendered.clear()  # the next turn's prompts are new
        self._check()
        return [self.sampled[key]["text"] for key in self.current]

    def _sample(self, missing: list[tuple[TurnKey, list[dict]]], turn: int) -> None:
        if not missing:
            return
        rl, ctx = self.rl, self.ctx
        prompt_ids = [self.prompt_ids(messages) for _, messages in missing]
        lengths = [len(ids) for ids in prompt_ids]
        order = sorted(range(len(missing)), key=lambda j: (-lengths[j], missing[j][0]))
        batch = max(1, rl.generation_batch_size)
        for chunk_index, start in enumerate(range(0, len(order), batch)):
            chunk = order[start:start + batch]
            params = SamplingParams(
                max_new_tokens=rl.max_new_tokens, temperature=rl.temperature, top_p=rl.top_p,
                seed=ctx.cfg.run.seed + 100_003 * self.round_index + 1009 * ctx.dist.rank + 50_021 * turn + chunk_index,
                batch_size=batch, cuda_graphs=rl.cuda_graphs, compile_step=rl.compile_decode,
            )
            stopped = False
            try:
                _, sampled = rollouts.sample_rollouts(self.model, ctx.tokenizer, [missing[j][1] for j in chunk], 1,
                                                      params, progress=ctx.progress,
                                                      prompt_ids=[prompt_ids[j] for j in chunk],
                                                      should_stop=ctx.stop_requested)
            except rollouts.SamplingStopped as stop:
                # Keep what finished; the signal check after sampling stops the round.
                sampled, stopped = stop.partial, True
            records = []
            for j, (rollout,) in zip(chunk, sampled):
                if rollout is None:
                    continue
                text, sequence = rollout
                key, messages = missing[j]
                record = turn_sample_record(*key, text, sequence.token_ids, [float(x) for x in sequence.logprobs],
                                            messages, lengths[j], _rounds_left_out(self.by_owner[key[:2]], messages))
                self.sampled[key] = record
                self.verdicts.pop(key, None)
                self.stats["sampled_tokens"] += len(sequence.token_ids)
                records.append(record)
            self.log.append(records)
            if stopped:
                return

    def verify(self, requests: list[VerifyRequest]) -> list[VerifyResult]:
        if len(requests) != len(self.current):
            raise RuntimeError(f"{len(requests)} verification requests for {len(self.current)} sampled turns")
        pending = []
        for key in self.current:
            logged = self.logged_verdicts.get(key)
            if key not in self.verdicts and logged is not None and self.logged_samples.get(key) is self.sampled[key]:
                self.verdicts[key] = logged  # judged before the interruption, this very text
            if key not in self.verdicts:
                pending.append(key)
        code_of = {t.key: t.task_code for t in self.trajectories}
        started = time.perf_counter()
        chunk_size = max(1, self.rl.verify_chunk_size)
        for start in range(0, len(pending), chunk_size):
            chunk = pending[start:start + chunk_size]
            items = [VerifyRequest(problem_code=code_of[f"{tid}#{i}"], candidate_text=self.sampled[(tid, i, turn)]["text"],
                                   label=f"r{self.round_index}/{tid}/{i}/turn{turn}")
                     for tid, i, turn in chunk]
            results = self.ctx.verify_fn(items)
            if len(results) != len(items):
                raise RuntimeError(f"verifier returned {len(results)} results for {len(items)} candidates")
            records = []
            for key, result in zip(chunk, results):
                self.verdicts[key] = result_dict(result)
                records.append(verdict_record(key[0], key[1], self.sampled[key]["text"], self.verdicts[key], turn=key[2]))
            self.log.append(records)
        self.stats["verifying_s"] += time.perf_counter() - started
        return [VerifyResult.from_dict(self.verdicts[key]) for key in self.current]

    def after_turn(self, _turn: int, _live) -> None:
        self._check()

    def _check(self) -> None:
        self.checks += 1
        check_signal(self.ctx, self.log.path)

    def finish_checks(self) -> None:
        """The signal checks of turns this rank did not run, so every rank makes the same number."""
        while self.checks < CHECKS_PER_TURN * self.rl.max_turns:
            self._check()

    # -- result ----------------------------------------------------------------------------------------------
    def candidates(self, level_of: dict[str, int]) -> list[Candidate]:
        out = []
        for trajectory in self.trajectories:
            task_id, sample = self.owner[trajectory.key]
            for turn_index, turn in enumerate(trajectory.turns, start=1):
                record = self.sampled[(task_id, sample, turn_index)]
                out.append(Candidate(task_id, level_of[task_id], sample, turn.response,
                                     self.verdicts[(task_id, sample, turn_index)], list(record["token_ids"]),
                                     [float(x) for x in record["logprobs"]], turn=turn_index,
                                     prompt=record["prompt"], turns_dropped=int(record.get("turns_dropped", 0)),
                                     prompt_tokens=record.get("prompt_tokens")))
        return out


def _has_sequence(record: dict) -> bool:
    return isinstance(record.get("token_ids"), list) and isinstance(record.get("logprobs"), list) \
        and isinstance(record.get("prompt"), list)


def _rounds_left_out(trajectory: Trajectory, messages: list[dict]) -> int:
    shown = (len(messages) - len(trajectory.prompt)) // 2
    return len(trajectory.turns) - shown


def collect_trajectories(ctx: RoundContext, model, round_index: int, tasks: Sequence[dict],
                         policy: str) -> tuple[list[Candidate], dict]:
    """Every turn of every trajectory of the round (reusing the log), gathered on all ranks.

    Returns the candidates, one per turn, sorted by (task, sample, turn), and the phase statistics
    (seconds sampling, verifying and waiting for verdicts, tokens sampled in this process run).
    """
    rl = ctx.cfg.rl
    log = rollouts.open_round_log(ctx, round_index, tasks, policy)
    contents = log.read()
    state = RoundTrajectories(ctx, model, round_index, ctx.dist.shard(tasks), log, contents)
    restored = state.restore_logged_turns()
    if ctx.dist.is_main and (contents.turn_samples or contents.damaged_lines):
        print(f"[rl] round {round_index}: reusing {restored} judged turn(s) from {log.path}"
              + (f"; skipped {contents.damaged_lines} damaged line(s)" if contents.damaged_lines else ""), flush=True)
    run_turns(state.trajectories, state.generate, state.verify, rl.max_turns,
              max_prompt_tokens=ctx.cfg.prompt.max_prompt_tokens, count_tokens=state.count_tokens,
              on_turn=state.after_turn)
    state.finish_checks()
    level_of = {t["task_id"]: int(t["level"]) for t in tasks}
    local = [dataclasses.asdict(c) for c in state.candidates(level_of)]
    gathered = [Candidate(**c) for c in ctx.dist.gather_objects(local)]
    gathered.sort(key=lambda c: c.key)
    stats = dict(state.stats)
    stats["waiting_s"] = stats["verifying_s"]  # turn by turn, the sampler waits for every verdict
    stats["sampled_tokens"] = int(ctx.dist.sum([float(stats["sampled_tokens"])])[0])
    return gathered, stats


def with_discounted_returns(candidates: Sequence[Candidate], gamma: float) -> list[Candidate]:
    """The candidates with each turn's training reward replaced by its discounted return
    R_t = s_t + gamma * R_{t+1} over its own trajectory (s_t: the turn's scored reward)."""
    trajectories: dict[tuple[str, int], list[Candidate]] = {}
    for candidate in candidates:
        trajectories.setdefault((candidate.task_id, candidate.sample_index), []).append(candidate)
    returns: dict[TurnKey, float] = {}
    for turns in trajectories.values():
        turns.sort(key=lambda c: c.turn)
        if [c.turn for c in turns] != list(range(1, len(turns) + 1)):
            raise ValueError(f"trajectory {turns[0].task_id}#{turns[0].sample_index} has turns "
                             f"{[c.turn for c in turns]}, expected 1..{len(turns)}")
        for candidate, value in zip(turns, discounted_returns([c.reward for c in turns], gamma)):
            returns[candidate.key] = value
    return [dataclasses.replace(c, score=returns[c.key]) for c in candidates]
