"""Training metrics to TensorBoard and to a JSONL file (one object per step or round).

Only the main process writes; other ranks get a logger whose calls do nothing.
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Optional


class MetricsLogger:
    def __init__(self, jsonl_path: Path, tensorboard_dir: Optional[Path], *, enabled: bool = True):
        self.enabled = enabled
        self.jsonl_path = Path(jsonl_path)
        self._writer = None
        if not enabled:
            return
        self.jsonl_path.parent.mkdir(parents=True, exist_ok=True)
        if tensorboard_dir is not None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as exc:  # tensorboard is a listed dependency; say so rather than crash
                print(f"[metrics] TensorBoard unavailable ({exc}); writing JSONL only", flush=True)
            else:
                Path(tensorboard_dir).mkdir(parents=True, exist_ok=True)
                self._writer = SummaryWriter(log_dir=str(tensorboard_dir))

    @classmethod
    def for_stage(cls, paths, stage: str, *, enabled: bool = True) -> "MetricsLogger":
        return cls(paths.metrics_log(stage), paths.tensorboard(stage), enabled=enabled)

    def log(self, step: int, metrics: dict[str, Any], *, kind: str = "step") -> None:
        if not self.enabled:
            return
        record = {"kind": kind, "step": step, "time": time.time(), **metrics}
        with open(self.jsonl_path, "a") as handle:
            handle.write(json.dumps(record, default=str) + "\n")
        if self._writer is not None:
            for name, value in _flatten(metrics).items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                    self._writer.add_scalar(f"{kind}/{name}", value, step)
            self._writer.flush()

    def log_histogram(self, tag: str, values, step: int) -> None:
        """A distribution (e.g. a round's advantages) as a TensorBoard histogram."""
        if self.enabled and self._writer is not None and len(values):
            import numpy as np

            self._writer.add_histogram(tag, np.asarray(values, dtype=np.float64), step)
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def _flatten(metrics: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{name}/"))
        else:
            flat[name] = value
    return flat
