"""The reward of one verdict (the RL signal), from its funnel stage, flags and speedup, under a
reward table: ``verifier.reward_weights`` (``RewardWeightsConfig``), or one of RL's presets.

    stage reached                               column               default
    no code extracted                           none                 0.0
    extracted, failed the static check          extract              0.0
    passed static, failed to compile            static               0.0
    compiled (ModelNew built)                   compile              0.3
    tiny input set correct                      tiny                 0.5
    every input set correct                     full                 0.7
    timed                                       full + speed * min(speedup / speedup_saturation, 1)
                                                (0.7 + 0.3 * min(speedup / 2, 1))

Any cheating flag zeroes the reward (and the candidate is not correct). Advisory flags do not:
``speedup_review`` earns no speed bonus, the others are informational. The verifier judges; this
module is the one place a verdict becomes a number (the CLI's ``reward``, every ``VerifyResult``'s,
and RL's presets).
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional

from .result import STAGES

# The columns of a reward table: the funnel's stages before timing, then the speed bonus.
TABLE_COLUMNS = (*STAGES[:-1], "speed", "speedup_saturation")

# Signals that the answer did not come from Triton doing the work, or that the check was gamed.
CHEATING_FLAGS = frozenset({
    "torch_compute",          # an ATen op outside the policy ran in forward
    "library_gemm",           # cuBLAS/cuDNN/MKL GEMM or conv without the config allowing it
    "no_triton_launch",       # forward launched no Triton kernel
    "threads",                # work moved to another thread (invisible to the thread-local audit)
    "subprocess",             # a process was started during forward
    "output_not_from_kernel",  # an output's storage was never written by a Triton launch
    "numpy_compute",          # a tensor went through NumPy during forward
    "host_compute",           # more tensor data read into Python (tolist, item, float) than a few scalars
    "host_cast_compute",      # floating tensor data cast to an integer or bool dtype (the cast did the math)
    "decoy_kernel",           # CUDA: copies/fills took most of the GPU time, Triton a trivial part
    "side_stream",            # a kernel ran on another CUDA stream than forward's
    "non_triton_kernel",      # the GPU ran a kernel that is neither Triton's nor a copy/fill
    "inherits_reference",     # ModelNew derives from the reference Model
    "output_aliases_input",   # forward returned an input (or a view of one)
    "output_aliases_weight",  # forward returned a parameter/buffer's storage
    "mutated_inputs",         # forward wrote into its inputs
    "memoized_output",        # the last timed call's output does not match the reference
    "audit_tampered",         # the audit's hooks, its profiler record or the worker's code changed
    "timer_patched",          # the clocks or CUDA events the timer reads were replaced
    # from the timer (extensions.timing):
    "output_reused",          # a call returned the storage of an earlier output still held
    "output_mismatch_during_timing",  # a timed call disagreed with the reference
    # work finished after the timed stream: the candidate hid work from the timer, and correctness
    # runs cannot show that the hidden work is not the answer's
    "side_stream_suspected",
})

# Reported, never zeroing.
ADVISORY_FLAGS = frozenset({
    "speedup_review",         # speedup above speedup_review_bound: capped at the full-correct reward
    "timing_unstable",        # the timer could not get a stable measurement
    "library_gemm_allowed",   # library GEMM/conv ran and the config allows it (see allowed_library_calls)
    # from the timer, which already charged the candidate for them:
    "timing_budget_cut", "event_wall_mismatch", "memoization_suspected", "single_input_set",
    # CPU: no input set at the problem's own size ran (the verdict holds at the sizes run)
    "reduced_size",
    # a value set was left out because the reference failed or overflowed on it
    "value_sets_skipped",
    # CPU: Triton's interpreter refused a construct a GPU compiles (inline PTX): only a GPU can judge it
    "needs_gpu",
})


def is_cheating(flags: Iterable[str]) -> bool:
    return any(flag in CHEATING_FLAGS for flag in flags)


def table_weights(table: Any) -> dict[str, float]:
    """A reward table (``RewardWeightsConfig`` or a mapping with its columns) as plain numbers."""
    if isinstance(table, Mapping):
        return {column: float(table[column]) for column in TABLE_COLUMNS}
    return {column: float(getattr(table, column)) for column in TABLE_COLUMNS}


def compute_reward(stage: str, flags: Iterable[str], speedup: Optional[float], table: Any) -> float:
    """The reward of a verdict that reached ``stage`` with ``flags`` and ``speedup``, under ``table``."""
    flags = list(flags)
    if is_cheating(flags) or stage not in STAGES:
        return 0.0
    weights = table_weights(table)
    if stage != "timing":
        return weights[stage]
    reward = weights["full"]
    if "speedup_review" not in flags and speedup is not None and speedup == speedup and speedup > 0:
        saturation = weights["speedup_saturation"]
        if saturation <= 0:
            raise ValueError("verifier.reward_weights.speedup_saturation must be > 0")
        reward += weights["speed"] * min(speedup / saturation, 1.0)
    return float(reward)


def reward_of(verdict: Any, table: Any) -> float:
    """``compute_reward`` of a verdict: a ``VerifyResult`` or its ``to_dict()`` (None: 0)."""
    if not verdict:
        return 0.0
    if isinstance(verdict, Mapping):
        return compute_reward(verdict.get("stage", "none"), verdict.get("flags") or [], verdict.get("speedup"), table)
    return compute_reward(verdict.stage, verdict.flags, verdict.speedup, table)
