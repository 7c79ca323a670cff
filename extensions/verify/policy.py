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


# --- Static check vocabulary (names in source; the runtime audit above stays authoritative) ---

# Tensor methods that compute (from torch.Tensor, minus the allowed and layout-only ones). A call
# ``obj.<name>(...)`` in the forward path is PyTorch doing the math.
TENSOR_COMPUTE_METHODS = frozenset("""
    abs abs_ absolute absolute_ acos acos_ acosh acosh_ add add_ addbmm addbmm_ addcdiv addcdiv_
    addcmul addcmul_ addmm addmm_ addmv addmv_ addr addr_ adjoint all allclose amax amin aminmax
    angle any apply_ arccos arccos_ arccosh arccosh_ arcsin arcsin_ arcsinh arcsinh_ arctan arctan2
    arctan2_ arctan_ arctanh arctanh_ argmax argmin argsort argwhere as_strided_scatter as_subclass
    asin asin_ asinh asinh_ atan atan2 atan2_ atan_ atanh atanh_ backward baddbmm baddbmm_ bernoulli
    bernoulli_ bincount bitwise_and bitwise_and_ bitwise_left_shift bitwise_left_shift_ bitwise_not
    bitwise_not_ bitwise_or bitwise_or_ bitwise_right_shift bitwise_right_shift_ bitwise_xor
    bitwise_xor_ bmm cauchy_ ccol_indices ceil ceil_ cholesky cholesky_inverse cholesky_solve clamp
    clamp_ clamp_max clamp_max_ clamp_min clamp_min_ clip clip_ coalesce col_indices conj
    conj_physical conj_physical_ copysign copysign_ corrcoef cos cos_ cosh cosh_ count_nonzero cov
    cross crow_indices cummax cummin cumprod cumprod_ cumsum cumsum_ deg2rad deg2rad_ dequantize det
    diag diag_embed diagflat diagonal_scatter diff digamma digamma_ dist div div_ divide divide_ dot
    eig eq eq_ equal erf erf_ erfc erfc_ erfinv erfinv_ exp exp2 exp2_ exp_ expm1 expm1_
    exponential_ fill_diagonal_ fix fix_ flip fliplr flipud float_power float_power_ floor floor_
    floor_divide floor_divide_ fmax fmin fmod fmod_ frac frac_ frexp gather gcd gcd_ ge ge_
    geometric_ geqrf ger greater greater_ greater_equal greater_equal_ gt gt_ hardshrink hash_tensor
    heaviside heaviside_ histc histogram hypot hypot_ i0 i0_ igamma igamma_ igammac igammac_ index
    index_add index_add_ index_copy index_copy_ index_fill index_fill_ index_put index_put_
    index_reduce index_reduce_ index_select inner int_repr inverse isclose isfinite isinf isnan
    isneginf isposinf isreal istft kron kthvalue lcm lcm_ ldexp ldexp_ le le_ lerp lerp_ less less_
    less_equal less_equal_ lgamma lgamma_ log log10 log10_ log1p log1p_ log2 log2_ log_ log_normal_
    log_softmax logaddexp logaddexp2 logcumsumexp logdet logical_and logical_and_ logical_not
    logical_not_ logical_or logical_or_ logical_xor logical_xor_ logit logit_ logsumexp lstsq lt lt_
    lu lu_solve map2_ map_ masked_fill masked_fill_ masked_scatter masked_scatter_ masked_select
    matmul matrix_exp matrix_power max maximum mean median min minimum mm mode msort mul mul_
    multinomial multiply multiply_ mv mvlgamma mvlgamma_ nan_to_num nan_to_num_ nanmean nanmedian
    nanquantile nansum ne ne_ neg neg_ negative negative_ new nextafter nextafter_ nonzero
    nonzero_static norm normal_ not_equal not_equal_ numpy orgqr ormqr outer pinverse polygamma
    polygamma_ positive pow pow_ prelu prod put put_ q_per_channel_axis q_per_channel_scales
    q_per_channel_zero_points q_scale q_zero_point qr qscheme quantile rad2deg rad2deg_ random_
    reciprocal reciprocal_ reinforce relu relu_ remainder remainder_ renorm renorm_ repeat
    repeat_interleave resize resize_as resize_as_sparse_ resolve_conj resolve_neg roll rot90 round
    round_ row_indices rsqrt rsqrt_ scatter scatter_ scatter_add scatter_add_ scatter_reduce
    scatter_reduce_ select_scatter set_ sgn sgn_ sigmoid sigmoid_ sign sign_ signbit sin sin_ sinc
    sinc_ sinh sinh_ slice_inverse slice_scatter slogdet smm softmax solve sort sparse_mask
    sparse_resize_ sparse_resize_and_clear_ sqrt sqrt_ square square_ sspaddmm std stft sub sub_
    subtract subtract_ sum sum_to_size svd symeig take take_along_dim tan tan_ tanh tanh_ tile
    to_dense to_mkldnn to_padded_tensor to_sparse to_sparse_bsc to_sparse_bsr to_sparse_coo
    to_sparse_csc to_sparse_csr topk trace triangular_solve tril tril_ triu triu_ true_divide
    true_divide_ trunc trunc_ uniform_ unique unique_consecutive var vdot where xlogy xlogy_
""".split())

# Tensor methods that move, view or describe data without math; not flagged by the static check.
TENSOR_LAYOUT_METHODS = frozenset("""
    as_strided_ bool broadcast_to byte cdouble cfloat chalf char const_data_ptr dense_dim detach_
    diagonal dim_order double dsplit hsplit indices int ipu is_coalesced is_complex is_conj
    is_distributed is_floating_point is_inference is_neg is_nonzero is_pinned is_same_size is_set_to
    is_shared is_signed long module_load moveaxis mtia narrow_copy new_empty_strided pin_memory
    ravel record_stream register_hook register_post_accumulate_grad_hook resize_ resize_as_
    retain_grad share_memory_ short sparse_dim split_with_sizes squeeze_ storage storage_type
    swapaxes swapaxes_ swapdims swapdims_ t_ tensor_split transpose_ type unfold unsafe_chunk
    unsafe_split unsafe_split_with_sizes unsqueeze_ untyped_storage values vsplit xpu
""".split())

# Compute method names that Python containers also have (set.add, list.sort, list.index): flagged
# only when the receiver is known to be a tensor (a parameter of the function, an attribute of self).
TENSOR_METHODS_SHARED_WITH_CONTAINERS = frozenset({"add", "index", "sort"})

# Tensor methods that are library GEMMs.
TENSOR_LIBRARY_GEMM_METHODS = frozenset({
    "matmul", "mm", "bmm", "addmm", "baddbmm", "addmv", "mv", "dot",
})

# nn modules: calling one in forward is PyTorch compute, except these (no math) ...
NN_MODULES_WITHOUT_COMPUTE = frozenset({"Identity", "Flatten", "Unflatten"})
# ... and these, which are library GEMM/convolution calls (allowed only under the policy).
NN_LIBRARY_GEMM_MODULES = frozenset({
    "Linear", "LazyLinear", "Bilinear", "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d",
    "ConvTranspose2d", "ConvTranspose3d", "LazyConv1d", "LazyConv2d", "LazyConv3d",
    "LazyConvTranspose1d", "LazyConvTranspose2d", "LazyConvTranspose3d",
})
# nn containers: what they hold decides what calling them does.
NN_CONTAINERS = frozenset({"Sequential", "ModuleList", "ModuleDict"})

# torch.cuda.<name>(...) calls allowed in the forward path: device queries and synchronisation.
ALLOWED_TORCH_CUDA_FUNCTIONS = frozenset({
    "is_available", "current_device", "device_count", "get_device_properties",
    "get_device_capability", "get_device_name", "synchronize", "device", "set_device",
    "is_initialized",
})

# Modules a candidate may import. "triton" covers every triton submodule; torch only these.
ALLOWED_IMPORTS = frozenset({
    "torch", "torch.nn", "torch.nn.functional", "torch.nn.init", "torch.autograd",
    "triton", "math", "typing", "functools", "dataclasses", "__future__",
})
ALLOWED_IMPORT_PREFIXES = ("triton.",)


def import_allowed(module: str) -> bool:
    """Whether ``import module`` (or ``from module import ...``) is on the allow-list."""
    return module in ALLOWED_IMPORTS or module.startswith(ALLOWED_IMPORT_PREFIXES)
