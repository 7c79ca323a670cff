"""Running what is left of a run, stage by stage, in the order of the stage table.

``plan_resume`` says which stages are left, where training continues and the command of each stage;
``execute_plan`` runs such a plan for resume_training.py (the last stage replaces the process).
``PipelineRun`` is the pipeline's loop behind run_pipeline.sh: each stage whose complete output exists
and fits this config is skipped; the others run one at a time, and after each one the run's files
must show it done before the next starts. The first failure ends the run with the stage's exit
status (75: it saved a checkpoint on request and stopped; 3: it exited 0 without its output; 2: a
saved result does not fit this command), and a summary closes every run, whatever its end.
"""
from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ..config.sections import PipelineConfig
from ..runtime.activity import rl_activity
from ..runtime.freshness import StaleResultError
from ..runtime.paths import RunPaths
from ..runtime.run_files import LOCAL_FILES, NotKnownBeforeRestore, RunFiles
from .launcher import training_launcher
from .run_state import RunState, read_run_state
from .stages import STAGE_ORDER, STAGES, stage_command, stage_named

EXIT_STOPPED_AFTER_SAVE = 75  # train_integrated.py: saved a complete checkpoint on request, then stopped
EXIT_INCOMPLETE = 3
EXIT_STALE = 2
EXIT_INTERRUPTED = 130


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


def plan_resume(paths: RunPaths, python: str, scripts_dir: Path, config_args: list[str],
                cfg: Optional[PipelineConfig] = None,
                force: bool = False, files: RunFiles = LOCAL_FILES) -> ResumePlan:
    """The stages still to run and their commands; a stale stage stops the plan unless ``force``,
    which retrains it (``--force``) and everything after it. ``files``: the view of the run the plan
    is made from (the disk, or the disk as a restore will leave it)."""
    state = read_run_state(paths, cfg, force=force, files=files)
    stages = [stage for stage in STAGE_ORDER if not state.done(stage)]
    resume_from, position = _position(state, files)
    trains = any(stage_named(stage).trains for stage in stages)
    launcher = training_launcher(python, cfg.model.device_map if cfg is not None else None) if trains else None
    commands = [stage_command(stage, python, scripts_dir, config_args, launcher)
                + (["--force"] if stage in state.stale else []) for stage in stages]
    return ResumePlan(state, stages, commands, resume_from, position,
                      resume_from_s3=resume_from is not None and files.from_s3(resume_from))


def execute_plan(plan: ResumePlan, paths: RunPaths) -> int:
    """Run the remaining stages in order; the last one replaces this process (signals reach it)."""
    for stage, command in zip(plan.stages[:-1], plan.commands[:-1]):
        print(f"[resume] stage {stage}: {' '.join(command)}", flush=True)
        code = subprocess.call(command)
        if code != 0:
            print(f"[resume] stage {stage} failed with exit code {code}", file=sys.stderr)
            return code
        if not read_run_state(paths).done(stage):
            print(f"[resume] stage {stage} exited 0 but its output is not complete (stopped by a save "
                  "request?); run resume_training.py again to continue", file=sys.stderr)
            return EXIT_INCOMPLETE
    print(f"[resume] stage {plan.stages[-1]}: {' '.join(plan.commands[-1])}", flush=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(plan.commands[-1][0], plan.commands[-1])
    return 0  # not reached


def log(message: str) -> None:
    print(f"[pipeline {time.strftime('%H:%M:%S')}] {message}", flush=True)


def banner(title: str) -> None:
    print(f"\n======== {title} ========", flush=True)


def duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 60}m{seconds % 60:02d}s"


def _ignore_sigint() -> None:
    # The stages start as run_pipeline.sh's own background jobs always did: with SIGINT ignored
    # until they install their handlers, so a Ctrl-C reaches them as the save-and-stop request the
    # pipeline sends (SIGTERM), not as a KeyboardInterrupt at an arbitrary point.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@dataclass
class PipelineRun:
    """One run of the remaining stages, as run_pipeline.sh starts it."""

    paths: RunPaths
    cfg: PipelineConfig
    config_args: list[str]
    force: bool = False
    s3_uri: Optional[str] = None
    python: str = sys.executable
    scripts_dir: Path = field(default_factory=lambda: Path("."))
    stage_lines: list[str] = field(default_factory=list)
    failed: Optional[str] = None
    signal_name: Optional[str] = None  # set by SIGINT/SIGTERM
    _child: Optional[subprocess.Popen] = None
    _running: Optional[str] = None
    _state: Optional[RunState] = None
    _launcher: Optional[list[str]] = None
    _started: float = field(default_factory=time.monotonic)

    def _read_state(self) -> RunState:
        self._state = read_run_state(self.paths, self.cfg, force=self.force)
        return self._state

    def _on_signal(self, signum, _frame) -> None:
        # Only records the signal and passes SIGTERM on (the stage saves and stops); the loop reports.
        self.signal_name = self.signal_name or signal.Signals(signum).name
        if self._child is not None and self._child.poll() is None:
            try:
                self._child.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass

    def _command(self, stage: str, stale: bool) -> list[str]:
        launcher = None
        if stage_named(stage).trains:
            if self._launcher is None:
                self._launcher = training_launcher(self.python, self.cfg.model.device_map)
            launcher = self._launcher
        return stage_command(stage, self.python, self.scripts_dir, self.config_args, launcher) + (["--force"] if stale else [])

    def run(self) -> int:
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, self._on_signal)
        try:
            code = self._run_stages()
        finally:
            self.summary()
        return code

    def _interrupted(self) -> int:
        name = self.signal_name
        stage = self._running
        if stage is not None:
            self.stage_lines.append(f"{stage:<8} interrupted by {name}")
        self.failed = f"{stage or 'pipeline'} ({name})"
        return EXIT_INTERRUPTED

    def _run_stages(self) -> int:
        try:
            state = self._read_state()
        except StaleResultError as exc:
            print(f"run_pipeline: {exc}", file=sys.stderr, flush=True)
            self.failed = "the run's saved results do not fit this command (see above)"
            return EXIT_STALE
        for spec in STAGES:
            stage = spec.name
            if self.signal_name:
                return self._interrupted()
            if state.done(stage):
                log(f"stage {stage}: complete output exists, skipped")
                self.stage_lines.append(f"{stage:<8} skipped (already complete)")
                continue
            banner(f"stage {stage}")
            command = self._command(stage, stale=stage in state.stale)
            log(" ".join(command))
            started = time.monotonic()
            self._running = stage
            self._child = subprocess.Popen(command, preexec_fn=_ignore_sigint)
            code = self._child.wait()
            self._child = None
            if self.signal_name:
                return self._interrupted()
            self._running = None
            took = duration(time.monotonic() - started)
            if code == EXIT_STOPPED_AFTER_SAVE:
                self.failed = f"stage {stage} (stopped after saving a checkpoint; run the same command to continue)"
                self.stage_lines.append(f"{stage:<8} STOPPED after {took} with a complete checkpoint")
                log(f"stage {stage} stopped after saving a checkpoint ({took}); run the same command again to continue")
                return code
            if code != 0:
                self.failed = f"stage {stage} (exit code {code})"
                self.stage_lines.append(f"{stage:<8} FAILED with exit code {code} after {took}")
                log(f"stage {stage} FAILED with exit code {code} after {took}")
                return code
            try:
                state = self._read_state()
            except StaleResultError as exc:
                print(f"run_pipeline: {exc}", file=sys.stderr, flush=True)
                self.failed = f"after stage {stage}: the run's saved results do not fit this command (see above)"
                return EXIT_STALE
            if not state.done(stage):
                self.failed = f"stage {stage} (exited 0 without its complete output)"
                self.stage_lines.append(f"{stage:<8} INCOMPLETE after {took}")
                log(f"stage {stage} exited 0 but its output is not complete (stopped by a save request?); run again to continue")
                return EXIT_INCOMPLETE
            self.stage_lines.append(f"{stage:<8} done in {took}")
            log(f"stage {stage} done in {took}")
        log("pipeline finished")
        return 0

    def summary(self) -> None:
        banner(f"summary ({duration(time.monotonic() - self._started)})")
        lines = list(self.stage_lines)
        try:  # what RL really did (candidates per verifier stage, optimizer steps), read from its logs
            lines += rl_activity(self.paths).describe()
        except Exception:  # noqa: BLE001 - the summary must close the run whatever a log holds
            pass
        try:
            state = self._read_state()
        except Exception:  # noqa: BLE001 - a result that does not fit: the last state read stands
            state = self._state
        paths = self.paths

        def status(done: bool, yes: str = "(complete)") -> str:
            return yes if done else "(not yet)"

        lines += [
            f"run root     {paths.root}",
            f"data         {paths.processed}",
            f"SFT adapter  {paths.final('sft')} {status(bool(state and state.sft_done))}",
            f"RL adapter   {paths.final('rl')} {status(bool(state and state.rl_done))}",
            f"comparison   {paths.compare_md} {status(bool(state and state.evaluated), '')}",
            f"logs         {paths.logs}",
        ]
        if self.s3_uri:
            lines.append(f"S3 mirror    {self.s3_uri}")
        if self.signal_name:
            lines.append(f"INTERRUPTED: {self.failed}; run the same command again to continue from the last checkpoint")
        elif self.failed:
            lines.append(f"FAILED: {self.failed}; fix the cause and run the same command again to continue")
        for line in lines:
            print(f"  {line}", flush=True)
