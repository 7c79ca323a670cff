"""S3 failures as a user meets them: retries logged with attempt counts, then one line naming the
endpoint, the operation and the likely cause; no traceback. Real servers only: moto on loopback and
a loopback port nobody listens on."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from extensions.cloud.failures import describe, likely_cause

from fake_stages import stage_env, write_config, write_fake_stages
from s3_testing import PROJECT_ROOT, free_port

FAST_RETRIES = ["--set", "checkpoint.max_retries=3", "--set", "checkpoint.retry_backoff_s=0.01",
                "--set", "checkpoint.retry_backoff_max_s=0.02"]


def s3_env(endpoint: str, tmp_path, credentials: bool = True) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(PYTHONPATH=str(PROJECT_ROOT), AWS_ENDPOINT_URL=endpoint, AWS_DEFAULT_REGION="us-east-1",
               # No shared files, and never the instance metadata address as a credential source.
               AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "no-credentials"),
               AWS_CONFIG_FILE=str(tmp_path / "no-config"), AWS_EC2_METADATA_DISABLED="true")
    if credentials:
        env.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing")
    return env


def manager(action: str, bucket: str, env: dict, tmp_path) -> subprocess.CompletedProcess:
    command = [sys.executable, str(PROJECT_ROOT / "checkpoint_manager.py"), "--action", action, "--smoke",
               "--bucket", bucket, "--local-dir", str(tmp_path / "run"), *FAST_RETRIES]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)


def the_error_line(result: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    return errors[0]


def test_unreachable_endpoint_retries_visibly_then_says_so_in_one_line(tmp_path):
    endpoint = f"http://127.0.0.1:{free_port()}"
    result = manager("restore", "some-bucket", s3_env(endpoint, tmp_path), tmp_path)
    assert result.returncode == 1
    line = the_error_line(result)
    assert endpoint in line and "restore s3://some-bucket/" in line and "list bucket" in line
    assert "endpoint unreachable" in line
    assert "attempt 1/3" in result.stderr and "attempt 2/3" in result.stderr  # INFO, not silence


def test_missing_bucket_is_named_with_the_command_that_creates_it(s3, tmp_path):
    result = manager("list", "no-such-bucket-here", s3_env(s3["url"], tmp_path), tmp_path)
    assert result.returncode == 1
    line = the_error_line(result)
    assert s3["url"] in line and "list checkpoints" in line
    assert "bucket 'no-such-bucket-here' does not exist" in line and "--action setup" in line
    assert "attempt 2/" not in result.stderr  # a missing bucket is not retried


def test_missing_credentials_are_the_cause_not_the_bucket(s3, tmp_path):
    result = manager("restore", s3["bucket"], s3_env(s3["url"], tmp_path, credentials=False), tmp_path)
    assert result.returncode == 1
    assert "no AWS credentials found" in the_error_line(result)


def test_rejected_and_denied_requests_are_told_apart():
    from botocore.exceptions import ClientError

    def client_error(code: str) -> ClientError:
        return ClientError({"Error": {"Code": code, "Message": "..."}}, "ListObjectsV2")

    assert "access denied" in likely_cause(client_error("AccessDenied"), "b")
    assert "credentials rejected" in likely_cause(client_error("InvalidAccessKeyId"), "b")
    assert "does not exist" in likely_cause(client_error("NoSuchBucket"), "b")
    line = describe(client_error("AccessDenied"), "sync s3://b/p/r/", "http://127.0.0.1:9")
    assert line.startswith("S3 sync s3://b/p/r/ at http://127.0.0.1:9 failed: access denied")


def test_pipeline_restore_failure_gives_the_cause_and_no_wrong_hint(tmp_path):
    endpoint = f"http://127.0.0.1:{free_port()}"
    env = {**stage_env(write_fake_stages(tmp_path / "scripts")), **s3_env(endpoint, tmp_path)}
    config = write_config(tmp_path / "run.yaml", tmp_path / "run")
    result = subprocess.run(["bash", str(PROJECT_ROOT / "run_pipeline.sh"), "--config", str(config),
                             "--bucket", "some-bucket", *FAST_RETRIES], env=env, capture_output=True, text=True,
                            timeout=180)
    output = result.stdout + result.stderr
    assert result.returncode == 4, output
    assert "endpoint unreachable" in output and "Traceback" not in output
    assert "does the bucket exist" not in output
