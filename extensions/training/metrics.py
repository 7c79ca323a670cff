"""Training metrics to a JSONL file (always) and to the experiment trackers ``logging.report_to``
names, through accelerate's tracker classes (one object per step or round).

TensorBoard is the default and a listed dependency; Weights & Biases (``wandb``) and MLflow
(``mlflow``) are used only when named, and only if their package is installed: a named tracker
whose package is missing stops the stage at start-up with what to install, never hours later.
Only the main process writes; other ranks get a logger whose calls do nothing.
"""
from __future__ import annotations

import importlib.util
import json
import math
import os
import time
from pathlib import Path
from typing import Any, Sequence

# Tracker name in logging.report_to -> the package it needs.
TRACKER_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}
DEFAULT_TRACKERS = ("tensorboard",)


def check_trackers(report_to: Sequence[str]) -> None:
    """Raise ConfigError naming the first tracker that is unknown or whose package is missing."""
    from ..config import ConfigError

    for name in report_to:
        if name not in TRACKER_PACKAGES:
            raise ConfigError(f"logging.report_to: unknown tracker {name!r} (choose from {', '.join(TRACKER_PACKAGES)})")
        package = TRACKER_PACKAGES[name]
        if importlib.util.find_spec(package) is None:
            raise ConfigError(f"logging.report_to names {name}, but the package {package!r} is not installed: "
                              f"pip install {package}, or remove {name} from logging.report_to")


def start_trackers(report_to: Sequence[str], *, project: str, stage: str, tracker_root: Path) -> list:
    """Started accelerate trackers: TensorBoard under ``tracker_root/STAGE``; a W&B run ``PROJECT-STAGE``
    in project PROJECT; an MLflow run STAGE in experiment PROJECT ($MLFLOW_TRACKING_URI, default
    ./mlruns, says where MLflow keeps it)."""
    from accelerate.tracking import MLflowTracker, TensorBoardTracker, WandBTracker

    trackers = []
    for name in dict.fromkeys(report_to):  # each once, in the order given
        if name == "tensorboard":
            tracker = TensorBoardTracker(stage, str(tracker_root))
        elif name == "wandb":
            tracker = WandBTracker(project, name=f"{project}-{stage}", dir=os.environ.get("WANDB_DIR"))
        else:
            tracker = MLflowTracker(experiment_name=project, run_name=stage)
        tracker.start()
        trackers.append(tracker)
    return trackers


class MetricsLogger:
    def __init__(self, jsonl_path: Path, trackers: Sequence = (), *, enabled: bool = True):
        self.enabled = enabled
        self.jsonl_path = Path(jsonl_path)
        self.trackers = list(trackers) if enabled else []
        if enabled:
            self.jsonl_path.parent.mkdir(parents=True, exist_ok=True)

    @classmethod
    def for_stage(cls, paths, stage: str, *, enabled: bool = True, report_to: Sequence[str] = DEFAULT_TRACKERS,
                  project: str = "kernel-rl") -> "MetricsLogger":
        check_trackers(report_to)  # on every rank, so no rank trains on while the main one stops
        trackers: list = []
        if enabled and report_to:
            trackers = start_trackers(report_to, project=project, stage=stage,
                                      tracker_root=paths.tensorboard(stage).parent)
        return cls(paths.metrics_log(stage), trackers, enabled=enabled)

    def log(self, step: int, metrics: dict[str, Any], *, kind: str = "step") -> None:
        if not self.enabled:
            return
        record = {"kind": kind, "step": step, "time": time.time(), **metrics}
        with open(self.jsonl_path, "a") as handle:
            handle.write(json.dumps(record, default=str) + "\n")
        scalars = {f"{kind}/{name}": value for name, value in _flatten(metrics).items()
                   if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)}
        if not scalars:
            return
        for tracker in self.trackers:
            if tracker.name == "wandb":
                # W&B drops a step lower than one already logged; RL's step and round counters interleave.
                tracker.log({**scalars, f"{kind}/step": step})
            else:
                tracker.log(scalars, step=step)
            writer = getattr(tracker, "writer", None)
            if writer is not None:
                writer.flush()  # TensorBoard: a crash must not lose the last steps

    def log_histogram(self, tag: str, values, step: int) -> None:
        """A distribution (e.g. a round's advantages) as a histogram, in the trackers that keep one
        (TensorBoard); the JSONL record carries its bins separately."""
        if not (self.enabled and len(values)):
            return
        import numpy as np

        for tracker in self.trackers:
            writer = getattr(tracker, "writer", None)
            if writer is not None and hasattr(writer, "add_histogram"):
                writer.add_histogram(tag, np.asarray(values, dtype=np.float64), step)
                writer.flush()

    def close(self) -> None:
        for tracker in self.trackers:
            tracker.finish()
        self.trackers = []


def _flatten(metrics: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{name}/"))
        else:
            flat[name] = value
    return flat
