"""The Triton names a candidate may use: the public kernel-writing API of ``triton``, the kernel
language (``tl.*``) and its math libraries, reached only along the namespaces that lead to them."""
from __future__ import annotations


# The public kernel-writing API of triton. ``set_allocator`` gives Triton the scratch memory that
# tensor descriptors (``tl.make_tensor_descriptor``) need on the GPU; Triton calls it at launch,
# inside the audited forward and the timed region.
TRITON_API = frozenset({
    "jit", "autotune", "heuristics", "Config", "cdiv", "next_power_of_2", "language", "set_allocator",
    "OutOfResources", "CompilationError",
})
# triton.language (tl.*) names: functions, dtypes and types of the kernel language (triton 3.x).
# ``advance`` (block pointers) is exported by the triton of the GPU image (3.6) and not by newer
# ones; listed, a kernel using it compiles where the name exists and fails to compile elsewhere.
TRITON_LANGUAGE_API = frozenset("""
    PropagateNan TRITON_MAX_TENSOR_NUMEL abs add advance aggregate_replace arange argmax argmin
    associative_scan assume atomic_add atomic_and atomic_cas atomic_load atomic_max atomic_min
    atomic_or atomic_poll atomic_store atomic_xchg atomic_xor bfloat16 bitonic_merge block_type
    broadcast broadcast_to cast cat cdiv ceil clamp condition const constexpr constexpr_type cos
    cumprod cumsum debug_barrier device_assert device_print div_rn dot dot_scaled dtype erf exp
    exp2 expand_dims expect_zero fdiv flip float16 float32 float64 float8e4b15 float8e4b8
    float8e4nv float8e5 float8e5b16 floor fma full gather histogram inline_asm_elementwise int1
    int16 int32 int64 int8 interleave join load load_tensor_descriptor log log2 make_block_ptr
    make_tensor_descriptor map_elementwise max max_constancy max_contiguous maximum min minimum
    mul multiple_of num_programs pair_uniform_to_normal permute philox philox_impl pi32_t
    pointer_type program_id rand rand4x randint randint4x randn randn4x range ravel reduce
    reduce_or reshape rsqrt sigmoid sin slice softmax sort split sqrt sqrt_rn squeeze
    static_assert static_print static_range store store_tensor_descriptor str_to_ty sub sum
    swizzle2d tensor tensor_descriptor tensor_descriptor_type to_tensor topk trans tuple
    tuple_type uint16 uint32 uint64 uint8 uint_to_uniform_float umulhi unsqueeze view void where
    xor_sum zeros zeros_like
""".split())
# Functions of tl.math, tl.extra.libdevice and tl.extra.cuda.libdevice (the namespaces also hold
# the modules and helpers they were built with, e.g. functools.wraps: those are not listed). One
# list for all of them: a kernel may alias ``libdevice = tl.math`` where the import fails. Not
# ``fast_tanhf``: the generic libdevice stub and the HIP module declare it, CUDA's does not, so
# Triton compiling for an NVIDIA GPU refuses it where the CPU interpreter computes it.
TRITON_MATH_API = frozenset("""
    abs acos acosh add_rd add_rn add_ru add_rz asin asinh atan atan2 atanh brev byte_perm cbrt
    ceil clz copysign cos cosh cospi cyl_bessel_i0 cyl_bessel_i1 div_rd div_rn div_ru div_rz
    double2float_rd double2float_rn double2float_ru double2float_rz double2hiint double2int_rd
    double2int_rn double2int_ru double2int_rz double2ll_rd double2ll_rn double2ll_ru double2ll_rz
    double2loint double2uint_rd double2uint_rn double2uint_ru double2uint_rz double2ull_rd
    double2ull_rn double2ull_ru double2ull_rz double_as_longlong erf erfc erfcinv erfcx erfinv exp
    exp10 exp2 expm1 fast_cosf fast_dividef fast_exp10f fast_expf fast_log10f fast_log2f fast_logf
    fast_powf fast_sinf fast_tanf fdim fdiv ffs finitef float2int_rd float2int_rn
    float2int_ru float2int_rz float2ll_rd float2ll_rn float2ll_ru float2ll_rz float2uint_rd
    float2uint_rn float2uint_ru float2uint_rz float2ull_rd float2ull_rn float2ull_ru float2ull_rz
    float_as_int float_as_uint floor fma fma_rd fma_rn fma_ru fma_rz fmod hadd hiloint2double
    hypot ilogb int2double_rn int2float_rd int2float_rn int2float_ru int2float_rz int_as_float
    isfinited isinf isnan j0 j1 jn ldexp lgamma ll2double_rd ll2double_rn ll2double_ru
    ll2double_rz ll2float_rd ll2float_rn ll2float_ru ll2float_rz llrint llround log log10 log1p
    log2 logb longlong_as_double mul24 mul_rd mul_rn mul_ru mul_rz mulhi nearbyint nextafter
    norm3d norm4d normcdf normcdfinv popc pow rcbrt rcp64h rcp_rd rcp_rn rcp_ru rcp_rz remainder
    rhadd rhypot rint rnorm3d rnorm4d round rsqrt rsqrt_rn sad saturatef scalbn signbit sin sinh
    sinpi sqrt sqrt_rd sqrt_rn sqrt_ru sqrt_rz sub_rd sub_rn sub_ru sub_rz tan tanh tgamma trunc
    uint2double_rn uint2float_rd uint2float_rn uint2float_ru uint2float_rz uint_as_float
    ull2double_rd ull2double_rn ull2double_ru ull2double_rz ull2float_rd ull2float_rn ull2float_ru
    ull2float_rz umulhi y0 y1 yn
""".split())
# tl.math's own functions that CUDA's libdevice module does not define.
TL_MATH_ONLY = frozenset({"fdiv", "umulhi"})
# The functions of triton.language.extra.cuda.libdevice (triton 3.6 and 3.9 define the same ones),
# which is what ``tl.extra.libdevice`` resolves to when Triton compiles for an NVIDIA GPU.
CUDA_LIBDEVICE_API = TRITON_MATH_API - TL_MATH_ONLY
TRITON_MATH_NAMESPACES = frozenset({
    "triton.language.math", "triton.language.extra.libdevice",
    "triton.language.extra.cuda.libdevice", "triton.language.extra.hip.libdevice",
})
# Namespaces that only lead to one of the above.
TRITON_PATH_NAMESPACES = {
    "triton.language": frozenset({"math", "extra"}),
    "triton.language.extra": frozenset({"libdevice", "cuda", "hip"}),
    "triton.language.extra.cuda": frozenset({"libdevice"}),
    "triton.language.extra.hip": frozenset({"libdevice"}),
}


def triton_name_allowed(parts: list[str]) -> bool:
    """Whether the dotted name ``parts`` (rooted at ``triton``) is on the allow-list."""
    if len(parts) == 1:
        return True
    if parts[1] not in TRITON_API:
        return False
    if parts[1] != "language":
        return len(parts) == 2
    namespace = "triton.language"
    for depth in range(2, len(parts)):
        name = parts[depth]
        last = depth == len(parts) - 1
        if name in TRITON_PATH_NAMESPACES.get(namespace, ()):
            namespace = f"{namespace}.{name}"
            continue
        if namespace == "triton.language":
            return last and name in TRITON_LANGUAGE_API
        if namespace in TRITON_MATH_NAMESPACES:
            return last and name in TRITON_MATH_API
        return False
    return True
