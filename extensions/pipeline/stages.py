"""The stage table: every stage of the pipeline, in the order the pipeline runs them.

Each stage names the script that runs it, the arguments that select it, whether it trains (and so
starts through the training launcher, one process per GPU), and the files it leaves behind when it
is done. run_state.py judges "done" from those files; runner.py and resume_training.py run the
commands built here; run_pipeline.sh knows none of this and asks the runner.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from ..runtime.paths import RunPaths
from ..runtime.run_files import LOCAL_FILES, RunFiles

REPOSITORY_ROOT = Path(__file__).resolve().parents[2]
SCRIPTS_DIR_ENV = "KERNEL_RL_SCRIPTS_DIR"  # where the stage scripts live; tests point it at stand-ins


def prepared_files(paths: RunPaths) -> list[Path]:
    return [paths.prepare_report, paths.sft_train, paths.sft_val, paths.difficulty_labels,
            paths.rl_tasks, paths.eval_tasks]


@dataclass(frozen=True)
class Stage:
    name: str
    script: str
    arguments: tuple[str, ...]
    trains: bool  # started by the training launcher; its outputs are checkpoints
    outputs: Callable[[RunPaths], list[Path]]  # what the stage leaves behind when it is done

    def complete(self, paths: RunPaths, files: RunFiles = LOCAL_FILES) -> bool:
        """Its output exists whole: every file, or every checkpoint with its manifest written.
        Whether the output also fits this run's config is run_state.py's question."""
        exists = files.is_complete if self.trains else files.is_file
        return all(exists(path) for path in self.outputs(paths))


STAGES = (
    Stage("prepare", "prepare_data.py", (), False, prepared_files),
    Stage("sft", "train_integrated.py", ("--stage", "sft"), True, lambda paths: [paths.final("sft")]),
    Stage("rl", "train_integrated.py", ("--stage", "rl"), True, lambda paths: [paths.final("rl")]),
    Stage("eval", "evaluate.py", ("--compare",), False, lambda paths: [paths.compare_json]),
)
STAGE_ORDER = tuple(stage.name for stage in STAGES)
_BY_NAME = {stage.name: stage for stage in STAGES}


def stage_named(name: str) -> Stage:
    return _BY_NAME[name]


def stage_outputs(paths: RunPaths) -> dict[str, list[Path]]:
    """What each stage leaves behind when it is done."""
    return {stage.name: stage.outputs(paths) for stage in STAGES}


def scripts_dir() -> Path:
    return Path(os.environ.get(SCRIPTS_DIR_ENV) or REPOSITORY_ROOT)


def stage_command(stage: str, python: str, scripts_dir: Path, config_args: list[str],
                  launcher: Optional[list[str]] = None) -> list[str]:
    """The command that runs ``stage``: a training stage through ``launcher`` (the plain interpreter
    without one), the others with ``python``."""
    spec = stage_named(stage)
    start = (launcher or [python]) if spec.trains else [python]
    return [*start, str(Path(scripts_dir) / spec.script), *spec.arguments, *config_args]
