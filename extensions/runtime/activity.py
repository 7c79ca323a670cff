"""What RL actually did in a run, read from its logs: how many candidates reached each verifier
stage, and how many optimizer steps (RL updates) changed the adapter.

A small model can finish every stage of the pipeline without a single candidate reaching the
sandbox or a single RL update, and the run's summary would still say "done". These counts say
whether the machinery ran, not just whether the stages returned 0. Sources: the per-round
candidate logs (``logs/rl/round-NNN.candidates.jsonl``, the verdict of every candidate) and the RL
metrics log (``logs/rl_metrics.jsonl``, one ``step`` row per optimizer step).

    python -m extensions.runtime.activity [--config F | --smoke]    # the lines run_pipeline.sh prints
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator

from .io import BadLine, read_jsonl
from .paths import RunPaths

# The verifier's funnel, in order (extensions.verify.result.STAGES): a candidate whose last passed
# stage is "compile" reached extract, static and compile. "compile" and later run in the sandbox.
FUNNEL = ("extract", "static", "compile", "tiny", "full", "timing")


@dataclass
class RLActivity:
    rounds_logged: int = 0  # rounds with a candidate log
    candidates_judged: int = 0
    reached: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FUNNEL, 0))
    correct: int = 0
    optimizer_steps: int = 0  # distinct RL optimizer steps in the metrics log
    rounds_with_updates: int = 0
    damaged_lines: int = 0

    def to_json(self) -> dict:
        return asdict(self)

    def describe(self) -> list[str]:
        if not self.rounds_logged:
            return ["RL: no candidate log yet (RL has not run)"]
        funnel = ", ".join(f"{stage} {self.reached[stage]}" for stage in FUNNEL)
        lines = [f"RL candidates: {self.candidates_judged} judged in {self.rounds_logged} round(s); passed {funnel}; "
                 f"{self.correct} correct",
                 f"RL updates: {self.optimizer_steps} optimizer step(s) in {self.rounds_with_updates} round(s)"]
        if self.reached["compile"] == 0:
            lines.append("  no candidate reached the sandbox (compile stage): the model wrote no runnable ModelNew")
        if self.optimizer_steps == 0:
            lines.append("  no RL update happened: no candidate reached rl.reward_threshold, the adapter is SFT's")
        if self.damaged_lines:
            lines.append(f"  {self.damaged_lines} damaged log line(s) skipped")
        return lines


def _json_rows(path: Path, activity: RLActivity) -> Iterator[dict]:
    def count_damage(bad: BadLine) -> None:
        if bad.json_error is not None:  # a crash mid-write leaves a partial last line
            activity.damaged_lines += 1

    return (row for _, row in read_jsonl(path, count_damage))


def rl_activity(paths: RunPaths) -> RLActivity:
    activity = RLActivity()
    for log in sorted((paths.logs / "rl").glob("round-*.candidates.jsonl")):
        activity.rounds_logged += 1
        verdicts: dict[tuple, dict] = {}
        for row in _json_rows(log, activity):
            if row.get("type") == "verdict" and isinstance(row.get("result"), dict):
                # A resumed round may log a verdict again: the last one per sample (per turn) counts.
                verdicts[(row.get("task_id"), row.get("sample_index"), row.get("turn"), row.get("sha1"))] = row["result"]
        for result in verdicts.values():
            activity.candidates_judged += 1
            stage = result.get("stage")
            depth = FUNNEL.index(stage) + 1 if stage in FUNNEL else 0
            for passed in FUNNEL[:depth]:
                activity.reached[passed] += 1
            activity.correct += bool(result.get("correct"))
    metrics = paths.metrics_log("rl")
    if metrics.is_file():
        steps, rounds = set(), set()
        for row in _json_rows(metrics, activity):
            if row.get("kind") == "step":
                steps.add(row.get("step"))  # a step replayed after a resume counts once
                rounds.add(row.get("round"))
        activity.optimizer_steps, activity.rounds_with_updates = len(steps), len(rounds)
    return activity


def main(argv=None) -> int:
    from ..config import add_config_args, config_from_args

    parser = argparse.ArgumentParser(prog="python -m extensions.runtime.activity", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print the counts as one JSON object")
    add_config_args(parser)
    args = parser.parse_args(argv)
    activity = rl_activity(RunPaths.from_config(config_from_args(args)))
    print(json.dumps(activity.to_json()) if args.json else "\n".join(activity.describe()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
