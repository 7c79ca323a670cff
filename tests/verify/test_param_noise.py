"""Noise for constant-initialised parameters, varied constructor scalars and reused input tensors:
the reference's and the candidate's models must get the same values whatever the candidate calls
or shapes its tensors, and nothing the reference did not perturb may change."""
import torch
import torch.nn as nn

from extensions.verify.common.param_noise import apply_parameter_noise, constant_parameter_keys
from extensions.verify.common.problem_constants import find_scalar_constants, rewrite_constants, varied_scalar
from extensions.verify.sandboxed.handed_files import into_previous_tensors


class Reference(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm((3, 4))
        self.proj = nn.Linear(4, 4)


class Candidate(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(12))  # flattened, renamed
        self.register_buffer("b", torch.zeros(3, 4))  # a buffer instead of a parameter
        self.helper = torch.full((5,), 7.0)  # a constant the reference has no counterpart for


def test_reference_constants_and_candidate_tensors_get_the_same_noise():
    ref, cand = Reference(), Candidate()
    keys = constant_parameter_keys(ref)
    assert keys == ["12:0.0", "12:1.0"]  # the Linear's random weight and bias are not constant
    assert apply_parameter_noise(ref, 1234, keys, reference=True) == 2
    assert apply_parameter_noise(cand, 1234, keys, reference=False) == 2
    assert torch.equal(cand.w.detach(), ref.ln.weight.detach().reshape(-1))
    assert torch.equal(cand.b, ref.ln.bias.detach())
    assert torch.equal(cand.helper, torch.full((5,), 7.0))
    assert bool((ref.ln.weight > 0).all()) and not bool((ref.ln.bias == 0).any())
    other = Reference()
    apply_parameter_noise(other, 99, constant_parameter_keys(other), reference=True)
    assert not torch.equal(other.ln.weight, ref.ln.weight)  # the seed decides the values


def test_scalar_constants_vary_and_rewrite():
    source = "import torch\nmultiplier = 2.0\nslope = -0.1\np = 0.0\nsize = 8\n"
    found = find_scalar_constants(source)
    assert found == {"multiplier": 2.0, "slope": -0.1, "p": 0.0}
    varied = {n: varied_scalar(v, 1.5) for n, v in found.items()}
    assert varied == {"multiplier": 3.0, "slope": -0.1 * 1.5, "p": 0.0}
    namespace = {}
    exec(rewrite_constants(source, {**varied, "size": 5}), namespace)
    assert (namespace["multiplier"], namespace["slope"], namespace["size"]) == (3.0, -0.1 * 1.5, 5)


def test_inputs_of_the_same_layout_go_into_the_previous_tensors():
    first = [torch.zeros(2, 3), 4]
    second = [torch.ones(2, 3), 4]
    reused = into_previous_tensors(first, second)
    assert reused is first and torch.equal(first[0], torch.ones(2, 3))
    assert into_previous_tensors(first, [torch.ones(3, 2), 4])[0].shape == (3, 2)
    assert into_previous_tensors(first, [torch.ones(2, 3), 5])[1] == 5
    assert into_previous_tensors(None, second) is second


CONV_PROBLEM = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, channels, kernel_size, multiplier, dim):
        super().__init__()
        self.conv = nn.Conv1d(channels, channels, kernel_size)
        self.multiplier = multiplier
        self.dim = dim

    def forward(self, x):
        return torch.sum(self.conv(x) * self.multiplier, dim=self.dim)

batch_size = 2
channels = 4
length = 16
kernel_size = 3
multiplier = 2.0
dim = 1

def get_inputs():
    return [torch.rand(batch_size, channels, length)]

def get_init_inputs():
    return [channels, kernel_size, multiplier, dim]
'''


def test_constructor_arguments_vary_except_axes():
    from extensions.verify.reference.builder import ReferenceBuilder

    from extensions.config import VerifierConfig
    from extensions.verify.parent.reference_data import reference_job

    job = {**reference_job(VerifierConfig(), "cpu"), "seed": 0, "max_input_numel": 0}
    secret = {"input_seed": 1, "param_seed": 2, "scalar_factor": 1.5,
              "transforms": {"signed": [4.0, 2.0, 1.0], "scale_down": 1e-3, "scale_up": 1e2, "shift": 2.0,
                             "shift_scale": 100.0, "scale_up_tops": [5.5, 4.0],
                             "scale_up_share": 1e-3}}
    builder = ReferenceBuilder(CONV_PROBLEM, job, secret)
    # kernel_size moves one step; the multiplier is whole, so it does too; the axis stays.
    assert builder._constructor_arguments() == {"kernel_size": 4, "multiplier": 3.0}


class TwoNorms(nn.Module):
    """Two constant-initialised parameters of each key (a tied key), next to a buffer of one."""

    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(6)  # weight 6:1.0, bias 6:0.0, running_mean 6:0.0, running_var 6:1.0
        self.norm = nn.LayerNorm(6)  # weight 6:1.0, bias 6:0.0


def _noised_reference(seed=7):
    ref = TwoNorms()
    keys = constant_parameter_keys(ref)
    apply_parameter_noise(ref, seed, keys, reference=True)
    return ref, keys


def test_tied_keys_get_a_noise_per_member():
    ref, keys = _noised_reference()
    assert keys == [{"key": "6:0.0", "names": ["bn.bias", "norm.bias"], "buffers": ["bn.running_mean"]},
                    {"key": "6:1.0", "names": ["bn.weight", "norm.weight"], "buffers": ["bn.running_var"]}]
    assert not torch.equal(ref.bn.weight, ref.norm.weight) and not torch.equal(ref.bn.bias, ref.norm.bias)
    assert torch.equal(ref.bn.running_mean, torch.zeros(6))  # the reference's buffers stay


def test_tied_keys_pair_by_name_whatever_the_order():
    ref, keys = _noised_reference()

    class SameNamesOtherOrder(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm(6)
            self.bn = nn.BatchNorm1d(6)

    cand = SameNamesOtherOrder()
    report = {}
    apply_parameter_noise(cand, 7, keys, reference=False, report=report)
    assert report == {"6:0.0": "names", "6:1.0": "names"}
    for name in ("bn.weight", "bn.bias", "norm.weight", "norm.bias"):
        assert torch.equal(cand.get_parameter(name), ref.get_parameter(name)), name
    # BatchNorm's running statistics are the reference's buffers' counterparts: left alone.
    assert torch.equal(cand.bn.running_mean, torch.zeros(6)) and torch.equal(cand.bn.running_var, torch.ones(6))


def test_tied_keys_pair_renamed_tensors_by_order_and_views_as_one():
    ref, keys = _noised_reference()

    class Renamed(nn.Module):
        def __init__(self):
            super().__init__()
            self.g1 = nn.Parameter(torch.ones(6))
            self.register_buffer("b1", torch.zeros(6))
            self.g2 = nn.Parameter(torch.ones(2, 3))  # reshaped
            self.register_buffer("b2", torch.zeros(6))
            self.g1_view = self.g1.view(2, 3)  # a view of g1: the same tensor, not a third one

    cand = Renamed()
    report = {}
    apply_parameter_noise(cand, 7, keys, reference=False, report=report)
    assert report == {"6:0.0": "order", "6:1.0": "order"}
    assert torch.equal(cand.g1.detach(), ref.bn.weight.detach())
    assert torch.equal(cand.g2.detach().reshape(-1), ref.norm.weight.detach())
    assert torch.equal(cand.b1, ref.bn.bias.detach()) and torch.equal(cand.b2, ref.norm.bias.detach())


def test_no_choice_of_names_or_count_gives_two_roles_one_noise():
    ref, keys = _noised_reference()

    class OneWeight(nn.Module):  # holds one weight for both norms (the cheat's natural shape)
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(6))

    class SharedModule(nn.Module):  # the reference's names, both on one tensor
        def __init__(self):
            super().__init__()
            self.bn = nn.BatchNorm1d(6)
            self.norm = nn.LayerNorm(6)
            self.norm.weight = self.bn.weight

    class SpareFirst(nn.Module):  # a spare tensor of the key ahead of the real ones
        def __init__(self):
            super().__init__()
            self.spare = nn.Parameter(torch.ones(6))
            self.a = nn.Parameter(torch.ones(6))
            self.b = nn.Parameter(torch.ones(6))

    for cls in (OneWeight, SharedModule, SpareFirst):
        cand = cls()
        report = {}
        apply_parameter_noise(cand, 7, keys, reference=False, report=report)
        held = [t for _, t in cand.named_parameters() if t.numel() == 6 and not bool((t == t.reshape(-1)[0]).all())]
        values = [t.detach().reshape(-1) for t in held]
        assert all(not torch.equal(x, y) for i, x in enumerate(values) for y in values[i + 1:]), cls.__name__
        assert any(torch.equal(v, ref.bn.weight.detach()) for v in values), cls.__name__
    assert report["6:1.0"] == "order+unpaired"  # SpareFirst: b keeps its ones
    assert torch.equal(cand.b.detach(), torch.ones(6))


def test_kernelbench_batch_norm_beside_group_norm_is_told_apart(kernelbench_jsonl):
    """L2 #11: BatchNorm2d(128) and GroupNorm(8, 128) hold weights and biases of one key each."""
    import json

    key = (2, 11)
    with open(kernelbench_jsonl, encoding="utf-8") as handle:
        row = next(r for r in map(json.loads, handle) if (r["level"], r["problem_id"]) == key)
    namespace: dict = {}
    exec(compile(row["code"], "problem", "exec"), namespace)
    torch.manual_seed(0)
    ref = namespace["Model"](*namespace["get_init_inputs"]())
    keys = constant_parameter_keys(ref)
    assert {"key": "128:1.0", "names": ["batch_norm.weight", "group_norm.weight"],
            "buffers": ["batch_norm.running_var"]} in keys
    apply_parameter_noise(ref, 5, keys, reference=True)
    torch.manual_seed(0)
    cand = namespace["Model"](*namespace["get_init_inputs"]())  # a candidate that keeps the modules
    report = {}
    apply_parameter_noise(cand, 5, keys, reference=False, report=report)
    assert report == {"128:0.0": "names", "128:1.0": "names"}
    for name in ("batch_norm.weight", "batch_norm.bias", "group_norm.weight", "group_norm.bias"):
        assert torch.equal(cand.get_parameter(name), ref.get_parameter(name)), name
    assert not torch.equal(ref.batch_norm.bias, ref.group_norm.bias)


def test_pairing_detail_keeps_only_the_forms_the_worker_writes():
    from extensions.verify.parent.judge import _param_pairing

    written = {"param_pairing": {"96:1.0": "order", "96:0.0": "names+order+unpaired",
                                 "96:2.0": "AWS_SECRET", "token=abc": "names", "3:1e-05": "names"}}
    assert _param_pairing(written) == {"96:1.0": "order", "96:0.0": "names+order+unpaired", "3:1e-05": "names"}
    assert _param_pairing({"param_pairing": ["names"]}) == {} and _param_pairing(None) == {}
