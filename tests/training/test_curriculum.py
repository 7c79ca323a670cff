"""The adaptive curriculum: share movement, level-3 gating, task choice and exact state restore."""
from __future__ import annotations

import json

import pytest

from extensions.config import CurriculumConfig
from extensions.training.curriculum import Curriculum


def _tasks(per_level: int = 10) -> list[dict]:
    return [{"task_id": f"l{level}-{i}", "level": level} for level in (1, 2, 3) for i in range(per_level)]


def test_level2_share_waits_for_the_moving_level1_rate_then_steps_to_the_end():
    cur = Curriculum(CurriculumConfig(curriculum_start_p=0.1, curriculum_end_p=0.5, curriculum_trigger_threshold=0.4,
                                      curriculum_step=0.1, curriculum_window=3), seed=0)
    cur.update(1, {1: 0.2, 2: 0.0})
    cur.update(2, {1: 0.3, 2: 0.0})
    assert cur.share_l2 == pytest.approx(0.1)  # moving mean 0.25 < 0.4
    cur.update(3, {1: 0.9, 2: 0.0})  # mean(0.2, 0.3, 0.9) = 0.467 >= 0.4
    assert cur.share_l2 == pytest.approx(0.2)
    cur.update(4, {1: 0.1, 2: 0.0})  # mean(0.3, 0.9, 0.1) = 0.433: still triggered
    assert cur.share_l2 == pytest.approx(0.3)
    cur.update(5, {1: 0.1, 2: 0.0})  # mean(0.9, 0.1, 0.1) = 0.367: holds
    assert cur.share_l2 == pytest.approx(0.3)
    for r in range(6, 12):
        cur.update(r, {1: 1.0, 2: 0.0})
    assert cur.share_l2 == pytest.approx(0.5)  # capped at the end value
    assert cur.share_l3 == 0.0  # level 2 never mastered


def test_level3_opens_only_after_level2_is_at_its_end_and_mastered():
    cfg = CurriculumConfig(curriculum_start_p=0.4, curriculum_end_p=0.5, curriculum_trigger_threshold=0.4,
                           curriculum_step=0.1, curriculum_window=1, curriculum_level3_end_p=0.2)
    cur = Curriculum(cfg, seed=0)
    cur.update(1, {1: 0.8, 2: 0.9})
    assert (cur.share_l2, cur.share_l3) == (pytest.approx(0.5), 0.0)
    cur.update(2, {1: 0.8, 2: 0.9})
    assert cur.share_l3 == pytest.approx(0.1)
    cur.update(3, {1: 0.8, 2: 0.1})
    assert cur.share_l3 == pytest.approx(0.1)
    cur.update(4, {1: 0.8, 2: 0.9})
    cur.update(5, {1: 0.8, 2: 0.9})
    assert cur.share_l3 == pytest.approx(0.2)
    assert cur.shares == pytest.approx({1: 0.3, 2: 0.5, 3: 0.2})
    excluded = Curriculum(CurriculumConfig(curriculum_start_p=0.5, curriculum_level3_end_p=0.0, curriculum_window=1), seed=0)
    excluded.update(1, {1: 1.0, 2: 1.0})
    assert excluded.share_l3 == 0.0


def test_selection_follows_the_shares_and_prefers_unseen_tasks():
    cur = Curriculum(CurriculumConfig(curriculum_start_p=0.25), seed=3)
    chosen = cur.select(_tasks(), 8)
    assert [t["level"] for t in chosen].count(2) == 2 and [t["level"] for t in chosen].count(1) == 6
    assert len({t["task_id"] for t in chosen}) == 8
    second = cur.select(_tasks(), 8)
    level1_first = {t["task_id"] for t in chosen if t["level"] == 1}
    level1_second = {t["task_id"] for t in second if t["level"] == 1}
    assert len(level1_first | level1_second) == 10  # 6 + 6 over 10 level-1 tasks: all seen before any repeats


def test_short_levels_are_refilled_from_the_others():
    cur = Curriculum(CurriculumConfig(curriculum_start_p=0.5), seed=0)
    tasks = [t for t in _tasks() if t["level"] == 1] + [{"task_id": "only-l2", "level": 2}]
    chosen = cur.select(tasks, 6)
    assert len(chosen) == 6 and sum(t["level"] == 2 for t in chosen) == 1
    assert cur.level_counts(4, {1: 1, 2: 0, 3: 0}) == {1: 1, 2: 0, 3: 0}


def test_state_round_trip_reproduces_the_next_selection():
    cfg = CurriculumConfig(curriculum_start_p=0.3, curriculum_window=2)
    cur = Curriculum(cfg, seed=11)
    cur.select(_tasks(), 5)
    cur.update(1, {1: 0.5, 2: 0.1})
    saved = json.loads(json.dumps(cur.state_dict()))  # as stored in curriculum.json
    expected = cur.select(_tasks(), 5)
    restored = Curriculum(cfg, seed=999)
    restored.load_state_dict(saved)
    assert restored.select(_tasks(), 5) == expected
    assert restored.share_l2 == cur.share_l2 and restored.history == cur.history
