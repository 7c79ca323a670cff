"""What the model is told about its previous kernel: a verifier result turned into one short text.

A refinement turn shows the model the verdict on its last answer: which way it failed (a fixed
category), the verifier's key error line, how many input sets passed, and what to look at next.
Nothing the candidate printed or wrote reaches the text: the only candidate-dependent part is the
verifier's own one-line ``error``, which the verifier already reduced to a category plus a short
line (no stdout, no file content, no environment); this module further keeps its first line, drops
absolute paths and caps its length, so a long or odd line cannot grow the prompt.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from ..verify.result import VerifyResult
from ..verify.reward import is_cheating

MAX_ERROR_CHARS = 240

# category -> (headline, guidance). The headline says what happened; the guidance what to check.
CATEGORIES: dict[str, tuple[str, str]] = {
    "no_code": (
        "No code found in your answer.",
        "Answer with the complete Python module (imports, @triton.jit kernels, class ModelNew) in one "
        "```python code block.",
    ),
    "syntax_error": (
        "The module does not parse as Python.",
        "Check brackets, colons, indentation and unfinished lines; answer with the whole module, not a "
        "fragment, and nothing but prose outside the code block.",
    ),
    "policy_violation": (
        "The kernel breaks the Triton-only policy.",
        "Do the math inside @triton.jit kernels launched from forward: no PyTorch operators, NumPy, "
        "threads, subprocesses or the reference Model for the computation, and never modify the inputs "
        "or return an input as the output.",
    ),
    "compile_error": (
        "The module failed to import or construct ModelNew.",
        "Check imports, names and the constructor: ModelNew must take the same arguments as Model and "
        "only use triton, triton.language and torch for allocation.",
    ),
    "runtime_error": (
        "The forward pass raised an error.",
        "Check the kernel launch (grid, argument order and count, constexpr block sizes), pointer "
        "offsets and masks, and that every tensor passed to the kernel is contiguous.",
    ),
    "timeout": (
        "The candidate ran past the time limit.",
        "Look for loops that never end or launch far more programs than needed; keep block sizes "
        "powers of two and bound every loop by the input size.",
    ),
    "wrong_output": (
        "The output has the wrong structure, shape, dtype or non-finite values.",
        "Return exactly what Model.forward returns: same tensor count, shape and dtype; mask loads "
        "and stores so no lane reads or writes out of bounds, and guard divisions and exponentials.",
    ),
    "numerical_mismatch": (
        "The output values do not match the reference.",
        "Compare the math with Model.forward step by step: reduction axes, strides, broadcasting, "
        "masked lanes' fill values, and accumulate in float32.",
    ),
    "timing_failed": (
        "The kernel was correct but could not be timed.",
        "Make forward deterministic and free of caching between calls: every call must compute its "
        "output from its inputs.",
    ),
    "problem_error": (
        "The verifier could not run the reference for this task.",
        "This is not a fault of your kernel; answer with your best kernel again.",
    ),
    "correct": (
        "The kernel is correct.",
        "Keep it correct and make it faster: fuse operations into fewer kernels, pick block sizes "
        "that fill the GPU, and avoid extra copies and launches.",
    ),
}

_SET_PREFIX = re.compile(r"^(?P<phase>tiny|full)(?: \((?P<set>[^)]*)\))?: (?P<rest>.*)$", re.S)
_STAGE_PREFIX = re.compile(r"^(?:extract|static|compile|timing): ")
_ABSOLUTE_PATH = re.compile(r"(?<![\w.])/(?:[\w.+-]+/)+([\w.+-]+)")
_WRONG_OUTPUT_REASONS = frozenset({"structure", "shape", "dtype", "nan_or_inf"})


@dataclass(frozen=True)
class Feedback:
    category: str  # a key of CATEGORIES
    error_line: Optional[str]  # the verifier's cleaned key line, without its stage prefix
    input_set: Optional[str]  # the input set that failed ("tiny", "seed_1", ...), when one did
    tests_passed: Optional[int]  # input sets passed, when the candidate ran at all
    tests_total: Optional[int]
    speedup: Optional[float] = None

    @property
    def headline(self) -> str:
        return CATEGORIES[self.category][0]

    @property
    def guidance(self) -> str:
        return CATEGORIES[self.category][1]

    def text(self) -> str:
        """The feedback as the model reads it, a few short lines."""
        lines = [f"Verifier result: {self.category.replace('_', ' ')}. {self.headline}"]
        if self.error_line:
            where = f" (input set {self.input_set})" if self.input_set else ""
            lines.append(f"Key error{where}: {self.error_line}")
        if self.tests_total:
            lines.append(f"Input sets passed: {self.tests_passed} of {self.tests_total}.")
        if self.category == "correct":
            if self.speedup is None:
                lines.append("Timing: not measured on this device.")
            else:
                relation = "faster than" if self.speedup >= 1.0 else "slower than"
                lines.append(f"Timing: {self.speedup:.2f}x the PyTorch reference ({relation} it).")
        lines.append(f"What to do: {self.guidance}")
        return "\n".join(lines)


def clean_error_line(error: Optional[str]) -> Optional[str]:
    """The first line of the verifier's error, absolute paths reduced to file names, capped."""
    if not error:
        return None
    first = next((line.strip() for line in error.splitlines() if line.strip()), "")
    first = _ABSOLUTE_PATH.sub(r"\1", first)
    first = re.sub(r"\s+", " ", first)
    if len(first) > MAX_ERROR_CHARS:
        first = first[:MAX_ERROR_CHARS - 3].rstrip() + "..."
    return first or None


def _split_location(error: Optional[str]) -> tuple[Optional[str], Optional[str]]:
    """(input set, message) from ``tiny: ...`` / ``full (seed_2): ...``; other stages' prefixes go."""
    line = clean_error_line(error)
    if line is None:
        return None, None
    match = _SET_PREFIX.match(line)
    if match:
        return match.group("set") or match.group("phase"), match.group("rest")
    return None, _STAGE_PREFIX.sub("", line)


def categorize(result: VerifyResult) -> str:
    """The feedback category of ``result`` (a key of ``CATEGORIES``)."""
    error = result.error or ""
    if result.correct:
        return "correct"
    if result.stage == "none":
        # The extractor found ModelNew but no version of the text around it parses.
        return "syntax_error" if "parseable" in error else "no_code"
    if result.details.get("problem_error"):
        return "problem_error"
    if is_cheating(result.flags):
        return "policy_violation"
    if result.stage == "extract":
        return "syntax_error" if "SyntaxError" in error or "IndentationError" in error else "policy_violation"
    if result.details.get("timed_out"):
        return "timeout"
    if result.stage == "static":
        return "compile_error"
    if result.stage == "full" or error.startswith("timing"):
        return "timing_failed"
    mismatch = result.details.get("mismatch")
    if mismatch in _WRONG_OUTPUT_REASONS:
        return "wrong_output"
    if mismatch is not None:
        return "numerical_mismatch"
    return "runtime_error"


def _input_set_counts(result: VerifyResult) -> tuple[Optional[int], Optional[int]]:
    names = result.details.get("input_sets")
    if not names or result.stage in ("none", "extract", "static"):
        return None, None
    # The judge records one launch count per input set that passed every check.
    passed = len(result.details.get("launches") or [])
    return min(passed, len(names)), len(names)


def build_feedback(result: VerifyResult) -> Feedback:
    category = categorize(result)
    input_set, message = _split_location(result.error)
    passed, total = _input_set_counts(result)
    return Feedback(category=category, error_line=message, input_set=input_set, tests_passed=passed,
                    tests_total=total, speedup=result.speedup if result.correct else None)


def feedback_text(result: VerifyResult) -> str:
    """What the model reads about ``result`` in its next turn."""
    return build_feedback(result).text()
