"""Which stages of a run are done, judged from its files only, and the commands that continue it.

A stage is done when its complete output exists: prepare when ``prepare_report.json`` and every
processed file exist; SFT when ``sft/final`` is a complete checkpoint; RL when ``rl/final`` is;
evaluation when ``outputs/compare.json`` exists. Given the run's config, done also means made with
that config: prepare's report fingerprint matches the data inputs (else prepare runs again, as
prepare_data.py would), evaluation's comparison names the adapters and eval settings of now (else it
runs again, reusing generations by adapter content), and a training stage whose result was made
with other settings is *stale* (``extensions.runtime.freshness``): the run stops unless forced.
run_pipeline.sh and resume_training.py both ask this module, so "done" means the same thing to both.

The files are read through a RunFiles view (``extensions.runtime.run_files``): this disk, or, for
``resume_training.py --dry-run --bucket``, the disk as the restore from S3 will leave it; then each
done stage also says whether its output is here already or comes with the restore.
"""
from __future__ import annotations

import json
import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ..runtime.paths import RunPaths
from ..runtime.run_files import LOCAL_FILES, NotKnownBeforeRestore, RunFiles
from ..runtime.freshness import Freshness, StaleResultError, stage_freshness

STAGE_ORDER = ("prepare", "sft", "rl", "eval")


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


def prepared_files(paths: RunPaths) -> list[Path]:
    return [paths.prepare_report, paths.sft_train, paths.sft_val, paths.difficulty_labels,
            paths.rl_tasks, paths.eval_tasks]


def stage_outputs(paths: RunPaths) -> dict[str, list[Path]]:
    """What each stage leaves behind when it is done."""
    return {"prepare": prepared_files(paths), "sft": [paths.final("sft")], "rl": [paths.final("rl")],
            "eval": [paths.compare_json]}


def _prepare_up_to_date(paths: RunPaths, cfg, files: RunFiles) -> bool:
    from ..data.pipeline import input_fingerprint, is_up_to_date
    from ..data.sources import SourceError

    try:
        return is_up_to_date(paths.processed, input_fingerprint(cfg.data, cfg.prompt), files)
    except (SourceError, OSError, ValueError):
        return False  # a source that cannot be read: prepare runs and reports why


def _comparison_current(paths: RunPaths, cfg, files: RunFiles) -> bool:
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


def read_run_state(paths: RunPaths, cfg=None, force: bool = False, files: RunFiles = LOCAL_FILES) -> RunState:
    """Stage status from the files; with ``cfg``, results made with other settings are not done.

    A stale training stage raises StaleResultError (the message names what differs), unless
    ``force``: then it is listed in ``stale`` and counts as not done.
    """
    missing = [p.name for p in prepared_files(paths) if not files.is_file(p)]
    state = RunState(
        root=paths.root,
        prepared=not missing,
        sft_done=files.is_complete(paths.final("sft")),
        rl_done=files.is_complete(paths.final("rl")),
        evaluated=files.is_file(paths.compare_json),
        missing_data=missing,
        newest_sft=files.newest_complete(paths.stage_dir("sft")),
        newest_rl=files.newest_complete(paths.stage_dir("rl")),
    )
    if cfg is not None:
        _judge_against_config(state, paths, cfg, force, files)
    state.restored = {stage for stage, outputs in stage_outputs(paths).items()
                      if state.done(stage) and any(files.from_s3(path) for path in outputs)}
    return state


def _judge_against_config(state: RunState, paths: RunPaths, cfg, force: bool, files: RunFiles) -> None:
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


def stage_command(stage: str, python: str, scripts_dir: Path, config_args: list[str],
                  launcher: Optional[list[str]] = None) -> list[str]:
    script = {"prepare": "prepare_data.py", "sft": "train_integrated.py", "rl": "train_integrated.py",
              "eval": "evaluate.py"}[stage]
    extra = {"sft": ["--stage", "sft"], "rl": ["--stage", "rl"], "eval": ["--compare"]}.get(stage, [])
    start = (launcher or [python]) if stage in ("sft", "rl") else [python]
    return [*start, str(Path(scripts_dir) / script), *extra, *config_args]


@dataclass
class ResumePlan:
    state: RunState
    stages: list[str]  # still to run, in order
    commands: list[list[str]]
    resume_from: Optional[Path]  # the checkpoint the first training stage continues from
    position: str  # "SFT step 40", "RL round 3", ...
    resume_from_s3: bool = False  # resume_from is a checkpoint the restore brings

    def stage_lines(self) -> list[str]:
        """One line per stage: done locally, done in S3 (restored first), or will run."""
        state, lines = self.state, []
        for stage in STAGE_ORDER:
            if state.done(stage):
                status = "done in S3 (will be restored)" if stage in state.restored else "done locally"
            elif stage in state.stale:
                status = "will run (--force: its result was made with other settings)"
            else:
                status = "will run"
            if stage in state.unchecked:
                status += f"; whether it fits this config is checked after the restore: {state.unchecked[stage]}"
            lines.append(f"  {stage:<8} {status}")
        return lines

    def describe(self) -> str:
        if not self.stages:
            return "\n".join([f"run at {self.state.root} is finished: rl/final is complete and compare.json "
                              "exists; nothing to do", *self.stage_lines()])
        lines = [f"run at {self.state.root}: next stage {self.stages[0]} ({self.position})", *self.stage_lines()]
        if self.resume_from is not None:
            where = " (in S3, will be restored)" if self.resume_from_s3 else ""
            lines.append(f"  continues from {self.resume_from}{where}")
        lines += ["  " + shlex.join(command) for command in self.commands]
        return "\n".join(lines)


def _position(state: RunState, files: RunFiles) -> tuple[Optional[Path], str]:
    stage = state.next_stage
    if stage == "sft":
        if state.newest_sft is None:
            return None, "SFT from the start"
        return state.newest_sft, f"SFT from step {_index(state.newest_sft, 'step', files)}"
    if stage == "rl":
        if state.newest_rl is None:
            return None, "RL from round 0 (on sft/final)"
        return state.newest_rl, f"RL after round {_index(state.newest_rl, 'round', files)}"
    if stage == "prepare":
        return None, "data not prepared (missing: " + ", ".join(state.missing_data) + ")"
    if stage == "eval":
        return None, "training finished, comparison not yet written"
    return None, "finished"


def _index(checkpoint: Path, key: str, files: RunFiles):
    try:
        value = files.read_meta(checkpoint).get(key)
    except (OSError, ValueError, NotKnownBeforeRestore):
        value = None
    return value if value is not None else checkpoint.name


def plan_resume(paths: RunPaths, python: str, scripts_dir: Path, config_args: list[str], cfg=None,
                force: bool = False, files: RunFiles = LOCAL_FILES) -> ResumePlan:
    """The stages still to run and their commands; a stale stage stops the plan unless ``force``,
    which retrains it (``--force``) and everything after it. ``files``: the view of the run the plan
    is made from (the disk, or the disk as a restore will leave it)."""
    state = read_run_state(paths, cfg, force=force, files=files)
    stages = [stage for stage in STAGE_ORDER if not state.done(stage)]
    resume_from, position = _position(state, files)
    launcher = training_launcher(python, cfg.model.device_map if cfg is not None else None) if {"sft", "rl"} & set(stages) else None
    commands = [stage_command(stage, python, scripts_dir, config_args, launcher)
                + (["--force"] if stage in state.stale else []) for stage in stages]
    return ResumePlan(state, stages, commands, resume_from, position,
                      resume_from_s3=resume_from is not None and files.from_s3(resume_from))


def shell_assignments(paths: RunPaths, state: RunState, s3_uri: Optional[str] = None, cfg=None) -> str:
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
