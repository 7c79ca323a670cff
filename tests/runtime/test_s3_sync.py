"""S3 sync, restore, retention and bucket setup against a real S3 server on loopback (moto)."""
from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path


from extensions.runtime import checkpoints as ck
from extensions.cloud.location import S3Location
from extensions.cloud.remote_tree import ManifestReader, list_objects, remote_checkpoints
from extensions.cloud.restore import Restorer
from extensions.cloud.retention import checkpoints_to_prune
from extensions.cloud.s3_sync import CheckpointManager
from extensions.runtime.paths import RunPaths

from s3_testing import PROJECT_ROOT, make_checkpoint, small_settings, start_moto

MB = 1024 * 1024


def make_run(root: Path) -> RunPaths:
    paths = RunPaths(root)
    make_checkpoint(paths.sft_checkpoint(2), "sft", 2)
    make_checkpoint(paths.sft_checkpoint(4), "sft", 4, payload_bytes=6 * MB + 123)  # multipart
    make_checkpoint(paths.final("sft"), "sft", 4)
    make_checkpoint(paths.rl_round(1), "rl", 1)
    make_checkpoint(paths.rl_round(2), "rl", 2, complete=False)
    paths.processed.mkdir(parents=True)
    paths.sft_train.write_text('{"prompt": "a", "completion": "b"}\n' * 50)
    paths.prepare_report.write_text('{"kept": 50}\n')
    paths.outputs.mkdir(parents=True)
    paths.compare_json.write_text('{"base": 0.1}\n')
    paths.logs.mkdir(parents=True)
    paths.metrics_log("sft").write_text('{"step": 1, "loss": 2.0}\n')
    (paths.logs / "save_request.json").write_text('{"reason": "stale"}')  # machine-local, never synced
    (paths.checkpoints / "sft" / ".final.staging").mkdir()
    (paths.checkpoints / "sft" / ".final.staging" / "half.bin").write_bytes(b"x")
    return paths


def tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def assert_manifests_truthful(client, location: S3Location) -> list[str]:
    """Every manifest in S3 lists files that are there with the listed size and sha256."""
    objects = list_objects(client, location)
    sealed = []
    for checkpoint in remote_checkpoints(objects, ManifestReader(client, location)):
        if checkpoint.manifest is None:
            continue
        assert checkpoint.complete, f"{checkpoint.rel_dir}: manifest over missing data {checkpoint.missing}"
        for name, entry in checkpoint.manifest["files"].items():
            key = location.key_for(f"{checkpoint.rel_dir}/{name}")
            body = client.get_object(Bucket=location.bucket, Key=key)["Body"].read()
            assert hashlib.sha256(body).hexdigest() == entry["sha256"], f"{key} differs from its manifest"
        sealed.append(checkpoint.rel_dir)
    return sealed


def test_sync_and_restore_give_byte_identical_trees(s3, tmp_path):
    cfg = small_settings(tmp_path / "a")
    paths = make_run(tmp_path / "a")
    location = S3Location(s3["bucket"], "runs", "test-run")
    manager = CheckpointManager(cfg.checkpoint, paths, location)

    first = manager.sync_once()
    assert first.ok, first.summary()
    keys = set(list_objects(s3["client"], location))
    assert "logs/save_request.json" not in keys and not any(".staging" in key for key in keys)
    assert "checkpoints/rl/round-002/adapter_model.safetensors" in keys  # incomplete: files only
    assert "checkpoints/rl/round-002/manifest.json" not in keys
    assert sorted(assert_manifests_truthful(s3["client"], location)) == [
        "checkpoints/rl/round-001", "checkpoints/sft/checkpoint-2", "checkpoints/sft/checkpoint-4",
        "checkpoints/sft/final"]

    second = manager.sync_once()
    assert second.uploaded_files == 0 and second.unchanged_files == first.uploaded_files

    paths.metrics_log("sft").write_text('{"step": 2, "loss": 1.5}\n')
    third = manager.sync_once()
    assert third.uploaded_files == 1, third.summary()

    restored = RunPaths(tmp_path / "b")
    report = Restorer(cfg.checkpoint, restored, location).restore()
    assert report.ok, report.summary()
    assert report.checkpoints_incomplete == ["checkpoints/rl/round-002: incomplete (no manifest)"]
    expected = {k: v for k, v in tree(paths.root).items()
                if not k.startswith("checkpoints/rl/round-002") and ".staging" not in k
                and not k.endswith("save_request.json")}
    assert tree(restored.root) == expected
    assert ck.is_complete(restored.sft_checkpoint(4), verify_hashes=True)

    again = Restorer(cfg.checkpoint, restored, location).restore()
    assert again.files_downloaded == 0 and len(again.checkpoints_already_local) == 4


def test_other_part_size_does_not_force_reupload(s3, tmp_path):
    paths = make_run(tmp_path / "run")
    location = S3Location(s3["bucket"], "runs", "test-run")
    CheckpointManager(small_settings(paths.root).checkpoint, paths, location).sync_once()
    other = CheckpointManager(small_settings(paths.root, multipart_chunk_mb=6).checkpoint, paths, location)
    report = other.sync_once()  # the 6 MB file's ETag differs; its stored sha256 says it is the same
    assert report.ok and report.uploaded_files == 0, report.summary()


def test_sync_killed_mid_upload_leaves_no_manifest_over_partial_data(s3, tmp_path):
    cfg_root = tmp_path / "run"
    paths = RunPaths(cfg_root)
    make_checkpoint(paths.sft_checkpoint(3), "sft", 3, payload_bytes=40 * MB)
    location = S3Location(s3["bucket"], "runs", "test-run")
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
    command = [sys.executable, str(PROJECT_ROOT / "checkpoint_manager.py"), "--action", "sync", "--smoke",
               "--bucket", s3["bucket"], "--prefix", "runs", "--run-id", "test-run", "--local-dir", str(cfg_root),
               "--set", "checkpoint.upload_concurrency=1", "--set", "checkpoint.file_concurrency=1",
               "--set", "checkpoint.multipart_chunk_mb=5"]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    client, key_prefix = s3["client"], location.key_for("checkpoints/sft/checkpoint-3/")
    deadline = time.time() + 60
    try:
        while time.time() < deadline and proc.poll() is None:
            uploads = client.list_multipart_uploads(Bucket=s3["bucket"], Prefix=key_prefix).get("Uploads", [])
            if uploads:
                break
            time.sleep(0.02)
        assert proc.poll() is None, "the sync finished before it could be killed: " + proc.stdout.read().decode()
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()
    keys = set(list_objects(client, location))
    assert "checkpoints/sft/checkpoint-3/manifest.json" not in keys
    assert "checkpoints/sft/checkpoint-3/adapter_model.safetensors" not in keys  # multipart never completed
    assert_manifests_truthful(client, location)

    report = CheckpointManager(small_settings(cfg_root).checkpoint, paths, location).sync_once()
    assert report.ok and "checkpoints/sft/checkpoint-3" in report.manifests_uploaded, report.summary()
    assert assert_manifests_truthful(client, location) == ["checkpoints/sft/checkpoint-3"]
    restored = RunPaths(tmp_path / "restored")
    assert Restorer(small_settings(restored.root).checkpoint, restored, location).restore().ok
    assert tree(restored.checkpoints) == tree(paths.checkpoints)


def test_changed_checkpoint_withdraws_remote_manifest_before_overwriting(s3, tmp_path):
    paths = RunPaths(tmp_path / "run")
    location = S3Location(s3["bucket"], "runs", "test-run")
    make_checkpoint(paths.final("sft"), "sft", 2, seed="old")
    settings = small_settings(paths.root).checkpoint
    CheckpointManager(settings, paths, location).sync_once()
    # final/ replaced by a newer one: the remote manifest must go before its files are overwritten
    make_checkpoint(paths.final("sft"), "sft", 4, payload_bytes=4096, seed="new")
    report = CheckpointManager(settings, paths, location).sync_once()
    assert report.manifests_withdrawn == ["checkpoints/sft/final"]
    assert report.manifests_uploaded == ["checkpoints/sft/final"]
    assert assert_manifests_truthful(s3["client"], location) == ["checkpoints/sft/final"]


def test_endpoint_outage_costs_retries_not_the_run(s3, tmp_path):
    paths = make_run(tmp_path / "run")
    location = S3Location(s3["bucket"], "runs", "test-run")
    manager = CheckpointManager(small_settings(paths.root).checkpoint, paths, location)
    manager.start()
    try:
        _wait_for(lambda: manager.last_report is not None and manager.last_report.ok, 30)
        s3["server"].stop()
        make_checkpoint(paths.sft_checkpoint(6), "sft", 6)
        _wait_for(lambda: manager.last_report.endpoint_down or manager.last_report.error, 30)
        time.sleep(0.5)  # a few more failing rounds
        assert manager.running, "the sync thread died with the endpoint"
        # A new, empty S3 endpoint on the same address: the next rounds must upload everything.
        s3["server"] = start_moto(s3["port"])
        urllib.request.urlopen(urllib.request.Request(f"{s3['url']}/moto-api/reset", method="POST"), timeout=10)
        s3["client"].create_bucket(Bucket=s3["bucket"])
        _wait_for(lambda: manager.last_report.ok and manager.last_report.started_unix > time.time() - 5
                  and "checkpoints/sft/checkpoint-6" in _sealed(s3["client"], location), 60)
    finally:
        manager.stop(final_sync=False, timeout=30)
    assert sorted(assert_manifests_truthful(s3["client"], location)) == [
        "checkpoints/rl/round-001", "checkpoints/sft/checkpoint-2", "checkpoints/sft/checkpoint-4",
        "checkpoints/sft/checkpoint-6", "checkpoints/sft/final"]


def _sealed(client, location) -> list[str]:
    return [c.rel_dir for c in remote_checkpoints(list_objects(client, location), ManifestReader(client, location))
            if c.complete]


def _wait_for(condition, timeout: float) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached in time")


def test_retention_keeps_newest_complete_per_stage(s3, tmp_path):
    paths = RunPaths(tmp_path / "run")
    location = S3Location(s3["bucket"], "runs", "test-run")
    for step in (1, 2, 3, 4, 5):
        make_checkpoint(paths.sft_checkpoint(step), "sft", step)
    make_checkpoint(paths.final("sft"), "sft", 5)
    for round_index in (1, 2, 3):
        make_checkpoint(paths.rl_round(round_index), "rl", round_index)
    make_checkpoint(paths.rl_round(4), "rl", 4, complete=False)

    CheckpointManager(small_settings(paths.root, keep_last=10).checkpoint, paths, location).sync_once()
    assert len(_sealed(s3["client"], location)) == 9
    report = CheckpointManager(small_settings(paths.root, keep_last=2).checkpoint, paths, location).sync_once()
    assert sorted(report.pruned) == ["checkpoints/rl/round-001", "checkpoints/sft/checkpoint-1",
                                     "checkpoints/sft/checkpoint-2", "checkpoints/sft/checkpoint-3"]
    keys = set(list_objects(s3["client"], location))
    dirs = {"/".join(key.split("/")[:3]) for key in keys if key.startswith("checkpoints/")}
    assert dirs == {"checkpoints/sft/checkpoint-4", "checkpoints/sft/checkpoint-5", "checkpoints/sft/final",
                    "checkpoints/rl/round-002", "checkpoints/rl/round-003", "checkpoints/rl/round-004"}
    assert "checkpoints/rl/round-004/manifest.json" not in keys  # incomplete and newer: kept, unsealed

    # keep_last=0 still keeps the newest complete checkpoint of each stage
    objects = list_objects(s3["client"], location)
    doomed = checkpoints_to_prune(remote_checkpoints(objects, ManifestReader(s3["client"], location)), 0)
    assert sorted(c.rel_dir for c in doomed) == ["checkpoints/rl/round-002", "checkpoints/sft/checkpoint-4"]


def test_setup_and_list_actions(s3, tmp_path, capsys):
    import checkpoint_manager

    bucket = f"kernel-rl-setup-{uuid.uuid4().hex[:8]}"
    assert checkpoint_manager.main(["--action", "setup", "--bucket", bucket, "--smoke",
                                    "--set", "checkpoint.noncurrent_version_days=3"]) == 0
    client = s3["client"]
    assert client.get_bucket_versioning(Bucket=bucket)["Status"] == "Enabled"
    rules = client.get_bucket_encryption(Bucket=bucket)["ServerSideEncryptionConfiguration"]["Rules"]
    assert rules[0]["ApplyServerSideEncryptionByDefault"]["SSEAlgorithm"] == "AES256"
    lifecycle = client.get_bucket_lifecycle_configuration(Bucket=bucket)["Rules"][0]
    assert lifecycle["NoncurrentVersionExpiration"]["NoncurrentDays"] == 3
    assert checkpoint_manager.main(["--action", "setup", "--bucket", bucket, "--smoke"]) == 0  # idempotent

    paths = make_run(tmp_path / "run")
    args = ["--bucket", bucket, "--prefix", "runs", "--run-id", "listed", "--local-dir", str(paths.root),
            "--smoke", "--set", "checkpoint.multipart_chunk_mb=5"]
    assert checkpoint_manager.main(["--action", "sync", *args]) == 0
    capsys.readouterr()
    assert checkpoint_manager.main(["--action", "list", *args]) == 0
    out = capsys.readouterr().out
    assert "s3://%s/runs/listed/" % bucket in out
    assert any(line.split()[:2] == ["sft", "checkpoint-4"] and line.endswith("complete") for line in out.splitlines())
    assert any(line.split()[:2] == ["rl", "round-002"] and "incomplete (no manifest)" in line
               for line in out.splitlines())
