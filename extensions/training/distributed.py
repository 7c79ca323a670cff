"""Data parallelism through accelerate: one process per GPU under ``accelerate launch``, or one
process on a CPU / a single GPU / a ``device_map="auto"`` model sharded over all GPUs.

Only rank 0 writes checkpoints and logs; every decision that changes control flow (save now, stop)
is agreed by all ranks so none waits alone at a barrier.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Sequence

if TYPE_CHECKING:  # accelerate loads torch; the first Dist made imports it
    from accelerate import Accelerator

_ACCELERATOR = None


def _accelerator(mixed_precision: str):
    # accelerate keeps process-wide state; one Accelerator per process serves SFT and RL alike.
    global _ACCELERATOR
    if _ACCELERATOR is None:
        from accelerate import Accelerator

        _ACCELERATOR = Accelerator(mixed_precision=mixed_precision)
    return _ACCELERATOR


@dataclass
class Dist:
    accelerator: Accelerator

    @property
    def rank(self) -> int:
        return self.accelerator.process_index

    @property
    def local_rank(self) -> int:
        return self.accelerator.local_process_index

    @property
    def world_size(self) -> int:
        return self.accelerator.num_processes

    @property
    def is_main(self) -> bool:
        return self.accelerator.is_main_process

    @property
    def device(self):
        return self.accelerator.device

    def barrier(self) -> None:
        if self.world_size > 1:
            self.accelerator.wait_for_everyone()

    def any(self, flag: bool) -> bool:
        """True on every rank when ``flag`` is true on at least one."""
        if self.world_size == 1:
            return flag
        return sum(self.sum([1.0 if flag else 0.0])) > 0

    def sum(self, values: Sequence[float]) -> list[float]:
        """Element-wise sum of ``values`` over ranks."""
        if self.world_size == 1:
            return list(values)
        import torch

        tensor = torch.tensor(list(values), dtype=torch.float64, device=self.device)
        return self.accelerator.reduce(tensor, reduction="sum").tolist()

    def gather_objects(self, items: list) -> list:
        """Concatenation of every rank's ``items`` (rank order), on every rank."""
        if self.world_size == 1:
            return list(items)
        from accelerate.utils import gather_object

        return gather_object(items)

    def shard(self, items: Sequence) -> list:
        """This rank's share of ``items`` (round robin), so no work is done twice."""
        return list(items[self.rank::self.world_size])

    def verifier_device(self, configured: str) -> Optional[str]:
        """The verifier device for this rank's candidates.

        The verifier takes "cpu" or "cuda" and spreads its workers over every visible GPU (a
        worker is pinned to one GPU through CUDA_VISIBLE_DEVICES, GPU timing is serialised per GPU),
        so each rank verifies only its own share of candidates, on whichever GPUs are free.
        """
        return None if configured == "auto" else configured

    def unwrap(self, model):
        return self.accelerator.unwrap_model(model)


def make_dist(model_cfg) -> Dist:
    """The process group for this run; bf16 autocast on GPUs when the weights are bf16."""
    import torch

    use_bf16 = torch.cuda.is_available() and model_cfg.dtype in ("auto", "bfloat16")
    return Dist(_accelerator("bf16" if use_bf16 else "no"))
