"""Shared test fixtures. Tests are CPU-only and never touch the network."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[1]
KERNELBENCH_JSONL = PROJECT_ROOT.parent / "shared" / "kernelbench" / "kernelbench_problems.jsonl"

if str(PROJECT_ROOT) not in sys.path:
    sys.path.insert(0, str(PROJECT_ROOT))

# Triton kernels run in the interpreter on CPU.
os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def project_root() -> Path:
    return PROJECT_ROOT


@pytest.fixture(scope="session")
def kernelbench_jsonl() -> Path:
    if not KERNELBENCH_JSONL.is_file():
        pytest.skip(f"KernelBench data not found at {KERNELBENCH_JSONL}")
    return KERNELBENCH_JSONL


@pytest.fixture(scope="module")
def moto_server():
    """A real S3 server on loopback (moto), one per test module."""
    from s3_testing import free_port, start_moto

    port = free_port()
    server = start_moto(port)
    yield {"server": server, "port": port, "url": f"http://127.0.0.1:{port}"}
    server.stop()


@pytest.fixture
def s3(moto_server, monkeypatch):
    """boto3 pointed at the loopback server through AWS_ENDPOINT_URL, with a fresh bucket."""
    import boto3
    from s3_testing import point_boto3_at

    bucket = point_boto3_at(moto_server["url"], monkeypatch)
    client = boto3.client("s3")
    client.create_bucket(Bucket=bucket)
    return {"client": client, "bucket": bucket, **moto_server}
