"""Every path of a run, in one place.

No script joins a run path by hand: training saves where evaluation and resume look because both ask
this module. Layout (see README, "Run layout"):

    ROOT/data/processed/   sft_train.jsonl sft_val.jsonl difficulty_labels.jsonl rl_tasks.jsonl
                           eval_tasks.jsonl prepare_report.json retrieval/ (worked-example index)
    ROOT/checkpoints/      sft/checkpoint-N/ sft/final/ rl/round-NNN/ rl/final/
    ROOT/outputs/          eval_<name>.json generations_<name>.jsonl compare.{json,md,png}
                           trajectories_<name>.jsonl turns_<name>.png (multi-turn evaluation)
    ROOT/logs/             metrics, TensorBoard events, per-round candidate logs
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ..config.sections import PipelineConfig

STAGES = ("sft", "rl")
_SFT_STEP = re.compile(r"^checkpoint-(\d+)$")
_RL_ROUND = re.compile(r"^round-(\d+)$")


@dataclass(frozen=True)
class RunPaths:
    root: Path

    @classmethod
    def from_config(cls, cfg: PipelineConfig) -> "RunPaths":
        return cls(Path(cfg.run.root).expanduser().resolve())

    @classmethod
    def of_checkpoint(cls, directory: Path) -> "RunPaths | None":
        """The run a checkpoint directory belongs to (``ROOT/checkpoints/<stage>/<name>``); None for
        a directory outside that layout (a copied adapter)."""
        stage_dir = Path(directory).expanduser().resolve().parent
        if stage_dir.name in STAGES and stage_dir.parent.name == "checkpoints":
            return cls(stage_dir.parent.parent)
        return None

    @property
    def run_lock(self) -> Path:
        """Held by the process working on this run; outside the synced folders, so never mirrored."""
        return self.root / ".run.lock"

    # data -------------------------------------------------------------------------------------
    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def processed(self) -> Path:
        return self.data / "processed"

    @property
    def sft_train(self) -> Path:
        return self.processed / "sft_train.jsonl"

    @property
    def sft_val(self) -> Path:
        return self.processed / "sft_val.jsonl"

    @property
    def difficulty_labels(self) -> Path:
        return self.processed / "difficulty_labels.jsonl"

    @property
    def rl_tasks(self) -> Path:
        return self.processed / "rl_tasks.jsonl"

    @property
    def eval_tasks(self) -> Path:
        return self.processed / "eval_tasks.jsonl"

    @property
    def prepare_report(self) -> Path:
        return self.processed / "prepare_report.json"

    @property
    def retrieval_index(self) -> Path:
        return retrieval_index_dir(self.processed)

    # checkpoints ------------------------------------------------------------------------------
    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    def stage_dir(self, stage: str) -> Path:
        if stage not in STAGES:
            raise ValueError(f"unknown stage {stage!r}; expected one of {STAGES}")
        return self.checkpoints / stage

    def sft_checkpoint(self, step: int) -> Path:
        return self.stage_dir("sft") / f"checkpoint-{step}"

    def rl_round(self, round_index: int) -> Path:
        return self.stage_dir("rl") / f"round-{round_index:03d}"

    def final(self, stage: str) -> Path:
        return self.stage_dir(stage) / "final"

    # logs -------------------------------------------------------------------------------------
    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def metrics_log(self, stage: str) -> Path:
        return self.logs / f"{stage}_metrics.jsonl"

    def tensorboard(self, stage: str) -> Path:
        return self.logs / "tensorboard" / stage

    def rl_candidates_log(self, round_index: int) -> Path:
        return self.logs / "rl" / f"round-{round_index:03d}.candidates.jsonl"

    @property
    def save_request(self) -> Path:
        """Flag file through which another process asks the trainer to checkpoint now."""
        return self.logs / "save_request.json"

    @property
    def spot_interruption_report(self) -> Path:
        return self.logs / "spot_interruption.json"

    # outputs ----------------------------------------------------------------------------------
    @property
    def outputs(self) -> Path:
        return self.root / "outputs"

    def eval_report(self, name: str) -> Path:
        return self.outputs / f"eval_{name}.json"

    def generations(self, name: str) -> Path:
        return self.outputs / f"generations_{name}.jsonl"

    def trajectories(self, name: str) -> Path:
        """Multi-turn evaluation: every turn's response, verdict and feedback per trajectory."""
        return self.outputs / f"trajectories_{name}.jsonl"

    def turns_plot(self, name: str) -> Path:
        return self.outputs / f"turns_{name}.png"

    @property
    def compare_json(self) -> Path:
        return self.outputs / "compare.json"

    @property
    def compare_md(self) -> Path:
        return self.outputs / "compare.md"

    @property
    def compare_png(self) -> Path:
        return self.outputs / "compare.png"


def retrieval_index_dir(processed: Path) -> Path:
    """The worked-example index inside a ``data/processed`` directory (also one given by --out)."""
    return Path(processed) / "retrieval"


REPLACED_SUFFIX = ".replaced-"


def replaced_stage_dir(stage_dir: Path, stamp: str) -> Path:
    """Where ``--force`` sets a stage's old results aside (``checkpoints/sft.replaced-<stamp>``)."""
    return Path(stage_dir).with_name(Path(stage_dir).name + REPLACED_SUFFIX + stamp)


def replaced_stage_dirs(stage_dir: Path) -> list[Path]:
    stage_dir = Path(stage_dir)
    if not stage_dir.parent.is_dir():
        return []
    return sorted(p for p in stage_dir.parent.iterdir() if p.name.startswith(stage_dir.name + REPLACED_SUFFIX))


def checkpoint_index(path: Path) -> int | None:
    """The step (``checkpoint-N``) or round (``round-NNN``) a checkpoint directory is named for."""
    for pattern in (_SFT_STEP, _RL_ROUND):
        match = pattern.match(Path(path).name)
        if match:
            return int(match.group(1))
    return None
