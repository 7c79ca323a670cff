"""Stage 4: evaluate models on KernelBench tasks and compare base, SFT and RL.

Generates Triton rewrites of the tasks in data/processed/eval_tasks.jsonl, saves them
(outputs/generations_NAME.jsonl) before verifying, verifies them with extensions.verify and writes
outputs/eval_NAME.json (metrics plus per-sample records). ``--compare`` does that for the base model,
checkpoints/sft/final and checkpoints/rl/final and writes outputs/compare.{json,md,png}.

    python evaluate.py --model_path checkpoints/sft/final --num_tasks 50 --level 1 --name sft
    python evaluate.py --from_generations gens.jsonl --tasks tasks.jsonl --device cpu --name mine
    python evaluate.py --from_generations KB_RUN_DIR --tasks tasks.jsonl --name kb   # KernelBench's layout
    python evaluate.py --model_path checkpoints/rl/final --name rl --export-kernelbench KB_RUN_DIR
    python evaluate.py --compare --smoke
    python evaluate.py --model_path checkpoints/rl/final --turns 3 --name rl3   # multi-turn refinement

Without --config or --smoke the config is configs/default.yaml when a CUDA GPU is visible, else
configs/smoke.yaml. Ctrl-C stops at once; finished generation chunks stay saved and a re-run reuses
them. Exit status: 0 all evaluated, 1 the verifier could not run, 2 usage or config error, 3
something was skipped (reported; reports still written), 73 another process is working on this run,
130 interrupted. See docs/evaluation.md.
"""
from __future__ import annotations

import argparse
import sys

from extensions.config import add_config_args


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_argument_group("mode (exactly one)")
    mode.add_argument("--model_path", help="model to evaluate: a checkpoint directory, a model directory or a hub id")
    mode.add_argument("--from_generations", metavar="GEN.jsonl|DIR",
                      help="re-verify saved generations, no model: a generations JSONL file or a KernelBench "
                           "run folder (level_L_problem_P_sample_S_kernel.py files)")
    mode.add_argument("--compare", action="store_true", help="evaluate base, SFT final and RL final and compare")
    parser.add_argument("--tasks", metavar="TASKS.jsonl", help="tasks file (default: the run's eval_tasks.jsonl)")
    parser.add_argument("--num_tasks", type=int, help="evaluate the first N selected tasks (default: eval.num_tasks)")
    parser.add_argument("--level", type=int, choices=(1, 2, 3), help="only this KernelBench level (default: eval.levels)")
    parser.add_argument("--samples_per_task", type=int, help="k samples per task (default: eval.samples_per_task)")
    parser.add_argument("--turns", type=int,
                        help="refinement turns per sample: turn t sees the previous kernel and the verifier's "
                             "feedback; per-turn metrics and turns_NAME.png (default: eval.turns)")
    parser.add_argument("--name", help="report name: eval_NAME.json, generations_NAME.jsonl")
    parser.add_argument("--output_dir", help="write reports here instead of the run's outputs/")
    parser.add_argument("--device", choices=("cpu", "cuda"), help="verification device (default: verifier.device)")
    parser.add_argument("--export-kernelbench", dest="export_kernelbench", metavar="DIR",
                        help="also write the generations as a KernelBench run folder (for its eval scripts)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars (log files, CI)")
    parser.add_argument("--base", help="--compare: base model (default: model.name_or_path)")
    parser.add_argument("--sft", help="--compare: SFT checkpoint (default: checkpoints/sft/final)")
    parser.add_argument("--rl", help="--compare: RL checkpoint (default: checkpoints/rl/final)")
    add_config_args(parser, stage_script=True)
    return parser


def evaluate(argv=None) -> int:
    from extensions.evaluation.commands import run_command

    from extensions.config import parse_flags

    return run_command(parse_flags(build_parser(), argv))


def main(argv=None) -> int:
    from extensions.runtime.entry_point import run_entry_point

    return run_entry_point("evaluate", evaluate, argv,
                           interrupted_hint="finished generation chunks are saved; a re-run reuses them")


if __name__ == "__main__":
    sys.exit(main())
