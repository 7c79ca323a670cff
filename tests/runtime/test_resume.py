"""resume_training.py: plans from run state, and a run SIGKILLed at a random moment that resumes from
its last complete checkpoint (locally or from S3) and ends exactly where an uninterrupted run ends.

The stage scripts are small stand-ins (written to a temporary directory) that keep a deterministic
hash-chain state, save checkpoints with extensions.runtime.checkpoints and resume from newest_complete, as
the real train_integrated.py does; these tests do not depend on the real stages."""
from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path


from extensions.runtime import checkpoints as ck
from extensions.cloud.location import S3Location
from extensions.pipeline.run_state import read_run_state
from extensions.pipeline.runner import plan_resume
from extensions.pipeline.stages import prepared_files
from extensions.cloud.s3_sync import CheckpointManager
from extensions.config import load_config
from extensions.runtime.paths import RunPaths

from fake_stages import final_states, stage_env, write_config, write_fake_stages, write_finished_run
from s3_testing import PROJECT_ROOT


def resume(config: Path, scripts: Path, *extra: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(PROJECT_ROOT / "resume_training.py"), "--config", str(config), *extra],
                          env=stage_env(scripts), capture_output=True, text=True, timeout=timeout)


def test_plan_follows_the_newest_complete_checkpoint(tmp_path):
    paths = RunPaths(tmp_path / "run")
    scripts = tmp_path / "scripts"
    plan = plan_resume(paths, "python", scripts, ["--config", "c.yaml"])
    assert plan.stages == ["prepare", "sft", "rl", "eval"]
    assert plan.commands[1] == ["python", str(scripts / "train_integrated.py"), "--stage", "sft", "--config", "c.yaml"]

    for path in prepared_files(paths):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}\n")
    for step in (2, 4):
        directory = paths.sft_checkpoint(step)
        directory.mkdir(parents=True)
        ck.write_meta(directory, stage="sft", config="c.yaml", base_model="m", data="d", step=step)
        ck.finalize(directory)
    partial = paths.sft_checkpoint(6)
    partial.mkdir()
    ck.write_meta(partial, stage="sft", config="c.yaml", base_model="m", data="d", step=6)  # no manifest
    plan = plan_resume(paths, "python", scripts, [])
    assert plan.stages == ["sft", "rl", "eval"]
    assert plan.resume_from == paths.sft_checkpoint(4) and plan.position == "SFT from step 4"

    ck.copy_checkpoint(paths.sft_checkpoint(4), paths.final("sft"))
    assert plan_resume(paths, "python", scripts, []).position == "RL from round 0 (on sft/final)"


def test_finished_run_is_left_alone(tmp_path):
    scripts = write_fake_stages(tmp_path / "scripts")
    config = write_config(tmp_path / "run.yaml", tmp_path / "run")
    paths = write_finished_run(load_config(config))
    result = resume(config, scripts)
    assert result.returncode == 0, result.stderr
    assert "is finished" in result.stdout and "nothing to do" in result.stdout
    assert not paths.logs.exists()  # no stage ran


def _kill_at_random_moment(config: Path, scripts: Path, paths: RunPaths, rng: random.Random) -> int:
    """Start the pipeline's stages via resume_training.py and SIGKILL them at a random moment."""
    proc = subprocess.Popen([sys.executable, str(PROJECT_ROOT / "resume_training.py"), "--config", str(config)],
                            env=stage_env(scripts), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        end = time.time() + 60
        while time.time() < end and not paths.sft_checkpoint(2).exists():
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.6))  # somewhere in SFT or RL: mid-step, mid-save, mid-copy
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode


def test_sigkill_at_random_moment_resumes_to_the_uninterrupted_result(tmp_path):
    scripts = write_fake_stages(tmp_path / "scripts")
    reference = RunPaths(tmp_path / "reference")
    result = resume(write_config(tmp_path / "reference.yaml", reference.root), scripts)
    assert result.returncode == 0, result.stdout + result.stderr
    expected = final_states(reference)
    assert expected["rl"]["index"] == 4 and json.loads(reference.compare_json.read_text())["rl_state"] == expected["rl"]

    seed = int(os.environ.get("RESUME_TEST_SEED", time.time_ns() % 10_000))
    rng = random.Random(seed)
    for attempt in range(2):
        paths = RunPaths(tmp_path / f"killed-{attempt}")
        config = write_config(tmp_path / f"killed-{attempt}.yaml", paths.root)
        assert _kill_at_random_moment(config, scripts, paths, rng) == -signal.SIGKILL
        state = read_run_state(paths)
        assert not state.evaluated, f"seed {seed}: the kill came after the run finished"
        stage = state.next_stage
        newest = {"sft": state.newest_sft, "rl": state.newest_rl}.get(stage)
        index = json.loads((newest / "state.json").read_text())["index"] if newest else None
        result = resume(config, scripts)
        assert result.returncode == 0, f"seed {seed}: {result.stdout}{result.stderr}"
        assert final_states(paths) == expected, f"seed {seed}"
        assert json.loads(paths.compare_json.read_text())["rl_state"] == expected["rl"]
        if newest is not None:  # killed mid-stage after a checkpoint: it must continue from that one
            log = (paths.logs / "fake_stages.log").read_text()
            assert f"{stage} resumed from {index}" in log, f"seed {seed}: did not resume from {newest}\n{log}"


def test_resume_restores_from_s3_then_continues(s3, tmp_path):
    scripts = write_fake_stages(tmp_path / "scripts")
    reference = RunPaths(tmp_path / "reference")
    assert resume(write_config(tmp_path / "reference.yaml", reference.root), scripts).returncode == 0
    expected = final_states(reference)

    # A machine that got as far as RL round 2 (round 3 half-written) and mirrored itself, then vanished.
    lost = RunPaths(tmp_path / "lost")
    lost_config = write_config(tmp_path / "lost.yaml", lost.root, run_id="spot-run", rl="{num_rounds: 2}")
    assert resume(lost_config, scripts).returncode == 0
    (lost.final("rl") / "manifest.json").unlink()  # as if killed before rl/final was sealed
    lost.compare_json.unlink()
    partial = lost.rl_round(3)
    partial.mkdir()
    (partial / "adapter_model.bin").write_bytes(b"half")
    cfg = load_config(lost_config)
    location = S3Location(s3["bucket"], "runs", "spot-run")
    assert CheckpointManager(cfg.checkpoint, lost, location).sync_once().ok

    fresh = RunPaths(tmp_path / "fresh")
    config = write_config(tmp_path / "fresh.yaml", fresh.root, run_id="spot-run")
    dry = resume(config, scripts, "--bucket", s3["bucket"], "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "rl     round-002" in dry.stdout and not fresh.root.exists()  # dry run: listed, nothing fetched

    result = resume(config, scripts, "--bucket", s3["bucket"])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "RL after round 2" in result.stdout
    assert final_states(fresh) == expected
    lost_log = (lost.logs / "fake_stages.log").read_text().splitlines()
    fresh_log = (fresh.logs / "fake_stages.log").read_text().splitlines()  # restored, then appended to
    assert fresh_log == lost_log + ["rl started", "rl resumed from 2", "eval"]


def test_training_stages_use_the_configured_launcher(tmp_path, monkeypatch):
    from extensions.pipeline.launcher import LAUNCHER_ENV, visible_gpus

    monkeypatch.setenv(LAUNCHER_ENV, "accelerate launch --num_processes 8")
    plan = plan_resume(RunPaths(tmp_path / "run"), "python", tmp_path, ["--config", "c.yaml"])
    assert plan.commands[0][:2] == ["python", str(tmp_path / "prepare_data.py")]
    assert plan.commands[1][:5] == ["accelerate", "launch", "--num_processes", "8", str(tmp_path / "train_integrated.py")]
    assert plan.commands[3][0] == "python"
    monkeypatch.delenv(LAUNCHER_ENV)
    if visible_gpus() <= 1:  # one GPU or none: the plain interpreter
        assert plan_resume(RunPaths(tmp_path / "run"), "python", tmp_path, []).commands[1][0] == "python"


def test_results_restored_from_s3_are_checked_against_the_resuming_config(s3, tmp_path):
    scripts = write_fake_stages(tmp_path / "scripts")
    first = RunPaths(tmp_path / "first")
    first_config = write_config(tmp_path / "first.yaml", first.root, run_id="shared-run")
    assert resume(first_config, scripts).returncode == 0
    cfg = load_config(first_config)
    assert CheckpointManager(cfg.checkpoint, first, S3Location(s3["bucket"], "runs", "shared-run")).sync_once().ok

    second = RunPaths(tmp_path / "second")
    other_config = write_config(tmp_path / "second.yaml", second.root, run_id="shared-run", lora="{r: 8}")
    dry = resume(other_config, scripts, "--bucket", s3["bucket"], "--dry-run")  # judged from S3's meta.json
    assert dry.returncode == 2, dry.stdout + dry.stderr
    assert "sft: the finished result" in dry.stderr and "(in S3; the restore brings it here)" in dry.stderr
    assert "lora.r: 16 -> 8" in dry.stderr and not second.root.exists()
    forced_dry = resume(other_config, scripts, "--bucket", s3["bucket"], "--dry-run", "--force")
    assert forced_dry.returncode == 0, forced_dry.stdout + forced_dry.stderr
    assert "sft      will run (--force: its result was made with other settings)" in forced_dry.stdout
    assert "prepare  done in S3 (will be restored)" in forced_dry.stdout and not second.root.exists()
    refused = resume(other_config, scripts, "--bucket", s3["bucket"])
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "sft: the finished result" in refused.stderr and "lora.r: 16 -> 8" in refused.stderr
    assert "Traceback" not in refused.stderr
    restored_log = (first.logs / "fake_stages.log").read_text()
    assert (second.logs / "fake_stages.log").read_text() == restored_log  # restored, and no stage ran

    forced = resume(other_config, scripts, "--bucket", s3["bucket"], "--force")
    assert forced.returncode == 0, forced.stdout + forced.stderr
    log = (second.logs / "fake_stages.log").read_text().splitlines()
    assert log[-5:] == ["sft forced", "sft started", "rl forced", "rl started", "eval"]
    assert ck.read_meta(second.final("rl"))["config"]["lora"]["r"] == 8


# -- dry run with a bucket: the plan of the run as the restore will leave it ----------------------
def _tree(root: Path) -> list[tuple[str, int, int]]:
    return sorted((str(p.relative_to(root)), p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*"))


def _stage_lines(stdout: str) -> dict[str, str]:
    lines = {}
    for line in stdout.splitlines():
        name, _, status = line.strip().partition(" ")
        if name in ("prepare", "sft", "rl", "eval") and status.strip().startswith(("done", "will run")):
            lines[name] = status.strip()
    return lines


def _mirror_sft_only_run(s3, tmp_path: Path, scripts: Path, run_id: str) -> tuple[RunPaths, S3Location]:
    """A machine that prepared the data and finished SFT (RL never started), mirrored to S3, then lost."""
    lost = RunPaths(tmp_path / "lost")
    config = write_config(tmp_path / "lost.yaml", lost.root, run_id=run_id)
    assert resume(config, scripts).returncode == 0
    shutil.rmtree(lost.stage_dir("rl"))
    lost.compare_json.unlink()
    location = S3Location(s3["bucket"], "runs", run_id)
    assert CheckpointManager(load_config(config).checkpoint, lost, location).sync_once().ok
    return lost, location


def test_dry_run_plans_from_what_the_bucket_holds_and_downloads_nothing(s3, tmp_path):
    scripts = write_fake_stages(tmp_path / "scripts")
    lost, _ = _mirror_sft_only_run(s3, tmp_path, scripts, "sft-in-s3")

    fresh = RunPaths(tmp_path / "fresh")
    fresh.root.mkdir()
    config = write_config(tmp_path / "fresh.yaml", fresh.root, run_id="sft-in-s3")
    dry = resume(config, scripts, "--bucket", s3["bucket"], "--dry-run")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert _tree(fresh.root) == []  # nothing downloaded, nothing created
    assert _stage_lines(dry.stdout) == {"prepare": "done in S3 (will be restored)",
                                        "sft": "done in S3 (will be restored)",
                                        "rl": "will run", "eval": "will run"}, dry.stdout
    assert "next stage rl (RL from round 0 (on sft/final))" in dry.stdout
    assert "plan from the local files" not in dry.stdout

    # The real run does what the dry run said: restore, then RL and evaluation only.
    restored_log = (lost.logs / "fake_stages.log").read_text().splitlines()
    result = resume(config, scripts, "--bucket", s3["bucket"])
    assert result.returncode == 0, result.stdout + result.stderr
    assert (fresh.logs / "fake_stages.log").read_text().splitlines() == restored_log + ["rl started", "eval"]

    # Restored and finished: everything is done locally now.
    again = resume(config, scripts, "--bucket", s3["bucket"], "--dry-run")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "nothing to do" in again.stdout
    assert set(_stage_lines(again.stdout).values()) == {"done locally"}, again.stdout


def test_dry_run_does_not_count_incomplete_checkpoints_in_s3(s3, tmp_path):
    scripts = write_fake_stages(tmp_path / "scripts")
    lost, location = _mirror_sft_only_run(s3, tmp_path, scripts, "torn-sft")
    client, bucket = s3["client"], s3["bucket"]
    # sft/final caught mid-upload (its manifest lists a file S3 lacks); checkpoint-12 never sealed.
    client.delete_object(Bucket=bucket, Key=location.key_for("checkpoints/sft/final/adapter_model.bin"))
    client.delete_object(Bucket=bucket, Key=location.key_for("checkpoints/sft/checkpoint-12/manifest.json"))

    fresh = RunPaths(tmp_path / "fresh")
    fresh.root.mkdir()
    config = write_config(tmp_path / "fresh.yaml", fresh.root, run_id="torn-sft")
    dry = resume(config, scripts, "--bucket", bucket, "--dry-run")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert _tree(fresh.root) == []
    assert _stage_lines(dry.stdout) == {"prepare": "done in S3 (will be restored)", "sft": "will run",
                                        "rl": "will run", "eval": "will run"}, dry.stdout
    assert "next stage sft (SFT from step 10)" in dry.stdout
    assert f"continues from {fresh.sft_checkpoint(10)} (in S3, will be restored)" in dry.stdout
    assert "sft    final" in dry.stdout and "incomplete (1 listed file(s) missing" in dry.stdout

    result = resume(config, scripts, "--bucket", bucket)
    assert result.returncode == 0, result.stdout + result.stderr
    new_lines = (fresh.logs / "fake_stages.log").read_text().splitlines()[
        len((lost.logs / "fake_stages.log").read_text().splitlines()):]
    assert new_lines == ["sft started", "sft resumed from 10", "rl started", "eval"]


def test_dry_run_says_when_only_the_restore_can_judge_a_result(s3, tmp_path):
    scripts = write_fake_stages(tmp_path / "scripts")
    lost, location = _mirror_sft_only_run(s3, tmp_path, scripts, "foreign-upload")
    # Uploaded by another tool: no sha256 stored with the object, so its hash needs its bytes.
    s3["client"].put_object(Bucket=s3["bucket"], Key=location.key_for("data/processed/sft_train.jsonl"),
                            Body=lost.sft_train.read_bytes())
    fresh = RunPaths(tmp_path / "fresh")
    config = write_config(tmp_path / "fresh.yaml", fresh.root, run_id="foreign-upload")
    dry = resume(config, scripts, "--bucket", s3["bucket"], "--dry-run")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert not fresh.root.exists()
    sft = _stage_lines(dry.stdout)["sft"]
    assert sft.startswith("done in S3 (will be restored); whether it fits this config is checked after the restore")
    assert "sft_train.jsonl" in sft
