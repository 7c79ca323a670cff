"""The calling context is no constant a candidate can key on.

Every set once ran with the module in training mode and grad off, so a kernel exact only there
(``self.training`` true, or a parameter's clone not requiring grad) was accepted and wrong in a
user's eval-mode or training call. Some sets now run in eval mode, with grad on and/or under
inference mode, the
reference in the same context; where eval mode changes the reference's output (BatchNorm) the
set keeps training mode, since a kernel that ignores the mode is right for the problem as
KernelBench calls it; with grad on the inputs require grad too, as an inner layer's do in a
training call. The suite files ``wrong/rt_exact_only_*`` and
``wrong/rt_bias_only_when_its_clone_needs_no_grad.py`` are the end-to-end cases. Fresh CPU
memory, always NaN, was another such constant (``wrong/rt_exact_only_where_fresh_memory_reads_nan.py``).
"""
from __future__ import annotations

import torch

from extensions.config import VerifierConfig
from extensions.verify.common.judged_context import CONTEXTS, judged_context
from extensions.verify.parent.reference_data import draw_secret, reference_job
from extensions.verify.reference.builder import ReferenceBuilder

JOB = {**reference_job(VerifierConfig(), "cpu"), "seed": 0, "max_input_numel": 4096, "tiny_first": True,
       "num_tests": 5}

ELEMENTWISE = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return torch.sigmoid(x)

batch_size = 16
dim = 64

def get_inputs():
    return [torch.rand(batch_size, dim)]

def get_init_inputs():
    return []
'''

BATCH_NORM = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.bn = nn.BatchNorm1d(features)

    def forward(self, x):
        return self.bn(x)

batch_size = 16
features = 32

def get_inputs():
    return [torch.rand(batch_size, features)]

def get_init_inputs():
    return [features]
'''


def _contexts(source: str, device: str = "cpu") -> tuple[list, ReferenceBuilder]:
    job = JOB if device == "cpu" else {**reference_job(VerifierConfig(), device), "seed": 0, "num_tests": 5}
    builder = ReferenceBuilder(source, job, draw_secret())
    builder.build()
    return [s.get("context") for s in builder.sets], builder


def test_every_context_is_judged_on_some_set_and_never_on_tiny_base_or_wide(verify_device):
    """On the suite's device: on CUDA the context's output and the expected one it replaces live
    on different devices until one is moved."""
    for _ in range(3):  # the sets that get them are drawn per batch
        contexts, builder = _contexts(ELEMENTWISE, verify_device)
        assert not any("judged context" in str(note) for note in builder.skipped), builder.skipped
        seen = {(c["eval"], c["grad"], c["inference"]) for c in contexts if c}
        assert seen == set(CONTEXTS), contexts
        for entry in builder.sets:
            if entry["kind"] in ("tiny", "base", "wide"):
                assert "context" not in entry, entry["name"]


def test_eval_mode_is_left_out_where_it_changes_the_reference():
    contexts, builder = _contexts(BATCH_NORM)
    assert [c for c in contexts if c], contexts
    assert all(not c["eval"] for c in contexts if c), contexts
    assert any("eval mode" in s and "changes with it" in s for s in builder.skipped), builder.skipped


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Dropout(0.0)
        self.b = torch.nn.Sequential(torch.nn.Identity(), torch.nn.Dropout(0.0))
        self.b[1].eval()  # a module its constructor left in eval mode stays so after the call

    def forward(self, x):
        seen.append((self.training, self.a.training, self.b.training, torch.is_grad_enabled(),
                     torch.is_inference_mode_enabled()))
        return x


seen: list = []


def test_the_context_is_set_as_a_users_call_sets_it_and_put_back():
    model = _Net()
    before = [m.training for m in model.modules()]
    seen.clear()
    for context in (None, {"eval": True, "grad": False}, {"eval": False, "grad": True}, {"eval": True, "grad": True},
                    {"eval": True, "grad": False, "inference": True}):
        with judged_context(model, context):
            out = model(torch.ones(1))
        assert [m.training for m in model.modules()] == before
    assert seen == [(True, True, True, False, False), (False, False, False, False, False),
                    (True, True, True, True, False), (False, False, False, True, False),
                    (False, False, False, False, True)]
    assert out.is_inference()  # made in a user's inference_mode call, as the candidate sees it


def test_inputs_require_grad_where_grad_is_on_and_not_after():
    """With grad on and inputs that never required it, a kernel keyed on ``x.requires_grad`` was
    judged in a training call no user makes (``wrong/rt_exact_only_when_input_needs_no_grad.py``)."""
    x, index = torch.ones(3), torch.arange(3)
    for context, expected in ((None, False), ({"eval": True, "grad": False}, False),
                              ({"eval": False, "grad": True}, True), ({"eval": True, "grad": True}, True)):
        with judged_context(_Net(), context, [x, index]):
            assert x.requires_grad is expected and not index.requires_grad
        assert not x.requires_grad
        x.copy_(torch.zeros(3))  # the harness's refill for the next set


def test_fresh_memory_holds_a_fill_drawn_per_set_past_the_base():
    """Always NaN, fresh CPU memory told a kernel it was judged
    (``wrong/rt_exact_only_where_fresh_memory_reads_nan.py``): past the base, one set's fresh
    memory is zero, another's a drawn finite value, every ATen allocation's whole storage."""
    import math

    from extensions.verify.sandboxed.interpreter_compat import FreshMemory

    fresh = FreshMemory()
    fresh.plan([False, False, True, True, True, True])
    assert set(fresh.fills) == {2, 3, 4, 5}
    values = list(fresh.fills.values())
    assert 0.0 in values and any(v != 0.0 and math.isfinite(v) for v in values)
    (finite,) = [i for i, v in fresh.fills.items() if v != 0.0 and math.isfinite(v)][:1]
    fresh.start_set(finite)
    expected = fresh.fills[finite]
    x = torch.ones(3)
    with fresh.during():
        made = [torch.empty(5), torch.empty_like(x), x.new_empty(4), torch.empty_strided((2,), (3,)),
                torch.empty(0).resize_(6), torch.empty(3, dtype=torch.int32)]
    for tensor in made[:5]:
        storage = torch.empty(0).set_(tensor.untyped_storage(), 0, (tensor.untyped_storage().nbytes() // 4,))
        assert torch.all(storage == torch.tensor(expected, dtype=torch.float32)), tensor
    assert 1 <= int(made[5][0]) <= 100
    fresh.start_set(0)  # no fill of its own: torch's deterministic NaN, as the worker sets it
    assert type(fresh.during()).__name__ == "nullcontext"
