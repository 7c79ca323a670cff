"""Which config a command uses when none is named: production with a GPU, the CPU smoke run without.

Every entry point and run_pipeline.sh ask ``default_config`` (run_pipeline.sh through
``python -m extensions.pipeline state``), so a bare ``python evaluate.py --compare`` on a laptop reads
the same run as ``./run_pipeline.sh`` did there.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CONFIG = PROJECT_ROOT / "configs" / "default.yaml"
SMOKE_CONFIG = PROJECT_ROOT / "configs" / "smoke.yaml"


@dataclass(frozen=True)
class ConfigChoice:
    path: Path
    reason: str


def cuda_gpu_visible() -> bool:
    """True when a CUDA GPU is usable here, asked of nvidia-smi (instant; no torch import).

    ``CUDA_VISIBLE_DEVICES`` set to nothing (or -1) hides every GPU from CUDA programs, so it
    counts as no GPU whatever nvidia-smi lists.
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return False
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return any(line.startswith("GPU ") for line in listing.splitlines())


def default_config() -> ConfigChoice:
    if cuda_gpu_visible():
        return ConfigChoice(DEFAULT_CONFIG, "a CUDA GPU is visible: the production config")
    return ConfigChoice(SMOKE_CONFIG, "no CUDA GPU visible: the CPU smoke config")
