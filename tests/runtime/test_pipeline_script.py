"""run_pipeline.sh end to end with stand-in stages: skipping of complete stages, a failed stage that
stops the pipeline with its name and exit code, and an S3-mirrored run restored onto a new machine."""
from __future__ import annotations

import shutil
from pathlib import Path
import subprocess

from extensions.cloud.ec2_detect import ec2_evidence
from extensions.cloud.location import S3Location
from extensions.cloud.remote_tree import ManifestReader, list_objects, remote_checkpoints
from extensions.runtime.paths import RunPaths

from fake_stages import final_states, stage_env, write_config, write_fake_stages
from s3_testing import PROJECT_ROOT

SCRIPT = PROJECT_ROOT / "run_pipeline.sh"


def pipeline(*args: str, env: dict, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=timeout)


def stage_lines(output: str) -> dict[str, str]:
    lines = output.split("======== summary", 1)[-1].splitlines()
    return {line.split()[0]: line.strip() for line in lines if line.strip().split(" ")[0] in ("prepare", "sft", "rl", "eval")}


def test_runs_all_stages_then_skips_them(tmp_path):
    env = stage_env(write_fake_stages(tmp_path / "scripts"))
    config = write_config(tmp_path / "run.yaml", tmp_path / "run")
    first = pipeline("--config", str(config), env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    lines = stage_lines(first.stdout)
    assert all("done in" in lines[stage] for stage in ("prepare", "sft", "rl", "eval")), first.stdout
    assert "pipeline finished" in first.stdout and "comparison" in first.stdout
    paths = RunPaths(tmp_path / "run")
    assert final_states(paths)["rl"]["index"] == 4 and paths.compare_json.is_file()
    watcher_log = (paths.logs / "checkpoint_manager.log").read_text()
    if ec2_evidence() is None:  # off EC2 the metadata address is never polled
        assert "no metadata polling (not an EC2 instance" in watcher_log, watcher_log

    again = pipeline("--config", str(config), "--set", "rl.num_rounds=4", env=env)
    assert again.returncode == 0, again.stdout + again.stderr
    assert all("skipped" in line for line in stage_lines(again.stdout).values()), again.stdout
    assert (paths.logs / "fake_stages.log").read_text().count("prepare") == 1


def test_failed_stage_stops_the_pipeline_with_its_name_and_exit_code(tmp_path):
    env = stage_env(write_fake_stages(tmp_path / "scripts"))
    config = write_config(tmp_path / "run.yaml", tmp_path / "run")
    failed = pipeline("--config", str(config), env={**env, "FAKE_FAIL_STAGE": "rl"})
    assert failed.returncode == 7
    assert "stage rl FAILED with exit code 7" in failed.stdout
    assert "FAILED: stage rl (exit code 7)" in failed.stdout
    assert "eval" not in stage_lines(failed.stdout)

    resumed = pipeline("--config", str(config), env=env)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    lines = stage_lines(resumed.stdout)
    assert "skipped" in lines["prepare"] and "skipped" in lines["sft"]
    assert "done in" in lines["rl"] and "done in" in lines["eval"]


def test_stage_stopped_after_a_save_says_to_run_again(tmp_path):
    env = stage_env(write_fake_stages(tmp_path / "scripts"))
    config = write_config(tmp_path / "run.yaml", tmp_path / "run")
    stopped = pipeline("--config", str(config), env={**env, "FAKE_FAIL_STAGE": "sft", "FAKE_FAIL_CODE": "75"})
    assert stopped.returncode == 75
    assert "stage sft stopped after saving a checkpoint" in stopped.stdout
    assert "run the same command again to continue" in stopped.stdout
    assert "FAILED with exit code" not in stopped.stdout


def test_bad_arguments_are_refused(tmp_path):
    env = stage_env(write_fake_stages(tmp_path / "scripts"))
    assert pipeline("--bogus", env=env).returncode == 2
    both = pipeline("--smoke", "--config", str(tmp_path / "x.yaml"), env=env)
    assert both.returncode == 2 and "not both" in both.stderr
    missing = pipeline("--config", str(tmp_path / "x.yaml"), env=env)
    assert missing.returncode == 2 and "config file not found" in missing.stderr


def test_mirrored_run_restores_on_a_new_machine_and_skips_what_is_done(s3, tmp_path):
    env = {**stage_env(write_fake_stages(tmp_path / "scripts")), "KERNEL_RL_BUCKET": s3["bucket"]}
    root = tmp_path / "run"
    config = write_config(tmp_path / "run.yaml", root, run_id="mirrored")
    first = pipeline("--config", str(config), env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "final S3 sync done" in first.stdout
    location = S3Location(s3["bucket"], "runs", "mirrored")
    assert f"S3 mirror    {location.uri}" in first.stdout
    sealed = {c.rel_dir for c in remote_checkpoints(list_objects(s3["client"], location),
                                                    ManifestReader(s3["client"], location)) if c.complete}
    assert {"checkpoints/sft/final", "checkpoints/rl/final"} <= sealed
    expected = final_states(RunPaths(root))

    shutil.rmtree(root)  # the spot instance is gone; a new one runs the same command
    second = pipeline("--config", str(config), env=env)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "restoring from" in second.stdout
    assert all("skipped" in line for line in stage_lines(second.stdout).values()), second.stdout
    assert final_states(RunPaths(root)) == expected


def test_sigkilled_pipeline_leaves_no_watcher_and_reruns_to_completion(tmp_path):
    import os
    import re
    import signal
    import time

    env = stage_env(write_fake_stages(tmp_path / "scripts"))
    config = write_config(tmp_path / "run.yaml", tmp_path / "run")
    paths = RunPaths(tmp_path / "run")
    out = open(tmp_path / "pipeline.out", "w")
    proc = subprocess.Popen(["bash", str(SCRIPT), "--config", str(config)], env={**env, "FAKE_STEP_S": "0.2"},
                            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    watcher_pid = None
    try:
        end = time.time() + 60
        while time.time() < end and not paths.sft_checkpoint(2).is_dir():
            time.sleep(0.05)
        text = (tmp_path / "pipeline.out").read_text()
        watcher_pid = int(re.search(r"checkpoint watcher running \(pid (\d+)", text).group(1))
        proc.send_signal(signal.SIGKILL)  # the script only; its stage child and watcher are orphaned
        proc.wait(10)
        end = time.time() + 20
        while time.time() < end and _alive(watcher_pid):
            time.sleep(0.1)
        assert not _alive(watcher_pid), "the watcher outlived the pipeline"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the orphaned stage (same session)
        except ProcessLookupError:
            pass
        out.close()
    rerun = pipeline("--config", str(config), env=env)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert final_states(paths)["rl"]["index"] == 4 and paths.compare_json.is_file()


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, parent not yet reaped it) is gone for our purposes
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_rerun_with_other_settings_stops_naming_them_and_force_retrains_only_what_changed(tmp_path):
    env = stage_env(write_fake_stages(tmp_path / "scripts"))
    config = write_config(tmp_path / "run.yaml", tmp_path / "run")
    paths = RunPaths(tmp_path / "run")
    assert pipeline("--config", str(config), env=env).returncode == 0

    changed = pipeline("--config", str(config), "--set", "rl.num_rounds=5", "--set", "rl.learning_rate=1.0e-5", env=env)
    assert changed.returncode == 2, changed.stdout + changed.stderr
    assert "rl.num_rounds: 4 -> 5" in changed.stderr and "rl.learning_rate: 5e-06 -> 1e-05" in changed.stderr
    assert "--force" in changed.stderr and str(paths.final("rl") / "config.yaml") in changed.stderr
    assert "already complete" not in changed.stdout and "Traceback" not in changed.stderr

    forced = pipeline("--config", str(config), "--set", "rl.num_rounds=5", "--set", "rl.learning_rate=1.0e-5",
                      "--force", env=env)
    assert forced.returncode == 0, forced.stdout + forced.stderr
    lines = stage_lines(forced.stdout)
    assert "skipped" in lines["prepare"] and "skipped" in lines["sft"], forced.stdout
    assert "done in" in lines["rl"] and "done in" in lines["eval"], forced.stdout  # eval follows the new adapter
    assert final_states(paths)["rl"]["index"] == 5
    assert (paths.logs / "fake_stages.log").read_text().splitlines()[-3:] == ["rl forced", "rl started", "eval"]

    # The new settings are now the run's own: the same command skips everything.
    again = pipeline("--config", str(config), "--set", "rl.num_rounds=5", "--set", "rl.learning_rate=1.0e-5", env=env)
    assert again.returncode == 0 and all("skipped" in line for line in stage_lines(again.stdout).values()), again.stdout


def test_without_a_config_the_pipeline_takes_the_machines_default_once_for_all_stages(tmp_path):
    from s3_testing import free_port

    env = {**stage_env(write_fake_stages(tmp_path / "scripts")), "CUDA_VISIBLE_DEVICES": ""}
    smoke = PROJECT_ROOT / "configs" / "smoke.yaml"
    result = pipeline("--set", f"run.root={tmp_path / 'run'}", "--set", "sft.max_steps=2", "--set", "rl.num_rounds=1",
                      "--set", f"checkpoint.metadata_endpoint=http://127.0.0.1:{free_port()}", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"no --config given: {smoke} (no CUDA GPU visible: the CPU smoke config" in result.stdout
    commands = [line for line in result.stdout.splitlines() if "scripts/" in line and ".py" in line]
    assert len(commands) == 4 and all(f"--config {smoke}" in line for line in commands), result.stdout
