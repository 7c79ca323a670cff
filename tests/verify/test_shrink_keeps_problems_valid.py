"""Shrinking a problem for the CPU interpreter must leave a problem whose reference still runs.

When the base input set's reference fails, the whole problem is unusable and every candidate for
it, correct ones included, is rejected. Halving one size at a time broke problems whose sizes are
tied: HingeLoss's targets broadcast against the batch, GroupNorm needs channels divisible by groups,
a dilated convolution's kernel must fit its padded input. Every level-1 and level-2 problem must
shrink to sizes under the cap where its forward still runs (checked on the meta device).
"""
from __future__ import annotations

import json

import pytest

from extensions.verify.common.problem_constants import rewrite_constants
from extensions.verify.common.problem_sizes import meta_forward_runs, meta_numel, shrink_to_cap

CPU_CAP = 65536
# Problems whose sizes are tied in ways that one halving at a time broke.
TIED = [(1, 100), (2, 88), (2, 23), (1, 84), (2, 3)]


@pytest.fixture(scope="module")
def problems(kernelbench_jsonl):
    rows = {}
    with open(kernelbench_jsonl, encoding="utf-8") as handle:
        for line in handle:
            row = json.loads(line)
            if row["level"] <= 2:
                rows[(row["level"], row["problem_id"])] = row["code"]
    return rows


@pytest.mark.parametrize("key", TIED, ids=[f"l{l}_{p}" for l, p in TIED])
def test_tied_sizes_shrink_to_a_valid_problem(problems, key):
    source = problems[key]
    values, notes = shrink_to_cap(source, CPU_CAP)
    shrunk = rewrite_constants(source, values)
    assert meta_forward_runs(shrunk), (values, notes)
    # Under the cap, or as close as valid sizes go (a tuple-valued shape is not rewritten), and
    # then the notes say so.
    assert meta_numel(shrunk) <= CPU_CAP or any("cannot shrink" in n for n in notes), (values, notes)
    assert meta_numel(shrunk) < meta_numel(source)


def test_every_level_1_and_2_problem_shrinks_to_a_valid_problem(problems):
    broken = []
    for key, source in sorted(problems.items()):
        if not meta_forward_runs(source):
            continue  # the problem's own forward has no meta kernel: nothing to compare with
        values, _notes = shrink_to_cap(source, CPU_CAP)
        if not meta_forward_runs(rewrite_constants(source, values)):
            broken.append(key)
    assert broken == []


def test_a_problem_whose_output_dwarfs_its_inputs_is_capped_by_its_output(problems):
    """Matmul over a small K: 4M input elements, a 32768 x 32768 output. Capping the inputs alone
    left every candidate writing 4 GB per input set back to the verifier, eight at a time."""
    import torch

    from extensions.verify.common.problem_sizes import load_problem

    source = problems[(1, 7)]
    cuda_cap = 1 << 25
    values, notes = shrink_to_cap(source, cuda_cap)
    module = load_problem(rewrite_constants(source, values))
    with torch.device("meta"):
        output = module.Model()(*module.get_inputs())
    assert output.numel() <= cuda_cap, (values, notes)
    assert values["K"] == 64  # the inner dimension was never the problem: M and N shrink
