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
