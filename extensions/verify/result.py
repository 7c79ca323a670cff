"""The verdict on one candidate: what every consumer of the verifier (SFT data checks, the RL
reward, evaluation reports, the CLI's ``--json`` lines) reads."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Optional

# The funnel, in order. ``stage`` on a result is the last stage the candidate passed.
STAGES = ("none", "extract", "static", "compile", "tiny", "full", "timing")


def stage_rank(stage: str) -> int:
    return STAGES.index(stage)


@dataclass
class VerifyResult:
    candidate: str  # the label the caller gave (CLI: the file path)
    correct: bool = False
    stage: str = "none"
    reward: float = 0.0
    error: Optional[str] = None
    flags: list[str] = field(default_factory=list)
    speedup: Optional[float] = None
    # Which OS isolation the candidate ran under: "bwrap", "process" (asked for explicitly), or
    # "none" when it never ran (rejected before the compile stage).
    isolation: str = "none"
    # Why it failed, one of ``redact.ERROR_CATEGORIES`` (``error`` adds a redacted line); None if it passed.
    error_category: Optional[str] = None
    # Conditions the caller must know about, e.g. that no OS sandbox was in force.
    warnings: list[str] = field(default_factory=list)
    # Library calls (GEMM/conv) a config policy allowed, reported so they are never silent.
    allowed_library_calls: list[str] = field(default_factory=list)
    timing: Optional[dict[str, Any]] = None
    details: dict[str, Any] = field(default_factory=dict)
    cached: bool = False  # identical normalised code was already judged in this batch

    def passed(self, stage: str) -> bool:
        return stage_rank(self.stage) >= stage_rank(stage)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "VerifyResult":
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)
