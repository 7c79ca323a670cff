"""Inputs that share a storage reach the candidate and the reference sharing it.

A problem's ``get_inputs`` may return one tensor twice (``[x, x]``) or views of one storage
(``[h[:, :d], h[:, d:]]``). The verifier used to copy every input into a storage of its own, for
the candidate and for the reference alike: a kernel wrong only when its inputs alias was never
judged where the problem has them alias (accepted), and a reference that writes into one input
(``a.mul_(2); return a + b``) answered 3x where the problem's call answers 4x, so the kernel
computing the problem's own result was rejected. Now a storage crosses once, with its views
(``tensor_io.pack``/``unpack``), and every place that copies inputs keeps the sharing: the
sandbox's placement, the reference's own copies, the varied sets and the timer's buffers. The
candidates run through the real verifier on CPU (Triton's interpreter); the pieces are tested
below them.
"""
from __future__ import annotations

import textwrap

import pytest
import torch

import candidate_catalog as catalog
from extensions.config import VerifierConfig
from extensions.verify.common.tensor_io import own_copies, pack, stored_spans, unpack
from extensions.verify.reference.variations import between_elements, in_drawn_layouts, in_drawn_structure
from extensions.verify.sandboxed.handed_files import fill_gaps, gaps_intact, into_previous_tensors, spaced_apart
from sandbox_support import judge_cases

REPEATED = (catalog.PROBLEMS_DIR / "repeated_input.py").read_text()  # a * sigmoid(b) on [x, x]
HALVES = (catalog.PROBLEMS_DIR / "halves_add.py").read_text()  # a + b on [h[:, :48], h[:, 48:]]

MUTATES_ALIASED = textwrap.dedent('''
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        """Doubles its first input in place, then adds the second: both are one tensor on every
        call the problem makes, so the second is doubled too and the answer is 4x."""

        def __init__(self):
            super().__init__()

        def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            a.mul_(2)
            return a + b


    size = 4096


    def get_inputs():
        x = torch.randn(size)
        return [x, x]


    def get_init_inputs():
        return []
''')

_SILU_BOTH_OPERANDS = '''
    import torch
    import torch.nn as nn
    import triton
    import triton.language as tl


    @triton.jit
    def gated_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        a = tl.load(a_ptr + offs, mask=mask, other=0.0)
        b = tl.load(b_ptr + offs, mask=mask, other=0.0)
        tl.store(out_ptr + offs, a * tl.sigmoid(b), mask=mask)


    class ModelNew(nn.Module):
        def __init__(self):
            super().__init__()

        def forward(self, a, b):
            a, b = a.contiguous(), b.contiguous()
            out = torch.empty_like(a)
            n = a.numel()
            gated_kernel[(triton.cdiv(n, 1024),)](a, b, out, n, BLOCK=1024)
            return out
'''
SILU_BOTH_OPERANDS = textwrap.dedent(_SILU_BOTH_OPERANDS)


def _replaced(text: str, *pairs: tuple[str, str]) -> str:
    for old, new in pairs:
        assert old in text, old
        text = text.replace(old, new)
    return text


# Right on two tensors; a fast path for one tensor passed twice with its sigmoid's sign flipped.
SILU_WRONG_WHEN_ALIASED = textwrap.dedent(_replaced(_SILU_BOTH_OPERANDS, (
    """
        def forward(self, a, b):
            a, b = a.contiguous(), b.contiguous()
""", """
        def forward(self, a, b):
            a, b = a.contiguous(), b.contiguous()
            if a.data_ptr() == b.data_ptr():
                # One tensor passed twice: load it once.
                out = torch.empty_like(a)
                n = a.numel()
                silu_once_kernel[(triton.cdiv(n, 1024),)](a, out, n, BLOCK=1024)
                return out
"""), (
    """
    class ModelNew""", """
    @triton.jit
    def silu_once_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask, other=0.0)
        tl.store(out_ptr + offs, x / (1.0 + tl.exp(x)), mask=mask)


    class ModelNew""")))

SCALE_ADD = textwrap.dedent('''
    import torch
    import torch.nn as nn
    import triton
    import triton.language as tl


    @triton.jit
    def scale_add_kernel(a_ptr, b_ptr, out_ptr, n, scale_b, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        a = tl.load(a_ptr + offs, mask=mask, other=0.0)
        b = tl.load(b_ptr + offs, mask=mask, other=0.0)
        tl.store(out_ptr + offs, 2.0 * a + scale_b * b, mask=mask)


    class ModelNew(nn.Module):
        def __init__(self):
            super().__init__()

        def forward(self, a, b):
            # The reference doubles ``a`` in place: where ``b`` is the same memory it is doubled too.
            same = a.data_ptr() == b.data_ptr() and a.stride() == b.stride()
            a, b = a.contiguous(), b.contiguous()
            out = torch.empty_like(a)
            n = a.numel()
            scale_add_kernel[(triton.cdiv(n, 1024),)](a, b, out, n, SCALE_B, BLOCK=1024)
            return out
''')
MUTATION_SEEN = SCALE_ADD.replace("SCALE_B", "2.0 if same else 1.0")
MUTATION_WRITTEN_FOR_ONE_TENSOR = SCALE_ADD.replace("SCALE_B", "2.0")  # 4x: b is a on every call
MUTATION_IGNORED = SCALE_ADD.replace("SCALE_B", "1.0")

HALVES_STRIDED = (catalog.CANDIDATES_DIR / "kernelbench" / "rt2_halves_add_strided.py").read_text()

# Right through the strides; a fused path for halves lying side by side in one row (the second
# starting ``cols`` elements after the first) that reads the second half one element early.
HALVES_WRONG_SIDE_BY_SIDE = _replaced(HALVES_STRIDED, (
    """
class ModelNew(nn.Module):""", """
@triton.jit
def fused_rows_kernel(a_ptr, out_ptr, rows, cols, row_stride, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)[:, None]
    c = tl.arange(0, BLOCK_C)[None, :]
    mask = (r < rows) & (c < cols)
    row = a_ptr + r * row_stride
    a = tl.load(row + c, mask=mask, other=0.0)
    b = tl.load(row + cols - 1 + c, mask=mask, other=0.0)
    tl.store(out_ptr + r * cols + c, a + b, mask=mask)


class ModelNew(nn.Module):"""), (
    """
        out = torch.empty((rows, cols), dtype=a.dtype, device=a.device)
""", """
        out = torch.empty((rows, cols), dtype=a.dtype, device=a.device)
        if (b.data_ptr() - a.data_ptr() == cols * a.element_size() and a.stride() == b.stride()
                and a.stride(1) == 1):
            # The halves lie side by side in one matrix: one pass over its rows.
            fused_rows_kernel[(triton.cdiv(rows, 32),)](a, out, rows, cols, a.stride(0), BLOCK_R=32,
                                                        BLOCK_C=triton.next_power_of_2(cols))
            return out
"""))

CASES = {
    "repeated_correct": (REPEATED, SILU_BOTH_OPERANDS),
    "repeated_wrong_when_aliased": (REPEATED, SILU_WRONG_WHEN_ALIASED),
    "mutation_seen": (MUTATES_ALIASED, MUTATION_SEEN),
    "mutation_written_for_one_tensor": (MUTATES_ALIASED, MUTATION_WRITTEN_FOR_ONE_TENSOR),
    "mutation_ignored": (MUTATES_ALIASED, MUTATION_IGNORED),
    "halves_correct": (HALVES, HALVES_STRIDED),
    "halves_wrong_side_by_side": (HALVES, HALVES_WRONG_SIDE_BY_SIDE),
}


@pytest.fixture(scope="module")
def verdicts(verify_device, verify_isolation):
    return judge_cases(CASES, verify_device, verify_isolation)


def _describe(result) -> str:
    return (f"stage={result.stage} flags={result.flags} error={result.error} "
            f"skipped={result.details.get('skipped_input_sets')}")


@pytest.mark.parametrize("name", ["repeated_correct", "mutation_seen", "mutation_written_for_one_tensor",
                                  "halves_correct"])
def test_correct_kernels_pass_on_the_problems_aliasing(name, verdicts):
    """``mutation_written_for_one_tensor`` (4x, the problem's answer) was rejected while the
    reference's inputs were copied apart: its in-place ``a.mul_(2)`` no longer reached ``b``,
    and the expected output was 3x."""
    result = verdicts[name]
    assert result.correct, _describe(result)
    assert {"base", "signed", "scale_up", "shift"} <= set(result.details["sets_run"]), _describe(result)


@pytest.mark.parametrize("name", ["repeated_wrong_when_aliased", "mutation_ignored", "halves_wrong_side_by_side"])
def test_kernels_wrong_on_the_problems_aliasing_are_rejected(name, verdicts):
    """Each was accepted while every input crossed in a storage of its own: the aliased path
    never ran (``repeated``, ``halves``), or the expected output was the one without aliasing
    (``mutation_ignored``: 2a + b)."""
    result = verdicts[name]
    assert not result.correct and result.error_category == "mismatch", _describe(result)
    assert result.flags == [], _describe(result)  # honest wrong kernels, not cheats


def _shares_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _problem_inputs() -> list:
    x, h = torch.randn(4, 5), torch.randn(6, 8)
    return [x, x, h[:, :4], h[:, 4:], 3, torch.randn(3)]


def test_a_storage_crosses_once_with_its_views():
    drawn = _problem_inputs()
    tensors: dict = {}
    spec = pack(drawn, "in", tensors, layouts=True)
    assert sorted(tensors) == ["in.0", "in.2", "in.5"]  # one stretch per storage
    back = unpack(spec, tensors, layouts=True)
    assert back[0] is back[1] and torch.equal(back[0], drawn[0])
    assert _shares_storage(back[2], back[3]) and not _shares_storage(back[2], back[0])
    assert back[3].storage_offset() == 4 and torch.equal(back[3], drawn[3])
    assert back[4] == 3 and not _shares_storage(back[5], back[0])
    assert not _shares_storage(back[0], drawn[0])  # still a copy of its own
    assert stored_spans([t for t in back if isinstance(t, torch.Tensor)]) == [20, 20, 48, 48, None]
    # Unpacked again: a storage of its own again.
    assert not _shares_storage(unpack(spec, tensors, layouts=True)[2], back[2])


def test_the_sandbox_places_one_storage_once_and_its_gaps_around_it():
    """The memory between one view's elements that another view holds is that view's, not a gap:
    filled as a gap, it would change the other input."""
    drawn = _problem_inputs()
    tensors: dict = {}
    handed = unpack(pack(drawn, "in", tensors, layouts=True), tensors, layouts=True)
    placed = spaced_apart(handed, "cpu")
    assert placed[0] is placed[1] and _shares_storage(placed[2], placed[3])
    for original, received in zip(drawn, placed):
        if isinstance(original, torch.Tensor):
            assert received.stride() == original.stride() and received.storage_offset() == original.storage_offset()
            assert torch.equal(received, original)
    for data_like in (False, True):
        filled = fill_gaps(placed, data_like=data_like)
        assert len(filled) == 4 and gaps_intact(filled)  # three storages: four gaps
        for original, received in zip(drawn, placed):
            if isinstance(original, torch.Tensor):
                assert torch.equal(received, original)
    later: dict = {}
    nxt = spaced_apart(unpack(pack(_problem_inputs(), "in", later, layouts=True), later, layouts=True), "cpu")
    kept = into_previous_tensors(placed, nxt)
    assert kept is placed and torch.equal(kept[3], nxt[3]) and torch.equal(kept[1], nxt[1])
    apart = [torch.randn(4, 5), torch.randn(4, 5), *nxt[2:]]
    assert into_previous_tensors(placed, spaced_apart(apart, "cpu")) is not placed


def test_the_references_copies_keep_the_aliasing_and_leave_the_inputs_alone():
    x = torch.randn(8)
    copies = own_copies([x, x])
    assert copies[0] is copies[1] and not _shares_storage(copies[0], x)
    copies[0].mul_(2)
    assert torch.equal(copies[0] + copies[1], 4 * x)
    h = torch.randn(3, 6)
    halves = own_copies([h[:, :3], h[:, 3:]])
    assert _shares_storage(*halves) and torch.equal(halves[1], h[:, 3:])
    wide = own_copies([h[:, :3], h[:, 3:]], convert=lambda t: t.to(torch.float64, copy=True))
    assert _shares_storage(*wide) and wide[1].dtype == torch.float64 and torch.equal(wide[1], h[:, 3:].double())


def test_varied_sets_vary_one_storage_and_keep_it_shared():
    """A value transform builds a new tensor per input; the views of one drawn storage are put
    back into one, and the memory no view holds is varied as the storage's elements are."""
    x, h = torch.randn(4, 5), torch.randn(6, 10)
    drawn = [x, x, h[:, :4], h[:, 6:]]  # columns 4 and 5 belong to neither view

    def transform(values):
        return [v * 1000 - 7 for v in values]

    laid = in_drawn_layouts(drawn, in_drawn_structure(drawn, transform(drawn)), between_elements(drawn, transform))
    assert laid[0] is laid[1] and torch.allclose(laid[0], x * 1000 - 7)
    assert _shares_storage(laid[2], laid[3]) and laid[3].storage_offset() == 6
    assert torch.allclose(laid[2], h[:, :4] * 1000 - 7) and torch.allclose(laid[3], h[:, 6:] * 1000 - 7)
    between = torch.as_strided(laid[2], (5, 2), (10, 1), 4)  # the columns between, in the rows both span
    assert torch.allclose(between, h[:5, 4:6] * 1000 - 7)


def test_the_timer_gives_views_of_one_storage_one_buffer():
    """A kernel is timed on the aliasing it was judged on, and the reference that writes into one
    input changes the other there too."""
    from extensions.timing.runners import HostTrialRunner
    from extensions.timing.schedule import CANDIDATE, REFERENCE
    from extensions.verify.common.compare import compare_outputs

    class DoublesInPlace(torch.nn.Module):
        def forward(self, a, b):
            a.mul_(2)
            return a + b

    class FourTimes(torch.nn.Module):
        def forward(self, a, b):
            return 4 * a

    def one_set():
        x = torch.randn(64)
        return [x, x]

    sets = [one_set(), one_set()]
    runner = HostTrialRunner(DoublesInPlace(), FourTimes(), sets, VerifierConfig(), compare_outputs)
    for index, input_set in enumerate(sets):
        runner.load(index)
        assert runner.inputs.args[0] is runner.inputs.args[1]
        runner.time_call(REFERENCE)
        runner.load(index)
        runner.time_call(CANDIDATE)
        assert runner.outputs_agree()
        assert torch.equal(runner.output(CANDIDATE), 4 * input_set[0])
    h = torch.randn(4, 8)
    views = HostTrialRunner(DoublesInPlace(), FourTimes(), [[h[:, :4], h[:, 4:]]], VerifierConfig(), compare_outputs)
    views.load(0)
    assert _shares_storage(*views.inputs.args) and torch.equal(views.inputs.args[1], h[:, 4:])
