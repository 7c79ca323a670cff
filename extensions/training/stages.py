"""Running the training stages in order, with the save/stop signal wired in.

Before a stage runs, its saved result (``final/``, or the newest checkpoint it would resume from)
must have been made with this run's settings (``extensions.stage_freshness``), and RL needs its
SFT adapter unless ``rl.init`` is ``base``. ``force`` retrains instead.
"""
from __future__ import annotations

import logging

from ..interrupt import SaveSignal
from ..paths import RunPaths
from ..stage_freshness import require_fresh, require_rl_start

# The process stopped on request after saving; rerunning the same command resumes.
EXIT_STOPPED = 75


def run_stages(cfg, stage: str, *, force: bool = False, progress: bool = True, verify_fn=None) -> bool:
    """Run ``sft``, ``rl`` or ``all``; True when a save-and-stop request ended the run early."""
    from .rl import run_rl
    from .sft import run_sft

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    paths = RunPaths.from_config(cfg)
    signal = SaveSignal.for_run(paths)
    signal.install_signal_handlers()
    if stage in ("sft", "all"):
        if not force:
            require_fresh(paths, cfg, "sft")
        outcome = run_sft(cfg, save_signal=signal, force=force, progress=progress)
        if outcome.status == "stopped":
            return True
    if stage in ("rl", "all"):
        if not force:
            require_fresh(paths, cfg, "rl")
        require_rl_start(paths, cfg)
        outcome = run_rl(cfg, save_signal=signal, force=force, progress=progress, verify_fn=verify_fn)
        if outcome.status == "stopped":
            return True
    return False
