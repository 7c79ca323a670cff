"""Which stages of a run are done, judged from its files only.

A stage is done when its complete output exists: prepare when ``prepare_report.json`` and every
processed file exist; SFT when ``sft/final`` is a complete checkpoint; RL when ``rl/final`` is;
evaluation when ``outputs/compare.json`` exists. Given the run's config, done also means made with
that config: prepare's report fingerprint matches the data inputs (else prepare runs again, as
prepare_data.py would), evaluation's comparison names the adapters and eval settings of now (else it
runs again, reusing generations by adapter content), and a training stage whose result was made
with other settings is *stale* (``extensions.runtime.freshness``): the run stops unless forced.
The pipeline runner and resume_training.py both ask this module, so "done" means the same thing to
both.

The files are read through a RunFiles view (``extensions.runtime.run_files``): this disk, or, for
``resume_training.py --dry-run --bucket``, the disk as the restore from S3 will leave it; then each
done stage also says whether its output is here already or comes with the restore.
"""
from __future__ import annotations

import json
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ..config.sections import PipelineConfig
from ..runtime.freshness import Freshness, StaleResultError, stage_freshness
from ..runtime.paths import RunPaths
from ..runtime.run_files import LOCAL_FILES, NotKnownBeforeRestore, RunFiles
from .launcher import training_launcher
from .stages import STAGE_ORDER, prepared_files, stage_named, stage_outputs


@dataclass
class RunState:
    root: Path
    prepared: bool
    sft_done: bool
    rl_done: bool
    evaluated: bool
    missing_data: list[str] = field(default_factory=list)
    newest_sft: Optional[Path] = None
    newest_rl: Optional[Path] = None
    stale: dict[str, Freshness] = field(default_factory=dict)  # training stages made with other settings
    restored: set[str] = field(default_factory=set)  # done stages whose output the restore from S3 brings
    unchecked: dict[str, str] = field(default_factory=dict)  # stage -> why its fit is judged after the restore

    def done(self, stage: str) -> bool:
        return {"prepare": self.prepared, "sft": self.sft_done, "rl": self.rl_done, "eval": self.evaluated}[stage]

    @property
    def next_stage(self) -> Optional[str]:
        return next((stage for stage in STAGE_ORDER if not self.done(stage)), None)

    @property
    def finished(self) -> bool:
        return self.next_stage is None


def _prepare_up_to_date(paths: RunPaths, cfg: PipelineConfig, files: RunFiles) -> bool:
    from ..data.pipeline import input_fingerprint, is_up_to_date
    from ..data.sources import SourceError

    try:
        return is_up_to_date(paths.processed, input_fingerprint(cfg.data, cfg.prompt), files)
    except (SourceError, OSError, ValueError):
        return False  # a source that cannot be read: prepare runs and reports why


def _comparison_current(paths: RunPaths, cfg: PipelineConfig, files: RunFiles) -> bool:
    from ..evaluation.commands import comparison_inputs

    try:
        recorded = json.loads(files.read_text(paths.compare_json)).get("inputs")
    except (OSError, ValueError, AttributeError):
        return False
    return recorded == comparison_inputs(cfg, paths, files)


def _judged(state: RunState, stage: str, check) -> bool:
    """``check()``; where only the restore can tell, the stage counts as fitting, as the listing
    suggests, and the plan says that the real run judges it after restoring."""
    try:
        return check()
    except NotKnownBeforeRestore as exc:
        state.unchecked[stage] = str(exc)
        return True


def read_run_state(paths: RunPaths, cfg: Optional[PipelineConfig] = None, force: bool = False, files: RunFiles = LOCAL_FILES) -> RunState:
    """Stage status from the files; with ``cfg``, results made with other settings are not done.

    A stale training stage raises StaleResultError (the message names what differs), unless
    ``force``: then it is listed in ``stale`` and counts as not done.
    """
    missing = [p.name for p in prepared_files(paths) if not files.is_file(p)]
    state = RunState(
        root=paths.root,
        prepared=not missing,
        sft_done=stage_named("sft").complete(paths, files),
        rl_done=stage_named("rl").complete(paths, files),
        evaluated=stage_named("eval").complete(paths, files),
        missing_data=missing,
        newest_sft=files.newest_complete(paths.stage_dir("sft")),
        newest_rl=files.newest_complete(paths.stage_dir("rl")),
    )
    if cfg is not None:
        _judge_against_config(state, paths, cfg, force, files)
    state.restored = {stage for stage, outputs in stage_outputs(paths).items()
                      if state.done(stage) and any(files.from_s3(path) for path in outputs)}
    return state


def _judge_against_config(state: RunState, paths: RunPaths, cfg: PipelineConfig, force: bool, files: RunFiles) -> None:
    state.prepared = state.prepared and _judged(state, "prepare", lambda: _prepare_up_to_date(paths, cfg, files))
    for stage in ("sft", "rl"):
        if not state.prepared and stage == "sft":
            continue  # the data is rebuilt first; the training stages are judged on it afterwards
        if stage == "rl" and "sft" in state.stale:
            state.stale["rl"] = Freshness("rl", paths.final("rl"), True, ["input sft adapter: retrained first"])
            continue
        try:
            freshness = stage_freshness(paths, cfg, stage, files)
        except NotKnownBeforeRestore as exc:
            state.unchecked[stage] = str(exc)
            continue
        if freshness.stale:
            if not force:
                raise StaleResultError(freshness.message("--force"))
            state.stale[stage] = freshness
    if "sft" in state.stale:
        state.newest_sft = None  # retrained from its start
    if "rl" in state.stale:
        state.newest_rl = None
    state.sft_done = state.sft_done and "sft" not in state.stale
    state.rl_done = state.rl_done and "rl" not in state.stale and state.sft_done
    state.evaluated = state.evaluated and state.rl_done and _judged(
        state, "eval", lambda: _comparison_current(paths, cfg, files))


def shell_assignments(paths: RunPaths, state: RunState, s3_uri: Optional[str] = None,
                     cfg: Optional[PipelineConfig] = None) -> str:
    """``NAME=value`` lines for ``eval`` in run_pipeline.sh: stage status and where things are."""
    values = {
        "CONFIG_FILE": (cfg.source or "") if cfg is not None else "",
        "CONFIG_REASON": (cfg.source_reason or "") if cfg is not None else "",
        "RUN_ROOT": state.root,
        "PREPARE_DONE": int(state.prepared),
        "SFT_DONE": int(state.sft_done),
        "RL_DONE": int(state.rl_done),
        "EVAL_DONE": int(state.evaluated),
        "SFT_STALE": int("sft" in state.stale),
        "RL_STALE": int("rl" in state.stale),
        "DATA_DIR": paths.processed,
        "SFT_FINAL": paths.final("sft"),
        "RL_FINAL": paths.final("rl"),
        "COMPARE_MD": paths.compare_md,
        "OUTPUTS_DIR": paths.outputs,
        "LOGS_DIR": paths.logs,
        "S3_URI": s3_uri or "",
        "TRAIN_LAUNCHER": shlex.join(training_launcher(sys.executable, cfg.model.device_map if cfg is not None else None)),
    }
    return "\n".join(f"{name}={shlex.quote(str(value))}" for name, value in values.items())
