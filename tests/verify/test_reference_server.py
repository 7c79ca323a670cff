"""A batch's reference processes build one problem after another (``verifier.reference_server``).

What a user relies on: the reference data a kept process builds is exactly what a fresh process
per problem builds (the same secret gives the same inputs and expected outputs), whatever the
problems built before it changed in torch's global settings; a problem whose reference fails or
hangs is a verdict on that problem only, and the next problem still gets its reference; and no
reference process outlives its batch.
"""
from __future__ import annotations

import textwrap

import pytest
import torch

from extensions.config import VerifierConfig
from extensions.verify.api import _DevicePool
from extensions.verify.parent import reference_data
from extensions.verify.parent.reference_data import ProblemPreparer

from sandbox_support import processes_with, wait_gone

SCALE = textwrap.dedent("""
    import torch
    import torch.nn as nn

    class Model(nn.Module):
        def __init__(self, alpha):
            super().__init__()
            self.alpha = alpha

        def forward(self, x):
            return torch.tanh(x) * self.alpha + torch.ones(x.shape[-1])

    batch_size = 4
    dim = 24

    def get_inputs():
        return [torch.randn(batch_size, dim)]

    def get_init_inputs():
        return [1.5]
""")

# Changes process-wide torch settings at import: a kept process must not build the next problem's
# reference under them (float64 defaults would turn SCALE's expected outputs into doubles).
GLOBAL_STATE_CHANGER = SCALE.replace(
    "import torch.nn as nn\n",
    "import torch.nn as nn\ntorch.set_default_dtype(torch.float64)\ntorch.backends.cudnn.benchmark = True\n"
    "torch.set_grad_enabled(False)\n", 1)

RAISES = SCALE.replace("return torch.tanh(x)", "raise RuntimeError('broken reference')\n        return torch.tanh(x)")

HANGS = SCALE.replace("def get_inputs():\n", "def get_inputs():\n    import time\n    time.sleep(3600)\n")

FIXED_SECRET = {
    "input_seed": 1234, "param_seed": 5678,
    "transforms": {"signed": [4.0, 2.0, 1.0], "scale_down": 1e-3, "scale_up": 300.0,
                   "scale_up_tops": [5.7, 4.2], "scale_up_share": 1e-3, "shift": 2.0, "shift_scale": 200.0},
    "scalar_factor": 0.7,
}


@pytest.fixture
def fixed_secret(monkeypatch):
    monkeypatch.setattr(reference_data, "draw_secret", lambda: dict(FIXED_SECRET))


def _config(**overrides) -> VerifierConfig:
    settings = {"device": "cpu", "timeout_s": 60, "multi_input_num_tests": 2, **overrides}
    return VerifierConfig(**settings)


def _same_reference(a, b) -> None:
    assert a.ok and b.ok, (a.error, b.error)
    assert [s["name"] for s in a.sets] == [s["name"] for s in b.sets]
    assert a.skipped == b.skipped and a.unanswered == b.unanswered
    for store_a, store_b in ((a.inputs, b.inputs), (a.expected, b.expected)):
        assert sorted(store_a) == sorted(store_b)
        for name in store_a:
            assert store_a[name].dtype == store_b[name].dtype, name
            assert torch.equal(store_a[name], store_b[name]), name


def test_a_kept_process_builds_what_a_fresh_process_builds(tmp_path, fixed_secret):
    config = _config()
    fresh = ProblemPreparer(config, "cpu", str(tmp_path), _DevicePool("cpu", 1)).prepare(SCALE)
    kept = ProblemPreparer(config, "cpu", str(tmp_path), _DevicePool("cpu", 1), reuse_processes=True)
    try:
        changer = kept.prepare(GLOBAL_STATE_CHANGER)
        after_changer = kept.prepare(SCALE)
        again = kept.prepare(SCALE)
    finally:
        kept.close()
    assert changer.ok, changer.error
    _same_reference(fresh, after_changer)
    _same_reference(fresh, again)
    assert fresh.expected and all(t.dtype == torch.float32 for t in after_changer.expected.values())
    # The kept process imported torch once: later problems report no import time.
    assert after_changer.phases["import"] < 0.5 < fresh.phases["import"]


def test_a_failing_or_hanging_reference_is_that_problems_verdict_only(tmp_path):
    kept = ProblemPreparer(_config(timeout_s=3), "cpu", str(tmp_path), _DevicePool("cpu", 1), reuse_processes=True)
    try:
        first = kept.prepare(SCALE)
        broken = kept.prepare(RAISES)
        after_broken = kept.prepare(SCALE)
        hung = kept.prepare(HANGS)
        after_hung = kept.prepare(SCALE)
    finally:
        kept.close()
    assert first.ok and after_broken.ok and after_hung.ok, (first.error, after_broken.error, after_hung.error)
    assert not broken.ok and broken.error.startswith("reference failed: ") and "broken reference" in broken.error
    # The same one line a fresh process per problem gives.
    fresh = ProblemPreparer(_config(), "cpu", str(tmp_path), _DevicePool("cpu", 1)).prepare(RAISES)
    assert fresh.error == broken.error
    assert not hung.ok and hung.error == "reference timed out after 9s"


def test_no_reference_process_outlives_its_batch(tmp_path):
    from extensions.verify import VerifyRequest, verify_batch

    marker = "reference_worker"
    before = set(processes_with(marker))
    kernel = textwrap.dedent("""
        import torch
        import torch.nn as nn
        import triton
        import triton.language as tl

        @triton.jit
        def copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)

        class ModelNew(nn.Module):
            def __init__(self, alpha):
                super().__init__()

            def forward(self, x):
                y = torch.empty_like(x)
                copy_kernel[(triton.cdiv(x.numel(), 256),)](x, y, x.numel(), BLOCK=256)
                return y
    """)
    problems = [SCALE, SCALE.replace("dim = 24", "dim = 20"), RAISES]
    results = verify_batch([VerifyRequest(p, kernel, label=str(i)) for i, p in enumerate(problems)],
                           _config(isolation="process", multi_input_num_tests=1), device="cpu", progress=False)
    assert [r.correct for r in results] == [False, False, False]  # a copy is not tanh * alpha + 1
    assert results[0].stage == "compile" and results[1].stage == "compile"
    assert results[2].error.startswith("problem: reference failed")
    assert set(wait_gone(marker)) <= before


def test_cuda_slots_scale_with_cores_and_gpu_memory_within_two_to_eight_per_gpu():
    from extensions.verify.api import default_cuda_slots

    assert default_cuda_slots(1, 16, 80) == 8  # one H100 machine: one slot per two cores
    assert default_cuda_slots(1, 64, 80) == 8  # never more than eight per GPU
    assert default_cuda_slots(1, 2, 80) == 2  # never fewer than two per GPU
    assert default_cuda_slots(8, 96, 80) == 48
    assert default_cuda_slots(8, 256, 80) == 64
    assert default_cuda_slots(8, 96, 40) == 32  # 40 GB cards: four per GPU
    assert default_cuda_slots(1, 16, 24) == 2


def test_a_reference_that_ran_out_of_memory_is_built_again_alone(tmp_path):
    """Beside other slots' candidates a large problem's reference may not fit on the GPU: it is
    built once more with the device to itself, and the problem is judged, not left out."""
    marker = tmp_path / "failed-once"
    # Every call fails in the first process that builds it (as a full GPU would), none after.
    flaky = SCALE.replace("def forward(self, x):\n", "def forward(self, x):\n"
                          f"        import os\n"
                          f"        if not os.path.exists({str(marker)!r}):\n"
                          f"            open({str(marker)!r}, 'w').write(str(os.getpid()))\n"
                          f"        if open({str(marker)!r}).read() == str(os.getpid()):\n"
                          f"            raise RuntimeError('CUDA out of memory. Tried to allocate 5.00 GiB')\n", 1)
    for reuse in (False, True):
        marker.unlink(missing_ok=True)
        preparer = ProblemPreparer(_config(), "cpu", str(tmp_path), _DevicePool("cpu", 1), reuse_processes=reuse)
        try:
            prepared = preparer.prepare(flaky)
        finally:
            preparer.close()
        assert marker.exists() and prepared.ok, prepared.error
    # Any other failure is the problem's verdict at once.
    broken = ProblemPreparer(_config(), "cpu", str(tmp_path), _DevicePool("cpu", 1)).prepare(RAISES)
    assert not broken.ok and "broken reference" in broken.error
