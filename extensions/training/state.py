"""Exact-resume state: RNG streams, optimizer, scheduler and the trainer's position in its data.

RNG states are stored as plain tensors/lists (``torch.load(weights_only=True)`` safe): Python's
``random``, NumPy's global generator, torch CPU and every CUDA device. Each rank writes its own file
because dropout streams differ per rank.
"""
from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

OPTIMIZER_FILE = "optimizer.pt"
SCHEDULER_FILE = "scheduler.pt"
TRAINER_STATE_FILE = "trainer_state.json"


def rng_file(rank: int) -> str:
    return f"rng_state_rank{rank}.pt"


@dataclass
class TrainerState:
    """Where training stands; with the epoch plan this names the next micro-batch exactly."""

    step: int = 0  # optimizer steps done
    total_steps: int = 0
    steps_per_epoch: int = 0
    tokens_seen: int = 0
    last_eval_loss: Optional[float] = None
    history: list[dict] = field(default_factory=list)  # eval losses by step

    @property
    def epoch(self) -> int:
        return self.step // self.steps_per_epoch if self.steps_per_epoch else 0

    @property
    def step_in_epoch(self) -> int:
        return self.step % self.steps_per_epoch if self.steps_per_epoch else 0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "epoch": self.epoch, "step_in_epoch": self.step_in_epoch}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrainerState":
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


def capture_rng_state() -> dict[str, Any]:
    import numpy as np
    import torch

    np_state = np.random.get_state()
    state: dict[str, Any] = {
        "python": json.dumps(random.getstate()),
        "numpy": {"name": np_state[0], "keys": np_state[1].tolist(), "pos": int(np_state[2]),
                  "has_gauss": int(np_state[3]), "cached_gaussian": float(np_state[4])},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    import numpy as np
    import torch

    version, internal, gauss = json.loads(state["python"])
    random.setstate((version, tuple(internal), gauss))
    n = state["numpy"]
    np.random.set_state((n["name"], np.array(n["keys"], dtype=np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        cuda_states = state["cuda"]
        if len(cuda_states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda_states)


def save_rng_state(directory: Path, rank: int) -> None:
    import torch

    torch.save(capture_rng_state(), Path(directory) / rng_file(rank))


def load_rng_state(directory: Path, rank: int) -> bool:
    """Restore this rank's RNG streams; False when the checkpoint holds none for this rank."""
    import torch

    path = Path(directory) / rng_file(rank)
    if not path.is_file():
        return False
    restore_rng_state(torch.load(path, weights_only=True))
    return True


def save_optimizer(directory: Path, optimizer, scheduler=None) -> None:
    import torch

    torch.save(optimizer.state_dict(), Path(directory) / OPTIMIZER_FILE)
    if scheduler is not None:
        torch.save(scheduler.state_dict(), Path(directory) / SCHEDULER_FILE)


def load_optimizer(directory: Path, optimizer, scheduler=None, map_location=None) -> None:
    import torch

    directory = Path(directory)
    optimizer.load_state_dict(torch.load(directory / OPTIMIZER_FILE, map_location=map_location, weights_only=True))
    if scheduler is not None:
        scheduler.load_state_dict(torch.load(directory / SCHEDULER_FILE, weights_only=True))


def save_trainer_state(directory: Path, state: TrainerState) -> None:
    from ..runtime.io import atomic_write_json

    atomic_write_json(Path(directory) / TRAINER_STATE_FILE, state.to_dict())


def load_trainer_state(directory: Path) -> TrainerState:
    return TrainerState.from_dict(json.loads((Path(directory) / TRAINER_STATE_FILE).read_text()))
