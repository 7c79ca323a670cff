"""GPU tests of the timer (skipped without CUDA): a kernel against itself reads 1.0 within its CI, a
side-stream candidate and memoising candidates get no speedup and carry flags."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from extensions.config.sections import VerifierConfig
from extensions.timing import gpu_lease, measure_speedup

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

CANDIDATES = Path(__file__).resolve().parents[1] / "bench" / "timing_candidates"
MEMO_FLAGS = {"memoization_suspected", "output_reused", "output_mismatch_during_timing"}


def _load(name):
    spec = importlib.util.spec_from_file_location(f"gpu_test_{name}", CANDIDATES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _config(**overrides):
    return VerifierConfig(timing_mode="budget", timing_budget_s=1.0, **overrides)


def _vectors(numel, count=4):
    sets = []
    for index in range(count):
        torch.manual_seed(index)
        sets.append([torch.rand(numel, device="cuda")])
    return sets


def test_same_kernel_against_itself_reads_one(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNEL_TIMING_LOCK_DIR", str(tmp_path))
    relu = _load("l1_019_relu")
    with gpu_lease(torch.cuda.current_device()):
        report = measure_speedup(relu.ModelNew(), relu.ModelNew(), _vectors(1 << 24), _config())
    low, high = report.ci95
    assert low <= 1.0 <= high or abs(report.speedup - 1.0) < 0.01, report.to_dict()
    assert report.stable and not report.flags, report.to_dict()
    assert report.method.startswith("paired-interleaved/cuda-events")
    assert report.last_input_index == 3
    assert torch.equal(report.last_output, torch.relu(_vectors(1 << 24)[3][0]))


def test_side_stream_candidate_is_flagged_and_gains_nothing():
    relu, exploits = _load("l1_019_relu"), _load("exploits")
    report = measure_speedup(relu.ModelNew(), exploits.SideStream(relu.ModelNew()), _vectors(1 << 26), _config())
    assert "side_stream_suspected" in report.flags or "event_wall_mismatch" in report.flags, report.to_dict()
    assert report.speedup is not None and report.speedup <= 1.2, report.to_dict()


@pytest.mark.parametrize("wrapper", ["AddressMemo", "FingerprintMemo"])
def test_memoiser_gains_nothing(wrapper):
    matmul, exploits = _load("l1_001_square_matmul"), _load("exploits")
    sets = []
    for index in range(4):
        torch.manual_seed(10 + index)
        sets.append([torch.rand(2048, 2048, device="cuda"), torch.rand(2048, 2048, device="cuda")])
    candidate = getattr(exploits, wrapper)(matmul.ModelNew())
    # TF32 against TF32: the reference is the same honest Triton kernel.
    report = measure_speedup(matmul.ModelNew(), candidate, sets, _config(atol_fp32=1e-2, rtol_fp32=1e-2))
    assert MEMO_FLAGS & set(report.flags), report.to_dict()
    assert report.speedup is None or report.speedup <= 1.2, report.to_dict()
