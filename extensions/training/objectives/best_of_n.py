"""Best-of-N expert iteration: per task the top ``top_k`` distinct samples with reward >=
``reward_threshold`` are kept, and the adapter is fine-tuned on them with the SFT loss for
``epochs_per_round`` epochs (accumulation shrinks when few were kept; with none, the adapter is
unchanged that round).

In a multi-turn round the choice is among trajectories, by their final answer's reward, and the
training example is the whole dialogue that final answer ended: the task's prompt, each of the
model's own answers and the verifier's feedback on it, as the last turn was prompted. Loss falls on
the model's own answers only (the task, feedback and any worked examples are masked), so it learns
to refine as well as to answer.

An answer cut off at ``max_new_tokens`` is trained without an end of turn: labelling one would teach
the model to stop where sampling merely ran out of room, and answers would shrink round by round."""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Optional, Sequence

from ...generation.sampling import eos_token_ids
from ..batching import IGNORE_INDEX, DropReport, TokenizedExample
from ..rollouts import Candidate
from ..trainer import OptimSettings, StepPlan
from .base import Objective, RoundRollouts, UpdateContext, group_statistics


def select_top_k(candidates: Sequence[Candidate], top_k: int, threshold: float) -> list[Candidate]:
    """Per task, the ``top_k`` best distinct candidates with reward >= ``threshold``.

    Order: reward descending, then sample index ascending (deterministic ties). A response whose
    text repeats a better one of the same task is skipped so duplicates do not count twice.
    """
    by_task: dict[str, list[Candidate]] = {}
    for candidate in candidates:
        by_task.setdefault(candidate.task_id, []).append(candidate)
    kept = []
    for task_id in sorted(by_task):
        eligible = sorted((c for c in by_task[task_id] if c.result is not None and c.reward >= threshold),
                          key=lambda c: (-c.reward, c.sample_index))
        texts = set()
        for candidate in eligible:
            key = candidate.text.strip()
            if key in texts:
                continue
            texts.add(key)
            kept.append(candidate)
            if len(texts) == top_k:
                break
    return kept


def final_turns(candidates: Sequence[Candidate]) -> list[Candidate]:
    """The last turn of each trajectory (task, sample), in (task, sample) order."""
    last: dict[tuple[str, int], Candidate] = {}
    for candidate in candidates:
        key = (candidate.task_id, candidate.sample_index)
        if key not in last or candidate.turn > last[key].turn:
            last[key] = candidate
    return [last[key] for key in sorted(last)]


def tokenize_dialogue(tokenizer, messages: list[dict], own_from: int, *, last_finished: bool = True) -> TokenizedExample:
    """Tokens of a chat whose assistant messages from index ``own_from`` on are the model's own
    answers: those (with their end-of-turn token) are the labels, everything else is masked. With
    ``last_finished`` False the last answer was cut off: its text is labelled, with no end of turn.

    The chat template renders each prefix of the dialogue; every prefix must be the start of the
    next rendering (true of ChatML-style templates), so the pieces add up to the whole dialogue.
    """
    input_ids: list[int] = []
    labels: list[int] = []
    rendered = ""
    own = [i for i in range(own_from, len(messages)) if messages[i]["role"] == "assistant"]
    if not own:
        raise ValueError("the dialogue holds no answer of the model's own")
    for index in own:
        for text, trained in ((tokenizer.apply_chat_template(messages[:index], tokenize=False, add_generation_prompt=True), False),
                              (tokenizer.apply_chat_template(messages[:index + 1], tokenize=False, add_generation_prompt=False), True)):
            if not text.startswith(rendered):
                raise ValueError("the chat template renders earlier turns differently once later ones follow")
            if trained and index == own[-1] and not last_finished:
                text = rendered + messages[index]["content"]
            ids = tokenizer(text[len(rendered):], add_special_tokens=False)["input_ids"]
            input_ids += ids
            labels += list(ids) if trained else [IGNORE_INDEX] * len(ids)
            rendered = text
    return TokenizedExample(input_ids=input_ids, labels=labels)


def finished(candidate: Candidate, eos_ids: Sequence[int]) -> bool:
    """Whether the answer ended on its own; one without sampled tokens (an old log) counts as ended."""
    return not candidate.token_ids or candidate.token_ids[-1] in eos_ids


def sampled_example(rollouts: RoundRollouts, candidate: Candidate) -> TokenizedExample:
    """A single-turn answer exactly as sampled: its prompt's tokens, masked, then its own tokens
    (ending with an end of turn only where sampling produced one)."""
    prompt_ids = rollouts.prompt_ids_for(candidate)
    return TokenizedExample(input_ids=[*prompt_ids, *candidate.token_ids],
                            labels=[IGNORE_INDEX] * len(prompt_ids) + list(candidate.token_ids))


def tokenize_kept(tokenizer, kept: Sequence[Candidate], rollouts: RoundRollouts, eos_ids: Sequence[int],
                  max_seq_len: int) -> tuple[list[TokenizedExample], DropReport]:
    """The kept answers as training examples: a single-turn answer as sampled, a multi-turn one
    with the dialogue it ended."""
    report = DropReport()
    examples = []
    first_prompts = rollouts.messages
    for candidate in kept:
        if not candidate.text.strip():
            report.add("with an empty completion")
            continue
        try:
            if candidate.prompt is None and candidate.token_ids:
                example = sampled_example(rollouts, candidate)
            else:
                messages = [*(candidate.prompt or first_prompts[candidate.task_id]),
                            {"role": "assistant", "content": candidate.text}]
                example = tokenize_dialogue(tokenizer, messages, len(first_prompts[candidate.task_id]),
                                            last_finished=finished(candidate, eos_ids))
        except Exception as exc:  # a malformed dialogue must not end the run
            report.add(f"that failed to tokenize ({type(exc).__name__})")
            continue
        if len(example) > max_seq_len:
            report.add(f"longer than max_seq_len={max_seq_len}")
            continue
        examples.append(example)
        report.kept += 1
    return examples, report


def fit_plan(examples, settings: OptimSettings, seed: int, world_size: int) -> Optional[StepPlan]:
    """A plan for the kept candidates; accumulation shrinks when few were kept (None: too few)."""
    for accumulation in range(settings.gradient_accumulation_steps, 0, -1):
        for batch_size in sorted({settings.per_device_batch_size, 1}, reverse=True):
            trial = dataclasses.replace(settings, gradient_accumulation_steps=accumulation, per_device_batch_size=batch_size)
            plan = StepPlan(examples, trial, seed=seed, world_size=world_size)
            if plan.steps_per_epoch > 0:
                return plan
    return None


class BestOfN(Objective):
    name = "best_of_n"

    def __init__(self, rl_cfg, max_seq_len: int):
        self.rl = rl_cfg
        self.max_seq_len = max_seq_len

    def update(self, ctx: UpdateContext, rollouts: RoundRollouts) -> dict[str, Any]:
        from tqdm.auto import tqdm

        rl, dist, round_index = self.rl, ctx.dist, rollouts.round_index
        multi_turn = any(c.prompt is not None for c in rollouts.candidates)
        candidates = final_turns(rollouts.candidates) if multi_turn else rollouts.candidates
        kept = select_top_k(candidates, rl.top_k, rl.reward_threshold)
        examples, report = tokenize_kept(ctx.tokenizer, kept, rollouts, eos_token_ids(ctx.trainer.model, ctx.tokenizer),
                                         self.max_seq_len)
        if report.dropped and dist.is_main:
            print(f"[rl] round {round_index}: {report.summary('kept candidates')}", flush=True)
        plan = fit_plan(examples, ctx.trainer.settings, seed=ctx.cfg.run.seed + round_index, world_size=dist.world_size) if examples else None
        losses, tokens = [], 0
        started = time.perf_counter()
        if plan is None:
            if dist.is_main:
                why = (f"no candidate reached reward {rl.reward_threshold}" if not kept
                       else f"{len(examples)} usable of {len(kept)} kept: too few for {dist.world_size} process(es)")
                print(f"[rl] round {round_index}: {why}; the adapter is unchanged this round", flush=True)
        else:
            steps = plan.steps_per_epoch * max(1, rl.epochs_per_round)
            for step in tqdm(range(steps), desc=f"rl round {round_index} training", disable=not (ctx.progress and dist.is_main)):
                ctx.check_signal()
                step_stats = ctx.trainer.train_step(plan, step)
                losses.append(step_stats["loss"])
                tokens += step_stats["tokens"]
                ctx.metrics.log(round_index * 100_000 + step, {"round": round_index, **step_stats})
        seconds = time.perf_counter() - started
        return {**group_statistics(rollouts.candidates), "kept": len(kept), "kept_tasks": len({c.task_id for c in kept}),
                "train_examples": len(examples), "train_steps": len(losses),
                "train_loss_mean": sum(losses) / len(losses) if losses else None, "train_tokens": tokens,
                "train_tokens_per_s": tokens / seconds if tokens and seconds > 0 else None}
