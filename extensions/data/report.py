"""Per-source accounting (read = kept + dropped by reason) and the difficulty agreement table."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable


@dataclass
class SourceTally:
    source: str  # what was read: a hub id, a path, "bundled"
    read: int = 0
    kept: int = 0
    dropped: Counter = field(default_factory=Counter)

    def count_read(self) -> None:
        self.read += 1

    def keep(self) -> None:
        self.kept += 1

    def drop(self, reason: str) -> None:
        self.dropped[reason] += 1

    def unkeep(self, reason: str) -> None:
        """A row kept earlier is dropped by a later whole-set check."""
        self.kept -= 1
        self.dropped[reason] += 1

    def to_dict(self) -> dict[str, Any]:
        total = self.kept + sum(self.dropped.values())
        if total != self.read:
            raise AssertionError(f"{self.source}: read {self.read} != kept {self.kept} + dropped {total - self.kept}")
        return {"source": self.source, "read": self.read, "kept": self.kept,
                "dropped": dict(sorted(self.dropped.items()))}


def difficulty_agreement(pairs: Iterable[tuple[int, int]]) -> dict[str, Any]:
    """Agreement of predicted with known levels: overall, per level, and the confusion matrix
    (``confusion[known][predicted]``)."""
    pairs = list(pairs)
    levels = sorted({known for known, _ in pairs} | {pred for _, pred in pairs})
    confusion = {str(k): {str(p): 0 for p in levels} for k in levels}
    for known, predicted in pairs:
        confusion[str(known)][str(predicted)] += 1
    per_level = {}
    for known in sorted({k for k, _ in pairs}):
        row = confusion[str(known)]
        total = sum(row.values())
        per_level[str(known)] = {"n": total, "agreement": round(row[str(known)] / total, 4)}
    correct = sum(1 for known, predicted in pairs if known == predicted)
    return {"n": len(pairs), "agreement": round(correct / len(pairs), 4) if pairs else None,
            "per_level": per_level, "confusion": confusion}


def format_summary(report: dict[str, Any]) -> str:
    """The report's counts as a small text table."""
    lines = [f"{'source':<14} {'read':>8} {'kept':>8} {'dropped':>8}  reasons"]
    for name, tally in report["sources"].items():
        dropped = sum(tally["dropped"].values())
        reasons = ", ".join(f"{reason}={count}" for reason, count in tally["dropped"].items()) or "-"
        lines.append(f"{name:<14} {tally['read']:>8} {tally['kept']:>8} {dropped:>8}  {reasons}")
    outputs = report.get("outputs", {})
    if outputs:
        lines.append("outputs: " + ", ".join(f"{name}={count}" for name, count in outputs.items()))
    index = report.get("retrieval", {}).get("index")
    if index:
        lines.append(f"retrieval index: {index['examples']} examples ({index['backend']}, "
                     f"{index['bytes'] / 1024:.0f} KiB)")
    verification = report.get("verification") or {}
    if "passed" in verification:
        lines.append(f"verified pairs: {verification['passed']} of {verification['pairs']} passed "
                     f"({', '.join(verification['devices']) or '-'}; {verification['cached']} from cache)"
                     + (f", failed by stage: {verification['failed_by_stage']}" if verification["failed"] else ""))
    elif verification.get("skipped"):
        lines.append(f"verified pairs: none ({verification['skipped']})")
    decontamination = report.get("decontamination") or {}
    if decontamination.get("by_computation") is not None:
        lines.append(f"decontaminated: {decontamination['by_text']} by text, {decontamination['by_computation']} by "
                     f"computation (untraceable: {decontamination['untraceable_pairs']} pairs, "
                     f"{len(decontamination['untraceable_eval_tasks'])} eval tasks; the text rule alone judged them)")
    missing = report.get("rl_task_ids_missing")
    if missing:
        lines.append(f"data.rl_task_ids not among the kept rows: {', '.join(missing)}")
    agreement = report.get("difficulty", {}).get("kernelbench_agreement")
    if agreement and agreement.get("n"):
        per_level = ", ".join(f"L{lvl} {v['agreement']:.2f}" for lvl, v in agreement["per_level"].items())
        lines.append(f"difficulty agreement on KernelBench: {agreement['agreement']:.3f} ({per_level})")
    return "\n".join(lines)
