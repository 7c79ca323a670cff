"""The training reward of a judged candidate, from the verifier's verdict (``rl.reward_preset``).

``verifier`` (the default) is the reward table, ``verifier.reward_weights``: 0 up to a static or
compile failure, 0.3 compiled, 0.5 tiny correct, 0.7 full correct, plus up to 0.3 for speed; every
verdict already carries it (``reward``). The presets are other tables, moving the weight along the
funnel, for a schedule that first teaches the format, then correctness, then speed:

    stage reached      none  extract  static  compile  tiny   full   speed (x min(speedup/2, 1))
    format             0.0   0.2      0.4     0.7      0.85   1.0    0.0
    correctness        0.0   0.0      0.0     0.1      0.4    1.0    0.0
    speed              0.0   0.0      0.0     0.0      0.1    0.5    0.5

``weights`` is the old name of ``verifier`` (it named a copy of the table kept in the rl section).
Every preset goes through the verifier's one computation (``verify.reward.compute_reward``): any
cheating flag gives 0, and a ``speedup_review`` flag (an implausible speedup) earns no speed bonus.
"""
from __future__ import annotations

import importlib
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional, Sequence

from ..config import ConfigError, RLConfig
from ..verify.reward import is_cheating, reward_of

if TYPE_CHECKING:  # rollouts loads the sampler; scoring needs only the candidate's fields
    from .rollouts import Candidate

PRESETS: dict[str, dict[str, float]] = {
    "format": {"none": 0.0, "extract": 0.2, "static": 0.4, "compile": 0.7, "tiny": 0.85, "full": 1.0,
               "speed": 0.0, "speedup_saturation": 2.0},
    "correctness": {"none": 0.0, "extract": 0.0, "static": 0.0, "compile": 0.1, "tiny": 0.4, "full": 1.0,
                    "speed": 0.0, "speedup_saturation": 2.0},
    "speed": {"none": 0.0, "extract": 0.0, "static": 0.0, "compile": 0.0, "tiny": 0.1, "full": 0.5,
              "speed": 0.5, "speedup_saturation": 2.0},
}

# Candidate -> reward; the stage's default is built from the config by ``make_score_fn``.
ScoreFn = Callable[["Candidate"], float]


def preset_weights(rl_cfg: RLConfig) -> Optional[dict[str, float]]:
    """The table of the configured preset; None for the reward table itself (``verifier``, and its
    old name ``weights``), whose reward every verdict already carries."""
    if rl_cfg.reward_preset in ("verifier", "weights"):
        return None
    return dict(PRESETS[rl_cfg.reward_preset])


def staged_reward(result: Optional[dict], weights: dict[str, float]) -> float:
    """Reward of one verdict (``VerifyResult.to_dict()``) under the table ``weights``."""
    return reward_of(result, weights)


def make_score_fn(rl_cfg: RLConfig) -> ScoreFn:
    """Candidate -> reward for the configured preset."""
    weights = preset_weights(rl_cfg)

    def score(candidate: Candidate) -> float:
        if weights is None:
            return float(candidate.result.get("reward", 0.0)) if candidate.result else 0.0
        return staged_reward(candidate.result, weights)

    return score


# The user's reward (rl.reward_fn): prompts (each candidate's problem source), completions (the raw
# answers), verdicts (VerifyResult dicts) and keyword arguments task_ids, levels, turns.
RewardFn = Callable[..., Sequence[float]]


class RewardFnError(ConfigError):
    """rl.reward_fn cannot be loaded, or returned something that is not one number per candidate."""


def load_reward_fn(spec: str) -> RewardFn:
    """``"module:function"`` -> the function; the working directory is importable, as for ``python -m``."""
    module_name, sep, function_name = spec.partition(":")
    if not sep or not module_name or not function_name:
        raise RewardFnError(f"rl.reward_fn {spec!r} must look like module:function")
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any import failure is the same message to the user
        raise RewardFnError(f"rl.reward_fn {spec!r}: cannot import {module_name} ({type(exc).__name__}: {exc})") from None
    fn = getattr(module, function_name, None)
    if not callable(fn):
        raise RewardFnError(f"rl.reward_fn {spec!r}: {module_name} has no function {function_name}")
    return fn


def gated_user_rewards(fn: RewardFn, candidates: Sequence[Candidate], problems: dict[str, str], score_fn: ScoreFn) -> list[float]:
    """The user's rewards for one round, gated by the verdicts: a cheating flag scores 0, and a
    candidate that is not correct scores at most its ``score_fn`` (preset) reward."""
    verdicts = [c.result or {} for c in candidates]
    values = fn([problems.get(c.task_id, "") for c in candidates], [c.text for c in candidates], verdicts,
                task_ids=[c.task_id for c in candidates], levels=[c.level for c in candidates],
                turns=[getattr(c, "turn", 1) for c in candidates])
    values = list(values) if values is not None else []
    if len(values) != len(candidates):
        raise RewardFnError(f"rl.reward_fn returned {len(values)} rewards for {len(candidates)} candidates")
    rewards = []
    for candidate, verdict, value in zip(candidates, verdicts, values):
        try:
            value = float(value)
        except (TypeError, ValueError):
            raise RewardFnError(f"rl.reward_fn returned {value!r}, not a number") from None
        if not math.isfinite(value):
            raise RewardFnError(f"rl.reward_fn returned {value} for {candidate.task_id}")
        if is_cheating(verdict.get("flags") or []):
            value = 0.0
        elif not verdict.get("correct"):
            value = min(value, float(score_fn(candidate)))
        rewards.append(value)
    return rewards
