"""Compare models evaluated on the same tasks: a summary row per model, paired per-task differences
with bootstrap confidence intervals, written as JSON, a markdown table and a PNG.

A difference is paired: only tasks that every compared report evaluated (same task ids, none of them
skipped) count, each task's score is its share of correct (valid, compiled, fast) samples, and the
bootstrap resamples tasks. A difference whose interval contains 0 is reported as not significant.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence

from ..runtime.activity import RLActivity
from ..runtime.io import atomic_write_json, atomic_write_text
from .metrics import FUNNEL_STAGES
from .stats import paired_bootstrap

SUMMARY_KEYS = ("correct_rate", "pass@1", "fast_1", "geomean_speedup", "valid_rate", "compiled_rate",
                "num_tasks", "num_samples")
PAIRED_METRICS = {
    "correct_rate": ("correct %", lambda s: s["correct"]),
    "valid_rate": ("valid %", lambda s: FUNNEL_STAGES.index(s["stage"]) >= FUNNEL_STAGES.index("static")),
    "compiled_rate": ("compiled %", lambda s: FUNNEL_STAGES.index(s["stage"]) >= FUNNEL_STAGES.index("compile")),
    "fast_1": ("fast_1", lambda s: bool(s["correct"] and s["speedup"] is not None and s["speedup"] > 1.0)),
}
PER_TURN_KEYS = ("turn", "compiled_rate", "correct_rate", "fast_1", "pass@1", "solved_share")
FUNNEL_BARS = (("extract", "extracted"), ("static", "valid"), ("compile", "compiled"), ("tiny", "tiny ok"),
               ("full", "full ok"))


def per_task_scores(report: dict, metric: str) -> dict[str, float]:
    """Each evaluated task's percentage of samples meeting ``metric`` (see PAIRED_METRICS)."""
    test = PAIRED_METRICS[metric][1]
    return {
        t["task_id"]: 100.0 * sum(bool(test(s)) for s in t["samples"]) / len(t["samples"])
        for t in report["tasks"] if t["samples"]
    }


def compare_reports(reports: dict[str, dict], *, bootstrap_samples: int = 2000, seed: int = 1234,
                    confidence: float = 0.95, skipped_models: Sequence[dict] = ()) -> dict[str, Any]:
    """Summary per model and paired differences for every pair (later model minus earlier model)."""
    names = list(reports)
    models = {}
    for name, report in reports.items():
        metrics = report["metrics"]
        models[name] = {
            "model_path": report.get("model_path"),
            "report": report.get("report_path"),
            "timing": bool(report["verification"]["timing"]),
            "no_timing_reason": report["verification"].get("no_timing_reason"),
            **{key: metrics.get(key) for key in SUMMARY_KEYS},
            "skipped_tasks": len(report.get("skipped_tasks", [])),
            # Multi-turn reports: the per-turn rates (by turn t), for the per-turn table and curves.
            "per_turn": [{key: entry.get(key) for key in PER_TURN_KEYS}
                         for entry in (report.get("turns") or {}).get("per_turn", [])],
        }
    common = set.intersection(*(set(t["task_id"] for t in r["tasks"] if t["samples"]) for r in reports.values())) \
        if reports else set()
    differences = []
    for i, baseline in enumerate(names):
        for candidate in names[i + 1:]:
            for metric, (label, _) in PAIRED_METRICS.items():
                if metric == "fast_1" and not (models[baseline]["timing"] and models[candidate]["timing"]):
                    continue
                a = per_task_scores(reports[baseline], metric)
                b = per_task_scores(reports[candidate], metric)
                order = sorted(common)
                interval = paired_bootstrap([b[t] - a[t] for t in order], bootstrap_samples, seed, confidence)
                differences.append({"baseline": baseline, "candidate": candidate, "metric": metric,
                                    "label": label, **interval.to_dict()})
    return {
        "models": models,
        "model_order": names,
        "paired_tasks": len(common),
        "task_counts_differ": len({m["num_tasks"] for m in models.values()}) > 1,
        "bootstrap": {"samples": bootstrap_samples, "seed": seed, "confidence": confidence,
                      "unit": "percentage points, candidate minus baseline, tasks resampled"},
        "differences": differences,
        "skipped_models": list(skipped_models),
    }


def _fmt(value: Optional[float], digits: int = 1, signed: bool = False, suffix: str = "") -> str:
    if value is None:
        return "n/a"
    return f"{value:+.{digits}f}{suffix}" if signed else f"{value:.{digits}f}{suffix}"


def render_markdown(comparison: dict[str, Any]) -> str:
    lines = ["# Model comparison", ""]
    models = comparison["models"]
    timing_notes = {m["no_timing_reason"] for m in models.values() if not m["timing"] and m["no_timing_reason"]}
    lines.append(f"Paired tasks (evaluated by every model): {comparison['paired_tasks']}. "
                 "Rates are percentages of all samples.")
    if comparison["task_counts_differ"]:
        lines.append("The models evaluated different task sets (see skipped tasks): the rows below use each "
                     "model's own tasks, the paired differences only the shared ones.")
    if timing_notes:
        lines.append(f"fast_1 and speedup are n/a where there was no timing ({'; '.join(sorted(timing_notes))}).")
    lines += ["", "| model | correct % | pass@1 % | fast_1 % | geomean speedup | valid % | compiled % | tasks | samples |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name in comparison["model_order"]:
        m = models[name]
        lines.append(
            f"| {name} | {_fmt(m['correct_rate'])} | {_fmt(m['pass@1'])} | {_fmt(m['fast_1'])} | "
            f"{_fmt(m['geomean_speedup'], 2, suffix='x')} | {_fmt(m['valid_rate'])} | {_fmt(m['compiled_rate'])} | "
            f"{m['num_tasks']} | {m['num_samples']} |"
        )
    if comparison["differences"]:
        boot = comparison["bootstrap"]
        lines += ["", f"## Paired differences ({int(boot['confidence'] * 100)}% bootstrap CI, "
                  f"{boot['samples']} resamples of tasks, seed {boot['seed']})", "",
                  "Percentage points, candidate minus baseline, over the same tasks.", "",
                  f"| candidate − baseline | metric | difference | {int(boot['confidence'] * 100)}% CI | significant? |",
                  "|---|---|---:|---|---|"]
        for d in comparison["differences"]:
            if d["low"] is None:
                ci, verdict = "n/a", f"not significant ({d['note']})"
            else:
                ci = f"[{_fmt(d['low'], signed=True)}, {_fmt(d['high'], signed=True)}]"
                verdict = "**yes**" if d["significant"] else "not significant (CI contains 0)"
            lines.append(f"| {d['candidate']} − {d['baseline']} | {d['label']} | {_fmt(d['mean'], signed=True)} | "
                         f"{ci} | {verdict} |")
    turn_models = [name for name in comparison["model_order"] if models[name].get("per_turn")]
    if turn_models:
        lines += ["", "## Per turn (multi-turn refinement)", "",
                  "Rates after t turns over all samples: a trajectory stops at its first correct kernel and "
                  "counts as correct from then on.", "",
                  "| model | turn | compiled % | correct % | fast_1 % | pass@1 % | tasks solved % |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for name in turn_models:
            for e in models[name]["per_turn"]:
                lines.append(f"| {name} | {e['turn']} | {_fmt(e['compiled_rate'])} | {_fmt(e['correct_rate'])} | "
                             f"{_fmt(e['fast_1'])} | {_fmt(e['pass@1'])} | {_fmt(e['solved_share'])} |")
    if comparison.get("rl_activity"):
        lines += ["", "## What RL did", ""]
        lines += [f"- {line.strip()}" for line in RLActivity(**comparison["rl_activity"]).describe()]
    if comparison["skipped_models"]:
        lines += ["", "## Skipped models", ""]
        lines += [f"- **{s['name']}** ({s.get('model_path')}): {s['reason']}" for s in comparison["skipped_models"]]
    skipped_tasks = {name: m["skipped_tasks"] for name, m in models.items() if m["skipped_tasks"]}
    if skipped_tasks:
        lines += ["", "Tasks left out of the rates (see each eval report's `skipped_tasks`): "
                  + ", ".join(f"{name}: {n}" for name, n in skipped_tasks.items())]
    return "\n".join(lines) + "\n"


def funnel_title(names: list[str], reports: dict[str, dict]) -> str:
    """The funnel panel's title, with how many samples and tasks each bar stands for."""
    counts = sorted({(reports[n]["metrics"]["num_samples"], len(reports[n]["tasks"])) for n in names})
    sizes = "; ".join(f"n={samples} samples over {tasks} tasks" for samples, tasks in counts)
    return f"Verification funnel (share of all samples; {sizes}{' per model' if len(names) > 1 else ''})"


def plot_comparison(comparison: dict[str, Any], reports: dict[str, dict], path: Path) -> None:
    """Funnel pass rates per model (grouped bars) and the speedups of correct samples."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.ticker import FuncFormatter

    names = comparison["model_order"]
    turn_models = [n for n in names if comparison["models"][n].get("per_turn")]
    speedups = {n: [s["speedup"] for t in reports[n]["tasks"] for s in t["samples"]
                    if s["correct"] and s["speedup"] is not None] for n in names}
    # Panels that have something to show: a run without timing (CPU) gets no empty speedup panel.
    widths = [3] + ([2] if any(speedups.values()) else []) + ([2] if turn_models else [])
    fig, axes = plt.subplots(1, len(widths), figsize=(4.4 * sum(widths) / 2 + 0.5, 4.8),
                             gridspec_kw={"width_ratios": widths}, squeeze=False)
    funnel_ax, *rest = axes[0]
    speed_ax = rest.pop(0) if any(speedups.values()) else None
    if turn_models:
        _plot_turns(rest.pop(0), {n: comparison["models"][n]["per_turn"] for n in turn_models})
    labels = [label for _, label in FUNNEL_BARS] + ["correct"]
    any_timing = any(comparison["models"][n]["timing"] for n in names)
    if any_timing:
        labels.append("fast_1")
    x = np.arange(len(labels))
    width = 0.8 / max(1, len(names))
    for i, name in enumerate(names):
        metrics = reports[name]["metrics"]
        total = metrics["num_samples"] or 1
        values = [100.0 * metrics["reached_counts"][stage] / total for stage, _ in FUNNEL_BARS]
        values.append(metrics["correct_rate"] or 0.0)
        if any_timing:
            values.append(metrics["fast_1"] or 0.0)
        bars = funnel_ax.bar(x + (i - (len(names) - 1) / 2) * width, values, width, label=name)
        funnel_ax.bar_label(bars, fmt="%.0f", fontsize=7, padding=1)
    funnel_ax.set_xticks(x, labels)
    funnel_ax.set_ylim(0, 109)
    funnel_ax.set_ylabel("% of samples reaching the stage")
    funnel_ax.set_title(funnel_title(names, reports), fontsize=10)
    funnel_ax.legend(loc="upper right", fontsize=8)
    funnel_ax.grid(axis="y", alpha=0.3)

    if speed_ax is not None:
        speed_ax.set_title("Speedup of correct samples")
        data = [speedups[n] or [np.nan] for n in names]
        speed_ax.boxplot(data, showfliers=False)
        rng = np.random.default_rng(0)
        for i, values in enumerate(data, start=1):
            speed_ax.scatter(i + rng.uniform(-0.12, 0.12, len(values)), values, s=10, alpha=0.6, color=f"C{i - 1}")
        speed_ax.set_xticks(range(1, len(names) + 1), [f"{n}\n(n={len(speedups[n])})" for n in names])
        speed_ax.set_yscale("log")
        speed_ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
        speed_ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}x" if v in (0.5, 2, 3, 5) else ""))
        speed_ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
        speed_ax.set_ylabel("speedup over PyTorch (log scale; 1x dashed)")
    else:
        reasons = sorted({comparison["models"][n]["no_timing_reason"] or "no correct sample was timed" for n in names})
        fig.text(0.01, 0.01, "No speedups: " + "; ".join(reasons), fontsize=8, color="dimgrey")
    fig.tight_layout(rect=(0, 0.05 if speed_ax is None else 0, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _plot_turns(ax, per_turn: dict[str, list[dict]]) -> None:
    """Tasks solved (solid) and correct samples (dashed) by turn, one colour per model."""
    for i, (name, entries) in enumerate(per_turn.items()):
        turns = [e["turn"] for e in entries]
        ax.plot(turns, [e["solved_share"] or 0.0 for e in entries], marker="o", color=f"C{i}",
                label=f"{name}: tasks solved")
        ax.plot(turns, [e["correct_rate"] or 0.0 for e in entries], linestyle="--", marker=".", color=f"C{i}",
                label=f"{name}: correct samples")
    ax.set_title("By turn (multi-turn refinement)")
    ax.set_xlabel("turn")
    ax.set_ylabel("% by turn t")
    ax.set_ylim(-2, 102)
    ax.set_xticks(sorted({e["turn"] for entries in per_turn.values() for e in entries}))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def write_comparison(comparison: dict[str, Any], reports: dict[str, dict], *, json_path: Path, md_path: Path,
                     png_path: Path) -> None:
    atomic_write_json(json_path, comparison)
    atomic_write_text(md_path, render_markdown(comparison))
    if reports:
        plot_comparison(comparison, reports, png_path)
