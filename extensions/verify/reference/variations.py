"""The value variations of the reference's input sets: both signs, large values (outliers), whole
lines of negative values, small values, exact zeros and the problem's Python floats at other values.

Each is drawn from parameters the parent drew per batch (``reference_data.draw_secret``), which a
candidate never sees; the builder (``builder.py``) decides which are kept.
"""
from __future__ import annotations

import math
from typing import Callable

from ..common.problem_constants import varied_int, varied_scalar, varied_zero

# In order of value when few sets are asked for: both signs first (many problems draw inputs
# with torch.rand, all positive, where ReLU and identity agree), then large values (past the
# range of fp32 ``exp``, and past a threshold below 10^t, ``with_outliers``), then whole lines of
# negative values, some far from zero (a maximum or a softmax started at 0, an activation wrong
# below some threshold; ``with_negative_lines``), then small ones. The large values are few (``with_outliers``) and of either sign where the
# fp32 reference stays exact with them; the uniform factor that stands in elsewhere keeps the
# problem's signs: a sum of large terms of both signs cancels, and its rounding error outgrows
# any tolerance measured on the output.
VALUE_VARIATIONS = ("signed", "scale_up", "shift", "scale_down")
# Sets whose elements are also exactly zero in about this share of places (not ``shift``: a zero
# there would be the maximum a reduction started at 0 needs).
ZERO_SHARE = 1 / 16
WITH_ZEROS = ("signed", "scale_up", "scale_down")


def value_transforms(params: dict) -> dict[str, Callable]:
    """The value variations for one batch, from parameters the parent drew (see ``reference_data.draw_secret``):
    ``signed`` ``±(x*a - b)``, ``scale_down``/``scale_up`` ``x*s``, ``shift`` ``(x - max(x) - d) * s``
    (every element negative, far from zero: where ``with_negative_lines`` cannot be used)."""
    a, b, sign = params["signed"]
    down, up = float(params["scale_down"]), float(params["scale_up"])
    below, spread = float(params["shift"]), float(params["shift_scale"])

    def signed(x):
        return (x * a - b) * sign

    def shifted(x):
        return (x - x.max() - below) * spread if x.numel() else x

    return {
        "signed": signed,
        "scale_down": lambda x: x * down,
        "scale_up": lambda x: x * up,
        "shift": shifted,
    }


# Lines made wholly negative in the ``shift`` set, per axis at most (one on an axis shorter than 64:
# each line there is a large share of the tensor, and a peek would find one).
NEGATIVE_LINES_MAX = 3


def with_negative_lines(params: dict) -> Callable:
    """``shift`` as lines: the problem's own values, except whole lines along every axis (of two or
    more elements) at secret places, a few per axis, at ``(x - max(x) - d) * s``: the first line
    of each axis far from zero (``s`` the batch's ``shift_scale``, every element at -150 or
    below: exp underflows), the others at ``s = 10^u``, u in [0, 2.5], from -1.5 down. A line
    along one axis lies wholly in a line of another, so whatever axes a kernel reduces over
    (one row of a softmax, a pooling window, a channel of a LayerNorm), some of its reductions
    see only negative values, and a maximum started at 0 fails there. Few: where every element
    was shifted, one peeked element told the set apart, and a softmax without its row maximum
    took its exact path only there; here a peek sees the problem's own values (a share of about
    the lines per axis over the axis length: 3% of a 256 x 192 CPU set). A tensor with fewer than
    two such axes has one line, itself: all of it is shifted, and a peek tells."""
    below, far = float(params["shift"]), float(params["shift_scale"])

    def negative_lines(x):
        import torch

        axes = [axis for axis, size in enumerate(x.shape) if size >= 2]
        if len(axes) < 2:
            return (x - x.max() - below) * far if x.numel() else x
        scale = torch.zeros([1] * x.dim(), dtype=x.dtype, device=x.device)
        for axis in axes:
            size = x.shape[axis]
            count = max(1, min(NEGATIVE_LINES_MAX, size // 32))
            spreads = torch.pow(10.0, torch.rand(count, device=x.device) * 2.5).to(x.dtype)
            spreads[0] = far
            per_index = torch.zeros(size, dtype=x.dtype, device=x.device)
            per_index[torch.randperm(size, device=x.device)[:count]] = spreads
            shape = [1] * x.dim()
            shape[axis] = size
            scale = torch.maximum(scale, per_index.reshape(shape))
        return torch.where(scale > 0, (x - x.max() - below) * scale, x)

    return negative_lines


# Outliers per tensor at least (all of a smaller one), about half of each sign: a kernel wrong in
# some band of positive magnitudes (a ReLU that returns 0 between 3.5 and 7) meets about thirteen
# in a band of a factor two, one wrong above 10^5 about ten; one peeked element of a CPU set
# (49152 elements) is an outlier in 1% of batches, a sample of 16 in 15% (on CUDA's full sizes
# the secret share, 0.05-0.2% of the elements, decides).
OUTLIERS_MIN = 512


def with_outliers(params: dict, top: float, either_sign: bool) -> Callable:
    """``scale_up`` as outliers: the problem's own values, except a secret share of the elements
    (``scale_up_share``, at least ``OUTLIERS_MIN``) times ``10^(r·top)``, ``r`` uniform per
    element, and with ``either_sign`` times -1 for about half of them (the problem's
    ``torch.rand`` draws no negative value, and a LeakyReLU wrong below -2000 met none). A kernel
    right below some large threshold only (a sigmoid that returns 0 above 1500) is right on any
    set whose largest element stays below it; this set reaches ``10^top``. Few and
    at secret places: a kernel that samples a few dozen elements to choose between a fragile path
    and an exact one (a softmax without its maximum unless the sample looks large) sees the
    problem's own values and takes the fragile path; where every element is scaled, any sample
    shows it. Neither exact zeros nor other Python floats: they would tell the set from the base."""
    share = float(params["scale_up_share"])

    def outliers(x):
        import torch

        if not x.numel():
            return x
        count = min(x.numel(), max(OUTLIERS_MIN, round(share * x.numel())))
        flat = x.reshape(-1).double()
        if 4 * count >= x.numel():  # distinct places; on a large tensor a repeat or two costs nothing
            where = torch.randperm(x.numel(), device=x.device)[:count]
        else:
            where = torch.randint(0, x.numel(), (count,), device=x.device)
        factor = torch.pow(10.0, torch.rand(count, device=x.device, dtype=torch.float64) * top)
        if either_sign:
            factor = torch.where(torch.rand(count, device=x.device) < 0.5, -factor, factor)
        flat[where] = flat[where] * factor
        return flat.reshape(x.shape).to(x.dtype)

    return outliers


def transform_tensors(values: list, fn) -> list:
    import torch

    return [fn(v) if isinstance(v, torch.Tensor) and v.is_floating_point() else v for v in values]


def between_elements(drawn: list, transform) -> list:
    """Per drawn tensor laid out as a slice or an expanded view (``strided_layout``), or sharing its
    storage with another input (``storage_groups``): the stretch of storage it reaches (the
    stretch the inputs share), holding the drawn stretch's values passed through the set's own
    ``transform``; None at the other places. On a problem's own inputs the memory around a slice
    holds values like its elements (the rest of the tensor it was cut from); kept as drawn on a
    varied set it did not, and a kernel that compared the two told the varied sets from the
    problem's and was wrong only on the latter. The transform sees the stretch shaped like the
    view (the storage's first view; rows added until it holds the whole stretch), so its lines
    and its maximum are drawn as the elements' are: one storage is varied once."""
    import torch

    from ..common.tensor_io import storage_units, stored_stretch

    stand_ins, spans = list(drawn), {}
    for positions, span in storage_units(drawn):
        tensor = drawn[positions[0]]
        if span is None or not isinstance(tensor, torch.Tensor):
            continue
        shape = list(tensor.shape) or [1]
        inner = max(1, tensor.numel() // max(1, shape[0]))
        rows = max(shape[0], -(-span // inner))
        stretch = stored_stretch(tensor, span)
        stand_ins[positions[0]] = stretch.repeat(-(-rows * inner // span))[:rows * inner].reshape(
            [rows, *shape[1:]]).clone()
        spans[positions[0]] = (positions, span)
    fills: list = [None] * len(drawn)
    if not spans:
        return fills
    try:
        varied = transform(stand_ins)
    except Exception:  # noqa: BLE001 - the set's own transform decides whether the set exists
        return fills
    for place, (positions, span) in spans.items():
        value = varied[place] if place < len(varied) else None
        if isinstance(value, torch.Tensor) and value.numel() >= span:
            for position in positions:
                fills[position] = value.reshape(-1)[:span]
    return fills


def in_drawn_layouts(drawn: list, varied: list, between: list | None = None) -> list:
    """``varied`` with each tensor laid out in memory as the one drawn at its place: a transform
    builds new tensors (a ``where``, a reshape), and a problem whose own inputs are column-major
    would otherwise see row-major inputs on its varied sets only, where a kernel written for one
    layout is judged on another. A slice keeps its strides and offset; an expanded (overlapping)
    view keeps its strides too, each memory location holding one of the varied values that share
    it. The memory between the elements holds ``between`` (``between_elements``) where given,
    else the drawn values. Tensors drawn in one storage (``storage_groups``: ``[x, x]``, two
    slices of one matrix) are scattered into one storage again, each location holding one of the
    varied values of the views that reach it: a set the problem could not have drawn (the two
    halves of one matrix in two storages) judges no kernel on aliasing the problem never has."""
    import torch

    from extensions.timing.tensors import storage_groups

    from ..common.tensor_io import memory_order, overlaps_itself, stored_stretch, strided_layout

    if len(drawn) != len(varied):
        return varied
    between = between if between is not None and len(between) == len(drawn) else [None] * len(drawn)
    laid = in_drawn_storages(drawn, varied, between)
    grouped = {position for members in storage_groups(drawn) for position in members}
    for position, (before, after, fill) in enumerate(zip(drawn, varied, between)):
        if position in grouped:
            continue
        if (isinstance(before, torch.Tensor) and isinstance(after, torch.Tensor) and after.shape == before.shape
                and after.stride() != before.stride()):
            layout = strided_layout(before)
            if memory_order(before) is not None:
                copy = torch.empty_like(before, dtype=after.dtype)  # preserve_format: ``before``'s strides
                copy.copy_(after)
                after = copy
            elif layout is not None:
                shape, stride, offset, span = layout
                stretch = (fill if fill is not None else stored_stretch(before, span)).to(
                    device=after.device, dtype=after.dtype, copy=True)
                if overlaps_itself(shape, stride):
                    places = torch.as_strided(torch.arange(span, device=after.device), shape, stride, offset)
                    stretch[places.reshape(-1)] = after.reshape(-1)
                    after = stretch.as_strided(shape, stride, offset)
                else:
                    view = stretch.as_strided(shape, stride, offset)
                    view.copy_(after)
                    after = view
        laid[position] = after
    return laid


def in_drawn_storages(drawn: list, varied: list, between: list | None = None) -> list:
    """``varied`` with the tensors drawn in one storage (``storage_groups``) scattered into one
    storage again, laid out as drawn: each location holds one of the varied values of the views
    that reach it, the rest of the stretch ``between`` (the fill ``between_elements`` made for
    the storage) or the drawn values. One tensor drawn twice becomes one tensor. A group whose
    varied tensors are the drawn ones, or not tensors of the drawn shapes and one dtype, is left
    as it is."""
    import torch

    from extensions.timing.tensors import group_span, storage_groups, views_over

    from ..common.tensor_io import stored_stretch

    laid = list(varied)
    if len(drawn) != len(varied):
        return laid
    for members in storage_groups(drawn):
        afters = [varied[p] for p in members]
        if all(varied[p] is drawn[p] for p in members):
            continue  # left as drawn: still views of the drawn storage
        if not all(isinstance(a, torch.Tensor) and a.shape == drawn[p].shape and a.dtype == afters[0].dtype
                   and a.device == afters[0].device for p, a in zip(members, afters)):
            continue
        span = group_span(drawn, members)
        fill = between[members[0]] if between is not None and len(between) == len(drawn) else None
        stretch = (fill if fill is not None else stored_stretch(drawn[members[0]], span)).to(
            device=afters[0].device, dtype=afters[0].dtype, copy=True)
        places = torch.arange(span, device=stretch.device)
        for p, after in zip(members, afters):
            before = drawn[p]
            where = torch.as_strided(places, before.shape, before.stride(), before.storage_offset())
            stretch[where.reshape(-1)] = after.reshape(-1)
        for p, view in views_over(stretch, drawn, members).items():
            laid[p] = view
    return laid


def in_drawn_structure(drawn: list, varied: list) -> list:
    """``varied`` with the structure the drawn inputs hold exactly put back: a tensor symmetric in
    two of its dimensions (``A == A.mT``, or ``A == A.transpose(0, 1)`` for a batch of pairwise
    values), upper or lower triangular in its last two, and the same tensor passed twice
    (``[x, x]``). A problem posed on such inputs (KernelBench's
    ``13_Matmul_for_symmetric_matrices``, ``14_Matmul_for_upper_triangular_matrices``) is a
    function on those inputs only: a kernel that reads A as its transpose, skips the blocks that
    are zero, or loads x once for both arguments is right on every input the problem has, and a
    value transform applied element by element (``±(x*a - b)``, a shift, an offset, signs for
    integers) would hand it inputs the problem never does. The transformed values are kept on and
    above the diagonal and mirrored, or the other triangle set to zero; the second of a tensor
    passed twice gets the first one's values."""
    import torch

    if len(drawn) != len(varied):
        return varied
    shaped = []
    for position, (before, after) in enumerate(zip(drawn, varied)):
        if isinstance(before, torch.Tensor) and isinstance(after, torch.Tensor) and after is not before:
            first = next(i for i, earlier in enumerate(drawn) if earlier is before)
            if first < position:
                after = shaped[first]
            elif after.shape == before.shape and before.dtype != torch.bool:
                after = _in_drawn_matrix_structure(before, after)
        shaped.append(after)
    return shaped


def _in_drawn_matrix_structure(before, after):
    """``after`` with ``before``'s symmetry in any two dimensions and its triangle in the last two."""
    import torch

    if before.dim() < 2 or before.numel() < 4 or bool((before == before.reshape(-1)[0]).all()):
        return after  # a constant tensor is symmetric in every pair of dimensions by no design
    if before.shape[-1] >= 2 and before.shape[-2] >= 2:
        upper = torch.equal(before, torch.triu(before))
        lower = torch.equal(before, torch.tril(before))
        if upper and lower:  # diagonal
            return torch.tril(torch.triu(after))
        if upper or lower:
            return torch.triu(after) if upper else torch.tril(after)
    for a in range(before.dim()):
        for b in range(a + 1, before.dim()):
            if before.shape[a] == before.shape[b] >= 2 and torch.equal(before, before.transpose(a, b)):
                index = torch.arange(before.shape[a], device=after.device)
                rows = index.view([-1 if d == a else 1 for d in range(before.dim())])
                cols = index.view([-1 if d == b else 1 for d in range(before.dim())])
                after = torch.where(rows <= cols, after, after.transpose(a, b))
    return after


def with_zeros(x):
    """Exact zeros in about ``ZERO_SHARE`` of ``x``'s places (drawn from the set's seed): a kernel
    wrong at zero only (``tanh(0) = 1``) is right on every other value."""
    import torch

    return x.masked_fill(torch.rand(x.shape, device=x.device) < ZERO_SHARE, 0.0)


def is_plain_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def varied_input_scalar(value, factor: float, step: int = 1):
    """``value`` (a Python int, or a float equal to 0.0) at the value a varied set gives it (an
    int ``step`` away from zero)."""
    return varied_int(value, step) if is_plain_int(value) else varied_zero(factor)


def with_scalars_varied(values: list, factor: float, positions: frozenset[int] | set[int] = frozenset(),
                        step: int = 1) -> list:
    """The problem's Python float inputs (a scale written into ``get_inputs``) at other values,
    as the odd-shape set varies the constructor's: a kernel with ``s = 3.14`` written in is right
    at that value only. The Python ints and the floats equal to 0.0 at ``positions`` (those the
    reference was found to stay valid with, ``ReferenceBuilder._scalar_plan``) move too
    (``varied_int``, ``varied_zero``): a kernel with ``k = 3`` or a zero shift written in is
    right at that value only; the ints ``step`` away from zero."""
    return [varied_input_scalar(v, factor, step) if i in positions
            else varied_scalar(v, factor) if isinstance(v, float) else v
            for i, v in enumerate(values)]


# Integer inputs: the variations that give them other values, and the share of elements made large.
# ``signed``: about half the elements negated (the problem's ``torch.randint(0, n)`` draws none, and
# C's truncating division agrees with Python's floor division on them). ``scale_up``: signs as
# ``signed``, and about half the elements times a large factor: for int64 past 2^31 (a kernel that
# narrows to int32 wraps there), for int32 up to its range. Never a new zero (a divisor stays one).
INTEGER_VARIATIONS = ("signed", "scale_up")
INTEGER_LARGE_SHARE = 0.5
# Integer dtypes whose values are varied: signed ones only (uint8 has no negative value; bool none).
INTEGER_DTYPES = ("torch.int8", "torch.int16", "torch.int32", "torch.int64")


def integer_operand(value) -> bool:
    """Whether ``value`` is an integer tensor of a signed dtype with more than one element (a
    0-d or one-element tensor is taken for a size or a count, never varied)."""
    import torch

    return isinstance(value, torch.Tensor) and str(value.dtype) in INTEGER_DTYPES and value.numel() > 1


def integer_transform(variation: str) -> Callable | None:
    """The transform of an integer tensor for ``variation`` (``INTEGER_VARIATIONS``), or None."""
    if variation not in INTEGER_VARIATIONS:
        return None

    def signs(x):
        import torch

        flip = torch.rand(x.shape, device=x.device) < 0.5
        return torch.where(flip, -x, x)

    def large(x):
        import torch

        x = signs(x)
        top = int(x.abs().max()) if x.numel() else 0
        if top == 0:
            return x
        limit = (2 ** 62 if x.dtype == torch.int64 else torch.iinfo(x.dtype).max) // top
        if x.dtype == torch.int64:
            low, high = 2 ** 31, min(limit, 2 ** 33)
        else:
            low, high = max(1, limit // 4), limit
        if high <= low:
            return x
        factor = torch.randint(low, high, x.shape, device=x.device, dtype=torch.int64).to(x.dtype)
        grown = torch.rand(x.shape, device=x.device) < INTEGER_LARGE_SHARE
        return torch.where(grown, x * factor, x)

    return signs if variation == "signed" else large


def transform_integers(values: list, fn, positions) -> list:
    """``values`` with ``fn`` applied to the tensors at ``positions``."""
    return [fn(v) if i in positions else v for i, v in enumerate(values)]


def with_offset(params: dict, share: float = 1.0) -> Callable:
    """The odd-shape set's common offset: each float tensor (of two or more elements) plus
    ``offset`` times its own standard deviation (``offset`` drawn per batch, 60-120 of either
    sign; ``share`` of it). A variance taken as E[x^2] - E[x]^2 loses its digits to the offset
    squared (a LayerNorm so computed is off by 1e-3 at 60 deviations, 5e-3 at 100, still 2.5e-4 at
    30); one taken about the mean stays within 1.5e-5. Kept only where the fp32 reference matches
    its fp64 run (``builder``), which near the top of the range PyTorch's own fp32 LayerNorm does
    not always: the builder then tries half the offset."""
    k = float(params.get("offset", 0.0)) * share

    def offset(x):
        if not k or x.numel() < 2:
            return x
        spread = float(x.double().std())
        if not math.isfinite(spread) or spread == 0.0:
            return x
        return x + k * spread

    return offset
