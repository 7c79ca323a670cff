"""What a candidate may read from a value whose kind the static check cannot name.

Name resolution judges attribute chains rooted at a module (``torch.cuda.os`` is refused), but most
attributes a kernel module reads sit on values: a call's result, a parameter, a subscript, a local
(``x.shape``, ``torch.finfo(dt).max``, ``cfg.block``). A value of a kind outside the kernel-writing
vocabulary turns such an attribute into a way out of the allow-list: a module returned by a
function (``torch.get_device_module("cuda").importlib``), a tensor's storage
(``x.untyped_storage().from_file(path, ...)`` reads any file), a NumPy array (``x.numpy().tofile``
writes one; ``.ctypes`` reaches raw memory), the interpreter's handle of a Triton value
(``v.handle.data`` is a NumPy array inside a kernel), a compiled kernel's internals.

So attributes of values are an allow-list too: ``VALUE_ATTRIBUTE_API`` holds what the kinds a kernel
module handles expose (tensors, nn modules, Python containers, strings and numbers, torch metadata
objects, Triton configs, Triton values inside kernels, autograd contexts, functools wrappers), and
the names the module defines itself (its attributes, fields and methods) are allowed as well.
``FOREIGN_KIND_ATTRIBUTES`` hand out a value of another kind: they are refused on any value;
defining one unlocks it only on the method's own ``self``/``cls`` (``self.cache = {}``).
"""
from __future__ import annotations

# Attributes that hand out a value of a kind outside the vocabulary: storages, NumPy arrays,
# autograd graph nodes, DLPack capsules, the interpreter's handle of a Triton value, a compiled
# kernel's code and caches. Refused on every value whose kind is not known, whoever defines them.
FOREIGN_KIND_ATTRIBUTES = frozenset({
    "storage", "untyped_storage", "storage_type", "share_memory_", "module_load", "numpy", "grad_fn",
    "register_hook", "register_post_accumulate_grad_hook", "apply_", "map_", "map2_", "as_subclass",
    "from_file", "tofile", "tobytes", "dump", "dumps", "ctypes", "to_dlpack", "handle", "fn", "src",
    "cache", "device_caches", "binder", "launch_metadata", "do_bench", "kernel", "base_fn",
    "pre_run_hooks", "used_global_vals", "rewriter", "importlib", "os", "sys", "builtins",
    # nn.Module.compile is torch.compile: on CPU its generated C++ runs below every operator audit
    "compile", "asm", "function", "packed_metadata",
})

# Properties of torch.Tensor (its methods are listed in policy).
TENSOR_PROPERTIES = frozenset("""
    H T mH mT data device dtype grad grad_dtype imag is_cpu is_cuda is_ipu is_leaf is_maia is_meta
    is_mkldnn is_mps is_mtia is_nested is_quantized is_sparse is_sparse_csr is_vulkan is_xla is_xpu
    itemsize layout name names nbytes ndim output_nr real requires_grad retains_grad shape volatile
    item tolist cpu
""".split())

# Public attributes of torch.nn.Module and of common layers' instances (a candidate keeps layers
# for their parameters and reads their settings).
NN_MODULE_ATTRIBUTES = frozenset("""
    T_destination add_module apply bfloat16 buffers call_super_init children cpu cuda double
    dump_patches eval extra_repr float forward get_buffer get_extra_state get_parameter
    get_submodule half ipu load_state_dict modules mtia named_buffers named_children named_modules
    named_parameters parameters register_backward_hook register_buffer register_forward_hook
    register_forward_pre_hook register_full_backward_hook register_full_backward_pre_hook
    register_load_state_dict_post_hook register_load_state_dict_pre_hook register_module
    register_parameter register_state_dict_post_hook register_state_dict_pre_hook requires_grad_
    set_extra_state set_submodule share_memory state_dict to to_empty train type xpu zero_grad
    add_zero_attn affine align_corners alpha approximate batch_first beta bias bias_hh_l0 bias_ih_l0
    bias_k bias_v bidirectional ceil_mode count_include_pad dilation dim divisor_override dropout
    elementwise_affine embed_dim embedding_dim end_dim eps groups head_dim hidden_size in_channels
    in_features in_proj_bias in_proj_weight init inplace input_size k_proj_weight kdim kernel_size
    max_norm max_val min_val mode momentum negative_slope norm_type normalized_shape
    num_batches_tracked num_channels num_embeddings num_features num_groups num_heads num_layers
    num_parameters out_channels out_features out_proj output_padding output_size p padding
    padding_idx padding_mode proj_size q_proj_weight recompute_scale_factor return_indices
    running_mean running_var scale_factor scale_grad_by_freq size sparse start_dim stride threshold
    track_running_stats training transposed v_proj_weight vdim weight weight_hh_l0 weight_ih_l0
    lambd upper lower
""".split())

# Methods and attributes of Python's containers, strings and numbers.
PYTHON_VALUE_ATTRIBUTES = frozenset("""
    add append as_integer_ratio bit_count bit_length capitalize casefold center clear conjugate copy
    count denominator difference difference_update discard encode endswith expandtabs extend find
    format format_map from_bytes fromhex fromkeys get hex imag index indices insert intersection
    intersection_update is_integer isalnum isalpha isascii isdecimal isdigit isdisjoint isidentifier
    islower isnumeric isprintable isspace issubset issuperset istitle isupper items join keys ljust
    lower lstrip maketrans numerator partition pop popitem real remove removeprefix removesuffix
    replace reverse rfind rindex rjust rpartition rsplit rstrip setdefault sort split splitlines
    start startswith step stop strip swapcase symmetric_difference symmetric_difference_update title
    to_bytes translate union update upper values zfill args
""".split())

# torch metadata objects (dtype, device, finfo/iinfo, CUDA device properties), Triton configs,
# autograd contexts, functools wrappers, properties.
METADATA_ATTRIBUTES = frozenset("""
    abbr is_complex is_floating_point is_signed itemsize to_complex to_real index type bits eps max
    min resolution smallest_normal tiny dtype
    name major minor total_memory multi_processor_count warp_size L2_cache_size
    max_threads_per_multi_processor regs_per_multiprocessor shared_memory_per_block
    shared_memory_per_block_optin shared_memory_per_multiprocessor max_threads_per_block
    gcnArchName uuid is_integrated is_multi_gpu_board clock_rate memory_clock_rate
    memory_bus_width
    kwargs all_kwargs num_warps num_stages num_ctas maxnreg pre_hook ir_override
    run warmup best_config
    save_for_backward saved_tensors needs_input_grad mark_dirty mark_non_differentiable
    set_materialize_grads
    func keywords cache_info cache_clear cache_parameters fget fset fdel setter getter deleter
""".split())

# Triton values inside a kernel (tl.tensor, tensor descriptors and their types) and tl.constexpr.
TRITON_VALUE_ATTRIBUTES = frozenset("""
    T abs advance argmax argmin associative_scan atomic_add atomic_and atomic_cas atomic_load
    atomic_max atomic_min atomic_or atomic_poll atomic_store atomic_xchg atomic_xor broadcast_to cast
    cdiv ceil cos cumprod cumsum erf exp exp2 expand_dims flip floor gather histogram item log log2
    logical_and logical_or max min permute ravel reduce reduce_or reshape rsqrt sigmoid sin softmax
    sort split sqrt sqrt_rn store sum to trans view xor_sum
    dtype shape type numel value element_ty primitive_bitwidth fp_mantissa_width int_bitwidth
    int_signedness scalar address_space is_const get_block_shapes nbytes
    is_bf16 is_block is_bool is_dtype is_floating is_fp16 is_fp32 is_fp64 is_fp8 is_fp8e4b15
    is_fp8e4b8 is_fp8e4nv is_fp8e5 is_fp8e5b16 is_int is_int1 is_int16 is_int32 is_int64 is_int8
    is_int_signed is_int_unsigned is_ptr is_standard_floating is_uint16 is_uint32 is_uint64
    is_uint8 is_void kind get_int_max_value get_int_min_value with_element_ty
    load scatter block_shape block_type strides
""".split())  # the last line: tensor descriptors (tl.make_tensor_descriptor)


def value_attribute_allowed(name: str, tensor_methods: frozenset[str], own_names: frozenset[str]) -> bool:
    """Whether ``name`` may be read or written on a value whose kind the check cannot name.
    ``tensor_methods``: torch.Tensor's methods (policy); ``own_names``: what the module defines."""
    if name in FOREIGN_KIND_ATTRIBUTES:
        return False
    return (name in tensor_methods or name in TENSOR_PROPERTIES or name in NN_MODULE_ATTRIBUTES
            or name in PYTHON_VALUE_ATTRIBUTES or name in METADATA_ATTRIBUTES
            or name in TRITON_VALUE_ATTRIBUTES or name in own_names)
