"""Does SFT and RL make the model write more correct kernels on tasks it never trained on?

A fixed split of KernelBench level-1 and level-2 problems into RL-training tasks and held-out tasks
(48 held out by default, 24 per level; no problem in both). Decontamination, by text and by what a
program computes (its traced operator graph, extensions/data/operator_graph.py): a held-out task
near the prompt's worked example or computing what it computes is replaced, an RL task near a
held-out one or computing what one computes is dropped, and the data stage drops every SFT pair
(and so every retrieval example) that does either; all of it is counted and named in the results.
Then the project's own stages on it:

    data       the data stage alone (split, pair verification, decontamination); needs no model, and
               every other phase runs it first where it has not finished; once built, the run's
               data stays as built (a later verifier change re-judges nothing) until this phase
               is asked for again
    base       evaluate the base model on the held-out tasks
    sft        LoRA SFT on what the data stage builds (configs/learning-signal.yaml: the synthesized
               pairs, verified and decontaminated against the held-out tasks)
    sft_eval   evaluate sft/final
    rl         RL rounds of the config's objective (GRPO; resumes after the last finished round) on
               the RL-training tasks: the split's KernelBench problems and the data stage's RL share
               of the synthesized programs (problems whose pairs are in neither SFT split,
               decontaminated like them)
    rl_eval    evaluate every round-NNN (rl_eval_<n>: round n only)
    report     correct rate (overall and per level), fast_1 and pass@k (pass@1 and pass@8 at 8
               samples) per model with bootstrap 95% intervals over tasks, paired differences
               between consecutive models (correct rate also per level), each RL round's numbers,
               the decontamination report, a table and a plot of the held-out correct rate
               against the RL round; every model's answers and verdicts are saved beside them

Every model is evaluated with the same seeds (each task's sampling seed comes from eval.seed and
the task id). Each phase is sized to fit a 10-minute GPU call on its own, but for the data phase
over the synthesized pairs (about 14 minutes of one H200): its verdicts are cached by content as
they arrive, so the same command again continues where a cut left it.

The settings are configs/learning-signal.yaml, the run a user makes with `./run_pipeline.sh
--config configs/learning-signal.yaml`; this script adds the split, the run directory, the flags
given and the report. Every phase is skipped when its result exists, so the same command continues
after a time limit; each phase's wall-clock time is recorded. The split is saved with the results.

    python bench/learning_signal.py --kernelbench ../shared/kernelbench/kernelbench_problems.jsonl \\
        --work /tmp/ls --out outputs/learning_signal --phases data
    python bench/learning_signal.py ... --phases base
    python bench/learning_signal.py ... --phases sft
    python bench/learning_signal.py ... --phases sft_eval
    python bench/learning_signal.py ... --phases rl
    python bench/learning_signal.py ... --phases rl_eval_1      # then rl_eval_2, ..., report
    python bench/learning_signal.py --quick --kernelbench ... --work /tmp/ls-quick   # CPU dry run, tiny model
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PHASES = ("data", "base", "sft", "sft_eval", "rl", "rl_eval", "report")
SPLIT_SALT = "learning-signal-v1"


# -- the split ---------------------------------------------------------------------------------------
def read_problems(path: Path, levels: tuple[int, ...]) -> list[dict]:
    from extensions.data.kernelbench import check_task_code

    problems, rejected = [], 0
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        if int(row["level"]) not in levels:
            continue
        try:
            check_task_code(row["code"])
        except ValueError:
            rejected += 1
            continue
        problems.append(row)
    if rejected:
        print(f"[split] {rejected} problem(s) dropped: not a valid KernelBench task")
    return problems


def computation_signatures(codes: list[str]) -> list:
    """Operator-graph signatures of programs (traced in a worker process, cached by content)."""
    from extensions.data.operator_graph import SignatureTracer

    with SignatureTracer() as tracer:
        return tracer.signatures(codes)


def make_split(problems: list[dict], *, heldout_per_level: int, rl_per_level: int, threshold: float,
               by_computation: bool = True) -> tuple[dict, list[dict], list[dict]]:
    """Held-out and RL-training problems per level, ordered by a salted hash of the problem name.

    A problem is near another when their code's Jaccard index reaches ``threshold`` or (with
    ``by_computation``) when they compute the same thing: equal traced operator graphs, shapes and
    constants abstracted. Held-out problems near the prompt's worked example are passed over, RL
    problems near a held-out one are dropped; both are named under ``dropped``. Problems that do not
    trace are judged by text alone and named under ``untraceable``."""
    from extensions.data.dedup import code_shingles, jaccard
    from extensions.data.operator_graph import ComputationIndex, Signature
    from extensions.data.splits import unit_hash
    from extensions.prompting.templates import WORKED_EXAMPLE_TASK

    example = code_shingles(WORKED_EXAMPLE_TASK)
    if by_computation:
        example_signature, *signatures = computation_signatures([WORKED_EXAMPLE_TASK] + [p["code"] for p in problems])
    else:
        example_signature, signatures = Signature(error="off"), [Signature(error="off")] * len(problems)
    signature_of = {p["name"]: sig for p, sig in zip(problems, signatures)}
    example_index = ComputationIndex()
    example_index.add("worked_example", example_signature)
    heldout_index = ComputationIndex()
    heldout, rl = [], []
    dropped = {"heldout_near_worked_example": [], "heldout_same_computation_as_worked_example": [],
               "rl_near_heldout": [], "rl_same_computation_as_heldout": []}
    for level in sorted({int(p["level"]) for p in problems}):
        ordered = sorted((p for p in problems if int(p["level"]) == level), key=lambda p: unit_hash(SPLIT_SALT, p["name"]))
        level_heldout = []
        for problem in ordered:
            if len(level_heldout) == heldout_per_level:
                break
            if jaccard(code_shingles(problem["code"]), example) >= threshold:
                dropped["heldout_near_worked_example"].append(problem["name"])
                continue
            if example_index.match(signature_of[problem["name"]]):
                dropped["heldout_same_computation_as_worked_example"].append(problem["name"])
                continue
            level_heldout.append(problem)
            heldout_index.add(problem["name"], signature_of[problem["name"]])
        heldout += level_heldout
        taken = {p["name"] for p in level_heldout}
        level_rl = []
        for problem in ordered:
            if len(level_rl) == rl_per_level:
                break
            if problem["name"] in taken:
                continue
            shingles = code_shingles(problem["code"])
            near = [h["name"] for h in heldout if jaccard(shingles, code_shingles(h["code"])) >= threshold]
            if near:
                dropped["rl_near_heldout"].append({"rl": problem["name"], "heldout": near})
                continue
            same = heldout_index.match(signature_of[problem["name"]])
            if same:
                dropped["rl_same_computation_as_heldout"].append(
                    {"rl": problem["name"], "heldout": same.key, "exact_graph": same.exact})
                continue
            level_rl.append(problem)
        rl += level_rl
    overlap = {p["name"] for p in heldout} & {p["name"] for p in rl}
    if overlap:
        raise AssertionError(f"split overlap: {sorted(overlap)}")
    chosen = heldout + rl
    return {
        "salt": SPLIT_SALT, "decontamination_threshold": threshold, "by_computation": by_computation,
        "heldout": [{"level": p["level"], "problem_id": p["problem_id"], "name": p["name"]} for p in heldout],
        "rl": [{"level": p["level"], "problem_id": p["problem_id"], "name": p["name"]} for p in rl],
        "dropped": dropped,
        "untraceable": sorted(p["name"] for p in chosen if by_computation and not signature_of[p["name"]].traceable),
    }, heldout, rl


def write_split(args, work: Path) -> dict:
    """The split (built once; later runs reuse the saved one), its held-out JSONL and the RL tasks."""
    split_file = work / "split.json"
    if split_file.is_file():
        return json.loads(split_file.read_text())
    problems = read_problems(Path(args.kernelbench), (1, 2))
    split, heldout, rl = make_split(problems, heldout_per_level=args.heldout_tasks // 2,
                                    rl_per_level=args.rl_tasks // 2, threshold=args.decontamination_threshold)
    work.mkdir(parents=True, exist_ok=True)
    with open(work / "heldout_problems.jsonl", "w") as out:
        for p in heldout:
            out.write(json.dumps(p) + "\n")
    split["rl_rows"] = [{"task_id": f"kernelbench_L{p['level']}_{p['problem_id']}", "level": int(p["level"]),
                         "name": p["name"], "code": p["code"]} for p in rl]
    split_file.write_text(json.dumps(split, indent=1))
    print(f"[split] {len(heldout)} held-out and {len(rl)} RL-training problems; dropped: "
          + ", ".join(f"{len(v)} {k}" for k, v in split["dropped"].items()))
    return split


# -- the config --------------------------------------------------------------------------------------
CONFIG = Path(__file__).resolve().parent.parent / "configs" / "learning-signal.yaml"


def build_config(args, work: Path, rl_pool: Optional[int] = None):
    """configs/learning-signal.yaml (the run a user makes with run_pipeline.sh) with this benchmark's
    split and run directory, and the settings given on the command line. ``rl_pool``: how many RL
    tasks there are (a round offers no more)."""
    from extensions.config import load_config

    overrides = [
        f"run.root={work / 'run'}", f"data.kernelbench={work / 'heldout_problems.jsonl'}",
        "data.kernelbench_levels=[1, 2]", "eval.levels=[1, 2]", f"verifier.device={args.device}",
    ]
    given = {
        "model.name_or_path": args.model, "data.kernelbook": args.sft_pairs, "sft.max_steps": args.sft_steps,
        "sft.learning_rate": args.sft_lr, "rl.learning_rate": args.rl_lr, "rl.num_rounds": args.rl_rounds,
        "rl.samples_per_task": args.samples, "eval.samples_per_task": args.samples,
        "rl.max_new_tokens": args.max_new_tokens, "eval.max_new_tokens": args.max_new_tokens,
        "sft.max_seq_len": args.max_seq_len, "rl.generation_batch_size": args.batch_size,
        "eval.generation_batch_size": args.batch_size, "verifier.timing_budget_s": args.timing_budget,
    }
    overrides += [f"{key}={value}" for key, value in given.items() if value is not None]
    if args.sft_steps is not None:  # one checkpoint and one validation, at the end
        overrides += [f"sft.save_every_steps={args.sft_steps}", f"sft.eval_every_steps={args.sft_steps}"]
    if args.rl_rounds is not None:
        overrides.append(f"rl.keep_last_rounds={args.rl_rounds}")
    overrides += args.set
    cfg = load_config(CONFIG, overrides)
    # A round offers no more tasks than there are for RL (the config's count, or a --set, when fewer).
    pool = args.rl_tasks if rl_pool is None else rl_pool
    if cfg.rl.tasks_per_round > pool and not any(item.startswith("rl.tasks_per_round=") for item in args.set):
        overrides.append(f"rl.tasks_per_round={pool}")
        cfg = load_config(CONFIG, overrides)
    return cfg, overrides


# -- phases ------------------------------------------------------------------------------------------
class PhaseClock:
    """Wall-clock seconds of each phase, kept in the work directory across runs."""

    def __init__(self, path: Path):
        self.path = path
        self.seconds = json.loads(path.read_text()) if path.is_file() else {}

    def record(self, phase: str, seconds: float) -> None:
        self.seconds[phase] = round(self.seconds.get(phase, 0.0) + seconds, 1)
        self.path.write_text(json.dumps(self.seconds, indent=1))


def evaluate(cfg, name: str, model_path: str) -> dict:
    """The project's evaluation of ``model_path`` on the held-out tasks (reused when already written)."""
    from extensions.evaluation.commands import evaluate_model, output_files
    from extensions.evaluation.inputs import load_tasks
    from extensions.evaluation.runner import EvalSettings

    outputs = output_files(cfg, None)
    report_path = outputs.eval_report(name)
    if report_path.is_file():
        return json.loads(report_path.read_text())
    tasks, issues = load_tasks(outputs.paths.eval_tasks, [1, 2], None)
    report, _ = evaluate_model(cfg, name=name, model_path=model_path, tasks=tasks, tasks_file=outputs.paths.eval_tasks,
                               task_issues=issues, outputs=outputs, settings=EvalSettings.from_config(cfg.eval),
                               device=cfg.verifier.device, progress=True)
    return report


def prepare_data(cfg, split: dict) -> dict[str, int]:
    """The data stage with the held-out problems as its evaluation tasks, then the RL tasks: the
    split's KernelBench problems and the data stage's own RL share of the pairs' problems (held out
    of SFT and decontaminated against the held-out problems like every pair). Returns how many of
    each there are."""
    from extensions.data.pipeline import format_summary, prepare
    from extensions.runtime.io import read_jsonl
    from extensions.runtime.paths import RunPaths

    paths = RunPaths.from_config(cfg)
    try:
        outcome = prepare(cfg, paths.processed, progress=False)
    except ValueError as exc:  # a missing package or source: one line, before any pair is judged
        raise SystemExit(f"[data] {exc}") from None
    if not outcome.up_to_date:
        print(format_summary(outcome.report))
    kernelbench_ids = {row["task_id"] for row in split["rl_rows"]}
    # The data stage writes its share once; a later run finds it beside the KernelBench rows added here.
    synthesized = [row for _, row in read_jsonl(paths.rl_tasks) if row.get("task_id") not in kernelbench_ids] \
        if paths.rl_tasks.is_file() else []
    with open(paths.rl_tasks, "w") as out:
        for row in split["rl_rows"] + synthesized:
            out.write(json.dumps(row) + "\n")
    return {"kernelbench": len(split["rl_rows"]), "synthesized": len(synthesized)}


def built_data(cfg) -> Optional[str]:
    """Which verifier judged the run's prepared data (its digest, and whether it is today's), or
    None where the data stage has not finished."""
    from extensions.data.pair_verification import verifier_digest
    from extensions.runtime.paths import RunPaths

    report = RunPaths.from_config(cfg).processed / "prepare_report.json"
    if not report.is_file():
        return None
    digest = (json.loads(report.read_text()).get("fingerprint") or {}).get("verifier")
    if digest is None:
        return "pairs not verified"
    today = verifier_digest()
    return f"verifier {digest[:12]}" + ("" if digest == today else f", today's {today[:12]}")


def measured_budgets(cfg, work: Path) -> dict[str, int]:
    """Token budgets read off the SFT pairs, so neither the sequence limit nor the answer budget is
    a guess: ``sft.max_seq_len`` covers 99% of the pairs (prompt and answer; the rest are dropped
    and counted by SFT), ``max_new_tokens`` 95% of the answers, each rounded up. Measured once and
    kept in the work directory, so every phase of a resumed run uses the same numbers."""
    saved = work / "budgets.json"
    if saved.is_file():
        return json.loads(saved.read_text())
    from extensions.models.loading import load_tokenizer
    from extensions.runtime.paths import RunPaths
    from extensions.training.batching import read_sft_jsonl

    tokenizer = load_tokenizer(cfg.model)
    pairs, _ = read_sft_jsonl(RunPaths.from_config(cfg).sft_train)
    if not pairs:
        raise SystemExit("budgets: no SFT pairs to measure; pass --max-new-tokens and --max-seq-len")
    answers, totals = [], []
    for prompt, completion in pairs:
        prompt_text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
        prompt_tokens = len(tokenizer(prompt_text, add_special_tokens=False)["input_ids"])
        answer_tokens = len(tokenizer(completion, add_special_tokens=False)["input_ids"]) + 1  # the end of turn
        answers.append(answer_tokens)
        totals.append(prompt_tokens + answer_tokens)

    def covering(values: list[int], share: float, step: int) -> int:
        ordered = sorted(values)
        value = ordered[min(len(ordered) - 1, int(share * len(ordered)))]
        return -(-value // step) * step

    budgets = {"max_new_tokens": covering(answers, 0.95, 128), "max_seq_len": covering(totals, 0.99, 512),
               "pairs_measured": len(pairs)}
    saved.write_text(json.dumps(budgets, indent=1))
    print(f"[budgets] from {len(pairs)} SFT pairs: max_new_tokens {budgets['max_new_tokens']} (95% of answers), "
          f"sft.max_seq_len {budgets['max_seq_len']} (99% of prompt + answer)")
    return budgets


def run_phase(phase: str, cfg, clock: PhaseClock) -> None:
    from extensions.runtime.paths import RunPaths
    from extensions.training.rl import run_rl
    from extensions.training.sft import run_sft

    paths = RunPaths.from_config(cfg)
    started = time.time()
    if phase == "data":
        pass  # main() has run the data stage before any phase
    elif phase == "base":
        evaluate(cfg, "base", cfg.model.name_or_path)
    elif phase == "sft":
        run_sft(cfg, progress=True)
    elif phase == "sft_eval":
        evaluate(cfg, "sft", str(paths.final("sft")))
    elif phase == "rl":
        run_rl(cfg, progress=True)
    elif phase.startswith("rl_eval"):
        rounds = range(1, cfg.rl.num_rounds + 1) if phase == "rl_eval" else [int(phase.rsplit("_", 1)[1])]
        for round_index in rounds:
            if not paths.rl_round(round_index).is_dir():
                raise SystemExit(f"{phase}: RL round {round_index} is not trained; run the rl phase first")
            evaluate(cfg, f"rl_round_{round_index}", str(paths.rl_round(round_index)))
        phase = "rl_eval"  # the clock sums every round's evaluation
    clock.record(phase, time.time() - started)


def phase_order(requested: list[str], rounds: int) -> list[str]:
    """The requested phases in pipeline order (rl_eval_<n> after rl, by round); unknown names raise."""
    def rank(phase: str) -> tuple[int, int]:
        if phase in PHASES:
            return PHASES.index(phase), 0
        if phase.startswith("rl_eval_") and phase[len("rl_eval_"):].isdigit() and 1 <= int(phase[8:]) <= rounds:
            return PHASES.index("rl_eval"), int(phase[8:])
        raise ValueError(phase)
    return sorted(dict.fromkeys(requested), key=rank)


# -- the report --------------------------------------------------------------------------------------
def interval(values: list[float], resamples: int, seed: int) -> dict:
    from extensions.evaluation.stats import paired_bootstrap

    result = paired_bootstrap(values, resamples, seed)
    return {"mean": result.mean, "low": result.low, "high": result.high, "tasks": result.num_tasks}


def model_summary(report: dict, samples: int, resamples: int) -> dict[str, Any]:
    """Per-model rates with 95% bootstrap intervals over tasks, in percent."""
    from extensions.evaluation.compare import per_task_scores
    from extensions.evaluation.stats import allowed_ks, pass_at_k

    tasks = [t for t in report["tasks"] if t["samples"]]
    summary = {
        "correct_rate": interval(list(per_task_scores(report, "correct_rate").values()), resamples, 1),
        # The goal is stated for level 1 (the published anchor's level), so each level has its own rate.
        "correct_rate_by_level": {str(level): interval(list(scores.values()), resamples, 20 + level)
                                  for level, scores in sorted(scores_by_level(report, "correct_rate").items())},
        "compiled_rate": interval(list(per_task_scores(report, "compiled_rate").values()), resamples, 2),
        "timing": bool(report["verification"]["timing"]),
    }
    if summary["timing"]:
        summary["fast_1"] = interval(list(per_task_scores(report, "fast_1").values()), resamples, 3)
    fewest = min((len(t["samples"]) for t in tasks), default=0)
    # Few samples per task here: every power of two up to that count, not only the report's 1, 5, 10...
    for k in sorted({k for k in (1, 2, 4, 8) if k <= fewest} | set(allowed_ks(fewest))):
        per_task = [100.0 * pass_at_k(len(t["samples"]), sum(bool(s["correct"]) for s in t["samples"]), k) for t in tasks]
        summary[f"pass@{k}"] = interval(per_task, resamples, 10 + k)
    summary["stages"] = report["metrics"].get("stage_counts")
    summary["failures"] = failure_breakdown(report)
    summary["answer_lengths"] = report.get("answer_lengths")
    summary["skipped_tasks"] = report.get("skipped_tasks", [])
    return summary


def scores_by_level(report: dict, metric: str) -> dict[int, dict[str, float]]:
    """``per_task_scores`` grouped by the tasks' KernelBench level (tasks without one left out)."""
    from extensions.evaluation.compare import per_task_scores

    levels = {t["task_id"]: t.get("level") for t in report["tasks"]}
    grouped: dict[int, dict[str, float]] = {}
    for task_id, score in per_task_scores(report, metric).items():
        if levels.get(task_id) is not None:
            grouped.setdefault(int(levels[task_id]), {})[task_id] = score
    return grouped


def level_differences(reports: dict[str, dict], pairs: list[tuple[str, str]], resamples: int) -> list[dict]:
    """Paired correct-rate differences per level (candidate - baseline, over the tasks both have),
    with 95% bootstrap intervals."""
    from extensions.evaluation.stats import paired_bootstrap

    rows = []
    for baseline, candidate in pairs:
        before, after = scores_by_level(reports[baseline], "correct_rate"), scores_by_level(reports[candidate], "correct_rate")
        for level in sorted(set(before) & set(after)):
            shared = sorted(set(before[level]) & set(after[level]))
            if not shared:
                continue
            result = paired_bootstrap([after[level][t] - before[level][t] for t in shared], resamples, 30 + level)
            rows.append({"baseline": baseline, "candidate": candidate, "level": level, "label": f"correct %, level {level}",
                         "mean": result.mean, "low": result.low, "high": result.high, "tasks": result.num_tasks,
                         "significant": result.significant})
    return rows


FAILURE_KINDS = ("no code block", "syntax error", "unbound name", "other static rule", "compile error",
                 "raised on first inputs", "wrong shape", "wrong values", "failed a later input set", "correct")
UNBOUND_NAME = "is neither defined in the module nor an allowed builtin"


def failure_kind(sample: dict) -> str:
    """Where one answer stops, finer than the verifier's stage: a syntax error and a name the answer
    never binds (the wrapper's bookkeeping gone wrong) apart from the other static rules, and a
    first-input-set failure split into raising, the wrong shape and wrong values."""
    if sample.get("correct"):
        return "correct"
    stage, error = sample.get("stage") or "none", sample.get("error") or ""
    if stage == "none":
        return "no code block"
    if stage == "extract":
        if "syntax error" in error:
            return "syntax error"
        return "unbound name" if UNBOUND_NAME in error else "other static rule"
    if stage == "static":
        return "compile error"
    if stage == "compile":
        if "exception:" in error:
            return "raised on first inputs"
        return "wrong shape" if "shape" in error and "!=" in error else "wrong values"
    return "failed a later input set"


def failure_breakdown(report: dict) -> dict[str, int]:
    counts = dict.fromkeys(FAILURE_KINDS, 0)
    for task in report["tasks"]:
        for sample in task["samples"]:
            counts[failure_kind(sample)] += 1
    return counts


def rl_round_summary(cfg) -> list[dict]:
    """Each RL round as it ran on the RL tasks: correct samples, what it trained on (Best-of-N's kept
    answers, or a policy gradient's samples with a non-zero advantage), update steps."""
    from extensions.runtime.io import read_jsonl
    from extensions.runtime.paths import RunPaths

    log = RunPaths.from_config(cfg).metrics_log("rl")
    rounds = []
    for _, row in (read_jsonl(log) if log.is_file() else []):
        if row.get("kind") == "round":
            rounds.append({key: row.get(key) for key in ("round", "algorithm", "reward_preset", "candidates", "correct",
                                                         "reward_mean", "kept", "kept_tasks", "trained_samples", "groups",
                                                         "zero_spread_groups", "train_steps", "correct_rate_by_level")}
                          | {"seconds": row.get("seconds")})
    return rounds


def fmt(block: Optional[dict]) -> str:
    if not block:
        return "n/a"
    if block["low"] is None:
        return f"{block['mean']:.1f}"
    return f"{block['mean']:.1f} [{block['low']:.1f}, {block['high']:.1f}]"


def build_results(cfg, names: list[str], reports: dict[str, dict], split: dict, clock: PhaseClock,
                  overrides: list[str], resamples: int, device: Optional[str] = None) -> dict:
    from extensions.evaluation.compare import compare_reports

    models = {name: model_summary(reports[name], cfg.eval.samples_per_task, resamples) for name in names}
    paired = compare_reports({n: reports[n] for n in names}, bootstrap_samples=resamples)
    consecutive = {(a, b) for a, b in zip(names, names[1:])} | {(names[0], names[-1])}
    differences = [d for d in paired["differences"] if (d["baseline"], d["candidate"]) in consecutive]
    ordered_pairs = sorted(consecutive, key=lambda pair: (names.index(pair[1]), names.index(pair[0])))
    return {
        "device": device or device_name(), "models": models, "model_order": names, "differences": differences,
        "level_differences": level_differences(reports, ordered_pairs, resamples),
        "phase_seconds": clock.seconds, "split": {k: v for k, v in split.items() if k != "rl_rows"},
        "samples_per_task": cfg.eval.samples_per_task, "eval_seed": cfg.eval.seed,
        "decontamination": decontamination_report(cfg, split), "config_overrides": overrides,
    }


def decontamination_report(cfg, split: dict) -> dict:
    """What was dropped to keep the held-out tasks unseen, by rule: the split's own drops (worked
    example, RL problems) and the data stage's (SFT pairs, and with them the retrieval examples)."""
    from extensions.runtime.paths import RunPaths

    report_path = RunPaths.from_config(cfg).processed / "prepare_report.json"
    stage = json.loads(report_path.read_text()) if report_path.is_file() else {}
    kernelbook = stage.get("sources", {}).get("kernelbook", {})
    reasons = ("overlaps_eval_problem", "same_computation_as_eval_problem")
    return {
        "split": {"counts": {reason: len(names) for reason, names in split["dropped"].items()},
                  "dropped": split["dropped"], "untraceable": split.get("untraceable", [])},
        "sft_pairs": {"source": kernelbook.get("source"), "read": kernelbook.get("read"), "kept": kernelbook.get("kept"),
                      "counts": {reason: kernelbook.get("dropped", {}).get(reason, 0) for reason in reasons},
                      **{k: v for k, v in (stage.get("decontamination") or {}).items() if k not in ("by_text", "by_computation")}},
        "retrieval_examples": "the SFT training pairs after the data stage's decontamination",
    }


def decontamination_table(report: dict) -> str:
    lines = ["| decontamination | dropped | which |", "|---|---|---|"]
    for reason, items in report["split"]["dropped"].items():
        names = ", ".join(i if isinstance(i, str) else f"{i['rl']} ~ {i['heldout']}" for i in items) or "-"
        lines.append(f"| split: {reason} | {len(items)} | {names} |")
    pairs = report["sft_pairs"]
    by_task: dict[str, list[str]] = {}
    for item in pairs.get("dropped") or []:
        by_task.setdefault(item["eval_task"], []).append(item["uuid"])
    for reason, count in pairs["counts"].items():
        which = "; ".join(f"{task}: {', '.join(uuids)}" for task, uuids in sorted(by_task.items())) \
            if reason == "same_computation_as_eval_problem" and by_task else "-"
        lines.append(f"| SFT pairs: {reason} | {count} | {which} |")
    untraceable = report["split"]["untraceable"]
    lines.append(f"| untraceable (text rule only) | split {len(untraceable)}, SFT pairs "
                 f"{pairs.get('untraceable_pairs', 'n/a')} | {', '.join(untraceable) or '-'} |")
    return "\n".join(lines)


def device_name() -> str:
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def table(results: dict) -> str:
    metrics = ["correct_rate", "compiled_rate", "fast_1", "pass@1"]
    metrics += sorted({k for m in results["models"].values() for k in m if k.startswith("pass@") and k != "pass@1"},
                      key=lambda k: int(k.split("@")[1]))
    levels = reported_levels(results)
    header = metrics[:1] + [f"correct, level {level}" for level in levels] + metrics[1:]
    lines = ["| model | " + " | ".join(header) + " |", "|---" * (len(header) + 1) + "|"]
    for name in results["model_order"]:
        model = results["models"][name]
        cells = [fmt(model.get(m)) for m in metrics]
        by_level = [fmt((model.get("correct_rate_by_level") or {}).get(level)) for level in levels]
        lines.append(f"| {name} | " + " | ".join(cells[:1] + by_level + cells[1:]) + " |")
    lines += ["", "| model | stops at: extract / static / compile / tiny / full | answers cut off at max_new_tokens | "
              "new tokens median / p90 / max |", "|---|---|---|---|"]
    for name in results["model_order"]:
        model = results["models"][name]
        stages = model.get("stages") or {}
        stops = " / ".join(str(stages.get(stage, 0)) for stage in ("none", "extract", "static", "compile", "tiny"))
        lengths = model.get("answer_lengths")
        cut = f"{lengths['cut_off']} of {lengths['answers']}" if lengths else "n/a"
        sizes = (f"{lengths['new_tokens_median']} / {lengths['new_tokens_p90']} / {lengths['new_tokens_max']}"
                 if lengths else "n/a")
        lines.append(f"| {name} | {stops} | {cut} | {sizes} |")
    lines += ["", "| model | " + " | ".join(FAILURE_KINDS) + " |", "|---" * (len(FAILURE_KINDS) + 1) + "|"]
    for name in results["model_order"]:
        failures = results["models"][name].get("failures") or {}
        lines.append(f"| {name} | " + " | ".join(str(failures.get(kind, "n/a")) for kind in FAILURE_KINDS) + " |")
    if results.get("rl_rounds"):
        lines += ["", "| RL round (on the RL tasks) | correct / samples | reward mean | trained on | update steps | seconds |",
                  "|---|---|---|---|---|---|"]
        for r in results["rl_rounds"]:
            lines.append(f"| {r['round']} ({r['algorithm']}) | {r['correct']} / {r['candidates']} | {r['reward_mean']:.3f} | "
                         f"{trained_on(r)} | {r['train_steps']} | {(r.get('seconds') or {}).get('round_s', 0):.0f} |")
    lines += ["", "| paired difference (pp) | metric | mean [95% CI] | significant |", "|---|---|---|---|"]
    for d in results["differences"] + results.get("level_differences", []):
        ci = "n/a" if d["low"] is None else f"{d['mean']:+.1f} [{d['low']:+.1f}, {d['high']:+.1f}]"
        lines.append(f"| {d['candidate']} - {d['baseline']} | {d['label']} | {ci} | {'yes' if d['significant'] else 'no'} |")
    return "\n".join(lines)


def reported_levels(results: dict) -> list[str]:
    """The KernelBench levels some model has a correct rate for, in order."""
    return sorted({level for m in results["models"].values() for level in m.get("correct_rate_by_level") or {}}, key=int)


def trained_on(round_row: dict) -> str:
    """What a round's update saw: Best-of-N's kept answers, or the samples a policy gradient weighs
    (those of groups whose rewards differ; a group of equal rewards has no advantage)."""
    if round_row.get("kept") is not None:
        return f"{round_row['kept']} kept ({round_row.get('kept_tasks')} tasks)"
    if round_row.get("trained_samples") is not None:
        groups, flat = round_row.get("groups"), round_row.get("zero_spread_groups")
        spread = f", {groups - flat} of {groups} groups with a reward spread" if groups is not None and flat is not None else ""
        return f"{round_row['trained_samples']} samples{spread}"
    return "n/a"


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = results["model_order"]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    # Correct rate, and the compiled rate beside it: while nothing is correct, what training moved.
    series = [("correct", "o", "-", [results["models"][n]["correct_rate"] for n in names]),
              ("compiled", "s", "-", [results["models"][n]["compiled_rate"] for n in names])]
    for level in reported_levels(results):  # the goal is stated for level 1; a level's line shows where the correct answers are
        blocks = [(results["models"][n].get("correct_rate_by_level") or {}).get(level) for n in names]
        if all(blocks):
            series.append((f"correct, level {level}", "^", "--", blocks))
    for label, marker, style, blocks in series:
        means = [b["mean"] for b in blocks]
        low = [b["mean"] - (b["low"] if b["low"] is not None else b["mean"]) for b in blocks]
        high = [(b["high"] if b["high"] is not None else b["mean"]) - b["mean"] for b in blocks]
        ax.errorbar(range(len(names)), means, yerr=[low, high], marker=marker, linestyle=style, capsize=4, label=label)
    labels = {"base": "base", "sft": "SFT"}
    ax.set_xticks(range(len(names)), [labels.get(n) or f"RL {n.rsplit('_', 1)[1]}" for n in names])
    ax.legend()
    ax.set_ylabel("held-out answers (%)")
    ax.set_title(f"{len(results['split']['heldout'])} held-out KernelBench L1/L2 tasks, 95% bootstrap CI")
    ax.set_ylim(bottom=0)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def save_answers(outputs, names: list[str], out: Path) -> None:
    """Every model's answers and per-sample verdicts, compressed, beside the results: what the rates
    are made of, for reading why answers fail."""
    import gzip
    import shutil

    folder = out / "answers"
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        for source in (outputs.generations(name), outputs.eval_report(name)):
            if source.is_file():
                with open(source, "rb") as raw, gzip.open(folder / (source.name + ".gz"), "wb") as packed:
                    shutil.copyfileobj(raw, packed)


def report_phase(cfg, split: dict, clock: PhaseClock, overrides: list[str], out: Path, resamples: int,
                 rl_tasks: dict[str, int]) -> None:
    from extensions.evaluation.commands import output_files

    outputs = output_files(cfg, None)
    names = ["base", "sft"] + [f"rl_round_{i}" for i in range(1, cfg.rl.num_rounds + 1)]
    present = [n for n in names if outputs.eval_report(n).is_file()]
    if len(present) < 2:
        raise SystemExit(f"report: only {present} evaluated; run the other phases first")
    reports = {n: json.loads(outputs.eval_report(n).read_text()) for n in present}
    # The machine the phases ran on (the report may be written elsewhere from the saved reports).
    device_file = clock.path.parent / "device.txt"
    device = device_file.read_text().strip() if device_file.is_file() else None
    results = build_results(cfg, present, reports, split, clock, overrides, resamples, device)
    results["rl_tasks"] = rl_tasks
    results["rl_rounds"] = rl_round_summary(cfg)
    out.mkdir(parents=True, exist_ok=True)
    save_answers(outputs, present, out)
    (out / "learning_signal.json").write_text(json.dumps(results, indent=1))
    (out / "learning_signal.md").write_text(table(results) + "\n\n" + decontamination_table(results["decontamination"]) + "\n")
    plot(results, out / "learning_signal.png")
    print(table(results))
    print(f"phase seconds: {results['phase_seconds']}  device: {results['device']}")
    print(f"results: {out}/learning_signal.{{json,md,png}}")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernelbench", required=True, help="KernelBench problems JSONL (level, problem_id, name, code)")
    parser.add_argument("--work", required=True, help="run directory (checkpoints, generations, reports)")
    parser.add_argument("--out", default="outputs/learning_signal", help="where the results JSON, table and plot go")
    parser.add_argument("--phases", default=",".join(PHASES),
                        help=f"comma-separated subset of {','.join(PHASES)} (rl_eval_<n>: round n only)")
    parser.add_argument("--model", help="model.name_or_path (default: the config's)")
    parser.add_argument("--sft-pairs",
                        help="SFT pairs: 'bundled', or KernelBook-format JSONL files, comma-joined (default: "
                             "the config's, the synthesizer's two files in bench/results/); every pair is "
                             "verified by the data stage and decontaminated against the held-out split")
    parser.add_argument("--heldout-tasks", type=int, default=48, help="held-out problems, half from each level")
    parser.add_argument("--rl-tasks", type=int, default=24)
    parser.add_argument("--samples", type=int, help="samples per task in RL and evaluation (default: the config's)")
    parser.add_argument("--rl-rounds", type=int, help="default: the config's rl.num_rounds")
    parser.add_argument("--sft-steps", type=int, help="default: the config's sft.max_steps")
    parser.add_argument("--sft-lr", type=float, help="default: the config's sft.learning_rate")
    parser.add_argument("--rl-lr", type=float, help="default: the config's rl.learning_rate")
    parser.add_argument("--max-new-tokens", default="auto",
                        help="answer budget in tokens, or 'auto': 95%% of the SFT pairs' answers fit")
    parser.add_argument("--max-seq-len", default="auto",
                        help="SFT sequence limit in tokens, or 'auto': 99%% of the SFT pairs fit")
    parser.add_argument("--batch-size", type=int, help="sequences decoded together (default: the config's)")
    parser.add_argument("--timing-budget", type=float, help="verifier timing seconds per candidate (default: the config's)")
    parser.add_argument("--decontamination-threshold", type=float, default=0.85)
    parser.add_argument("--bootstrap", type=int, default=2000)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="further config overrides")
    parser.add_argument("--quick", action="store_true",
                        help="dry run of the same code on CPU: a tiny random model, 2+2 tasks, 2 samples, 1 round, 16 tokens")
    args = parser.parse_args(argv)
    if args.quick:
        args.device, args.heldout_tasks, args.rl_tasks, args.samples, args.rl_rounds = "cpu", 2, 2, 2, 1
        args.sft_steps, args.max_new_tokens, args.batch_size = 1, 16, 4
        args.sft_pairs = args.sft_pairs or "bundled"  # the interpreter would take long over the synthesized pairs
        # The tiny tokenizer spends about three times the tokens of a real one on the same prompt.
        args.max_seq_len = 4096
        args.set = ["model.dtype=float32", "verifier.multi_input_num_tests=1", *args.set]
    for name in ("max_new_tokens", "max_seq_len"):
        value = getattr(args, name)
        if value != "auto":
            try:
                setattr(args, name, int(value))
            except ValueError:
                parser.error(f"--{name.replace('_', '-')} takes a number of tokens or 'auto', not {value!r}")
    unknown = {p for p in args.phases.split(",") if p not in PHASES
               and not (p.startswith("rl_eval_") and p[len("rl_eval_"):].isdigit())}
    if unknown:
        parser.error(f"unknown phase(s) {sorted(unknown)}; choose from {PHASES} or rl_eval_<n>")
    return args


def main(argv=None) -> int:
    import logging

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    work = Path(args.work).resolve()
    if args.quick:
        from extensions.models.tiny import save_tiny_model

        args.model = str(save_tiny_model(work / "tiny-model"))
    split = write_split(args, work)
    try:
        phases = phase_order(args.phases.split(","), args.rl_rounds or 10**6)
    except ValueError as exc:
        raise SystemExit(f"unknown phase {exc}")
    measure = [name for name in ("max_new_tokens", "max_seq_len") if getattr(args, name) == "auto"]
    for name in measure:  # a placeholder until the prepared pairs are measured
        setattr(args, name, 2048)
    cfg, overrides = build_config(args, work)
    clock = PhaseClock(work / "phase_seconds.json")
    started = time.time()
    counts_file = work / "rl_task_counts.json"
    built = built_data(cfg) if "data" not in phases and counts_file.is_file() else None
    if built is not None:
        # The run's data as it was built: a later verifier change does not re-judge its pairs
        # (minutes of GPU per change) unless the data phase is asked for.
        rl_tasks = json.loads(counts_file.read_text())
        print(f"[data] the run's data as built ({built}); --phases data builds it again")
    else:
        rl_tasks = prepare_data(cfg, split)
        counts_file.write_text(json.dumps(rl_tasks))
    if "data" in phases:
        clock.record("data", time.time() - started)
    print(f"[rl tasks] {rl_tasks['kernelbench']} KernelBench problems and {rl_tasks['synthesized']} synthesized programs")
    # Measuring the budgets needs the model's tokenizer; the data phase and the report do not (the
    # report states the measured ones when they exist).
    if measure and (set(phases) - {"data", "report"} or (work / "budgets.json").is_file()):
        budgets = measured_budgets(cfg, work)
        for name in measure:
            setattr(args, name, budgets[name])
    cfg, overrides = build_config(args, work, rl_pool=sum(rl_tasks.values()))
    try:
        phases = phase_order(phases, cfg.rl.num_rounds)
    except ValueError as exc:
        raise SystemExit(f"phase {exc} names an RL round the config does not have (rl.num_rounds={cfg.rl.num_rounds})")
    for phase in phases:
        print(f"==== {phase}", flush=True)
        if phase == "report":
            report_phase(cfg, split, clock, overrides, Path(args.out), args.bootstrap, rl_tasks)
        else:
            (work / "device.txt").write_text(device_name())
            run_phase(phase, cfg, clock)
    return 0


if __name__ == "__main__":
    sys.exit(main())
