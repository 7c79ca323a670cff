"""Training metrics: always JSONL, plus the trackers logging.report_to names (accelerate's tracker
classes). TensorBoard by default, read back from its event files; a named tracker whose package is
missing stops at start-up with what to install."""
from __future__ import annotations

import importlib.util
import json

import pytest

from extensions.config import ConfigError, load_config
from extensions.runtime.paths import RunPaths
from extensions.training.metrics import MetricsLogger

from s3_testing import PROJECT_ROOT


def tensorboard_scalars(directory) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(directory))
    events.Reload()
    return {tag: [(e.step, round(e.value, 6)) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_default_config_reports_to_tensorboard_and_jsonl(tmp_path):
    cfg = load_config(PROJECT_ROOT / "configs" / "smoke.yaml")
    assert cfg.logging.report_to == ["tensorboard"]
    paths = RunPaths(tmp_path / "run")
    metrics = MetricsLogger.for_stage(paths, "sft", report_to=cfg.logging.report_to, project="test-run")
    metrics.log(1, {"loss": 2.5, "lr": 1e-4, "grad": {"norm": 0.75}, "note": "text", "nan": float("nan")})
    metrics.log(2, {"loss": 2.25, "lr": 1e-4, "grad": {"norm": 0.5}})
    metrics.log(2, {"eval_loss": 3.0}, kind="eval")
    metrics.close()
    rows = [json.loads(line) for line in paths.metrics_log("sft").read_text().splitlines()]
    assert [(r["kind"], r["step"]) for r in rows] == [("step", 1), ("step", 2), ("eval", 2)]
    assert rows[0]["note"] == "text" and rows[0]["grad"] == {"norm": 0.75}
    scalars = tensorboard_scalars(paths.tensorboard("sft"))
    assert scalars["step/loss"] == [(1, 2.5), (2, 2.25)]
    assert scalars["step/grad/norm"] == [(1, 0.75), (2, 0.5)]
    assert scalars["eval/eval_loss"] == [(2, 3.0)]
    assert "step/note" not in scalars and "step/nan" not in scalars


def test_empty_report_to_writes_jsonl_only_and_other_ranks_write_nothing(tmp_path):
    paths = RunPaths(tmp_path / "run")
    quiet = MetricsLogger.for_stage(paths, "rl", report_to=[])
    quiet.log(0, {"reward_mean": 0.5}, kind="round")
    quiet.close()
    assert paths.metrics_log("rl").is_file() and not paths.tensorboard("rl").exists()
    other_rank = MetricsLogger.for_stage(RunPaths(tmp_path / "other"), "rl", enabled=False)
    other_rank.log(0, {"reward_mean": 0.5})
    other_rank.close()
    assert not (tmp_path / "other").exists()


@pytest.mark.parametrize("tracker", ["wandb", "mlflow"])
def test_named_tracker_without_its_package_is_a_clear_start_up_error(tmp_path, tracker):
    if importlib.util.find_spec(tracker) is not None:
        pytest.skip(f"{tracker} is installed here")
    cfg = load_config(PROJECT_ROOT / "configs" / "smoke.yaml", [f"logging.report_to=[tensorboard, {tracker}]"])
    with pytest.raises(ConfigError, match=f"pip install {tracker}"):
        MetricsLogger.for_stage(RunPaths(tmp_path / "run"), "sft", enabled=False, report_to=cfg.logging.report_to)
    assert not (tmp_path / "run").exists()  # nothing started, nothing written


def test_unknown_tracker_is_rejected_by_the_config():
    with pytest.raises(ConfigError, match="logging.report_to"):
        load_config(PROJECT_ROOT / "configs" / "smoke.yaml", ["logging.report_to=[neptune]"])


# -- RL round histograms -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from extensions.models.tiny import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("tiny_model"))


def judge_even_samples_correct(items):
    """Even sample indices are correct, with a speedup that depends on the index; odd ones are not."""
    from extensions.verify.result import VerifyResult

    results = []
    for request in items:
        label = request.label
        sample = int(label.split("/")[2])
        correct = sample % 2 == 0
        results.append(VerifyResult(candidate=label, correct=correct, stage="timing" if correct else "compile",
                                    reward=1.0 if correct else 0.0, speedup=1.0 + sample / 10 if correct else None))
    return results


def tensorboard_histograms(directory) -> dict[str, list[tuple[int, int]]]:
    """tag -> [(step, number of values)], every event kept (the default keeps one per tag)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(directory), size_guidance={"histograms": 0})
    events.Reload()
    return {tag: [(e.step, int(e.histogram_value.num)) for e in events.Histograms(tag)]
            for tag in events.Tags()["histograms"]}


@pytest.mark.parametrize("every, rounds", [(2, 3), (0, 2)])
def test_rl_rounds_log_histograms_every_n_rounds(tmp_path, model_dir, every, rounds):
    from rl_synthetic import synthetic_config, vowel_reward

    from extensions.training.rl import run_rl

    cfg = synthetic_config(tmp_path, model_dir, [
        "rl.algorithm=grpo", f"rl.num_rounds={rounds}", "rl.tasks_per_round=2", "rl.samples_per_task=4",
        "rl.max_new_tokens=4", f"logging.histogram_every={every}"])
    outcome = run_rl(cfg, progress=False, verify_fn=judge_even_samples_correct, score_fn=vowel_reward)
    assert outcome.status == "finished"
    paths = RunPaths.from_config(cfg)
    rows = [json.loads(line) for line in paths.metrics_log("rl").read_text().splitlines()]
    assert [row["round"] for row in rows if row["kind"] == "round"] == list(range(1, rounds + 1))
    histograms = tensorboard_histograms(paths.tensorboard("rl"))
    if every == 0:
        assert histograms == {}
        assert "round/reward_mean" in tensorboard_scalars(paths.tensorboard("rl"))
        return
    samples = cfg.rl.tasks_per_round * cfg.rl.samples_per_task
    assert histograms == {"round/reward": [(2, samples)], "round/advantage": [(2, samples)],
                          "round/speedup": [(2, samples // 2)]}
