"""How training stages start: $KERNEL_RL_TRAIN_LAUNCHER when it is set, else one process per
visible GPU through ``accelerate launch`` (data parallel), or one process in all when
``model.device_map`` shards a single model over every GPU."""
from __future__ import annotations

import os
import shlex
from typing import Optional

LAUNCHER_ENV = "KERNEL_RL_TRAIN_LAUNCHER"


def gpus_from_cuda_visible_devices(value: str) -> int:
    """How many GPUs a CUDA_VISIBLE_DEVICES value exposes: CUDA takes the comma-separated entries
    (indices, GPU-/MIG- UUIDs) up to the first invalid one, so "0,-1,2" exposes one GPU, "" none."""
    count = 0
    for entry in value.split(","):
        entry = entry.strip()
        if not entry or entry.startswith("-") or not (entry.isdigit() or entry.upper().startswith(("GPU-", "MIG-"))):
            break
        count += 1
    return count


def visible_gpus() -> int:
    """GPUs this process may use: CUDA_VISIBLE_DEVICES when it is set, else the GPUs ``nvidia-smi -L``
    lists (0 without a driver). No torch import, so it is instant."""
    import shutil
    import subprocess

    if "CUDA_VISIBLE_DEVICES" in os.environ:
        return gpus_from_cuda_visible_devices(os.environ["CUDA_VISIBLE_DEVICES"])
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in listing.splitlines() if line.startswith("GPU "))


def training_launcher(python: str, device_map: Optional[str] = None) -> list[str]:
    """How training stages start: $KERNEL_RL_TRAIN_LAUNCHER if set; the plain interpreter when
    ``model.device_map`` is set (one process shards the model over every GPU); else ``accelerate
    launch`` with one process per GPU when there are several (data parallel)."""
    override = os.environ.get(LAUNCHER_ENV)
    if override:
        return shlex.split(override)
    if device_map:
        return [python]
    gpus = visible_gpus()
    if gpus > 1:
        return [python, "-m", "accelerate.commands.launch", "--num_processes", str(gpus)]
    return [python]
