"""Inputs reach the candidate in the layout the problem gives them.

A problem whose ``get_inputs`` returns a transposed view hands its own forward column-major data.
The verifier used to hand the candidate a contiguous copy instead: a kernel that ignores strides
was judged correct there (and is wrong on the problem as posed), and a kernel written for the
problem's layout was rejected. The suites hold the judged cases
(``tests/fixtures/problems/column_major_affine.py``, ``sliced_affine.py``, ``expanded_affine.py``
and their candidates); these tests hold the pieces: the transport, the sandbox's placement, the
varied sets and the reuse of a previous set's tensors."""
from __future__ import annotations

import pytest
import torch

from extensions.verify.common.tensor_io import TensorIOError, memory_order, pack, unpack
from extensions.verify.reference.variations import in_drawn_layouts
from extensions.verify.sandboxed.handed_files import into_previous_tensors, spaced_apart


def _reach(tensor: torch.Tensor) -> torch.Tensor:
    """The stretch of storage ``tensor`` reaches, from its storage's start."""
    last = tensor.storage_offset() + sum((n - 1) * s for n, s in zip(tensor.shape, tensor.stride()))
    return torch.as_strided(tensor, (last + 1,), (1,), 0)


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


def test_slices_and_expanded_views_of_a_problem_cross_as_they_are():
    """A problem's inputs keep strides, storage offset and the memory between their elements: a
    kernel reading the column slice ``h[:, 1:]`` as dense reads the dropped column, as it would on
    the problem's own inputs, not a compact copy where that reading happens to be right."""
    sliced = torch.randn(6, 9)[:, 1:]
    expanded = torch.randn(5).expand(4, 5)
    stepped = torch.randn(20)[3::2]
    tensors: dict = {}
    spec = pack([sliced, expanded, stepped, torch.randn(2, 3)], "in", tensors, layouts=True)
    assert all(t.is_contiguous() and t.dim() == 1 for k, t in tensors.items() if not k.endswith(".3"))
    back = unpack(spec, tensors, layouts=True)
    for original, received in zip((sliced, expanded, stepped), back):
        assert received.stride() == original.stride() and received.storage_offset() == original.storage_offset()
        assert torch.equal(received, original) and torch.equal(_reach(received), _reach(original))
    assert back[3].is_contiguous()
    # Without ``layouts`` (a candidate's outputs) a slice crosses as a compact copy.
    assert unpack(pack(sliced, "out", {}), {"out": sliced.contiguous()}).is_contiguous()


@pytest.mark.parametrize("payload", [
    ["in", [3, 4], [5, 1], 0],         # reaches element 13 of 12 stored
    ["in", [3, 4], [4, 1], 1],         # the offset pushes it past the end
    ["in", [3, 4], [4], 0],            # a stride missing
    ["in", [3, 4], [4, -1], 0],
    ["in", [3, 0], [4, 1], 0],
    ["in", [3.0, 4], [4, 1], 0],
    ["missing", [3, 4], [4, 1], 0],
    ["in", [3, 4], [4, 1]],
])
def test_a_malformed_strided_spec_is_refused(payload):
    with pytest.raises(TensorIOError):
        unpack({"strided": payload}, {"in": torch.randn(12)}, layouts=True)


def test_a_strided_view_from_the_candidates_side_is_refused():
    """What the candidate's worker writes (its outputs, the inputs after its call) is read without
    ``layouts``: a view of a huge shape over one stored element would be materialized by the
    comparisons."""
    with pytest.raises(TensorIOError):
        unpack({"strided": ["out", [1 << 40], [0], 0]}, {"out": torch.randn(1)})
    with pytest.raises(TensorIOError):
        unpack({"list": [{"strided": ["out", [4, 5], [0, 1], 0]}]}, {"out": torch.randn(5)})


def test_the_sandbox_places_slices_and_expanded_views_in_their_layout():
    sliced = torch.randn(6, 9)[:, 1:]
    expanded = torch.randn(5).expand(4, 5)
    tensors: dict = {}
    handed = unpack(pack([sliced, expanded], "in", tensors, layouts=True), tensors, layouts=True)
    placed = spaced_apart(handed, "cpu")
    for original, received in zip((sliced, expanded), placed):
        assert received.stride() == original.stride() and received.storage_offset() == original.storage_offset()
        assert torch.equal(received, original) and torch.equal(_reach(received), _reach(original))
    assert placed[0].untyped_storage().data_ptr() != handed[0].untyped_storage().data_ptr()


def test_varied_sets_keep_a_slice_and_an_expanded_view():
    drawn = [torch.randn(6, 9)[:, 1:], torch.randn(5).expand(4, 5)]
    varied = [drawn[0] * 3, drawn[1] * torch.rand(4, 5)]  # the second differs along the broadcast
    laid = in_drawn_layouts(drawn, varied)
    assert laid[0].stride() == drawn[0].stride() and laid[0].storage_offset() == 1
    assert torch.equal(laid[0], varied[0])
    # Still a broadcast: each location holds one of the varied values that share it.
    assert laid[1].stride() == (0, 1)
    assert all(any(torch.equal(laid[1][0, c], varied[1][r, c]) for r in range(4)) for c in range(5))


def test_the_memory_between_a_slices_elements_is_varied_as_its_elements_are():
    """On a problem's own inputs the column beside a slice holds values like the slice's; a varied
    set that scaled the elements and kept the drawn column told itself apart from the problem's
    call (a kernel compared the two and was wrong only on the problem's)."""
    from extensions.verify.reference.variations import between_elements

    torch.manual_seed(0)
    drawn = [torch.randn(64, 33)[:, 1:], 2.5]

    def scale_up(values):
        return [v * 1000 if isinstance(v, torch.Tensor) else v for v in values]

    laid = in_drawn_layouts(drawn, scale_up(drawn), between_elements(drawn, scale_up))
    beside = _reach(laid[0]).reshape(64, 33)[:, 0]  # the column the slice was cut beside
    assert laid[0].stride() == drawn[0].stride() and torch.equal(laid[0], drawn[0] * 1000)
    assert beside.abs().max() > 0.25 * laid[0].abs().max()
    # Without it, the drawn column: the tell the set had.
    kept = _reach(in_drawn_layouts(drawn, scale_up(drawn))[0]).reshape(64, 33)[:, 0]
    assert kept.abs().max() < 0.01 * laid[0].abs().max()


def test_an_expanded_input_is_handed_anew_rather_than_written_into():
    """The next set reuses the previous set's tensor objects where the layouts match; an expanded
    view cannot be written element by element, so that set gets its own tensors."""
    previous = spaced_apart([torch.randn(5).expand(4, 5), torch.randn(6, 9)[:, 1:]], "cpu")
    again = spaced_apart([torch.randn(5).expand(4, 5), torch.randn(6, 9)[:, 1:]], "cpu")
    assert into_previous_tensors(previous, again) is again
    sliced_before, sliced_now = [previous[1]], [again[1]]
    kept = into_previous_tensors(sliced_before, sliced_now)
    assert kept is sliced_before and torch.equal(kept[0], again[1])


def test_a_reused_slice_takes_the_next_sets_memory_between_its_elements():
    """Where the next set reuses the previous set's tensor objects, a slice gets the whole stretch
    of the new set, not only its elements: the memory between them, which each set varies as it
    varies the elements, stayed what the first set had there, and every later set showed a
    kernel the drawn neighbours again. A slice that starts elsewhere gets tensors of its own."""
    previous = spaced_apart([torch.randn(6, 9)[:, 1:]], "cpu")
    nxt = spaced_apart([(1000 * torch.randn(6, 9))[:, 1:]], "cpu")
    kept = into_previous_tensors(previous, nxt)
    assert kept is previous and torch.equal(_reach(kept[0]), _reach(nxt[0]))
    elsewhere = spaced_apart([torch.randn(6, 9)[:, 2:]], "cpu")
    assert into_previous_tensors(spaced_apart([torch.randn(6, 9)[:, 1:-1]], "cpu"), elsewhere) is elsewhere


def test_the_memory_around_handed_inputs_is_nan_or_data_and_checked_after_the_call():
    """Every handed input sits between gaps: all-ones bytes (NaN) on even sets, values drawn from
    the input beside them on odd ones, so the element past an input's end tells no kernel that it
    is being judged; a write into a gap is seen after the call."""
    from extensions.verify.sandboxed.handed_files import _PLACEMENTS, fill_gaps, gaps_intact

    sliced, counts = torch.randn(6, 9)[:, 1:], torch.arange(1, 11, dtype=torch.int32)
    placed = spaced_apart([sliced, counts], "cpu")
    nan_gaps = fill_gaps(placed, data_like=False)
    assert nan_gaps and all(bool((region == 255).all()) for region, _ in nan_gaps)
    data_gaps = fill_gaps(placed, data_like=True)
    assert gaps_intact(data_gaps)
    gap_after_slice = data_gaps[1][0].view(torch.float32)  # between the slice and the counts
    assert bool(torch.isin(gap_after_slice, _reach(sliced)).all())
    assert bool(torch.isin(data_gaps[-1][0].view(torch.int32), counts).all())
    region = data_gaps[1][0]
    region[0] ^= 1  # what a kernel storing just past the slice's last element does
    assert not gaps_intact(data_gaps)
    assert _PLACEMENTS[id(placed[0])] is _PLACEMENTS[id(placed[1])]


def test_varied_sets_keep_the_symmetry_and_triangles_drawn():
    """Problems posed on symmetric or triangular matrices are functions on those matrices: a value
    transform applied element by element must not hand a kernel that relies on it (reads A as A^T,
    skips the zero blocks) a matrix the problem never does."""
    from extensions.verify.reference.variations import in_drawn_structure

    base = torch.rand(6, 6)
    symmetric = (base + base.T) / 2
    upper, lower = torch.triu(torch.rand(5, 5)), torch.tril(torch.rand(2, 5, 5))
    diagonal, dense, row = torch.diag(torch.rand(4)), torch.rand(4, 4), torch.rand(1, 7)
    drawn = [symmetric, upper, lower, diagonal, dense, row, 3]
    # An affine map of each element keeps symmetry (though not zeros); one that treats elements apart
    # (outliers at drawn places, shifted lines) does not.
    varied = [x * 2 - 1 + torch.rand_like(x) if isinstance(x, torch.Tensor) else x for x in drawn]
    kept = in_drawn_structure(drawn, varied)
    assert torch.equal(kept[0], kept[0].T) and torch.equal(torch.triu(kept[0]), torch.triu(varied[0]))
    assert torch.equal(kept[1], torch.triu(varied[1])) and torch.equal(kept[2], torch.tril(varied[2]))
    assert torch.equal(kept[3], torch.diag(torch.diagonal(varied[3])))
    assert kept[4] is varied[4] and kept[5] is varied[5] and kept[6] == 3
    assert not torch.equal(varied[0], varied[0].T)  # what the transform alone would have handed over


def test_varied_sets_keep_integer_structure_symmetry_in_any_dimensions_and_a_repeated_tensor():
    """The same holds for integer matrices (their sets flip signs element by element), for a batch
    symmetric in its first two dimensions (pairwise values, ``D[i, j] == D[j, i]`` per channel) and
    for one tensor passed twice (``[x, x]``: a kernel may load it once). A constant tensor is
    symmetric in every pair of dimensions by no design and is left as varied."""
    from extensions.verify.reference.variations import in_drawn_structure

    counts = torch.randint(-50, 50, (6, 6))
    counts = counts + counts.T
    lower_counts = torch.tril(torch.randint(1, 9, (5, 5)))
    pairwise = torch.rand(5, 5, 3)
    pairwise = pairwise + pairwise.transpose(0, 1)
    x = torch.rand(4, 7)
    zeros = torch.zeros(3, 3)
    drawn = [counts, lower_counts, pairwise, x, x, zeros]

    def flip_signs(v):
        return torch.where(torch.rand(v.shape) < 0.5, -v, v)

    varied = [flip_signs(v) for v in drawn]
    kept = in_drawn_structure(drawn, varied)
    assert torch.equal(kept[0], kept[0].T) and torch.equal(torch.triu(kept[0]), torch.triu(varied[0]))
    assert torch.equal(kept[1], torch.tril(varied[1]))
    assert torch.equal(kept[2], kept[2].transpose(0, 1))
    assert torch.equal(torch.triu(kept[2].permute(2, 0, 1)), torch.triu(varied[2].permute(2, 0, 1)))
    assert kept[3] is varied[3] and kept[4] is kept[3] and not torch.equal(varied[4], varied[3])
    assert kept[5] is varied[5]
    assert not torch.equal(varied[0], varied[0].T)  # what the transform alone would have handed over


def test_the_timer_runs_each_set_in_the_layout_it_was_judged_on():
    """The timer copies every set into fixed buffers; they keep a slice's and an expanded view's
    strides, storage offset and the values between the elements, so a kernel exact on the
    problem's layout (here one that reads the slice's storage as the problem lays it out) is timed
    on that layout and agrees with the reference on every set."""
    from extensions.timing.runners import HostTrialRunner
    from extensions.timing.schedule import CANDIDATE, REFERENCE
    from extensions.verify.common.compare import compare_outputs
    from extensions.config import VerifierConfig

    class Reference(torch.nn.Module):
        def forward(self, x, bias):
            return 2 * x + bias

    class ReadsTheProblemsLayout(torch.nn.Module):
        def forward(self, x, bias):
            rows = torch.as_strided(x, (8, 32), (33, 1), 0)  # the rows the slice was cut from
            return 2 * rows[:, 1::2] + torch.as_strided(bias, (8, 16), (0, 1))

    def one_set():
        return [torch.randn(8, 33)[:, 1::2], torch.randn(1, 16).expand(8, 16)]

    sets = [one_set(), one_set()]
    runner = HostTrialRunner(Reference(), ReadsTheProblemsLayout(), sets, VerifierConfig(), compare_outputs)
    for index, input_set in enumerate(sets):
        runner.load(index)
        for live, given in zip(runner.inputs.args, input_set):
            assert (live.stride(), live.storage_offset()) == (given.stride(), given.storage_offset())
            assert torch.equal(_reach(live), _reach(given))
        runner.time_call(REFERENCE)
        runner.time_call(CANDIDATE)
        assert runner.outputs_agree()
