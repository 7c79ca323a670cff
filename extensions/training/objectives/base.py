"""What every RL objective receives and returns: one round's scored rollouts in, an adapter update
and its statistics out. The round loop (``extensions.training.rl``) is the same for all of them."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ...config.sections import PipelineConfig
from ..distributed import Dist
from ..metrics import MetricsLogger
from ..rollouts import Candidate
from ..trainer import AdapterTrainer

if TYPE_CHECKING:  # transformers is heavy to import; the tokenizer comes in ready-made
    from transformers import PreTrainedTokenizerBase

# Spread below this is none: floating-point noise in equal rewards must not become a gradient.
ZERO_SPREAD = 1e-9


@dataclass
class RoundRollouts:
    round_index: int
    tasks: list[dict]
    candidates: list[Candidate]  # every rank holds all of them, sorted by (task_id, sample_index)
    prompt_ids: dict[str, list[int]]  # task_id -> the rendered prompt the samples continue
    messages: dict[str, list[dict[str, str]]]  # task_id -> the chat messages of that prompt
    # Multi-turn rounds: the rendered prompt each turn was sampled from, by Candidate.key.
    turn_prompt_ids: dict[tuple[str, int, int], list[int]] = field(default_factory=dict)

    def prompt_ids_for(self, candidate: Candidate) -> list[int]:
        """The prompt ``candidate``'s tokens continue (its turn's, else its task's)."""
        ids = self.turn_prompt_ids.get(candidate.key)
        return ids if ids is not None else self.prompt_ids[candidate.task_id]


@dataclass
class UpdateContext:
    cfg: PipelineConfig
    dist: Dist
    trainer: AdapterTrainer  # the (possibly DDP-wrapped) model, optimizer and settings
    tokenizer: PreTrainedTokenizerBase
    metrics: MetricsLogger
    progress: bool
    check_signal: Callable[[], None]  # serves save requests between optimizer steps; raises on stop
    # Per-sample values the objective computed (e.g. "advantage"): the round loop logs them as
    # histograms on the rounds logging.histogram_every picks, with the rewards and speedups.
    distributions: dict[str, list[float]] = field(default_factory=dict)


class Objective:
    """One RL algorithm: turns a round's rollouts into adapter updates."""

    name = "objective"

    def update(self, ctx: UpdateContext, rollouts: RoundRollouts) -> dict[str, Any]:
        """Train on the round; returns its statistics (merged into the round's metrics)."""
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """State carried from round to round (saved in each round checkpoint)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def groups_by_task(candidates: Sequence[Candidate]) -> dict[str, list[Candidate]]:
    """The samples of each task (a GRPO/RLOO group; in a multi-turn round every turn of every
    trajectory of the task), in sample and turn order."""
    groups: dict[str, list[Candidate]] = {}
    for candidate in candidates:
        groups.setdefault(candidate.task_id, []).append(candidate)
    for group in groups.values():
        group.sort(key=lambda c: (c.sample_index, c.turn))
    return groups


def zero_spread(rewards: Sequence[float]) -> bool:
    return max(rewards) - min(rewards) <= ZERO_SPREAD


def group_statistics(candidates: Sequence[Candidate]) -> dict[str, Any]:
    groups = groups_by_task(candidates)
    flat = sum(1 for g in groups.values() if zero_spread([c.reward for c in g]))
    return {"groups": len(groups), "zero_spread_groups": flat,
            "zero_spread_share": flat / len(groups) if groups else 0.0}
