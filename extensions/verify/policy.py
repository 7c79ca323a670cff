"""What a candidate's forward may do with PyTorch: allocate, inspect, reshape, copy. Nothing else.

One policy, read by the static check (names in source) and the runtime audit (ATen operators that
actually ran during forward), so a kernel that passes one cannot fail the other for a different
reading of the rules. The math must happen in Triton kernels; library GEMM/convolution calls are
rejected unless the config sets ``verifier.allow_library_gemm`` and are then reported.
"""
from __future__ import annotations

# torch.<name>(...) calls allowed in the forward path: allocation and metadata, no math.
ALLOWED_TORCH_FUNCTIONS = frozenset({
    "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like",
    "full", "full_like", "arange", "tensor", "as_tensor",
    "is_tensor", "is_floating_point", "numel", "result_type", "promote_types", "finfo", "iinfo",
    "device", "dtype", "Size", "no_grad", "inference_mode",
})

# tensor.<name>(...) methods allowed in the forward path: metadata, views, copies and fills.
ALLOWED_TENSOR_METHODS = frozenset({
    # metadata
    "size", "stride", "numel", "dim", "ndimension", "element_size", "data_ptr", "is_contiguous",
    "storage_offset", "get_device", "item", "tolist", "nelement",
    # views and layout
    "view", "view_as", "reshape", "reshape_as", "flatten", "unflatten", "unsqueeze", "squeeze",
    "permute", "transpose", "t", "expand", "expand_as", "as_strided", "narrow", "select",
    "unbind", "split", "chunk", "detach", "movedim",
    # copies and fills
    "contiguous", "clone", "copy_", "to", "cuda", "cpu", "float", "half", "bfloat16", "type_as",
    "fill_", "zero_", "new_empty", "new_zeros", "new_ones", "new_full", "new_tensor",
    "requires_grad_",
})

# ATen operators (overload packet names, without "aten::") that may run during forward.
ALLOWED_ATEN_OPS = frozenset({
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros", "zeros_like",
    "ones", "ones_like", "full", "full_like", "new_zeros", "new_ones", "new_full", "arange",
    "scalar_tensor", "lift_fresh", "lift_fresh_copy", "resize_",
    "fill_", "zero_", "copy_", "clone", "contiguous", "_to_copy", "to", "_copy_from",
    "_copy_from_and_resize",
    "view", "_unsafe_view", "reshape", "_reshape_alias", "as_strided", "expand", "permute",
    "transpose", "t", "unsqueeze", "squeeze", "slice", "select", "narrow", "detach", "alias",
    "unbind", "split", "split_with_sizes", "chunk", "flatten", "unflatten", "movedim",
    "view_as", "expand_as", "_local_scalar_dense", "item", "is_nonzero", "set_",
    "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "size", "stride", "numel", "dim",
    "is_contiguous", "storage_offset", "record_stream",
})

# Library GEMM / convolution entry points: rejected by default, allowed and reported under policy.
LIBRARY_GEMM_ATEN_OPS = frozenset({
    "mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "addmv", "mv", "dot", "einsum",
    "_scaled_mm", "convolution", "_convolution", "conv1d", "conv2d", "conv3d",
    "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "cudnn_convolution",
    "mkldnn_convolution", "_slow_conv2d_forward", "slow_conv3d_forward",
    "_mkldnn_convolution", "miopen_convolution",
})
LIBRARY_GEMM_TORCH_FUNCTIONS = frozenset({
    "mm", "addmm", "bmm", "baddbmm", "matmul", "einsum", "mv", "dot", "tensordot", "conv1d",
    "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "linear",
})

# CUDA kernels (by name fragment) that may run besides Triton's: PyTorch's copies and fills.
ALLOWED_CUDA_KERNEL_FRAGMENTS = (
    "fill_kernel", "FillFunctor", "copy_kernel", "direct_copy_kernel", "CatArrayBatchedCopy",
    "elementwise_kernel_with_index", "Memcpy", "Memset", "memcpy", "memset",
)


def aten_op_allowed(name: str, allow_library_gemm: bool = False) -> bool:
    """``name`` like "aten::add.Tensor", "aten::add" or "add"."""
    base = name.split("::", 1)[-1].split(".", 1)[0]
    if base in ALLOWED_ATEN_OPS:
        return True
    return allow_library_gemm and base in LIBRARY_GEMM_ATEN_OPS
