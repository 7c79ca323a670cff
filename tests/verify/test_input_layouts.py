"""Inputs reach the candidate in the layout the problem gives them.

A problem whose ``get_inputs`` returns a transposed view hands its own forward column-major data.
The verifier used to hand the candidate a contiguous copy instead: a kernel that ignores strides
was judged correct there (and is wrong on the problem as posed), and a kernel written for the
problem's layout was rejected. The suites hold the judged cases
(``tests/fixtures/problems/column_major_affine.py`` and its candidates); these tests hold the
pieces: the transport, the sandbox's placement, and the varied sets."""
from __future__ import annotations

import pytest
import torch

from extensions.verify.common.tensor_io import TensorIOError, memory_order, pack, unpack
from extensions.verify.reference.variations import in_drawn_layouts
from extensions.verify.sandboxed.handed_files import spaced_apart


def test_permuted_layouts_cross_the_boundary_as_they_are():
    column_major = torch.randn(8, 5).t()
    channels_last = torch.randn(2, 3, 4, 5).contiguous(memory_format=torch.channels_last)
    expanded = torch.randn(4, 1).expand(4, 6)
    tensors: dict = {}
    spec = pack([column_major, channels_last, expanded, torch.randn(3, 4)], "in", tensors)
    assert all(t.is_contiguous() for t in tensors.values())  # what the file holds
    back = unpack(spec, tensors)
    for original, received in zip((column_major, channels_last), back):
        assert received.stride() == original.stride() and torch.equal(received, original)
    assert back[2].is_contiguous() and torch.equal(back[2], expanded)  # no permutation of a dense tensor
    assert memory_order(back[3]) is None and back[3].is_contiguous()


@pytest.mark.parametrize("order", [[0, 0], [1], [0, 2], "ab", [1.0, 0.0]])
def test_a_malformed_permutation_is_refused(order):
    tensors = {"in": torch.randn(3, 4)}
    with pytest.raises(TensorIOError):
        unpack({"permuted": ["in", order]}, tensors)


def test_the_sandbox_places_inputs_in_their_layout():
    column_major = torch.randn(6, 7).t()
    placed, contiguous = spaced_apart([column_major, torch.randn(3, 3)], "cpu")
    assert placed.stride() == column_major.stride() and torch.equal(placed, column_major)
    assert placed.storage_offset() == 0 and contiguous.is_contiguous()


def test_varied_sets_keep_the_drawn_layout():
    drawn = [torch.randn(16, 8).t(), torch.randn(4, 4), 3]
    # A transform that builds its output anew (as the negative-lines set's ``where`` does).
    varied = [torch.where(drawn[0] > 0, drawn[0] * 2, drawn[0]).contiguous(), drawn[1] + 1, 3]
    laid = in_drawn_layouts(drawn, varied)
    assert laid[0].stride() == drawn[0].stride() and torch.equal(laid[0], varied[0])
    assert laid[1] is varied[1] and laid[2] == 3
