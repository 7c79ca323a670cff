"""The value sets the trusted reference builds: where wrong kernels hide, the sets reach.

A kernel started at 0 for a maximum is right on every input with a non-negative value; one that
returns 1 for tanh(0) is right on every input without an exact zero; one with ``get_inputs``'
scalar written in is right while every set passes that scalar. The sets are built the way a batch
builds them (secret drawn from the OS), and their inputs are checked directly.
"""
from __future__ import annotations

import torch

from extensions.verify.reference_data import draw_secret
from extensions.verify.reference_worker import ReferenceBuilder

JOB = {"device": "cpu", "seed": 0, "max_input_numel": 4096, "tiny_first": False, "num_tests": 5,
       "multi_input": True, "value_variations": True, "shape_variations": False}

SCALED = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, A, s):
        return A * s

rows = 64
cols = 64

def get_inputs():
    return [torch.rand(rows, cols), 3.14]

def get_init_inputs():
    return []
'''

DIVIDED = SCALED.replace("return A * s", "return A / s").replace("[torch.rand(rows, cols), 3.14]",
                                                                   "[torch.rand(rows, cols) + 1.0, torch.rand(rows, cols) + 1.0]")


def _built(source: str) -> ReferenceBuilder:
    builder = ReferenceBuilder(source, JOB, draw_secret())
    builder.build()
    return builder


def _inputs(builder: ReferenceBuilder, name: str) -> list:
    (chosen,) = [s for s in builder.sets if s["name"] == name]
    return [builder.tensors[spec["tensor"]] if "tensor" in spec else spec["value"] for spec in chosen["inputs"]["list"]]


def test_default_sets_reach_zeros_negatives_and_other_scalars():
    builder = _built(SCALED)
    names = [s["name"] for s in builder.sets]
    assert names[:4] == ["base", "signed", "scale_up", "shift"], names

    signed, scalar = _inputs(builder, "signed")
    assert (signed == 0).any() and (signed < 0).any() and (signed > 0).any()
    assert scalar != 3.14  # the scalar from get_inputs is not the problem's own

    shifted, _ = _inputs(builder, "shift")
    assert shifted.max() <= -100, float(shifted.max())  # all negative and far from zero: exp underflows

    large, _ = _inputs(builder, "scale_up")
    assert large.max() >= 50 and (large == 0).any()


def test_a_set_the_reference_rejects_with_zeros_is_kept_without_them():
    builder = _built(DIVIDED)
    assert "signed" in [s["name"] for s in builder.sets]  # a division by an input: zeros make inf
    numerator, denominator = _inputs(builder, "signed")
    assert not (denominator == 0).any()
    assert any(note.startswith("signed: without exact zeros") for note in builder.skipped), builder.skipped
    assert torch.isfinite(numerator).all()
