"""The static allow-list and the runtime audit must agree: every PyTorch call the static check
admits in forward runs only ATen operators the audit admits. A call admitted by one and flagged by
the other rejects a correct kernel (``torch.promote_types`` in forward was judged ``torch_compute``).
The calls run for real, under the same CPU profiler the audit reads.
"""
from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from extensions.verify.static import policy
from extensions.verify.sandboxed.audit import PROFILER_ONLY_OPS

X = torch.randn(4, 6)

TORCH_CALLS = {
    "empty": lambda: torch.empty(3), "empty_like": lambda: torch.empty_like(X),
    "empty_strided": lambda: torch.empty_strided((2, 2), (2, 1)), "zeros": lambda: torch.zeros(3),
    "zeros_like": lambda: torch.zeros_like(X), "ones": lambda: torch.ones(3), "ones_like": lambda: torch.ones_like(X),
    "full": lambda: torch.full((2,), 1.0), "full_like": lambda: torch.full_like(X, 2.0),
    "arange": lambda: torch.arange(5), "tensor": lambda: torch.tensor([1.0, 2.0]),
    "as_tensor": lambda: torch.as_tensor([1.0]), "is_tensor": lambda: torch.is_tensor(X),
    "is_floating_point": lambda: torch.is_floating_point(X), "numel": lambda: torch.numel(X),
    "result_type": lambda: torch.result_type(X, 1.0),
    "promote_types": lambda: torch.promote_types(torch.float16, torch.float32),
    "finfo": lambda: torch.finfo(X.dtype), "iinfo": lambda: torch.iinfo(torch.int32),
    "device": lambda: torch.device("cpu"), "dtype": lambda: X.dtype, "Size": lambda: torch.Size([1]),
    "no_grad": lambda: torch.no_grad(), "inference_mode": lambda: torch.inference_mode(),
}
TENSOR_CALLS = {
    "size": lambda: X.size(), "stride": lambda: X.stride(), "numel": lambda: X.numel(), "dim": lambda: X.dim(),
    "ndimension": lambda: X.ndimension(), "element_size": lambda: X.element_size(),
    "data_ptr": lambda: X.data_ptr(), "is_contiguous": lambda: X.is_contiguous(),
    "storage_offset": lambda: X.storage_offset(), "get_device": lambda: X.get_device(),
    "nelement": lambda: X.nelement(), "view": lambda: X.view(-1), "view_as": lambda: X.view_as(X),
    "reshape": lambda: X.reshape(6, 4), "reshape_as": lambda: X.reshape_as(X), "flatten": lambda: X.flatten(),
    "unflatten": lambda: X.unflatten(1, (2, 3)), "unsqueeze": lambda: X.unsqueeze(0),
    "squeeze": lambda: X.unsqueeze(0).squeeze(0), "permute": lambda: X.permute(1, 0),
    "transpose": lambda: X.transpose(0, 1), "t": lambda: X.t(), "expand": lambda: X[:1].expand(3, 6),
    "expand_as": lambda: X[:1].expand_as(X), "as_strided": lambda: X.as_strided((2, 2), (1, 1)),
    "narrow": lambda: X.narrow(0, 0, 2), "select": lambda: X.select(0, 1), "unbind": lambda: X.unbind(0),
    "split": lambda: X.split(2), "chunk": lambda: X.chunk(2), "detach": lambda: X.detach(),
    "movedim": lambda: X.movedim(0, 1), "contiguous": lambda: X.t().contiguous(), "clone": lambda: X.clone(),
    "copy_": lambda: torch.empty_like(X).copy_(X), "to": lambda: X.to(torch.float16),
    "cuda": lambda: X.to("cpu"), "float": lambda: X.half().float(), "half": lambda: X.half(),
    "bfloat16": lambda: X.bfloat16(), "type_as": lambda: X.type_as(X.half()),
    "fill_": lambda: torch.empty(3).fill_(1.0), "zero_": lambda: torch.empty(3).zero_(),
    "new_empty": lambda: X.new_empty(3), "new_zeros": lambda: X.new_zeros(3), "new_ones": lambda: X.new_ones(3),
    "new_full": lambda: X.new_full((3,), 1.0), "new_tensor": lambda: X.new_tensor([1.0]),
    "requires_grad_": lambda: torch.empty(2).requires_grad_(False),
}


def _rejected_ops(call) -> list[str]:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        call()
    names = {e.name for e in prof.events() if e.name.startswith("aten::")}
    return sorted(n for n in names if n.split("::", 1)[1].split(".", 1)[0] not in PROFILER_ONLY_OPS
                  and not policy.aten_op_allowed(n))


def test_every_allowed_call_has_a_probe():
    assert set(TORCH_CALLS) == set(policy.ALLOWED_TORCH_FUNCTIONS)
    assert set(TENSOR_CALLS) == set(policy.ALLOWED_TENSOR_METHODS)


@pytest.mark.parametrize("name", sorted(TORCH_CALLS))
def test_allowed_torch_function_runs_only_allowed_ops(name):
    assert _rejected_ops(TORCH_CALLS[name]) == []


@pytest.mark.parametrize("name", sorted(TENSOR_CALLS))
def test_allowed_tensor_method_runs_only_allowed_ops(name):
    assert _rejected_ops(TENSOR_CALLS[name]) == []
