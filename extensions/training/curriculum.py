"""Adaptive curriculum: which RL tasks each round samples, by difficulty level.

The level-2 share starts at ``curriculum_start_p``. After each round the per-level correct rates
(correct candidates / candidates of that level, i.e. a pass@1 estimate) are recorded; once the
moving level-1 rate (mean over the last ``curriculum_window`` rounds, or all rounds so far while
fewer exist) reaches ``curriculum_trigger_threshold``, the level-2 share grows by ``curriculum_step``
per round up to ``curriculum_end_p``.

Level 3 (whole architectures, long prompts, rarely solved by a 7B model early on) is held back:
its share starts at 0 and grows by the same step up to ``curriculum_level3_end_p`` only once the
level-2 share has reached its end value and the moving level-2 rate reaches the same trigger.
Level 1 takes the rest. Set ``curriculum_level3_end_p: 0`` to exclude level 3 entirely.

Within a level, tasks sampled least often so far come first (ties broken by a seeded RNG), so a
round sees new tasks before any task repeats. The state (shares, history, counts, RNG) is saved
with each round and restored on resume, which makes the choice of a resumed round identical.
"""
from __future__ import annotations

import json
import random
from typing import Any, Optional, Sequence

from ..config.sections import CurriculumConfig

LEVELS = (1, 2, 3)


class Curriculum:
    def __init__(self, cfg: CurriculumConfig, seed: int):
        self.cfg = cfg
        self.share_l2 = float(cfg.curriculum_start_p)
        self.share_l3 = 0.0
        self.history: list[dict[str, Any]] = []  # per round: {"round", "correct_rate": {level: rate}}
        self.times_picked: dict[str, int] = {}
        self._rng = random.Random(seed)

    # -- movement ------------------------------------------------------------------------------------
    def moving_rate(self, level: int) -> Optional[float]:
        rates = [h["correct_rate"][str(level)] for h in self.history if h["correct_rate"].get(str(level)) is not None]
        window = rates[-max(1, self.cfg.curriculum_window):]
        return sum(window) / len(window) if window else None

    def update(self, round_index: int, correct_rate_by_level: dict[int, Optional[float]]) -> dict[str, Any]:
        """Record a finished round and move the shares; returns what changed, for the round's log."""
        self.history.append({"round": round_index,
                             "correct_rate": {str(level): rate for level, rate in correct_rate_by_level.items()}})
        trigger = self.cfg.curriculum_trigger_threshold
        step = self.cfg.curriculum_step
        rate_l1, rate_l2 = self.moving_rate(1), self.moving_rate(2)
        before = (self.share_l2, self.share_l3)
        if rate_l1 is not None and rate_l1 >= trigger and self.share_l2 < self.cfg.curriculum_end_p:
            self.share_l2 = min(self.cfg.curriculum_end_p, round(self.share_l2 + step, 10))
        elif (self.share_l2 >= self.cfg.curriculum_end_p and rate_l2 is not None and rate_l2 >= trigger
              and self.share_l3 < self.cfg.curriculum_level3_end_p):
            self.share_l3 = min(self.cfg.curriculum_level3_end_p, round(self.share_l3 + step, 10))
        return {"moving_rate_l1": rate_l1, "moving_rate_l2": rate_l2, "share_before": list(before),
                "share_l2": self.share_l2, "share_l3": self.share_l3}

    @property
    def shares(self) -> dict[int, float]:
        return {1: max(0.0, 1.0 - self.share_l2 - self.share_l3), 2: self.share_l2, 3: self.share_l3}

    # -- selection -----------------------------------------------------------------------------------
    def level_counts(self, k: int, available: dict[int, int]) -> dict[int, int]:
        """How many of ``k`` tasks each level gets (rounded shares; a short level's gap is refilled
        from the other levels, easiest first)."""
        shares = self.shares
        counts = {level: int(k * shares[level] + 0.5) for level in (2, 3)}
        counts[1] = k - counts[2] - counts[3]
        counts = {level: min(counts[level], available.get(level, 0)) for level in LEVELS}
        gap = k - sum(counts.values())
        for level in LEVELS:
            extra = min(gap, available.get(level, 0) - counts[level])
            counts[level] += extra
            gap -= extra
        return counts

    def select(self, tasks: Sequence[dict], k: int) -> list[dict]:
        """``k`` tasks (dicts with ``task_id`` and ``level``) for the next round; advances the state."""
        by_level: dict[int, list[dict]] = {level: [] for level in LEVELS}
        for task in tasks:
            level = int(task.get("level", 1))
            by_level[min(max(level, 1), 3)].append(task)
        counts = self.level_counts(k, {level: len(items) for level, items in by_level.items()})
        chosen = []
        for level in LEVELS:
            pool = sorted(by_level[level], key=lambda t: str(t["task_id"]))
            keys = {str(t["task_id"]): self._rng.random() for t in pool}
            pool.sort(key=lambda t: (self.times_picked.get(str(t["task_id"]), 0), keys[str(t["task_id"])]))
            chosen.extend(pool[:counts[level]])
        for task in chosen:
            self.times_picked[str(task["task_id"])] = self.times_picked.get(str(task["task_id"]), 0) + 1
        return chosen

    # -- persistence ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        version, internal, gauss = self._rng.getstate()
        return {"share_l2": self.share_l2, "share_l3": self.share_l3, "history": self.history,
                "times_picked": self.times_picked, "rng": [version, list(internal), gauss]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.share_l2 = float(state["share_l2"])
        self.share_l3 = float(state["share_l3"])
        self.history = list(state["history"])
        self.times_picked = dict(state["times_picked"])
        version, internal, gauss = state["rng"]
        self._rng.setstate((version, tuple(internal), gauss))

    def to_json(self) -> str:
        return json.dumps(self.state_dict())
