"""The three modes of ``evaluate.py`` and their exit statuses.

    0  everything asked for was evaluated
    1  the verifier itself could not run (single-model modes; generations stay saved)
    2  usage error: bad arguments, bad config, unusable tasks or generations file
    3  something was skipped (a model, a task, an input row) and reported; the reports are written
"""
from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from ..config.sections import EvalConfig, PipelineConfig
from ..data.retrieval import ExampleRetriever, RetrievalUnavailable
from ..prompting.builder import PromptBuilder
from ..runtime.activity import rl_activity
from ..runtime.checkpoints import META, is_complete
from ..runtime.io import atomic_write_json
from ..runtime.paths import RunPaths
from ..runtime.run_files import LOCAL_FILES, RunFiles
from .compare import compare_reports, write_comparison
from .generation_cache import model_identity, task_code_hash
from .inputs import GenerationsFile, InputError, load_tasks, read_generations
from .kernelbench_runs import export_kernelbench_run, read_kernelbench_run
from .records import EvalTask
from .runner import (EvalSettings, VerificationError, build_report, generate_responses, resolve_device,
                     verify_generations)
from .turns import (build_trajectories, format_turn_table, model_callables, plot_turn_curves,
                    restore_trajectories, run_turns_evaluation, turns_block)

EXIT_OK, EXIT_VERIFIER_FAILED, EXIT_USAGE, EXIT_SKIPPED = 0, 1, 2, 3
COMPARED_MODELS = ("base", "sft", "rl")
# What loading or sampling a model raises when it cannot be evaluated (missing files, bad weights,
# out of memory): that model is skipped and reported.
MODEL_FAILURES = (InputError, OSError, RuntimeError, ValueError, ImportError)
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# A local directory is a model when it holds one of these (full weights' config or a LoRA adapter).
MODEL_MARKERS = ("config.json", "adapter_config.json")


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

    def trajectories(self, name: str) -> Path:
        return self._place(self.paths.trajectories(name))

    def turns_plot(self, name: str) -> Path:
        return self._place(self.paths.turns_plot(name))

    @property
    def compare_json(self) -> Path:
        return self._place(self.paths.compare_json)

    @property
    def compare_md(self) -> Path:
        return self._place(self.paths.compare_md)

    @property
    def compare_png(self) -> Path:
        return self._place(self.paths.compare_png)


def output_files(cfg: PipelineConfig, output_dir: Optional[str]) -> OutputFiles:
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
        if not any((path / name).is_file() for name in MODEL_MARKERS) and not any(path.glob("*.gguf")):
            return (f"{path} is not a model directory: it holds no {' or '.join(MODEL_MARKERS)} "
                    "and no .gguf file")
        return None
    if not must_be_local and (model_path.startswith(("pkg:", "fetch:")) or _HUB_ID.match(model_path)):
        return None  # a hub id, an installed package or a fetched model: loading will tell
    return f"checkpoint not found: {path}"


def select_tasks(args, eval_cfg: EvalConfig, paths: RunPaths) -> tuple[Path, list[EvalTask], list[str]]:
    tasks_file = Path(args.tasks) if args.tasks else paths.eval_tasks
    levels = [args.level] if args.level is not None else list(eval_cfg.levels)
    num_tasks = args.num_tasks if args.num_tasks is not None else eval_cfg.num_tasks
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
    prompt = report.get("prompt") or {}
    if prompt.get("mode") == "raicl":
        hits = prompt.get("retrieval", {})
        log(f"[{report['name']}] RA-ICL prompts: {prompt['examples_shown']} worked examples in {prompt['prompts']} "
            f"prompts (retrieval hit rate {hits.get('hit_rate', 0.0):.2f}, {prompt['examples_over_budget']} "
            "left out for the character budget)")
    if report.get("turns"):
        log(f"[{report['name']}] per turn (rates by turn t over all samples; answered: trajectories still refining):")
        log(format_turn_table(report["turns"]))
    lengths = report.get("answer_lengths")
    if lengths:
        budget = (report.get("generation") or {}).get("sampling", {}).get("max_new_tokens")
        log(f"[{report['name']}] answers: {lengths['cut_off']} of {lengths['answers']} cut off at max_new_tokens"
            + (f" ({budget})" if budget else "") + f"; new tokens median {lengths['new_tokens_median']}, "
            f"p90 {lengths['new_tokens_p90']}, max {lengths['new_tokens_max']}")
    if report["failed_samples_without_response"]:
        log(f"{report['failed_samples_without_response']} sample(s) had no usable response; counted as failed")
    log(f"report: {report_path}")


def prompt_builder(cfg: PipelineConfig, paths: RunPaths) -> PromptBuilder:
    """The prompts of ``prompt.mode`` (raicl reads the run's retrieval index); a missing index or
    backend is a usage error, found before any model is loaded."""
    try:
        return PromptBuilder.from_config(
            cfg.prompt, lambda: ExampleRetriever.open(paths.retrieval_index, cfg.data.retrieval_dense_model))
    except RetrievalUnavailable as exc:
        raise UsageError(f"{exc}; or evaluate with plain prompts: --set prompt.mode=plain") from None


def evaluate_model(cfg: PipelineConfig, *, name: str, model_path: str, tasks: list[EvalTask], tasks_file: Path,
                   task_issues: Sequence[str], outputs: OutputFiles, settings: EvalSettings,
                   device: Optional[str], progress: bool = True, turns: int = 1,
                   prompts: Optional[PromptBuilder] = None) -> tuple[dict, Path]:
    """Generate (or reuse), verify and report one model; returns the report and where it was written.
    With ``turns`` > 1 each sample refines its kernel on the verifier's feedback (``turns.py``)."""
    prompts = prompts or prompt_builder(cfg, outputs.paths)
    if turns > 1:
        return evaluate_model_turns(cfg, name=name, model_path=model_path, tasks=tasks, tasks_file=tasks_file,
                                    task_issues=task_issues, outputs=outputs, settings=settings, device=device,
                                    progress=progress, turns=turns, prompts=prompts)
    generations_path = outputs.generations(name)
    try:
        generations = generate_responses(model_path, tasks, settings, cfg.model, generations_path,
                                         progress=progress, workers=cfg.eval.generation_workers, prompts=prompts)
    except MODEL_FAILURES:
        _remove_if_header_only(generations_path)  # nothing generated: leave no file that looks like a result
        raise
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
        input_issues=[*task_issues, *generations.issues], config_source=cfg.source, config=cfg,
        generation_rows=generations.rows,
    )
    report["prompt"] = prompts.stats()
    report_path = outputs.eval_report(name)
    atomic_write_json(report_path, report)
    return report, report_path


def evaluate_model_turns(cfg: PipelineConfig, *, name: str, model_path: str, tasks: list[EvalTask], tasks_file: Path,
                         task_issues: Sequence[str], outputs: OutputFiles, settings: EvalSettings,
                         device: Optional[str], progress: bool, turns: int, prompts) -> tuple[dict, Path]:
    """Multi-turn evaluation of one model: trajectories, per-turn report and per-turn plot."""
    resolved = resolve_device(device, cfg.verifier)
    generate, verify, count_tokens = model_callables(model_path, cfg.model, settings, cfg.verifier, resolved,
                                                     progress)
    header = {"model_path": model_path, "model": model_identity(model_path, cfg.model),
              "sampling": settings.sampling_key(), "prompt": prompts.describe(), "turns": turns,
              "max_prompt_tokens": cfg.prompt.max_prompt_tokens,
              "tasks": {task.task_id: task_code_hash(task) for task in tasks}}
    trajectories_path = outputs.trajectories(name)
    trajectories = build_trajectories(tasks, settings.samples_per_task, prompts)
    restore_trajectories(trajectories_path, trajectories, header, turns)
    outcome = run_turns_evaluation(
        tasks, trajectories, generate=generate, verify=verify,
        count_tokens=count_tokens, turns=turns, max_prompt_tokens=cfg.prompt.max_prompt_tokens,
        trajectories_path=trajectories_path, header=header)
    report = build_report(
        name=name, model_path=model_path, tasks_file=tasks_file, generations_file=trajectories_path,
        generations_header=header, device=resolved, verifier_cfg=cfg.verifier, outcome=outcome.verification,
        input_issues=list(task_issues), config_source=cfg.source,
    )
    verification = report["verification"]
    report["turns"] = turns_block(outcome, verification["timing"],
                                  verification["no_timing_reason"] or "no timing was measured")
    report["prompt"] = prompts.stats()
    report_path = outputs.eval_report(name)
    atomic_write_json(report_path, report)
    plot_turn_curves({name: report["turns"]}, outputs.turns_plot(name))
    return report, report_path


def _remove_if_header_only(generations_path: Path) -> None:
    try:
        saved = read_generations(generations_path)
    except (InputError, OSError):
        return
    if not saved.rows and not saved.issues:
        generations_path.unlink(missing_ok=True)


def run_single_model(args, cfg: PipelineConfig) -> int:
    outputs = output_files(cfg, args.output_dir)
    name = args.name or report_name(args.model_path)
    reason = missing_model_reason(args.model_path, must_be_local=False)
    if reason:
        print(f"error: model skipped: {reason}", file=sys.stderr)
        return EXIT_SKIPPED
    tasks_file, tasks, issues = select_tasks(args, cfg.eval, outputs.paths)
    settings = EvalSettings.from_config(cfg.eval, args.samples_per_task)
    turns, prompts = turns_requested(args, cfg.eval), prompt_builder(cfg, outputs.paths)
    try:
        report, path = evaluate_model(cfg, name=name, model_path=args.model_path, tasks=tasks, tasks_file=tasks_file,
                                      task_issues=issues, outputs=outputs, settings=settings, device=args.device,
                                      turns=turns, prompts=prompts, progress=_progress(args))
    except VerificationError:
        raise  # exit status 1, handled in run_command
    except MODEL_FAILURES as exc:
        first_line = (str(exc).strip().splitlines() or [""])[0]
        print(f"error: model skipped: could not load or sample {args.model_path}: {type(exc).__name__}: {first_line}",
              file=sys.stderr)
        return EXIT_SKIPPED
    summarize(report, path)
    export_complete = (export_generations(args, read_generations(outputs.generations(name)), tasks)
                       if args.export_kernelbench else True)
    return EXIT_OK if report["complete"] and export_complete else EXIT_SKIPPED


def run_from_generations(args, cfg: PipelineConfig) -> int:
    if not args.name:
        raise UsageError("--from_generations needs --name NAME (the report is written to eval_NAME.json)")
    outputs = output_files(cfg, args.output_dir)
    tasks_file = Path(args.tasks) if args.tasks else outputs.paths.eval_tasks
    tasks, task_issues = load_tasks(tasks_file)
    source = Path(args.from_generations)
    generations = read_kernelbench_run(source, tasks) if source.is_dir() else read_generations(source)
    if not generations.rows:
        raise InputError(f"{args.from_generations}: no generation rows"
                         + (f" ({len(generations.issues)} bad lines)" if generations.issues else ""))
    device = resolve_device(args.device, cfg.verifier)
    outcome = verify_generations(tasks, generations, cfg.verifier, device, every_task_expected=False,
                                 progress=_progress(args))
    report = build_report(
        name=args.name, model_path=(generations.header or {}).get("model_path"), tasks_file=tasks_file,
        generations_file=Path(args.from_generations), generations_header=generations.header, device=device,
        verifier_cfg=cfg.verifier, outcome=outcome, input_issues=[*task_issues, *generations.issues],
        config_source=cfg.source, config=cfg,
    )
    path = outputs.eval_report(args.name)
    atomic_write_json(path, report)
    summarize(report, path)
    export_complete = export_generations(args, generations, tasks)
    return EXIT_OK if report["complete"] and export_complete else EXIT_SKIPPED


def export_generations(args, generations: GenerationsFile, tasks: Sequence[EvalTask]) -> bool:
    """``--export-kernelbench DIR``: the generations in KernelBench's run-folder layout. False when
    some samples could not be written (reported)."""
    if not args.export_kernelbench:
        return True
    summary = export_kernelbench_run(generations, tasks, Path(args.export_kernelbench))
    print(summary.describe())
    _print_issues("not written", summary.skipped)
    return not summary.skipped


def compared_model_paths(args, cfg: PipelineConfig, paths: RunPaths) -> list[tuple[str, str, bool]]:
    """(name, path, must_be_local) for base, SFT final and RL final, flags overriding RunPaths."""
    return [
        ("base", args.base or cfg.model.name_or_path, False),  # may be a hub id
        ("sft", args.sft or str(paths.final("sft")), True),
        ("rl", args.rl or str(paths.final("rl")), True),
    ]


def comparison_inputs(cfg: PipelineConfig, paths: RunPaths, files: RunFiles = LOCAL_FILES) -> dict[str, Any]:
    """What the default comparison of a run depends on (eval settings, tasks, the three models by
    content); compare.json records it so the pipeline redoes a comparison made of other inputs."""
    from ..config.fingerprint import stage_fingerprint

    return {
        "eval": stage_fingerprint(cfg, "eval"),
        "eval_tasks": files.sha256(paths.eval_tasks),
        "models": {"base": model_identity(cfg.model.name_or_path, cfg.model),
                   **{stage: files.adapter_hash(paths.final(stage)) for stage in ("sft", "rl")}},
    }


def _default_comparison(args) -> bool:
    return not any((args.base, args.sft, args.rl, args.tasks, args.output_dir, args.num_tasks is not None,
                    args.level is not None, args.samples_per_task is not None))


def run_compare(args, cfg: PipelineConfig) -> int:
    outputs = output_files(cfg, args.output_dir)
    tasks_file, tasks, issues = select_tasks(args, cfg.eval, outputs.paths)
    settings = EvalSettings.from_config(cfg.eval, args.samples_per_task)
    turns = turns_requested(args, cfg.eval)
    prompt_builder(cfg, outputs.paths)  # a missing retrieval index stops here, before any model loads
    reports: dict[str, dict] = {}
    skipped: list[dict] = []
    for name, model_path, must_be_local in compared_model_paths(args, cfg, outputs.paths):
        reason = missing_model_reason(model_path, must_be_local=must_be_local)
        if reason is None:
            try:
                report, path = evaluate_model(cfg, name=name, model_path=model_path, tasks=tasks,
                                              tasks_file=tasks_file, task_issues=issues, outputs=outputs,
                                              settings=settings, device=args.device, turns=turns,
                                              progress=_progress(args))
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
    # Whether RL really ran (candidates in the sandbox, optimizer steps), next to what it achieved.
    comparison["rl_activity"] = rl_activity(outputs.paths).to_json()
    comparison["inputs"] = comparison_inputs(cfg, outputs.paths) if _default_comparison(args) else None
    write_comparison(comparison, reports, json_path=outputs.compare_json, md_path=outputs.compare_md,
                     png_path=outputs.compare_png)
    print(f"comparison of {', '.join(reports) or 'no model'}: {outputs.compare_md}")
    incomplete = skipped or any(not r["complete"] for r in reports.values())
    return EXIT_SKIPPED if incomplete else EXIT_OK


def turns_requested(args, eval_cfg: EvalConfig) -> int:
    turns = args.turns if getattr(args, "turns", None) is not None else eval_cfg.turns
    if turns < 1:
        raise UsageError(f"--turns (eval.turns) must be at least 1, got {turns}")
    return turns


def _progress(args) -> bool:
    return not getattr(args, "no_progress", False)


def ensure_output_dir_writable(directory: Path) -> None:
    """Create ``directory`` and write a probe into it, so an unwritable --output_dir fails before any
    model loads or candidate is verified (the OSError becomes exit status 74, one line)."""
    directory.mkdir(parents=True, exist_ok=True)
    probe = directory / f".write-probe-{os.getpid()}"
    probe.write_bytes(b"")
    probe.unlink()


def run_command(args) -> int:
    """Dispatch parsed ``evaluate.py`` arguments; usage problems become exit status 2.

    Config errors, ``--print-config`` and Ctrl-C are left to the caller (``extensions.runtime.entry_point``);
    the run lock is taken for the run whose outputs/ are written.
    """
    from ..runtime.entry_point import start_config
    from ..runtime.run_lock import lock_run

    try:
        modes = [bool(args.model_path), bool(args.from_generations), bool(args.compare)]
        if sum(modes) != 1 and not getattr(args, "print_config", False):
            raise UsageError("give exactly one of --model_path, --from_generations, --compare")
        if args.samples_per_task is not None and args.samples_per_task < 1:
            raise UsageError("--samples_per_task must be at least 1")
        if args.from_generations and (args.level is not None or args.num_tasks is not None or args.samples_per_task):
            raise UsageError("--level, --num_tasks and --samples_per_task do not apply to --from_generations")
        if not args.compare and (args.base or args.sft or args.rl):
            raise UsageError("--base/--sft/--rl only apply to --compare")
        if args.from_generations and getattr(args, "turns", None) not in (None, 1):
            raise UsageError("--turns needs a model to refine its answers: use --model_path or --compare")
        if args.export_kernelbench and getattr(args, "turns", None) not in (None, 1):
            raise UsageError("--export-kernelbench writes single-turn generations; drop --turns")
        if args.compare and args.export_kernelbench:
            raise UsageError("--export-kernelbench applies to --model_path or --from_generations (one model)")
        cfg = start_config(args, "evaluate")
        if args.output_dir is None:
            lock_run(RunPaths.from_config(cfg))
        elif not getattr(args, "print_config", False):
            ensure_output_dir_writable(Path(args.output_dir).expanduser().resolve())
        if args.compare:
            return run_compare(args, cfg)
        if args.from_generations:
            return run_from_generations(args, cfg)
        return run_single_model(args, cfg)
    except (UsageError, InputError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except VerificationError as exc:
        print(f"error: {exc}; saved generations are kept and a re-run reuses them", file=sys.stderr)
        return EXIT_VERIFIER_FAILED
