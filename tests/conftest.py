"""Shared test fixtures. Tests are CPU-only and never touch the network."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parent
PROJECT_ROOT = TESTS_DIR.parent

# Test files sit in subfolders that follow the library's layout (tests/verify/, tests/training/, ...);
# the support modules (s3_testing, sandbox_support, rl_synthetic, project_paths, ...) and fixtures/
# stay here, so every test imports them by plain name wherever its own file is.
for _path in (PROJECT_ROOT, TESTS_DIR):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

# Under pytest-xdist (``-n 2``) each worker process has a temporary directory of its own, so that
# what one worker's verifier leaves there (a sandbox's private root, a tampering candidate's
# targets) is never another worker's business.
if os.environ.get("PYTEST_XDIST_WORKER"):
    import tempfile

    tempfile.tempdir = tempfile.mkdtemp(prefix=f"kernel-rl-{os.environ['PYTEST_XDIST_WORKER']}-")
    os.environ["TMPDIR"] = tempfile.tempdir

KERNELBENCH_JSONL = Path(os.environ.get(
    "KERNELBENCH_JSONL", PROJECT_ROOT.parent / "shared" / "kernelbench" / "kernelbench_problems.jsonl"))

def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


# The data stage's verdict cache lives in the user's home by default; tests keep theirs per session,
# shared by every test (and subprocess) of the run so each pair is judged once.
if "KERNEL_RL_VERIFY_CACHE" not in os.environ:
    import tempfile

    os.environ["KERNEL_RL_VERIFY_CACHE"] = str(Path(tempfile.mkdtemp(prefix="kernel-rl-tests-")) / "verified_pairs.jsonl")
# The same for the operator-graph signatures the decontamination traces.
if "KERNEL_RL_SIGNATURE_CACHE" not in os.environ:
    import tempfile

    os.environ["KERNEL_RL_SIGNATURE_CACHE"] = str(Path(tempfile.mkdtemp(prefix="kernel-rl-tests-")) / "signatures.jsonl")

# Tests talk to loopback only: a hub model id that is not cached fails at once instead of asking
# huggingface.co (the tests that exercise the hub path point HF_ENDPOINT at 127.0.0.1 themselves).
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# Without a GPU, Triton kernels run in the interpreter; on a GPU machine they compile for real.
if not _cuda_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def verify_device() -> str:
    """Device the candidate suites are judged on: cpu (interpreter) here, cuda on a GPU machine
    (``KERNEL_RL_TEST_DEVICE=cuda``), where the same verdicts must hold and timing runs too."""
    device = os.environ.get("KERNEL_RL_TEST_DEVICE", "cpu")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            pytest.skip("KERNEL_RL_TEST_DEVICE=cuda but no CUDA device")
    return device


@pytest.fixture(scope="session")
def verify_isolation() -> str:
    """Isolation the candidate suites are judged under: the default (bubblewrap) unless
    ``KERNEL_RL_TEST_ISOLATION=process`` asks for plain process isolation."""
    return os.environ.get("KERNEL_RL_TEST_ISOLATION", "auto")


@pytest.fixture(scope="session")
def project_root() -> Path:
    return PROJECT_ROOT


@pytest.fixture(scope="session")
def learning_signal(project_root: Path):
    """``bench/learning_signal.py`` as a module (a benchmark script, not part of the package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("learning_signal", project_root / "bench" / "learning_signal.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
