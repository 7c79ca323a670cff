"""Which stages of a run are done, judged from its files only, and the commands that continue it.

A stage is done when its complete output exists: prepare when ``prepare_report.json`` and every
processed file exist; SFT when ``sft/final`` is a complete checkpoint; RL when ``rl/final`` is;
evaluation when ``outputs/compare.json`` exists. run_pipeline.sh and resume_training.py both ask
this module, so "done" means the same thing to both.
"""
from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ..checkpoints import is_complete, newest_complete, read_meta
from ..paths import RunPaths

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


def read_run_state(paths: RunPaths) -> RunState:
    missing = [p.name for p in prepared_files(paths) if not p.is_file()]
    return RunState(
        root=paths.root,
        prepared=not missing,
        sft_done=is_complete(paths.final("sft")),
        rl_done=is_complete(paths.final("rl")),
        evaluated=paths.compare_json.is_file(),
        missing_data=missing,
        newest_sft=newest_complete(paths.stage_dir("sft")),
        newest_rl=newest_complete(paths.stage_dir("rl")),
    )


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

    def describe(self) -> str:
        if not self.stages:
            return (f"run at {self.state.root} is finished: rl/final is complete and compare.json exists; "
                    "nothing to do")
        lines = [f"run at {self.state.root}: next stage {self.stages[0]} ({self.position})"]
        if self.resume_from is not None:
            lines.append(f"  continues from {self.resume_from}")
        lines += ["  " + shlex.join(command) for command in self.commands]
        return "\n".join(lines)


def _position(state: RunState) -> tuple[Optional[Path], str]:
    stage = state.next_stage
    if stage == "sft":
        if state.newest_sft is None:
            return None, "SFT from the start"
        return state.newest_sft, f"SFT from step {_index(state.newest_sft, 'step')}"
    if stage == "rl":
        if state.newest_rl is None:
            return None, "RL from round 0 (on sft/final)"
        return state.newest_rl, f"RL after round {_index(state.newest_rl, 'round')}"
    if stage == "prepare":
        return None, "data not prepared (missing: " + ", ".join(state.missing_data) + ")"
    if stage == "eval":
        return None, "training finished, comparison not yet written"
    return None, "finished"


def _index(checkpoint: Path, key: str):
    try:
        value = read_meta(checkpoint).get(key)
    except (OSError, ValueError):
        value = None
    return value if value is not None else checkpoint.name


def plan_resume(paths: RunPaths, python: str, scripts_dir: Path, config_args: list[str],
                device_map: Optional[str] = None) -> ResumePlan:
    state = read_run_state(paths)
    stages = [stage for stage in STAGE_ORDER if not state.done(stage)]
    resume_from, position = _position(state)
    launcher = training_launcher(python, device_map) if {"sft", "rl"} & set(stages) else None
    commands = [stage_command(stage, python, scripts_dir, config_args, launcher) for stage in stages]
    return ResumePlan(state, stages, commands, resume_from, position)


def shell_assignments(paths: RunPaths, state: RunState, s3_uri: Optional[str] = None,
                      device_map: Optional[str] = None) -> str:
    """``NAME=value`` lines for ``eval`` in run_pipeline.sh: stage status and where things are."""
    values = {
        "RUN_ROOT": state.root,
        "PREPARE_DONE": int(state.prepared),
        "SFT_DONE": int(state.sft_done),
        "RL_DONE": int(state.rl_done),
        "EVAL_DONE": int(state.evaluated),
        "DATA_DIR": paths.processed,
        "SFT_FINAL": paths.final("sft"),
        "RL_FINAL": paths.final("rl"),
        "COMPARE_MD": paths.compare_md,
        "OUTPUTS_DIR": paths.outputs,
        "LOGS_DIR": paths.logs,
        "S3_URI": s3_uri or "",
        "TRAIN_LAUNCHER": shlex.join(training_launcher(sys.executable, device_map)),
    }
    return "\n".join(f"{name}={shlex.quote(str(value))}" for name, value in values.items())
