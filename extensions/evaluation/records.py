"""What an evaluation report stores per task and per sample: every metric is computed from these."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Optional


@dataclass
class EvalTask:
    """One row of ``eval_tasks.jsonl``: a KernelBench-style problem."""

    task_id: str
    level: Optional[int]
    name: str
    code: str


@dataclass
class SampleRecord:
    """The verifier's verdict on one generated response, reduced to what metrics need."""

    sample: int
    stage: str  # last funnel stage passed (extensions.verify.result.STAGES)
    correct: bool
    reward: float
    speedup: Optional[float] = None
    flags: list[str] = field(default_factory=list)
    error: Optional[str] = None
    isolation: str = "none"
    allowed_library_calls: list[str] = field(default_factory=list)

    @classmethod
    def from_verify_result(cls, sample: int, result) -> "SampleRecord":
        return cls(
            sample=sample, stage=result.stage, correct=bool(result.correct), reward=float(result.reward),
            speedup=None if result.speedup is None else float(result.speedup),
            flags=list(result.flags), error=result.error, isolation=result.isolation,
            allowed_library_calls=list(result.allowed_library_calls),
        )

    @classmethod
    def failed(cls, sample: int, error: str) -> "SampleRecord":
        """A response that never reached the verifier (e.g. empty): a failed sample with its reason."""
        return cls(sample=sample, stage="none", correct=False, reward=0.0, error=error)


@dataclass
class TaskRecord:
    task_id: str
    level: Optional[int]
    name: str
    samples: list[SampleRecord] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TaskRecord":
        samples = [SampleRecord(**s) for s in data.get("samples", [])]
        return cls(task_id=data["task_id"], level=data.get("level"), name=data.get("name", ""), samples=samples)


@dataclass
class SkippedTask:
    """A task left out of every rate, with the reason (e.g. its reference failed to run)."""

    task_id: str
    reason: str
