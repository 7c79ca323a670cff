"""GPU tests of the timer (skipped without CUDA): a kernel against itself reads 1.0 within its CI,
an honest Triton candidate against a PyTorch reference carries no flag, the launch gate takes host
launch time out of the region and the byte ratio of two sweeps comes out right in that mode, a
forward that waits for the device is reported as not gated, and side-stream and memoising
candidates get no speedup and carry flags in both launch-cost modes."""
from __future__ import annotations

import importlib.util

import pytest
import torch

from extensions.config.sections import VerifierConfig
from extensions.timing import gpu_lease, measure_speedup
from extensions.verify.common.compare import compare_outputs
from project_paths import PROJECT_ROOT

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

CANDIDATES = PROJECT_ROOT / "bench" / "timing_candidates"
MEMO_FLAGS = {"memoization_suspected", "output_reused", "output_mismatch_during_timing"}


def _load(name):
    spec = importlib.util.spec_from_file_location(f"gpu_test_{name}", CANDIDATES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _config(**overrides):
    settings = {"timing_mode": "budget", "timing_budget_s": 1.0, **overrides}
    return VerifierConfig(**settings)


def _gated_nearly_always(report) -> bool:
    """``excluded``, or ``mixed`` with at most 5% of either role's timed calls ungated: on a
    virtualised host a stall of the host now and then outlasts a gate (2 of 224 calls in one H100
    run), and the call is counted, not hidden (docs/timing.md); a forward that waits for the
    device is ungated on every call."""
    if report.launch_cost == "excluded":
        return True
    gated = report.details["launch_excluded_calls"]
    return report.launch_cost == "mixed" and min(gated.values()) >= 0.95 * report.trials


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
        report = measure_speedup(relu.ModelNew(), relu.ModelNew(), _vectors(1 << 24), _config(),
                                 compare_outputs=compare_outputs)
    low, high = report.ci95
    assert low <= 1.0 <= high or abs(report.speedup - 1.0) < 0.01, report.to_dict()
    assert report.stable and not report.flags, report.to_dict()
    assert report.method.startswith("paired-interleaved/cuda-events") and "gated-launch" in report.method
    assert _gated_nearly_always(report), report.to_dict()
    assert report.last_input_index == 3
    assert torch.equal(report.last_output, torch.relu(_vectors(1 << 24)[3][0]))


class TorchSigmoid(torch.nn.Module):
    def forward(self, x):
        return torch.sigmoid(x)


@pytest.mark.parametrize("launch_cost", ["excluded", "included"])
def test_honest_triton_candidate_against_pytorch_carries_no_flag(launch_cost):
    sigmoid = _load("l1_021_sigmoid")
    report = measure_speedup(TorchSigmoid(), sigmoid.ModelNew(), _vectors(1 << 26),
                             _config(timing_launch_cost=launch_cost), compare_outputs=compare_outputs)
    assert report.flags == [], report.to_dict()
    assert 0.5 < report.speedup < 2.0, report.to_dict()
    assert _gated_nearly_always(report) if launch_cost == "excluded" else report.launch_cost == "included", report.to_dict()


def test_launch_gate_takes_host_launch_time_out_of_the_region():
    relu = _load("l1_019_relu")
    sets = _vectors(1 << 14)  # a few microseconds of device work: launch time dominates eager timing
    reports = {mode: measure_speedup(torch.nn.ReLU(), relu.ModelNew(), sets, _config(timing_launch_cost=mode),
                                     compare_outputs=compare_outputs)
               for mode in ("excluded", "included")}
    assert _gated_nearly_always(reports["excluded"]), reports["excluded"].to_dict()
    assert reports["excluded"].cand_ms < reports["included"].cand_ms, {m: r.to_dict() for m, r in reports.items()}


def test_known_byte_ratio_in_the_launch_excluded_mode():
    sweep = _load("known_ratio_sweep")
    # 4 GB, the benchmark's known-ratio size: every pass from DRAM. At 1 GB the ratio missed 3% on
    # an H200 (per-call costs that do not scale with bytes weigh more) while 4 GB held on both GPUs.
    numel = 1 << 30
    sets = _vectors(numel, count=3)
    report = measure_speedup(sweep.MultiPassSweep(4), sweep.MultiPassSweep(1), sets, _config(), compare_outputs=compare_outputs)
    expected = sweep.bytes_moved(numel, 4) / sweep.bytes_moved(numel, 1)
    assert abs(report.speedup / expected - 1.0) <= 0.03, (expected, report.to_dict())


class WaitsForTheDevice(torch.nn.Module):
    """Reads a value back in forward: the host waits for the device, so no gate can hold."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        out = self.inner(x)
        if float(out[0]) < -1.0:  # never true for ReLU: only the synchronisation matters
            out = out * 0
        return out


def test_forward_that_waits_for_the_device_is_reported_as_not_gated():
    relu = _load("l1_019_relu")
    report = measure_speedup(relu.ModelNew(), WaitsForTheDevice(relu.ModelNew()), _vectors(1 << 20),
                             _config(timing_budget_s=0.3), compare_outputs=compare_outputs)
    assert report.launch_cost == "mixed", report.to_dict()
    assert report.details["launch_excluded_calls"]["candidate"] == 0
    assert report.speedup is not None and "side_stream_suspected" not in report.flags, report.to_dict()


@pytest.mark.parametrize("launch_cost", ["excluded", "included"])
def test_side_stream_candidate_is_flagged_and_gains_nothing(launch_cost):
    relu, exploits = _load("l1_019_relu"), _load("exploits")
    report = measure_speedup(relu.ModelNew(), exploits.SideStream(relu.ModelNew()), _vectors(1 << 26),
                             _config(timing_launch_cost=launch_cost), compare_outputs=compare_outputs)
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
    report = measure_speedup(matmul.ModelNew(), candidate, sets, _config(atol_fp32=1e-2, rtol_fp32=1e-2),
                             compare_outputs=compare_outputs)
    assert MEMO_FLAGS & set(report.flags), report.to_dict()
    assert report.speedup is None or report.speedup <= 1.2, report.to_dict()


def test_the_stream_trace_tells_an_honest_kernel_from_a_side_stream_one(tmp_path, monkeypatch):
    """What clears a short kernel's after-effect: the CUDA trace of the candidate's calls sees its
    kernels on the calling stream only, and a side-stream candidate's kernels elsewhere."""
    from extensions.timing.measure import make_runner

    monkeypatch.chdir(tmp_path)  # the trace file is written to the working directory
    relu, exploits = _load("l1_019_relu"), _load("exploits")
    sets = _vectors(1 << 16)
    honest = make_runner(relu.ModelNew(), relu.ModelNew(), sets, _config(), compare_outputs).trace_streams(4)
    assert honest["elsewhere"] == 0 and honest["on_calling_stream"] >= 8, honest
    hider = make_runner(relu.ModelNew(), exploits.SideStream(relu.ModelNew()), sets, _config(),
                        compare_outputs).trace_streams(4)
    assert hider["elsewhere"] >= 4, hider
    assert not list(tmp_path.iterdir())  # the trace file is removed
