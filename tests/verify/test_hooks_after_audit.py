"""Nothing a candidate defines may run outside an audited region.

The verifier reads a model's outputs and parameters after forward returns: it copies outputs to
the host, walks the weights, fingerprints timed outputs and refills input buffers. A method the
candidate gave a tensor (a tensor subclass, an instance attribute ``detach``) or a module
(``parameters``, nn.Module's tables) would run there, unaudited, and could compute the answer
with PyTorch. Both layers are tested: the static check refuses the constructs, and the worker and
the timer, run without the static check in front, read nothing through the candidate's code.

The cheats are the ``hook_*`` fixtures of the adversarial suite (tests/fixtures/candidates/cheats),
real candidates for KernelBench level 1 problem 19 (ReLU) judged by the real verifier on CPU in the
Triton interpreter.
"""
from __future__ import annotations

import textwrap

import pytest
import torch
import torch.nn as nn

import candidate_catalog as catalog
from extensions.config import VerifierConfig
from extensions.config.sections import VerifierConfig as TimingConfig
from extensions.timing import TimingError, measure_speedup
from extensions.timing import tensors as timing_tensors
from extensions.verify import VerifyRequest, verify_batch
from extensions.verify.api import verify_code_unscreened
from extensions.verify.common.compare import compare_outputs
from extensions.verify.common.param_noise import apply_parameter_noise
from extensions.verify.sandboxed.handed_files import into_previous_tensors
from extensions.verify.static import policy
from extensions.verify.static.static_check import static_check

RELU = (1, 19)

# fixture -> flags the static check must raise
HOOK_CHEATS = {
    "hook_parameter_subclass_output_detach.py": {"forbidden_api"},
    "hook_parameter_subclass_weight_numel.py": {"forbidden_api"},
    "hook_tensor_subclass_output_detach.py": {"forbidden_api"},
    "hook_module_parameters_instance_attribute.py": {"forbidden_api"},
    "hook_module_parameters_class_binding.py": {"forbidden_api"},
    "hook_module_parameter_table_replaced.py": {"private_access"},
    "hook_output_detach_instance_attribute.py": {"forbidden_api"},
}

HONEST_RELU = textwrap.dedent("""
    import torch
    import torch.nn as nn
    import triton
    import triton.language as tl


    @triton.jit
    def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask)
        tl.store(y_ptr + offs, tl.where(x > 0, x, 0.0), mask=mask)


    class _Launch(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.dim = x.dim()
            y = torch.empty_like(x)
            n = x.numel()
            relu_kernel[(triton.cdiv(n, 1024),)](x, y, n, BLOCK=1024)
            return y


    class Gate(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("scale", torch.ones(1))


    class Blocks(nn.ModuleList):
        pass


    class ModelNew(nn.Module):
        def __init__(self):
            super().__init__()
            self.dim = 1
            self.stride = 1
            self.bias = nn.Parameter(torch.zeros(4))
            self.table = torch.ones(2)
            self.blocks = Blocks([Gate()])
            self._block = 1024

        def forward(self, x):
            return _Launch.apply(x.contiguous())
""")


def _fixture(name: str) -> catalog.CandidateFile:
    return next(f for f in catalog.load_folder("cheats", require_expectation=True) if f.name == name)


@pytest.fixture(scope="module")
def relu_problem(kernelbench_jsonl) -> str:
    return catalog.load_problems(kernelbench_jsonl, {RELU})[RELU]["code"]


@pytest.fixture(scope="module")
def unscreened_config() -> VerifierConfig:
    return VerifierConfig(device="cpu", timeout_s=120, multi_input_num_tests=2)


@pytest.fixture(scope="module")
def screened_results(relu_problem, verify_isolation):
    names = sorted(HOOK_CHEATS) + ["honest"]
    texts = [_fixture(n).text for n in sorted(HOOK_CHEATS)] + [HONEST_RELU]
    requests = [VerifyRequest(relu_problem, text, label=name) for name, text in zip(names, texts)]
    results = verify_batch(requests, VerifierConfig(isolation=verify_isolation), device="cpu", progress=False)
    return dict(zip(names, results))


def _describe(result) -> str:
    return f"stage={result.stage} correct={result.correct} flags={result.flags} error={result.error}"


# --- the whole verifier ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(HOOK_CHEATS))
def test_hook_cheat_is_rejected_by_the_verifier(name, screened_results):
    result = screened_results[name]
    assert not result.correct and result.reward == 0.0, _describe(result)
    assert HOOK_CHEATS[name] & set(result.flags), _describe(result)


def test_fixtures_are_in_the_adversarial_suite():
    for name in HOOK_CHEATS:
        fixture = _fixture(name)
        assert fixture.problem_key == RELU and fixture.expect_max_stage == "extract"


def test_honest_kernel_near_the_new_rules_is_accepted(screened_results):
    """nn.Module and nn.ModuleList subclasses, a Function's ctx attribute, self.dim/self.stride,
    a Parameter, a buffer, a plain tensor attribute and a private attribute of its own."""
    result = screened_results["honest"]
    assert result.correct and result.flags in ([], ["reduced_size"]), _describe(result)


# --- the runtime layer alone (the static check skipped) --------------------------------------------


# Cheats the worker refuses for what they hand it (a foreign tensor type, a replaced table); those
# that keep their output in a list for the hook to finish later are caught holding its storage; the
# others' hooks are simply never called, which leaves the kernel's copy of x: not ReLU(x).
REFUSED_BY_TYPE = {"hook_parameter_subclass_output_detach.py", "hook_tensor_subclass_output_detach.py",
                   "hook_parameter_subclass_weight_numel.py", "hook_module_parameter_table_replaced.py"}
HOLDING_THE_OUTPUT = {"hook_module_parameters_class_binding.py", "hook_module_parameters_instance_attribute.py"}


@pytest.mark.parametrize("name", sorted(HOOK_CHEATS))
def test_hook_cheat_is_rejected_without_the_static_check(name, relu_problem, unscreened_config):
    """Past a static screen, the worker reads outputs and weights without calling the candidate's
    methods."""
    result = verify_code_unscreened(relu_problem, _fixture(name).text, unscreened_config, device="cpu")
    assert not result.correct, _describe(result)
    if name in REFUSED_BY_TYPE:
        assert "cannot read" in (result.error or ""), _describe(result)
    elif name in HOLDING_THE_OUTPUT:
        assert "output_reused" in result.flags, _describe(result)
    else:
        assert result.error_category == "mismatch", _describe(result)


def test_honest_kernel_is_accepted_without_the_static_check(relu_problem, unscreened_config):
    result = verify_code_unscreened(relu_problem, HONEST_RELU, unscreened_config, device="cpu")
    assert result.correct, _describe(result)


# --- the static rule -------------------------------------------------------------------------------

HEADER = textwrap.dedent("""
    import torch
    import torch.nn as nn
    import triton
    import triton.language as tl


    @triton.jit
    def copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)
""")


def _module(prelude: str = "", init: str = "pass", body: str = "", forward: str = "return y") -> str:
    return HEADER + textwrap.dedent(prelude) + textwrap.dedent(f"""

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        {init}
{body}
    def forward(self, x):
        y = torch.empty_like(x)
        copy_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        {forward}
""")


def _helper(name: str) -> str:
    return f"def {name}(module, *args, **kwargs):\n    return module\n"


STATIC_ESCAPES = {
    "parameter_base": (_module("class P(nn.Parameter):\n    pass\n"), "tensor type"),
    "parameter_base_aliased": (_module("Par = nn.Parameter\nclass P(Par):\n    pass\n"), "tensor type"),
    "parameter_base_imported": (_module("from torch.nn import Parameter\nclass P(Parameter):\n    pass\n"),
                                "tensor type"),
    "buffer_base": (_module("class B(nn.Buffer):\n    pass\n"), "tensor type"),
    "uninitialized_parameter_base": (_module("class U(nn.UninitializedParameter):\n    pass\n"), "tensor type"),
    "uninitialized_buffer_base": (_module("class U(nn.UninitializedBuffer):\n    pass\n"), "tensor type"),
    "tensor_base": (_module("class T(torch.Tensor):\n    pass\n"), "tensor type"),
    "tensor_base_imported": (_module("from torch import Tensor\nclass T(Tensor):\n    pass\n"), "tensor type"),
    "non_module_nn_class_base": (_module("class O(nn.LinearCrossEntropyOptions):\n    pass\n"),
                                 "is not allowed"),
    "state_dict_class_binding": (_module(_helper("hook"), body="    state_dict = hook\n"),
                                 "redefining nn.Module.state_dict"),
    "to_class_binding": (_module(_helper("hook"), body="    to = hook\n"), "redefining nn.Module.to"),
    "parameters_annotated_binding": (_module(_helper("hook"), body="    parameters: object = hook\n"),
                                     "redefining nn.Module.parameters"),
    "named_parameters_instance": (_module(_helper("hook"), init="self.named_parameters = hook"),
                                  "nn.Module method named_parameters()"),
    "to_instance": (_module(_helper("hook"), init="self.to = hook"), "nn.Module method to()"),
    "state_dict_on_submodule": (_module(_helper("hook"), init="self.inner = nn.Identity()\n"
                                        "        self.inner.state_dict = hook"), "nn.Module method state_dict()"),
    "buffers_table_replaced": (_module(init="self._buffers = {}"), "private attribute '_buffers'"),
    "modules_table_read": (_module(forward="m = self._modules\n        return y"), "private attribute '_modules'"),
    "output_cpu_attribute": (_module(_helper("hook"), forward="y.cpu = hook\n        return y"), "cpu()"),
    "output_numel_attribute": (_module(_helper("hook"), forward="y.numel = hook\n        return y"),
                               "tensor method numel()"),
    "weight_detach_attribute": (_module(_helper("hook"), init="self.w = nn.Parameter(torch.ones(1))\n"
                                        "        self.w.detach = hook"), "tensor method detach()"),
    "output_in_list_attribute": (_module(_helper("hook"), forward="outs = [y]\n        outs[0].untyped_storage = hook\n"
                                         "        return y"), "tensor method untyped_storage()"),
    "static_method_first_argument": (_module(body="    @staticmethod\n    def mark(t, f):\n        t.detach = f\n"),
                                     "tensor method detach()"),
}


@pytest.mark.parametrize("name", sorted(STATIC_ESCAPES))
def test_static_check_refuses(name):
    code, message = STATIC_ESCAPES[name]
    report = static_check(code)
    flag = "private_access" if message.startswith("private attribute") else "forbidden_api"
    assert not report.ok and flag in report.flags, (name, report.flags, report.errors)
    assert any(message in error for error in report.errors), (name, report.errors)


def test_static_check_admits_what_honest_kernels_do_near_the_rule():
    report = static_check(HONEST_RELU)
    assert report.ok, report.errors
    honest = _module("class Lin(nn.Linear):\n    def extra_repr(self):\n        return 'lin'\n",
                     init="self.dim = 1\n        self.norm = 2\n        self.size = 3\n        self.training = False\n"
                          "        self.lin = Lin(2, 2)\n        self.layers = nn.ModuleList([nn.Identity()])",
                     body="    def reset_parameters(self):\n        pass\n")
    report = static_check(honest)
    assert report.ok, report.errors


def test_every_nn_tensor_class_is_refused_and_every_nn_module_class_allowed():
    for name in dir(nn):
        value = getattr(nn, name)
        if not (name[:1].isupper() and isinstance(value, type)):
            continue
        q = f"torch.nn.{name}"
        assert policy.nn_module_class(q) == issubclass(value, nn.Module), q
        if issubclass(value, torch.Tensor):
            assert policy.tensor_type(q), q


def test_reserved_lists_cover_nn_module():
    """Every method nn.Module has (except forward and extra_repr, which only forward and repr call)
    is reserved, and every private table of a fresh module is never the candidate's own."""
    # torch's own methods: a library may add its own to nn.Module at run time (transformers adds
    # ``smart_apply`` when it initialises a model), which the harness never calls.
    methods = {n for n in dir(nn.Module) if not n.startswith("__") and callable(getattr(nn.Module, n))
               and getattr(getattr(nn.Module, n), "__module__", "torch").startswith("torch")}
    methods -= {"forward", "extra_repr", "T_destination"}
    assert methods <= policy.NN_MODULE_RESERVED_METHODS, sorted(methods - policy.NN_MODULE_RESERVED_METHODS)
    private_state = {n for n in vars(nn.Module()) if n.startswith("_")}
    assert private_state <= policy.NN_MODULE_STATE, sorted(private_state - policy.NN_MODULE_STATE)


def test_properties_are_not_shadowable_names():
    assert policy.shadows_tensor_method("detach") and policy.shadows_tensor_method("copy_")
    assert not policy.shadows_tensor_method("shape") and not policy.shadows_tensor_method("dtype")
    assert not policy.shadows_tensor_method("weight") and not policy.shadows_tensor_method("__class__")


# --- the readers themselves ------------------------------------------------------------------------

CALLS: list[str] = []


class _Hooked(nn.Parameter):
    def detach(self):
        CALLS.append("detach")
        return self

    def numel(self):
        CALLS.append("numel")
        return 1


class _HookedTensor(torch.Tensor):
    def data_ptr(self):
        CALLS.append("data_ptr")
        return 0

    def detach(self):
        CALLS.append("detach")
        return torch.Tensor.detach(self)


def _hook(*args, **kwargs):
    CALLS.append("instance attribute")
    return 0


@pytest.fixture(autouse=True)
def _no_calls_yet():
    CALLS.clear()
    yield


def test_plain_output_refuses_subclasses_and_drops_instance_attributes():
    plain_output, ForeignTensorType = timing_tensors.plain_output, timing_tensors.ForeignTensorType
    out = torch.arange(4.0)
    out.detach = _hook
    out.numel = _hook
    plain = plain_output((out, [out * 2, 3]))
    assert type(plain) is tuple and type(plain[1]) is list and plain[1][1] == 3
    assert type(plain[0]) is torch.Tensor and plain[0].data_ptr() == torch._C.TensorBase.data_ptr(out)
    assert plain[0].numel() == 4 and torch.equal(plain[0].detach(), torch.arange(4.0))
    with pytest.raises(ForeignTensorType, match="_HookedTensor"):
        plain_output([torch.zeros(2).as_subclass(_HookedTensor)])
    with pytest.raises(ForeignTensorType, match="_Hooked"):
        plain_output(_Hooked(torch.zeros(2), False))
    assert type(plain_output(nn.Parameter(torch.zeros(2)))) is torch.Tensor
    assert CALLS == []


class _Inner(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(3))
        self.register_buffer("running", torch.zeros(2))
        self.table = torch.full((2,), 5.0)


class _Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = _Inner()
        self.shared = self.inner  # the same module twice: walked once
        self.bias = nn.Parameter(torch.zeros(4))
        self.lazy = nn.LazyLinear(2)

    def parameters(self, recurse=True):  # never called by the walk
        CALLS.append("parameters")
        return iter(())


def test_module_tensors_read_tables_not_methods():
    from extensions.verify.common.model_tensors import module_tensors

    model = _Outer()
    model.bias.numel = _hook
    tensors = module_tensors(model)
    assert [t.shape for t in tensors] == [(4,), (3,), (2,)]
    assert all(type(t) is torch.Tensor for t in tensors)
    assert [t.shape for t in module_tensors(model, attributes=True)] == [(4,), (3,), (2,), (2,)]
    assert CALLS == []


def test_module_tensors_refuse_foreign_tensors_and_tables():
    from extensions.verify.common.model_tensors import ForeignTensorType, module_tensors

    model = _Outer()
    model.inner.weight = _Hooked(torch.ones(3), False)
    with pytest.raises(ForeignTensorType, match="_Hooked"):
        module_tensors(model)
    model = _Outer()
    object.__setattr__(model.inner, "_parameters", type("Table", (), {"items": _hook, "values": _hook})())
    with pytest.raises(ForeignTensorType, match="_parameters"):
        module_tensors(model)
    assert CALLS == []


def test_parameter_noise_reaches_candidate_tensors_without_their_methods():
    model = _Outer()
    model.inner.weight.detach = _hook
    model.inner.weight.copy_ = _hook
    assert apply_parameter_noise(model, 7, ["3:1.0"], reference=False) == 1
    assert not torch.equal(model.inner.weight.data, torch.ones(3))
    assert CALLS == []


def test_previous_inputs_are_refilled_through_torchs_own_copy():
    first = [torch.zeros(3), 4]
    first[0].copy_ = _hook
    first[0].stride = _hook
    reused = into_previous_tensors(first, [torch.ones(3), 4])
    assert reused is first and torch.equal(first[0], torch.ones(3))
    assert CALLS == []


# --- the timer -------------------------------------------------------------------------------------


def _timing_config():
    return TimingConfig(timing_mode="counts", timing_num_warmup=2, timing_num_trials=4,
                        timing_max_remeasure=0, timing_bootstrap_samples=50)


def _timing_sets():
    generator = torch.Generator().manual_seed(0)
    return [[torch.randn(1000, generator=generator)] for _ in range(3)]


class _Double(nn.Module):
    def forward(self, x):
        return x * 2.0


class _LateAnswer(nn.Module):
    """Returns zeros as a tensor subclass whose data_ptr/detach would write the answer in: the
    timer's reuse check and fingerprint run after the timed region."""

    def forward(self, x):
        return torch.zeros_like(x).as_subclass(_HookedTensor)


class _RefillHook(nn.Module):
    """Gives its live input an instance attribute copy_: the timer refills that buffer between
    timed calls, where the hook would run unmeasured."""

    def forward(self, x):
        x.copy_ = _hook
        return x * 2.0


def test_timer_refuses_a_foreign_output_type_without_calling_it():
    with pytest.raises(TimingError, match="_HookedTensor"):
        measure_speedup(_Double(), _LateAnswer(), _timing_sets(), _timing_config(), compare_outputs=compare_outputs)
    assert CALLS == []


def test_timer_refills_inputs_through_torchs_own_copy():
    report = measure_speedup(_Double(), _RefillHook(), _timing_sets(), _timing_config(),
                             compare_outputs=compare_outputs)
    assert CALLS == []
    assert "output_mismatch_during_timing" not in report.flags
