"""Running the training stages in order, with the save/stop signal wired in."""
from __future__ import annotations

import logging

from ..interrupt import SaveSignal
from ..paths import RunPaths

# The process stopped on request after saving; rerunning the same command resumes.
EXIT_STOPPED = 75


def run_stages(cfg, stage: str, *, force: bool = False, progress: bool = True, verify_fn=None) -> bool:
    """Run ``sft``, ``rl`` or ``all``; True when a save-and-stop request ended the run early."""
    from .rl import run_rl
    from .sft import run_sft

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    signal = SaveSignal.for_run(RunPaths.from_config(cfg))
    signal.install_signal_handlers()
    if stage in ("sft", "all"):
        outcome = run_sft(cfg, save_signal=signal, force=force, progress=progress)
        if outcome.status == "stopped":
            return True
    if stage in ("rl", "all"):
        outcome = run_rl(cfg, save_signal=signal, force=force, progress=progress, verify_fn=verify_fn)
        if outcome.status == "stopped":
            return True
    return False
