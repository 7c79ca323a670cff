"""The numerics the verifier fixes in its processes, and its advice to a GEMM multiplied at TF32.

The reference runs with TF32 off (cuDNN's convolutions default to it, five times the fp32
tolerance off on an H100); the timed baseline runs at those settings whatever the candidate's
module assigned at import (cuDNN's TF32 off and deterministic algorithms made it twice as slow).
"""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from extensions.verify.common.precision import dots_at_tf32


def test_reference_settings_are_pinned_and_a_candidates_changes_undone():
    script = textwrap.dedent("""
        import torch
        from extensions.verify.common.precision import backend_settings, pin_ieee_fp32, restore
        settings = pin_ieee_fp32()
        assert settings["cudnn.allow_tf32"] is False and settings["cuda.matmul.allow_tf32"] is False
        # what a candidate's module may assign at import (policy.ASSIGNABLE_TORCH_SETTINGS)
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.deterministic = True
        torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
        changed = restore(settings)
        assert sorted(changed) == ["cuda.matmul.allow_fp16_reduced_precision_reduction", "cudnn.allow_tf32",
                                   "cudnn.deterministic"], changed
        assert backend_settings() == settings and restore(settings) == []
        print("ok")
    """)
    from conftest import PROJECT_ROOT

    done = subprocess.run([sys.executable, "-c", script], cwd=PROJECT_ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_every_switch_a_candidate_may_assign_is_restored():
    from extensions.verify.static.policy import ASSIGNABLE_TORCH_SETTINGS
    from extensions.verify.common.precision import SWITCHES

    assert {f"torch.backends.{path}.{name}" for path, name in SWITCHES} >= ASSIGNABLE_TORCH_SETTINGS


@pytest.mark.parametrize("call, at_tf32", [
    ("acc += tl.dot(a, b)", True),
    ("acc = tl.dot(a, b, acc)", True),
    ('acc = tl.dot(a, b, acc, input_precision="tf32")', True),
    ("acc = tl.dot(a, b, acc, allow_tf32=True)", True),
    ('acc = tl.dot(a, b, acc, input_precision="ieee")', False),
    ('acc = triton.language.dot(a, b, input_precision="tf32x3")', False),
    ("acc = tl.dot(a, b, allow_tf32=False)", False),
    ("acc = tl.dot(a, b, input_precision=PRECISION)", False),  # cannot be told: no advice
    ("y = x.dot(w)", False),  # a tensor method, one argument
    ("def broken(:", False),
])
def test_dots_at_tf32(call, at_tf32):
    assert dots_at_tf32(call) is at_tf32
