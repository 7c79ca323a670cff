"""What a candidate's forward may do with PyTorch: allocate, inspect, reshape, copy. Nothing else.

One policy, read by the static check (names in source) and the runtime audit (ATen operators that
actually ran during forward), so a kernel that passes one cannot fail the other for a different
reading of the rules. The math must happen in Triton kernels; library GEMM/convolution calls are
rejected unless the config sets ``verifier.allow_library_gemm`` and are then reported.
"""
from __future__ import annotations

import functools
import importlib
import types

from . import value_api
from .triton_api import triton_name_allowed

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
    "storage_offset", "get_device", "nelement",
    # views and layout
    "view", "view_as", "reshape", "reshape_as", "flatten", "unflatten", "unsqueeze", "squeeze",
    "permute", "transpose", "t", "expand", "expand_as", "as_strided", "narrow", "select",
    "unbind", "split", "chunk", "detach", "movedim",
    # copies and fills
    "contiguous", "clone", "copy_", "to", "cuda", "float", "half", "bfloat16", "type_as",
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
    "promote_types",  # torch.promote_types: dtypes in, a dtype out
    # What .tolist() and printing dispatch under torch.inference_mode(): they return their input
    # unless it carries a conjugate or negative bit, which only a refused op (conj, a private
    # _neg_view) sets.
    "resolve_conj", "resolve_neg",
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

# --- The kernel-module allow-list (static check): what a candidate may import, name and call ---
#
# Anything not listed here is refused, so a name this list forgets is a false reject (fix: add it
# here, with a test), never a way out of the sandbox. docs/verifier-static.md explains each entry.

# Modules a candidate may import (exactly these; ``from M import name`` is judged by
# :func:`api_name_allowed` on "M.name").
ALLOWED_IMPORTS = frozenset({
    "torch", "torch.nn", "torch.nn.functional", "torch.nn.init", "torch.autograd",
    "triton", "triton.language", "triton.language.math", "triton.language.extra",
    "triton.language.extra.libdevice", "triton.language.extra.cuda",
    "triton.language.extra.cuda.libdevice", "triton.language.extra.hip",
    "triton.language.extra.hip.libdevice",
    "math", "itertools", "typing", "functools", "dataclasses", "__future__",
})

# Builtins a candidate may name. Every other builtin is refused wherever it appears.
ALLOWED_BUILTINS = frozenset({
    "abs", "all", "any", "bool", "callable", "chr", "classmethod", "complex", "dict", "divmod",
    "enumerate", "filter", "float", "frozenset", "hasattr", "int", "isinstance", "issubclass",
    "iter", "len", "list", "map", "max", "min", "next", "object", "ord", "pow", "print",
    "property", "range", "repr", "reversed", "round", "set", "slice", "sorted", "staticmethod",
    "str", "sum", "super", "tuple", "zip", "NotImplemented", "Ellipsis",
    "ArithmeticError", "AssertionError", "AttributeError", "Exception", "ImportError",
    "IndexError", "KeyError", "ModuleNotFoundError", "NotImplementedError", "OverflowError",
    "RuntimeError", "StopIteration", "TypeError", "ValueError", "ZeroDivisionError",
})
# Builtins that reach modules, frames, files or code: refused in every position (called, passed,
# aliased, stored, and as a name the candidate binds itself). ``input`` is also a common parameter
# name, so binding it is allowed; the builtin it shadows is still refused where it is not bound.
NEVER_BUILTINS = frozenset({
    "getattr", "setattr", "delattr", "eval", "exec", "compile", "open", "globals", "locals",
    "vars", "__import__", "breakpoint", "input", "type", "dir", "help", "memoryview", "id",
    "exit", "quit", "copyright", "credits", "license", "__builtins__", "__build_class__",
})
BINDABLE_NEVER_BUILTINS = frozenset({"input", "type", "id", "dir"})

# Dunder names a module definition needs: defining and calling ``__init__``.
ALLOWED_DUNDERS = frozenset({"__init__"})

# Attribute names that reach frames, code objects or the class graph without a leading underscore.
FRAME_AND_CLASS_ATTRIBUTES = frozenset({
    "f_back", "f_globals", "f_locals", "f_code", "f_builtins", "f_trace", "gi_frame", "gi_code",
    "cr_frame", "cr_code", "ag_frame", "ag_code", "tb_frame", "tb_next", "co_code", "co_consts",
    "co_names", "mro", "func_globals", "with_traceback",
})

# torch.<name> submodules. Only nn, cuda, backends and autograd may be entered, each only as far
# as TORCH_NAMESPACE_API says; the others reach the standard library or compute.
TORCH_SUBMODULES = frozenset("""
    accelerator amp ao autograd backends builtins classes compiler cpp cpu ctypes cuda distributed
    distributions export fft func functional functools futures fx glob hub importlib inspect jit
    library linalg masked math monitor mps mtia multiprocessing nested nn ops optim os overrides
    package platform profiler quantization quasirandom random return_types serialization signal
    sparse special storage sys testing textwrap threading torch torch_version types utils version
    warnings windows xpu
""".split())
# torch.<name> functions and objects that are no kernel-writing API: they compile or load code,
# read or replace the random state the inputs came from, or change process-wide defaults.
TORCH_REFUSED_NAMES = frozenset({
    "compile", "load", "save", "from_file", "initial_seed", "seed", "get_rng_state",
    "set_rng_state", "default_generator", "set_default_device", "set_default_dtype",
    "set_default_tensor_type", "use_deterministic_algorithms", "set_num_threads",
    "set_num_interop_threads", "set_flush_denormal", "set_warn_always", "set_printoptions",
    "set_grad_enabled", "cond", "vmap", "while_loop",
})
# torch.<name> objects that are neither operators nor dtypes but belong to the kernel-writing API.
TORCH_TOP_LEVEL_API = frozenset({
    "Tensor", "Size", "device", "dtype", "finfo", "iinfo", "no_grad", "enable_grad", "inference_mode",
    "is_tensor", "is_floating_point", "is_complex", "get_default_dtype", "is_grad_enabled",
    "manual_seed", "Generator", "broadcast_shapes", "inf", "nan", "pi", "e", "newaxis",
})
# Entered torch namespaces: which members a candidate may name. "*" admits every public name that
# is not a submodule; "Capitalized" admits classes only.
TORCH_NAMESPACE_API: dict[str, frozenset[str]] = {
    "torch.nn": frozenset({"functional", "init", "parameter", "Capitalized"}),
    "torch.nn.functional": frozenset({"*"}),
    "torch.nn.init": frozenset({"*"}),
    "torch.nn.parameter": frozenset({"Parameter", "Buffer"}),
    "torch.autograd": frozenset({"Function"}),
    "torch.backends": frozenset({"cuda", "cudnn"}),
    "torch.backends.cuda": frozenset({"matmul"}),
    "torch.backends.cuda.matmul": frozenset({
        "allow_tf32", "allow_fp16_reduced_precision_reduction",
        "allow_bf16_reduced_precision_reduction",
    }),
    "torch.backends.cudnn": frozenset({"allow_tf32", "benchmark", "deterministic", "enabled"}),
}
# torch.backends settings a module may assign at import (precision switches, not patches).
ASSIGNABLE_TORCH_SETTINGS = frozenset({
    "torch.backends.cuda.matmul.allow_tf32", "torch.backends.cudnn.allow_tf32",
    "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction",
    "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction",
    "torch.backends.cudnn.benchmark", "torch.backends.cudnn.deterministic",
})

# The standard-library modules' allowed members ("*": every public name; "Capitalized": classes).
STDLIB_API: dict[str, frozenset[str]] = {
    "math": frozenset({"*"}),
    "itertools": frozenset({"product", "chain", "accumulate", "combinations", "permutations",
                            "repeat", "count", "islice", "starmap", "zip_longest"}),
    "typing": frozenset({"Capitalized", "cast", "overload"}),
    "functools": frozenset({"lru_cache", "cache", "partial", "reduce", "cached_property"}),
    "dataclasses": frozenset({"dataclass", "field"}),
    "__future__": frozenset({"annotations"}),
}

# Decorators a candidate may use (qualified names; bare builtins by name).
ALLOWED_DECORATORS = frozenset({
    "triton.jit", "triton.autotune", "triton.heuristics", "staticmethod", "classmethod",
    "property", "torch.no_grad", "torch.inference_mode", "functools.lru_cache", "functools.cache",
    "functools.cached_property", "dataclasses.dataclass",
})
# Context managers a candidate may enter with ``with``.
ALLOWED_CONTEXT_MANAGERS = frozenset({
    "torch.no_grad", "torch.inference_mode", "torch.enable_grad", "torch.cuda.device",
    "torch.device",
})
# Base classes a candidate's classes may derive from, besides its own classes and the torch.nn
# classes that are nn.Module subclasses (``nn_module_class``). Never a tensor type (torch.Tensor,
# nn.Parameter, nn.Buffer, ...: ``tensor_type``): the verifier reads outputs and parameters after
# forward returns, and a method a tensor subclass overrides would run there, outside every audit.
ALLOWED_BASE_CLASSES = frozenset({"object", "torch.nn.Module", "torch.autograd.Function",
                                  "typing.NamedTuple"})

# Methods of nn.Module that the harness calls (moving, loading, iterating the model): a candidate
# class may not redefine them (by a def or a class-body binding), and no object may get an
# attribute of such a name, or its code runs outside forward and __init__.
NN_MODULE_RESERVED_METHODS = frozenset("""
    add_module apply bfloat16 buffers children compile cpu cuda double eval float get_buffer
    get_extra_state get_parameter get_submodule half ipu load_state_dict modules mtia
    named_buffers named_children named_modules named_parameters parameters register_backward_hook
    register_buffer register_forward_hook register_forward_pre_hook register_full_backward_hook
    register_full_backward_pre_hook register_load_state_dict_post_hook
    register_load_state_dict_pre_hook register_module register_parameter
    register_state_dict_post_hook register_state_dict_pre_hook requires_grad_ set_extra_state
    set_submodule share_memory state_dict to to_empty train type xpu zero_grad
    _apply _call_impl _get_backward_hooks _get_backward_pre_hooks _get_name _load_from_state_dict
    _maybe_warn_non_full_backward_hook _named_members _register_load_state_dict_pre_hook
    _register_state_dict_hook _replicate_for_data_parallel _save_to_state_dict _slow_forward
    _wrapped_call_impl _compiled_call_impl
""".split())

# nn.Module's own state (``vars(nn.Module())``): the parameter, buffer and submodule tables the
# verifier walks and the hook tables. A candidate may neither replace nor read them: they are never
# "its own" private names, whatever it assigns.
NN_MODULE_STATE = frozenset("""
    _backward_hooks _backward_pre_hooks _buffers _forward_hooks _forward_hooks_always_called
    _forward_hooks_with_kwargs _forward_pre_hooks _forward_pre_hooks_with_kwargs
    _is_full_backward_hook _load_state_dict_post_hooks _load_state_dict_pre_hooks _modules
    _non_persistent_buffers_set _parameters _state_dict_hooks _state_dict_pre_hooks _version
""".split())

# Tensor methods that hand tensor data to Python (computing on it there is invisible to every
# operator-level audit): refused in forward.
HOST_EXTRACTION_METHODS = frozenset({"tolist", "item", "numpy", "cpu"})


# Private helpers that parameter-init code mirroring nn.Linear/nn.Conv uses; they only compute
# fan-in/fan-out from a shape.
ALLOWED_PRIVATE_API = frozenset({
    "torch.nn.init._calculate_fan_in_and_fan_out", "torch.nn.init._calculate_correct_fan",
})


# Roots a module-ness lookup may import (they are the allowed imports' roots).
_IMPORTABLE_ROOTS = frozenset({"torch", "triton", "math", "itertools", "typing", "functools",
                               "dataclasses"})


def import_allowed(module: str) -> bool:
    """Whether ``import module`` (or ``from module import ...``) is on the allow-list."""
    return module in ALLOWED_IMPORTS


def api_name_allowed(qualified: str) -> bool:
    """Whether a candidate may name ``qualified`` (e.g. "triton.language.extra.libdevice.erf",
    "torch.nn.functional.relu"); its root must be an allowed import. Private and dunder parts are
    judged by the caller."""
    if qualified in ALLOWED_PRIVATE_API:
        return True
    parts = qualified.split(".")
    root = parts[0]
    if root == "torch":
        return _torch_name_allowed(parts)
    if root == "triton":
        return triton_name_allowed(parts)
    if root in STDLIB_API:
        return len(parts) == 1 or (len(parts) == 2 and _member_allowed(STDLIB_API[root], parts[1], root))
    return False


def _member_allowed(api: frozenset[str], name: str, namespace: str = "") -> bool:
    if name.startswith("_"):
        return False
    if name in api:
        return True
    if "*" in api or ("Capitalized" in api and name[:1].isupper()):
        # A wildcard admits the namespace's functions and classes, never a module it imported
        # (torch.nn.init.warnings.sys is the sys module; a module is a way to everything).
        return not (namespace and names_module(f"{namespace}.{name}"))
    return False


_UNRESOLVED = object()


def _resolve(qualified: str):
    """The object ``qualified`` (rooted at an allowed import) names at run time, or ``_UNRESOLVED``.
    Looked up on the modules the verifier itself imports; nothing is imported that is not already
    an allowed import."""
    parts = qualified.split(".")
    if parts[0] not in _IMPORTABLE_ROOTS:
        return _UNRESOLVED
    try:
        obj = importlib.import_module(parts[0])
        for part in parts[1:]:
            obj = getattr(obj, part)
    except Exception:  # noqa: BLE001 - an unknown name is simply not a module or class
        return _UNRESOLVED
    return obj


@functools.lru_cache(maxsize=4096)
def names_module(qualified: str) -> bool:
    """Whether ``qualified`` (rooted at an allowed import) is a module object at run time."""
    return isinstance(_resolve(qualified), types.ModuleType)


def _installed_class(qualified: str):
    """The class ``qualified`` (rooted at an allowed import) names at run time, or None."""
    obj = _resolve(qualified)
    return obj if isinstance(obj, type) else None


@functools.lru_cache(maxsize=1024)
def nn_module_class(qualified: str) -> bool:
    """Whether ``qualified`` is ``torch.nn.<Name>`` naming an nn.Module subclass (``nn.Linear``,
    ``nn.ModuleList``); looked up on the installed torch. ``nn.Parameter``, ``nn.Buffer`` and the
    other non-module classes of ``torch.nn`` are not."""
    parts = qualified.split(".")
    if len(parts) != 3 or parts[:2] != ["torch", "nn"] or not parts[2][:1].isupper():
        return False
    cls = _installed_class(qualified)
    try:
        import torch.nn
    except ImportError:  # no torch to ask: only nn.Module itself
        return qualified == "torch.nn.Module"
    return cls is not None and issubclass(cls, torch.nn.Module)


@functools.lru_cache(maxsize=1024)
def tensor_type(qualified: str) -> bool:
    """Whether ``qualified`` names ``torch.Tensor`` or a subclass of it (``nn.Parameter``,
    ``nn.Buffer``, ``nn.UninitializedParameter``, ...); looked up on the installed torch."""
    cls = _installed_class(qualified)
    try:
        import torch
    except ImportError:
        return qualified in ("torch.Tensor", "torch.nn.Parameter")
    return cls is not None and issubclass(cls, torch.Tensor)


@functools.lru_cache(maxsize=4096)
def shadows_tensor_method(name: str) -> bool:
    """Whether an instance attribute ``name`` would hide a method of a tensor (``detach``, ``cpu``,
    ``numel``, ``copy_``): methods are looked up on the instance first, properties (``shape``,
    ``dtype``) are not."""
    if name.startswith("__"):
        return False
    try:
        import torch
    except ImportError:
        return name in TENSOR_METHOD_NAMES
    for cls in torch.Tensor.__mro__[:-1]:  # not object's
        if name in vars(cls):
            return not hasattr(type(vars(cls)[name]), "__set__")
    return False


# torch.Tensor.<name>: its methods and properties, never what hands out another kind of value
# (a storage, a NumPy array, the autograd graph: value_api.FOREIGN_KIND_ATTRIBUTES).
TENSOR_API = (ALLOWED_TENSOR_METHODS | TENSOR_COMPUTE_METHODS | TENSOR_LAYOUT_METHODS
              | value_api.TENSOR_PROPERTIES) - value_api.FOREIGN_KIND_ATTRIBUTES
TENSOR_METHOD_NAMES = ALLOWED_TENSOR_METHODS | TENSOR_COMPUTE_METHODS | TENSOR_LAYOUT_METHODS


@functools.lru_cache(maxsize=4096)
def torch_top_level_is_api(name: str) -> bool:
    """Whether ``torch.<name>`` is an operator (a function of torch's operator namespace or of
    ``torch.functional``), a dtype, layout or memory format (``torch.channels_last``), a number
    constant or listed in ``TORCH_TOP_LEVEL_API``."""
    if name.startswith("_") or name in TORCH_REFUSED_NAMES or names_module(f"torch.{name}"):
        return False
    if name in TORCH_TOP_LEVEL_API:
        return True
    try:
        import torch
        import torch.functional
    except ImportError:  # no torch to ask: only the listed names
        return False
    value = getattr(torch, name, None)
    if isinstance(value, (torch.dtype, torch.layout, torch.memory_format)) or type(value) in (int, float, bool):
        return True
    return name in dir(torch._C._VariableFunctions) or name in getattr(torch.functional, "__all__", ())


def _torch_name_allowed(parts: list[str]) -> bool:
    if len(parts) == 1:
        return True
    head = parts[1]
    if head.startswith("_"):
        return False
    if head == "Tensor":
        return len(parts) == 2 or (len(parts) == 3 and parts[2] in TENSOR_API)
    if head == "cuda":
        return len(parts) == 2 or (len(parts) == 3 and parts[2] in ALLOWED_TORCH_CUDA_FUNCTIONS)
    if head in TORCH_SUBMODULES and f"torch.{head}" not in TORCH_NAMESPACE_API:
        return False
    if head in TORCH_REFUSED_NAMES:
        return False
    if head not in TORCH_SUBMODULES:
        # an operator, dtype or listed class; never an attribute of one, nor a submodule a later
        # torch added, nor a helper that hands out a module, a file or a thread (get_device_module,
        # PyTorchFileWriter, fork): those are not operators and not listed
        return len(parts) == 2 and torch_top_level_is_api(head)
    namespace = f"torch.{head}"
    for depth in range(2, len(parts)):
        api = TORCH_NAMESPACE_API.get(namespace)
        if api is None or not _member_allowed(api, parts[depth], namespace):
            return False
        if parts[depth][:1].isupper() and depth < len(parts) - 1:
            return False  # nn.Linear.forward, nn.Module.__call__: not through a class
        namespace = f"{namespace}.{parts[depth]}"
    return True
