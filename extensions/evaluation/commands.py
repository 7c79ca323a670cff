"""The three modes of ``evaluate.py`` and their exit statuses.

    0  everything asked for was evaluated
    1  the verifier itself could not run (single-model modes; generations stay saved)
    2  usage error: bad arguments, bad config, unusable tasks or generations file
    3  something was skipped (a model, a task, an input row) and reported; the reports are written
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from ..checkpoints import META, atomic_write_json, is_complete
from ..paths import RunPaths
from .compare import compare_reports, write_comparison
from .inputs import InputError, load_tasks, read_generations
from .records import EvalTask
from .runner import (EvalSettings, VerificationError, build_report, generate_responses, resolve_device,
                     verify_generations)

EXIT_OK, EXIT_VERIFIER_FAILED, EXIT_USAGE, EXIT_SKIPPED = 0, 1, 2, 3
COMPARED_MODELS = ("base", "sft", "rl")
# What loading or sampling a model raises when it cannot be evaluated (missing files, bad weights,
# out of memory): that model is skipped and reported.
MODEL_FAILURES = (InputError, OSError, RuntimeError, ValueError, ImportError)
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class UsageError(ValueError):
    """Arguments that do not make a valid evaluation request (exit status 2)."""


@dataclass(frozen=True)
class OutputFiles:
    """Where reports go: the run's outputs/ (RunPaths), or the same file names under ``--output_dir``."""

    paths: RunPaths
    directory: Optional[Path] = None

    def _place(self, path: Path) -> Path:
        return path if self.directory is None else self.directory / path.name

    def eval_report(self, name: str) -> Path:
        return self._place(self.paths.eval_report(name))

    def generations(self, name: str) -> Path:
        return self._place(self.paths.generations(name))

    @property
    def compare_json(self) -> Path:
        return self._place(self.paths.compare_json)

    @property
    def compare_md(self) -> Path:
        return self._place(self.paths.compare_md)

    @property
    def compare_png(self) -> Path:
        return self._place(self.paths.compare_png)


def output_files(cfg, output_dir: Optional[str]) -> OutputFiles:
    return OutputFiles(RunPaths.from_config(cfg), Path(output_dir).expanduser().resolve() if output_dir else None)


def report_name(model_path: str) -> str:
    """A file-name-safe report name for a model path: ``checkpoints/sft/final`` -> ``sft_final``."""
    path = Path(model_path.rstrip("/"))
    raw = f"{path.parent.name}_{path.name}" if path.name == "final" or path.name.startswith(("checkpoint-", "round-")) \
        else path.name
    return re.sub(r"[^A-Za-z0-9._-]+", "_", raw).strip("_") or "model"


def missing_model_reason(model_path: str, *, must_be_local: bool) -> Optional[str]:
    """Why ``model_path`` cannot be evaluated (missing or incomplete checkpoint), or None."""
    path = Path(model_path).expanduser()
    if path.exists():
        if not path.is_dir():
            return f"{path} is not a model directory"
        if (path / META).is_file() and not is_complete(path):
            return f"{path} is an incomplete checkpoint (no valid manifest.json: it was still being written)"
        return None
    if not must_be_local and (model_path.startswith(("pkg:", "fetch:")) or _HUB_ID.match(model_path)):
        return None  # a hub id, an installed package or a fetched model: loading will tell
    return f"checkpoint not found: {path}"


def select_tasks(args, cfg, paths: RunPaths) -> tuple[Path, list[EvalTask], list[str]]:
    tasks_file = Path(args.tasks) if args.tasks else paths.eval_tasks
    levels = [args.level] if args.level is not None else list(cfg.eval.levels)
    num_tasks = args.num_tasks if args.num_tasks is not None else cfg.eval.num_tasks
    tasks, issues = load_tasks(tasks_file, levels, num_tasks)
    return tasks_file, tasks, issues


def _print_issues(title: str, items: Sequence[str], log=print) -> None:
    if items:
        log(f"{title} ({len(items)}):")
        for item in items:
            log(f"  - {item}")


def summarize(report: dict[str, Any], report_path: Path, log=print) -> None:
    m = report["metrics"]

    def fmt(value):
        return "n/a" if value is None else f"{value:.1f}"

    log(f"[{report['name']}] {m['num_tasks']} tasks, {m['num_samples']} samples: correct {fmt(m['correct_rate'])}%, "
        f"pass@1 {fmt(m.get('pass@1'))}%, valid {fmt(m['valid_rate'])}%, compiled {fmt(m['compiled_rate'])}%, "
        f"fast_1 {fmt(m['fast_1'])}" + ("" if m["fast_1"] is not None else f" ({m['fast_p_note']})"))
    _print_issues("skipped tasks", [f"{s['task_id']}: {s['reason']}" for s in report["skipped_tasks"]], log)
    _print_issues("skipped input rows", report["skipped_rows"], log)
    if report["failed_samples_without_response"]:
        log(f"{report['failed_samples_without_response']} sample(s) had no usable response; counted as failed")
    log(f"report: {report_path}")


def evaluate_model(cfg, *, name: str, model_path: str, tasks: list[EvalTask], tasks_file: Path,
                   task_issues: Sequence[str], outputs: OutputFiles, settings: EvalSettings,
                   device: Optional[str], progress: bool = True) -> tuple[dict, Path]:
    """Generate (or reuse), verify and report one model; returns the report and where it was written."""
    generations_path = outputs.generations(name)
    generations = generate_responses(model_path, tasks, settings, cfg.model, generations_path, progress=progress,
                                     workers=cfg.eval.generation_workers)
    selected = {t.task_id for t in tasks}
    outside = sum(1 for row in generations.rows if row.task_id not in selected)
    if outside:
        print(f"{outside} saved generation row(s) belong to tasks outside this selection; not evaluated")
        generations.rows = [row for row in generations.rows if row.task_id in selected]
    resolved = resolve_device(device, cfg.verifier)
    outcome = verify_generations(tasks, generations, cfg.verifier, resolved, every_task_expected=True,
                                 progress=progress)
    report = build_report(
        name=name, model_path=model_path, tasks_file=tasks_file, generations_file=generations_path,
        generations_header=generations.header, device=resolved, verifier_cfg=cfg.verifier, outcome=outcome,
        input_issues=[*task_issues, *generations.issues], config_source=cfg.source,
    )
    report_path = outputs.eval_report(name)
    atomic_write_json(report_path, report)
    return report, report_path


def run_single_model(args, cfg) -> int:
    outputs = output_files(cfg, args.output_dir)
    name = args.name or report_name(args.model_path)
    reason = missing_model_reason(args.model_path, must_be_local=False)
    if reason:
        print(f"error: model skipped: {reason}")
        return EXIT_SKIPPED
    tasks_file, tasks, issues = select_tasks(args, cfg, outputs.paths)
    settings = EvalSettings.from_config(cfg.eval, args.samples_per_task)
    try:
        report, path = evaluate_model(cfg, name=name, model_path=args.model_path, tasks=tasks, tasks_file=tasks_file,
                                      task_issues=issues, outputs=outputs, settings=settings, device=args.device)
    except VerificationError:
        raise  # exit status 1, handled in run_command
    except MODEL_FAILURES as exc:
        print(f"error: model skipped: could not load or sample {args.model_path}: {type(exc).__name__}: {exc}")
        return EXIT_SKIPPED
    summarize(report, path)
    return EXIT_OK if report["complete"] else EXIT_SKIPPED


def run_from_generations(args, cfg) -> int:
    if not args.name:
        raise UsageError("--from_generations needs --name NAME (the report is written to eval_NAME.json)")
    outputs = output_files(cfg, args.output_dir)
    tasks_file = Path(args.tasks) if args.tasks else outputs.paths.eval_tasks
    tasks, task_issues = load_tasks(tasks_file)
    generations = read_generations(Path(args.from_generations))
    if not generations.rows:
        raise InputError(f"{args.from_generations}: no generation rows"
                         + (f" ({len(generations.issues)} bad lines)" if generations.issues else ""))
    device = resolve_device(args.device, cfg.verifier)
    outcome = verify_generations(tasks, generations, cfg.verifier, device, every_task_expected=False)
    report = build_report(
        name=args.name, model_path=(generations.header or {}).get("model_path"), tasks_file=tasks_file,
        generations_file=Path(args.from_generations), generations_header=generations.header, device=device,
        verifier_cfg=cfg.verifier, outcome=outcome, input_issues=[*task_issues, *generations.issues],
        config_source=cfg.source,
    )
    path = outputs.eval_report(args.name)
    atomic_write_json(path, report)
    summarize(report, path)
    return EXIT_OK if report["complete"] else EXIT_SKIPPED


def compared_model_paths(args, cfg, paths: RunPaths) -> list[tuple[str, str, bool]]:
    """(name, path, must_be_local) for base, SFT final and RL final, flags overriding RunPaths."""
    return [
        ("base", args.base or cfg.model.name_or_path, False),  # may be a hub id
        ("sft", args.sft or str(paths.final("sft")), True),
        ("rl", args.rl or str(paths.final("rl")), True),
    ]


def run_compare(args, cfg) -> int:
    outputs = output_files(cfg, args.output_dir)
    tasks_file, tasks, issues = select_tasks(args, cfg, outputs.paths)
    settings = EvalSettings.from_config(cfg.eval, args.samples_per_task)
    reports: dict[str, dict] = {}
    skipped: list[dict] = []
    for name, model_path, must_be_local in compared_model_paths(args, cfg, outputs.paths):
        reason = missing_model_reason(model_path, must_be_local=must_be_local)
        if reason is None:
            try:
                report, path = evaluate_model(cfg, name=name, model_path=model_path, tasks=tasks,
                                              tasks_file=tasks_file, task_issues=issues, outputs=outputs,
                                              settings=settings, device=args.device)
            except (VerificationError, *MODEL_FAILURES) as exc:
                reason = f"evaluation failed: {type(exc).__name__}: {exc}"
            else:
                summarize(report, path)
                report["report_path"] = str(path)
                reports[name] = report
        if reason is not None:
            print(f"[{name}] skipped: {reason}")
            skipped.append({"name": name, "model_path": model_path, "reason": reason})
    comparison = compare_reports(reports, bootstrap_samples=cfg.eval.bootstrap_samples, seed=cfg.eval.seed,
                                 skipped_models=skipped)
    write_comparison(comparison, reports, json_path=outputs.compare_json, md_path=outputs.compare_md,
                     png_path=outputs.compare_png)
    print(f"comparison of {', '.join(reports) or 'no model'}: {outputs.compare_md}")
    incomplete = skipped or any(not r["complete"] for r in reports.values())
    return EXIT_SKIPPED if incomplete else EXIT_OK


def run_command(args) -> int:
    """Dispatch parsed ``evaluate.py`` arguments; usage problems become exit status 2."""
    from ..config import ConfigError, config_from_args

    try:
        modes = [bool(args.model_path), bool(args.from_generations), bool(args.compare)]
        if sum(modes) != 1:
            raise UsageError("give exactly one of --model_path, --from_generations, --compare")
        if args.samples_per_task is not None and args.samples_per_task < 1:
            raise UsageError("--samples_per_task must be at least 1")
        if args.from_generations and (args.level is not None or args.num_tasks is not None or args.samples_per_task):
            raise UsageError("--level, --num_tasks and --samples_per_task do not apply to --from_generations")
        if not args.compare and (args.base or args.sft or args.rl):
            raise UsageError("--base/--sft/--rl only apply to --compare")
        cfg = config_from_args(args)
        if args.compare:
            return run_compare(args, cfg)
        if args.from_generations:
            return run_from_generations(args, cfg)
        return run_single_model(args, cfg)
    except (UsageError, ConfigError, InputError) as exc:
        print(f"error: {exc}")
        return EXIT_USAGE
    except VerificationError as exc:
        print(f"error: {exc}; saved generations are kept and a re-run reuses them")
        return EXIT_VERIFIER_FAILED
