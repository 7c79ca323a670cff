"""The reward of one verified candidate (the RL signal), from its funnel stage, flags and speedup.

    failed static check (or never extracted)   reward_static_fail   (0.0)
    passed static, failed to compile            reward_static_fail   (0.0)
    compiled (ModelNew built)                   reward_compiled      (0.3)
    tiny input set correct                      reward_tiny_correct  (0.5)
    every input set correct                     reward_full_correct  (0.7)
    timed                                       0.7 + 0.3 * min(speedup / 2, 1)

Any cheating flag zeroes the reward (and the candidate is not correct). Advisory flags do not:
``speedup_review`` caps the reward at the full-correct value, the others are informational.
"""
from __future__ import annotations

from typing import Iterable, Optional

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
    "output_reused",          # a timed call returned the storage of an earlier output
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
})


def is_cheating(flags: Iterable[str]) -> bool:
    return any(flag in CHEATING_FLAGS for flag in flags)


def compute_reward(stage: str, flags: Iterable[str], speedup: Optional[float], config) -> float:
    flags = list(flags)
    if is_cheating(flags):
        return 0.0
    if stage == "timing":
        if speedup is None or speedup != speedup or speedup <= 0:
            return config.reward_full_correct
        bonus = config.reward_speed_weight * min(speedup / config.reward_speedup_saturation, 1.0)
        reward = config.reward_full_correct + bonus
        if "speedup_review" in flags:
            reward = min(reward, config.reward_full_correct)
        return float(reward)
    return float({
        "full": config.reward_full_correct,
        "tiny": config.reward_tiny_correct,
        "compile": config.reward_compiled,
    }.get(stage, config.reward_static_fail))
