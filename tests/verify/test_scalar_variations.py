"""Python scalars the value sets vary, and those they must leave alone.

A Python int that ``get_inputs()`` returns, and a float equal to 0.0 (a forward argument, or a module
constant handed to the constructor), move in the value sets where the reference, given the new value
alone, still runs, keeps its output's shapes, stays finite and gives the same output twice: a kernel
with ``k = 3`` or a zero clamp bound written in is then wrong on some set (the suite's
``wrong/rt_*_written_in.py``). An axis or a size (shapes change, or the reference fails), a dropout
probability (the output turns random) and a value outside the function's domain (the output turns
non-finite) keep the problem's value, and the reason is noted. Reference builds only, on CPU.
"""
from __future__ import annotations

import textwrap

import pytest

import candidate_catalog as catalog
from extensions.config import VerifierConfig
from extensions.verify.parent.reference_data import draw_secret, reference_job
from extensions.verify.reference.builder import ReferenceBuilder

JOB = {**reference_job(VerifierConfig(), "cpu"), "seed": 0, "tiny_first": False}


def _built(source: str, factor: float = 1.5, shapes: bool = False) -> ReferenceBuilder:
    job = {**JOB, "shape_variations": shapes}
    builder = ReferenceBuilder(source, job, {**draw_secret(), "scalar_factor": factor})
    builder.build()
    return builder


def _set(builder: ReferenceBuilder, name: str) -> dict:
    (chosen,) = [s for s in builder.sets if s["name"] == name]
    return chosen


def _scalars(chosen: dict) -> list:
    return [spec["value"] for spec in chosen["inputs"]["list"] if "value" in spec]


def test_int_and_zero_inputs_move_in_the_value_sets():
    power = _built((catalog.PROBLEMS_DIR / "integer_power.py").read_text())
    assert _scalars(_set(power, "base")) == [3]
    assert _scalars(_set(power, "signed")) == [4] and _set(power, "signed")["scalars_varied"] == [1]
    shifted = _built((catalog.PROBLEMS_DIR / "shifted_relu.py").read_text(), factor=0.7)
    assert _scalars(_set(shifted, "base")) == [0.0]
    (shift,) = _scalars(_set(shifted, "signed"))
    assert abs(shift - (0.7 - 1.0)) < 1e-12
    assert not [n for n in power.skipped + shifted.skipped if "scalar inputs" in n]


def test_the_other_value_sets_move_an_int_farther_by_a_step_drawn_per_batch():
    """With one step in every set, an exponent capped at k + 1 was right on every set
    (``wrong/rt_int_power_capped_one_above_the_problems.py``)."""
    source = (catalog.PROBLEMS_DIR / "integer_power.py").read_text()
    steps = set()
    for _ in range(6):
        power = _built(source)
        others = [s for s in power.sets if s["kind"] == "values" and s["name"] != "signed" and "scalars_varied" in s]
        assert others, [s["name"] for s in power.sets]
        for chosen in others:
            assert chosen["int_step"] == power.int_step and _scalars(chosen) == [3 + power.int_step]
        steps.add(power.int_step)
    assert steps <= {2, 3}


AXIS_AND_PROBABILITY = textwrap.dedent('''
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Model(nn.Module):
        def forward(self, x, dim, p, start, eps):
            # an axis, a dropout probability of 0.0, a size, and a zero whose other values leave
            # the logarithm's domain
            return torch.log(F.dropout(x, p).narrow(1, 0, start).sum(dim) - eps)

    rows = 8
    cols = 24

    def get_inputs():
        return [torch.rand(rows, cols) + 1.0, 0, 0.0, 5, 0.0]

    def get_init_inputs():
        return []
''')


def test_axes_sizes_probabilities_and_domains_keep_their_values():
    builder = _built(AXIS_AND_PROBABILITY, factor=1.6)  # eps would become +0.6: sums of rows stay above it
    for name in ("signed", "scale_down"):
        assert _scalars(_set(builder, name)) == [0, 0.0, 5, 1.6 - 1.0], builder.skipped
    notes = [n for n in builder.skipped if n.startswith("scalar inputs")]
    assert any("input 1 kept at 0 (the output's shapes changed)" in n for n in notes), notes
    assert any("input 2 kept at 0.0 (the reference is not deterministic with it)" in n for n in notes), notes
    assert any("input 3 kept at 5 (the output's shapes changed)" in n for n in notes), notes
    small = _built(AXIS_AND_PROBABILITY.replace("torch.rand(rows, cols) + 1.0", "torch.rand(rows, cols) * 1e-3"),
                   factor=1.6)  # sums of rows below 0.6: log of a negative number
    assert any("input 4 kept at 0.0 (the output turned non-finite)" in n for n in small.skipped), small.skipped


CONSTRUCTOR_ZEROS = textwrap.dedent('''
    import torch
    import torch.nn as nn

    class Model(nn.Module):
        def __init__(self, clamp_min, clamp_max, dropout_p):
            super().__init__()
            self.clamp_min, self.clamp_max = clamp_min, clamp_max
            self.dropout = nn.Dropout(dropout_p)

        def forward(self, x):
            return self.dropout(torch.clamp(x, self.clamp_min, self.clamp_max))

    rows = 16
    cols = 64
    clamp_min = 0.0
    clamp_max = 1.0
    dropout_p = 0.0
    unused = 0.0

    def get_inputs():
        return [torch.randn(rows, cols)]

    def get_init_inputs():
        return [clamp_min, clamp_max, dropout_p]
''')


@pytest.mark.parametrize("factor, why", [(1.5, "the reference is not deterministic with it"),
                                         (0.7, "reference failed (ValueError)")])
def test_zero_constructor_constants_vary_unless_they_turn_an_option_on(factor, why):
    builder = _built(CONSTRUCTOR_ZEROS, factor=factor, shapes=True)
    zero = factor - 1.0  # a clamp bound of either sign; a dropout probability on, or negative
    assert builder._zero_arguments() == {"clamp_min": zero}
    assert f"constructor arguments: dropout_p kept at 0.0 ({why})" in builder.skipped, builder.skipped
    signed = _set(builder, "signed")
    assert signed["arguments_varied"] == ["clamp_min"]
    assert builder.inits[signed["init"]] == [zero, 1.0, 0.0]
    (shape,) = [s for s in builder.sets if s["kind"] == "shape"]
    assert builder.inits[shape["init"]][0] == zero and builder.inits[shape["init"]][2] == 0.0
