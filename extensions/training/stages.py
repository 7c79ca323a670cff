"""Running the training stages in order, with the save/stop signal wired in.

Before a stage runs, its saved result (``final/``, or the newest checkpoint it would resume from)
must have been made with this run's settings (``extensions.runtime.freshness``), and RL needs its
SFT adapter unless ``rl.init`` is ``base``. ``force`` retrains instead. With
``checkpoint.push_to_hub`` the RL stage's final adapter, once finished (or found finished), is
pushed to ``checkpoint.hub_model_id`` with its model card brought up to date; a failed push is a
warning and leaves the adapter in place.
"""
from __future__ import annotations

import logging

from ..config.sections import PipelineConfig
from ..runtime.freshness import require_fresh, require_rl_start
from ..runtime.interrupt import SaveSignal
from ..runtime.paths import RunPaths
from ..runtime.run_lock import is_secondary_rank

# The process stopped on request after saving; rerunning the same command resumes.
EXIT_STOPPED = 75


def run_stages(cfg: PipelineConfig, stage: str, *, force: bool = False, progress: bool = True, verify_fn=None) -> bool:
    """Run ``sft``, ``rl`` or ``all``; True when a save-and-stop request ended the run early."""
    from .rl import run_rl
    from .sft import run_sft

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    for client in ("httpx", "httpx2"):  # the hub client's HTTP layer logs every request at INFO
        logging.getLogger(client).setLevel(logging.WARNING)
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
        if cfg.checkpoint.push_to_hub and not is_secondary_rank():
            from ..export.hub import push_final_adapter

            push_final_adapter(paths.final("rl"), cfg.checkpoint, paths=paths, stage="rl",
                               log=lambda line: print(line, flush=True))
    return False
