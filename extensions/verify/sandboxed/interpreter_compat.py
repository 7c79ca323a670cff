"""What the Triton interpreter (``TRITON_INTERPRET=1``, the CPU verdict) lacks, added in the worker only.

* ``@triton.autotune`` with several configs benchmarks them through the GPU driver, which the
  interpreter does not have; and a GPU may pick any of them, so the answer must not depend on the
  config. ``AutotuneRotation`` runs one config per input set, in turn from a secret offset: input
  set ``i`` uses config ``(offset + i) mod n`` of every autotuned kernel (of the configs its
  ``prune_configs_by`` keeps), so a verdict over ``n`` or more sets has run every config on some
  set, and a kernel right for its first config only is wrong on another set. Nothing is
  benchmarked and each set runs once, so CPU verification costs what it did. The rotation holds on
  CUDA too (``rotate_autotune_on_cuda``): there the autotuner would benchmark and keep one config
  for every set, and a kernel right for the config this GPU happens to find fastest passed. For
  the timing only, which must see the config a user's GPU would pick, the rotation ends and the
  configs are benchmarked with CUDA events and no L2-flush fills, so that the audited forward's
  GPU time is the kernels' own.
* ``triton.language.extra.libdevice`` functions are declarations without bodies (they compile to
  CUDA's libdevice on a GPU) and return None in the interpreter: here the common ones compute with
  NumPy/``math`` on the interpreter's arrays, at the argument's precision.
* The interpreter runs a grid's programs one after another, in order, so a kernel whose answer
  depends on program order (one program reading what another wrote without synchronisation) is
  right by accident. ``ProgramOrder`` can run them in a shuffled order instead: a correct kernel
  gives the same answer in any order. A kernel that waits on an earlier program (a spin-wait
  look-back) cannot finish in the interpreter when the order is shuffled.
* A fresh CPU allocation often reads as zeros (new pages from the OS), so a kernel that leaves
  part of a ``torch.empty`` output unwritten can look right; on a GPU the caching allocator hands
  back old data. ``fill_fresh_memory_with_nan`` makes every ``torch.empty``/``empty_like``/
  ``new_empty`` NaN (integers: their maximum), so an unwritten element never matches. Always NaN
  was a constant a kernel could read (one element of a fresh ``torch.empty(1)``: exact only where
  it is NaN), so ``FreshMemory`` refills fresh memory during the sets past the base with a value
  drawn per set: zero in one, a drawn finite value in another, NaN or a drawn value in the rest.
* Even shuffled, programs never overlap, so a read-modify-write of another program's output with
  a plain load and store (a lost update on a GPU, where programs run at the same time) still adds
  up. While ``shuffled`` is set, a plain load of an address that another program of the same
  launch stored reads the value from before that store: the schedule where every program reads
  before the others write, which a GPU may run. Atomics, and every load of a program after its
  first atomic (acquire: the semaphore pattern of split reductions), see memory as it is; a
  volatile load alone orders nothing (a spin-wait on another program cannot finish under a
  shuffled order anyway).

* The interpreter lets a kernel read any module-level Python value; Triton compiling for a GPU
  refuses every global that is not a ``tl.constexpr(...)``, a module, another ``@triton.jit``
  function or a Triton builtin or dtype (``Cannot access global variable``), so such a kernel is
  right on CPU and does not compile on a GPU. ``refuse_non_constexpr_globals`` applies the
  compiler's rule to each kernel (and each ``@triton.jit`` helper) the first time it runs.
* The interpreter types some combined masks (a block mask ``&`` a scalar condition) as int32
  holding 0 and 1, and its load and store refuse any mask that is not bool; compiled, the same
  expression is a boolean. ``read_zero_one_masks_as_bool`` reads such a mask as the boolean it is.
* Triton 3.6 reads a scalar argument as a Python int in a way NumPy 2.4 refuses;
  ``index_with_one_element_arrays`` reads it as later releases do.
* NumPy has no bfloat16: the interpreter keeps bf16 values as their 16 bits in ``uint16`` arrays,
  converts into bf16 by truncating (fp32) or by a numeric cast to ``uint16`` (fp64, integers), and
  computes on the bits themselves (``a + b`` of two bf16 blocks adds their bit patterns; so do
  ``tl.dot`` and ``tl.sum``). A GPU rounds to nearest even and computes on the values, so every
  correct kernel that stores fp32 results into a bf16 output was off by a truncation and every one
  that computes in bf16 was rejected on CPU. ``compute_bfloat16_as_values`` converts as a GPU does
  and computes each floating-point operation on bf16 operands in fp32, rounding the result back to
  bf16 (a GPU's bf16 arithmetic rounds each operation's exact result once; fp32 then bf16 rounds
  twice, which differs only where the fp32 result falls exactly on a bf16 tie).
* ``tl.dot`` on fp32 operands defaults to TF32 (``input_precision="tf32"``): a GPU rounds each
  operand to 10 mantissa bits, the interpreter multiplies them in full fp32, so a GEMM that the
  fp32 tolerance rejects on CUDA passed on CPU. ``round_dot_operands_to_tf32`` rounds them as a
  GPU does (to nearest; an H100 truncates, which is further off); ``"ieee"`` and ``"tf32x3"``
  stay full fp32.

Nothing here is imported by the parent; ``install`` (CPU) or ``rotate_autotune_on_cuda`` (CUDA) is
called by the worker before the candidate is imported.
"""
from __future__ import annotations

import math
import secrets
import weakref
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np


@dataclass
class InterpreterRun:
    """What the worker switches per input set: the program order, the autotune config and what
    fresh memory holds."""

    order: "ProgramOrder"
    autotune: "AutotuneRotation"
    fresh: "FreshMemory"

    def start_set(self, index: int, shuffled: bool) -> None:
        self.order.shuffled = shuffled
        self.autotune.start_set(index)
        self.fresh.start_set(index)


def install() -> InterpreterRun:
    autotune = AutotuneRotation()
    autotune.install()
    make_libdevice_compute()
    refuse_non_constexpr_globals()
    fill_fresh_memory_with_nan()
    read_zero_one_masks_as_bool()
    index_with_one_element_arrays()
    round_dot_operands_to_tf32()
    compute_bfloat16_as_values()  # after the TF32 rounding: its dot then sees fp32 operands
    order = ProgramOrder()
    order.install()
    return InterpreterRun(order, autotune, FreshMemory())


# -- autotune ------------------------------------------------------------------------------------

class AutotuneRotation:
    """Every autotuned kernel runs config ``(offset + set index) mod n`` of its (pruned) configs
    during an input set: one config per set, all of them over ``n`` sets. The offset is drawn
    before the candidate is imported, so which set meets which config is not known to it.
    ``finish`` ends the rotation: from then on the autotuner benchmarks and keeps its fastest."""

    def __init__(self, offset: Optional[int] = None):
        self.offset = secrets.randbelow(1 << 30) if offset is None else int(offset)
        self.turn = 0
        self.rotating = True
        self._tuners: "weakref.WeakSet" = weakref.WeakSet()

    def start_set(self, index: int) -> None:
        """Input set ``index`` begins: every tuner forgets the config it chose for the last one."""
        self.turn = int(index)
        self._forget_choices()

    def finish(self) -> None:
        """The sets are over: tuners forget their set's config and choose by benchmark again."""
        self.rotating = False
        self._forget_choices()

    def _forget_choices(self) -> None:
        for tuner in list(self._tuners):
            tuner.cache.clear()

    def pick(self, configs: list) -> list:
        if not self.rotating or not configs:
            return configs
        return [configs[(self.offset + self.turn) % len(configs)]]

    def install(self) -> None:
        """CPU: the autotuner is left one config, which it runs without benchmarking."""
        from triton.runtime.autotuner import Autotuner

        # ``do_bench`` is a cached property that asks the (absent) driver for a benchmarker; with
        # one config left after pruning nothing is benchmarked, this only keeps the driver out.
        Autotuner.do_bench = property(lambda self: _equal_timings)
        prune = Autotuner.prune_configs
        rotation = self

        def prune_configs(tuner, kwargs):
            # The autotuner keeps the only config left after pruning without benchmarking it.
            return rotation.pick(prune(tuner, kwargs))

        Autotuner.prune_configs = prune_configs
        self._track_tuners(Autotuner)

    def install_on_cuda(self) -> None:
        """CUDA: while the rotation lasts, the autotuner's benchmark runs the set's config alone
        and reads it as the fastest, so it is the one launched; where this GPU cannot run it (out
        of shared memory, a failed compile) the next config that runs takes its place, as a user's
        autotuner would skip it. The other configs are not run: a benchmark run of one config
        writes the output, and would hide what another config leaves unwritten. Afterwards
        (``finish``) the configs are timed with CUDA events, for the timing."""
        from triton.runtime.autotuner import Autotuner

        prune = Autotuner.prune_configs
        rotation = self
        bench = {"position": 0, "target": 0, "found": False}

        def prune_configs(tuner, kwargs):
            configs = prune(tuner, kwargs)
            bench.update(position=0, target=(rotation.offset + rotation.turn) % max(1, len(configs)), found=False)
            return configs

        def timings(kernel_call, quantiles=None, **kwargs):
            if not rotation.rotating:
                return _event_timings(kernel_call, quantiles, **kwargs)
            position = bench["position"]
            bench["position"] += 1
            value = 2.0  # not run: chosen only where neither the set's config nor a later one ran
            if position >= bench["target"] and not bench["found"]:
                kernel_call()  # raises for a config this GPU cannot run: the autotuner drops it
                bench["found"] = True
                value = 0.0
            return [value, value, value] if quantiles else value

        def benchmark_without_disk_cache(tuner, tuning_key, configs, bench_fn):
            bench_fn()  # a config chosen on an earlier run (a cache file) would skip the rotation
            return False

        Autotuner.do_bench = property(lambda self: timings)
        Autotuner.prune_configs = prune_configs
        Autotuner.check_disk_cache = benchmark_without_disk_cache
        self._track_tuners(Autotuner)

    def _track_tuners(self, autotuner_class) -> None:
        run, rotation = autotuner_class.run, self

        def run_in_turn(tuner, *args, **kwargs):
            rotation._tuners.add(tuner)
            return run(tuner, *args, **kwargs)

        autotuner_class.run = run_in_turn


def _equal_timings(kernel_call, quantiles=None, **_kwargs):
    return [0.0, 0.0, 0.0] if quantiles else 0.0


def _event_timings(kernel_call, quantiles=None, **_kwargs):
    """Median of a few CUDA-event timed calls. Triton's own benchmarker zeroes a 256 MB buffer
    before every call to flush L2; in an audited forward those fills would outweigh the kernel and
    read as copies doing the work, so the configs are compared without the flush."""
    import torch

    kernel_call()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        kernel_call()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    middle = sorted(times)[len(times) // 2]
    return [middle, middle, middle] if quantiles else middle


def rotate_autotune_on_cuda() -> AutotuneRotation:
    """On CUDA (worker only): one config per input set, as on CPU, among those this GPU runs."""
    rotation = AutotuneRotation()
    rotation.install_on_cuda()
    return rotation


# -- libdevice -----------------------------------------------------------------------------------

def _round_half_away(x):
    return np.sign(x) * np.floor(np.abs(x) + 0.5)


def _ieee_remainder(x, y):
    return x - np.round(x / y) * y


def _vectorised(fn: Callable) -> Callable:
    ufunc = np.frompyfunc(fn, 1, 1)
    return lambda x: ufunc(x).astype(x.dtype) if isinstance(x, np.ndarray) else fn(x)


_FLOAT_FUNCTIONS: dict[str, Callable] = {
    "abs": np.abs, "floor": np.floor, "ceil": np.ceil, "trunc": np.trunc, "rint": np.rint,
    "nearbyint": np.rint, "round": _round_half_away, "sqrt": np.sqrt, "sqrt_rn": np.sqrt,
    "rsqrt": lambda x: 1 / np.sqrt(x), "rsqrt_rn": lambda x: 1 / np.sqrt(x), "rcp_rn": lambda x: 1 / x,
    "cbrt": np.cbrt, "rcbrt": lambda x: 1 / np.cbrt(x), "exp": np.exp, "exp2": np.exp2,
    "exp10": lambda x: np.power(np.asarray(10, x.dtype), x), "expm1": np.expm1, "log": np.log,
    "log2": np.log2, "log10": np.log10, "log1p": np.log1p, "sin": np.sin, "cos": np.cos, "tan": np.tan,
    "sinpi": lambda x: np.sin(np.pi * x), "cospi": lambda x: np.cos(np.pi * x), "asin": np.arcsin,
    "acos": np.arccos, "atan": np.arctan, "sinh": np.sinh, "cosh": np.cosh, "tanh": np.tanh,
    "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh, "saturatef": lambda x: np.clip(x, 0, 1),
    "fast_expf": np.exp, "fast_logf": np.log, "fast_log2f": np.log2, "fast_log10f": np.log10,
    "fast_sinf": np.sin, "fast_cosf": np.cos, "fast_tanf": np.tan, "fast_tanhf": np.tanh,
    "fast_exp10f": lambda x: np.power(np.asarray(10, x.dtype), x),
    "erf": _vectorised(math.erf), "erfc": _vectorised(math.erfc), "lgamma": _vectorised(math.lgamma),
    "tgamma": _vectorised(math.gamma),
    "normcdf": lambda x: 0.5 * _vectorised(math.erfc)(-x / np.sqrt(np.asarray(2, x.dtype))),
    # binary
    "pow": np.power, "fast_powf": np.power, "atan2": np.arctan2, "hypot": np.hypot,
    "copysign": np.copysign, "fmod": np.fmod, "remainder": _ieee_remainder, "nextafter": np.nextafter,
    "fdim": lambda x, y: np.maximum(x - y, 0), "div_rn": np.divide, "fast_dividef": np.divide,
    "add_rn": np.add, "sub_rn": np.subtract, "mul_rn": np.multiply,
    "rhypot": lambda x, y: 1 / np.hypot(x, y),
    # ternary
    "fma": lambda x, y, z: x * y + z, "fma_rn": lambda x, y, z: x * y + z,
}
_PREDICATES: dict[str, Callable] = {
    "isnan": np.isnan, "isinf": np.isinf, "signbit": np.signbit, "finitef": np.isfinite,
    "isfinited": np.isfinite,
}


def _libdevice_function(name: str, np_fn: Callable, predicate: bool) -> Callable:
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    def compute(*args, _semantic=None, **_kwargs):
        tensors = [a for a in args if isinstance(a, tl.tensor)]
        if not tensors:
            raise TypeError(f"libdevice.{name} needs a tensor argument in the interpreter")
        element = tensors[0].dtype
        np_dtype = tensors[0].handle.data.dtype
        values = [a.handle.data if isinstance(a, tl.tensor) else np.asarray(getattr(a, "value", a), np_dtype)
                  for a in args]
        with np.errstate(all="ignore"):
            data = np.asarray(np_fn(*values))
        if predicate:
            data, element = data.astype(np.int32), tl.int32
        else:
            data = data.astype(np_dtype)
        block = tensors[0].type
        shape = list(data.shape)
        kind = tl.block_type(element, shape) if shape and isinstance(block, tl.block_type) else element
        return tl.core.tensor(TensorHandle(data, element), kind)

    compute.__name__ = name
    return compute


def make_libdevice_compute() -> None:
    import importlib

    for module_name in ("triton.language.extra.libdevice", "triton.language.extra.cuda.libdevice"):
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        for name, fn in _FLOAT_FUNCTIONS.items():
            if hasattr(module, name):
                setattr(module, name, _libdevice_function(name, fn, predicate=False))
        for name, fn in _PREDICATES.items():
            if hasattr(module, name):
                setattr(module, name, _libdevice_function(name, fn, predicate=True))


# -- module-level values read by kernels ---------------------------------------------------------

def _global_reads(fn) -> set[str]:
    """Module-level names (or builtins) ``fn``'s body reads, from its bytecode's global loads, its
    nested code included: what the compiler's global lookup would be asked for. Argument defaults
    are not in the body (the compiler allows globals there)."""
    import dis
    import types

    names: set[str] = set()
    pending = [fn.__code__]
    while pending:
        code = pending.pop()
        names |= {ins.argval for ins in dis.get_instructions(code) if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME")}
        pending += [const for const in code.co_consts if isinstance(const, types.CodeType)]
    return names


def _compiler_accepts_global(value) -> bool:
    """Triton's rule for a module-level value read inside a kernel (its code generator's global
    lookup): constexpr values, modules, jit functions, Triton builtins, dtypes and named tuples."""
    import types

    import triton.language as tl
    from triton.runtime import jit
    from triton.runtime.interpreter import InterpretedFunction

    jit_types = tuple(t for t in (InterpretedFunction, getattr(jit, "JITCallable", None), jit.JITFunction) if t)
    return (isinstance(value, (types.ModuleType, tl.constexpr, tl.dtype) + jit_types)
            or bool(getattr(value, "__triton_builtin__", False))
            or bool(getattr(value, "__triton_aggregate__", False))
            or str(getattr(value, "__module__", "") or "").startswith("triton.language")
            or (isinstance(value, tuple) and hasattr(type(value), "_fields")))


def check_kernel_globals(fn) -> None:
    """Raise the compiler's ``NameError`` if ``fn`` (a kernel's Python function) reads a global
    that Triton would refuse when compiling it for a GPU."""
    namespace = getattr(fn, "__globals__", {})
    for name in sorted(_global_reads(fn)):
        if name in namespace and not _compiler_accepts_global(namespace[name]):
            raise NameError(f"Cannot access global variable {name} from within @jit'ed function "
                            f"{fn.__name__}: Triton kernels read only module-level values made with "
                            f"tl.constexpr(...); compiled for a GPU this kernel fails")


def refuse_non_constexpr_globals() -> None:
    from triton.runtime.interpreter import InterpretedFunction

    rewrite = InterpretedFunction.rewrite
    checked: set = set()

    def rewrite_checked(self):
        # Every launch and every device-function call rewrites the function first.
        if self.fn not in checked:
            check_kernel_globals(self.fn)
            checked.add(self.fn)
        return rewrite(self)

    InterpretedFunction.rewrite = rewrite_checked


# -- uninitialised memory ------------------------------------------------------------------------

def fill_fresh_memory_with_nan() -> None:
    import torch
    import torch.utils.deterministic

    # Deterministic mode is what turns the fill on; warn_only keeps ops without a deterministic
    # implementation working (a warning, not an error).
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True


# The operators that hand out fresh memory (``resize_`` where it grows a tensor).
_ALLOCATING_OPS = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
                             "empty_permuted", "resize_"})


class FreshMemory:
    """What fresh memory holds in each set: torch's NaN (``fill_fresh_memory_with_nan``) in the
    sets the worker calls plain (``tiny``, ``base``), and, in the others, ``plan``'s fill: zero in
    one, a finite value drawn from the OS in another (random sign, magnitude 10^-2 to 10^6;
    integers 1 to 100), NaN or such a value in the rest, in an order drawn before the candidate
    is imported. A kernel that reads a fresh element to tell the harness from a user's call meets
    zeros (fresh pages), NaN and arbitrary values, and an unwritten output element still fails
    wherever the fill is not the answer. ``during`` refills, below Python, every allocation made
    by an ATen operator (``_ALLOCATING_OPS``) inside the block: the whole storage, or a grown
    tensor's new tail."""

    def __init__(self):
        self.fills: dict[int, Optional[float]] = {}
        self.current: Optional[float] = None

    def plan(self, varied: list[bool]) -> None:
        """``varied[i]``: whether set ``i`` gets a fill of its own."""
        rng = secrets.SystemRandom()
        indices = [i for i, on in enumerate(varied) if on]
        rng.shuffle(indices)
        kinds = ["zero", "value"] + [rng.choice(("nan", "value")) for _ in indices[2:]]
        for index, kind in zip(indices, kinds):
            self.fills[index] = (0.0 if kind == "zero" else math.nan if kind == "nan"
                                 else rng.choice((-1.0, 1.0)) * 10.0 ** rng.uniform(-2.0, 6.0))

    def start_set(self, index: int) -> None:
        self.current = self.fills.get(index)

    def during(self):
        """A context in which fresh memory holds the set's fill (torch's NaN where it has none)."""
        import contextlib

        if self.current is None or self.current != self.current:
            return contextlib.nullcontext()
        return _fill_mode(self.current)


def _fill_value(dtype, value: float):
    """``value`` in ``dtype`` (within its range), or None for a dtype left as torch fills it."""
    import torch

    if dtype.is_floating_point:
        top = torch.finfo(dtype).max
        return max(-top, min(top, value))
    if dtype == torch.bool or dtype.is_complex:
        return None
    return 0 if value == 0.0 else 1 + int(abs(value)) % 100


def _fill_mode(value: float):
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class _Fill(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            grown_from = None
            if name == "resize_":
                grown_from = args[0].untyped_storage().nbytes()
            out = func(*args, **(kwargs or {}))
            if name in _ALLOCATING_OPS and isinstance(out, torch.Tensor) and out.device.type == "cpu":
                fill = _fill_value(out.dtype, value)
                storage = out.untyped_storage()
                start = (grown_from or 0) // out.element_size()
                count = storage.nbytes() // out.element_size()
                if fill is not None and count > start:
                    flat = torch.empty(0, dtype=out.dtype).set_(storage, 0, (count,))
                    flat[start:].fill_(fill)
            return out

    return _Fill()


# -- masks -----------------------------------------------------------------------------------------

def _mask_values(mask) -> np.ndarray:
    """The array of a load's or store's mask: a ``TensorHandle``'s data, or the bare array a
    tensor descriptor's load and store pass in Triton 3.6 (whose ``.data`` is a memoryview)."""
    return mask if isinstance(mask, np.ndarray) else mask.data


def _as_bool_mask(mask):
    """``mask`` as bool where the interpreter typed a boolean expression as an integer: values
    other than 0 and 1 are left for the interpreter to refuse, as before."""
    from triton.runtime.interpreter import TensorHandle

    if isinstance(mask, np.ndarray):
        return mask
    data = mask.data
    if data.dtype == np.bool_ or data.dtype.kind not in "iu" or not np.isin(data, (0, 1)).all():
        return mask
    return TensorHandle(data.astype(np.bool_), mask.dtype)


def read_zero_one_masks_as_bool() -> None:
    """The interpreter types some combined masks (``block_mask & (row < n)``, a block and a
    scalar condition) as int32 holding 0 and 1, and its load and store then refuse them ("mask has
    unsupported dtype"); compiled for a GPU the same expression is a boolean and the kernel runs.
    Such a mask is read as the boolean it is, so a correct kernel is not rejected on CPU alone."""
    from triton.runtime.interpreter import InterpreterBuilder

    load, store = InterpreterBuilder.create_masked_load, InterpreterBuilder.create_masked_store
    if getattr(load, "reads_zero_one_masks", False):
        return

    # The policy arguments after the mask differ between Triton releases (one ``cache_policy`` in
    # 3.9, ``cache_modifier, eviction_policy`` in 3.6) and come by position or by name (a tensor
    # descriptor's load): they pass through as they come.
    def create_masked_load(self, ptrs, mask, other, *policies, **named):
        return load(self, ptrs, _as_bool_mask(mask), other, *policies, **named)

    def create_masked_store(self, ptrs, value, mask, *policies, **named):
        return store(self, ptrs, value, _as_bool_mask(mask), *policies, **named)

    create_masked_load.reads_zero_one_masks = True
    InterpreterBuilder.create_masked_load = create_masked_load
    InterpreterBuilder.create_masked_store = create_masked_store


def index_with_one_element_arrays() -> None:
    """A scalar kernel argument is a one-element array in the interpreter. Triton 3.6 reads it
    as a Python int (``range(0, n, BLOCK)``, a shape) with ``int(array)``, which NumPy 2.4 refuses
    for arrays of one dimension ("only 0-dimensional arrays can be converted"): every kernel
    looping to a runtime bound was rejected on CPU. Later Triton releases squeeze the array
    first, as this does; an array of more than one element still raises."""
    from triton.runtime import interpreter

    patch = getattr(interpreter, "_patch_lang_tensor", None)
    if patch is None or getattr(patch, "indexes_one_element_arrays", False):
        return

    def _patch_lang_tensor(tensor, scope):
        patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    _patch_lang_tensor.indexes_one_element_arrays = True
    interpreter._patch_lang_tensor = _patch_lang_tensor


# -- tl.dot precision ------------------------------------------------------------------------------

def _to_tf32(data):
    """fp32 ``data`` rounded to TF32's 10 mantissa bits, to nearest (ties away from zero, as
    ``cvt.rna.tf32.f32``); infinities and NaNs as they are."""
    bits = data.view(np.uint32)
    rounded = ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)
    return np.where(np.isfinite(data), rounded, data).astype(np.float32)


def round_dot_operands_to_tf32() -> None:
    from triton._C.libtriton import ir
    from triton.runtime.interpreter import InterpreterBuilder, TensorHandle

    dot = InterpreterBuilder.create_dot
    if getattr(dot, "rounds_to_tf32", False):
        return

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if input_precision == ir.INPUT_PRECISION.TF32:
            a, b = (TensorHandle(_to_tf32(x.data), x.dtype) if x.data.dtype == np.float32 else x
                    for x in (a, b))
        return dot(self, a, b, d, input_precision, max_num_imprecise_acc)

    create_dot.rounds_to_tf32 = True
    InterpreterBuilder.create_dot = create_dot


# -- bfloat16 --------------------------------------------------------------------------------------

def bf16_bits_to_fp32(bits) -> np.ndarray:
    """The fp32 values of bf16 bit patterns (exact: bf16 is fp32's upper half)."""
    return (np.asarray(bits).astype(np.uint32) << np.uint32(16)).view(np.float32)


def fp32_to_bf16_bits(values, toward_zero: bool = False) -> np.ndarray:
    """bf16 bit patterns of fp32 ``values``, rounded to nearest even as a GPU's ``cvt.rn.bf16.f32``
    and PyTorch do (``toward_zero``: truncated, ``cvt.rz``); NaN stays a (quiet) NaN of the same sign."""
    values = np.asarray(values, dtype=np.float32)
    bits = values.view(np.uint32)
    if not toward_zero:
        bits = bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    quiet = ((values.view(np.uint32) >> np.uint32(16)) | np.uint32(0x0040)).astype(np.uint16)
    return np.where(np.isnan(values), quiet, (bits >> np.uint32(16)).astype(np.uint16)).astype(np.uint16)


# Builder operations that compute on floating-point values: with a bf16 operand they run on its
# fp32 values, and a result that comes back fp32 is rounded to bf16 (what the operation's type is).
_BF16_ARITHMETIC = (
    "create_fadd", "create_fsub", "create_fmul", "create_fdiv", "create_frem", "create_fneg",
    "create_precise_divf", "create_approx_divf", "create_minimumf", "create_minnumf", "create_maximumf",
    "create_maxnumf", "create_clampf", "create_fma", "create_fabs", "create_cos", "create_sin",
    "create_exp", "create_exp2", "create_log", "create_log2", "create_sqrt", "create_precise_sqrt",
    "create_rsqrt", "create_erf", "create_floor", "create_ceil",
    "create_fcmpOLT", "create_fcmpOGT", "create_fcmpOLE", "create_fcmpOGE", "create_fcmpOEQ", "create_fcmpONE",
    "create_fcmpULT", "create_fcmpUGT", "create_fcmpULE", "create_fcmpUGE", "create_fcmpUEQ", "create_fcmpUNE",
)


def compute_bfloat16_as_values() -> None:
    import triton.language as tl
    from triton.runtime import interpreter
    from triton.runtime.interpreter import InterpreterBuilder, TensorHandle

    if getattr(InterpreterBuilder, "bf16_as_values", False):
        return

    def is_bf16(handle) -> bool:
        return isinstance(handle, TensorHandle) and handle.dtype.scalar == tl.bfloat16

    def as_fp32(handle):
        return TensorHandle(bf16_bits_to_fp32(handle.data), tl.float32) if is_bf16(handle) else handle

    def as_bf16(handle):
        return TensorHandle(fp32_to_bf16_bits(handle.data), tl.bfloat16)

    def on_values(method: Callable) -> Callable:
        def run(self, *args):
            if not any(is_bf16(a) for a in args):
                return method(self, *args)
            result = method(self, *(as_fp32(a) for a in args))
            if isinstance(result, TensorHandle) and result.dtype.scalar == tl.float32:
                return as_bf16(result)
            return result
        return run

    for name in _BF16_ARITHMETIC:
        method = getattr(InterpreterBuilder, name, None)
        if method is not None:
            setattr(InterpreterBuilder, name, on_values(method))

    dot = InterpreterBuilder.create_dot

    def create_dot(self, a, b, d, *rest):
        # bf16 operands are exact in fp32; the accumulator's type is the result's
        return dot(self, as_fp32(a), as_fp32(b), d, *rest)

    InterpreterBuilder.create_dot = create_dot

    cast = InterpreterBuilder.cast_impl

    def cast_impl(self, src, dst_type):
        into, out_of = dst_type.scalar == tl.bfloat16, is_bf16(src)
        if into and out_of:
            return TensorHandle(src.data, tl.bfloat16)
        if into:
            return TensorHandle(fp32_to_bf16_bits(np.asarray(src.data).astype(np.float32)), tl.bfloat16)
        if out_of:
            values = bf16_bits_to_fp32(src.data)
            return TensorHandle(values.astype(interpreter._get_np_dtype(dst_type)), dst_type.scalar)
        return cast(self, src, dst_type)

    InterpreterBuilder.cast_impl = cast_impl
    fp_to_fp = InterpreterBuilder.create_fp_to_fp

    def create_fp_to_fp(self, src, dst_type, rounding_mode):
        floats = (tl.float32, tl.float16, tl.float64)
        into = dst_type.scalar == tl.bfloat16 and src.dtype.scalar in floats
        if into and rounding_mode is not None and "RTZ" in str(rounding_mode):
            values = np.asarray(src.data).astype(np.float32)
            return TensorHandle(fp32_to_bf16_bits(values, toward_zero=True), tl.bfloat16)
        if into or (is_bf16(src) and dst_type.scalar in floats):
            return self.cast_impl(src, dst_type)  # to nearest, as cast_impl above converts
        return fp_to_fp(self, src, dst_type, rounding_mode)

    InterpreterBuilder.create_fp_to_fp = create_fp_to_fp
    if not hasattr(InterpreterBuilder, "get_bf16"):  # Triton 3.6: a bf16 constant raised
        InterpreterBuilder.get_bf16 = lambda self, value: TensorHandle(
            fp32_to_bf16_bits(np.array([value], dtype=np.float32)), tl.bfloat16)
    _reduce_bf16_as_values(interpreter)
    InterpreterBuilder.bf16_as_values = True


def _reduce_bf16_as_values(interpreter) -> None:
    """The interpreter's NumPy fast paths of ``tl.sum``/``max``/``min`` and ``cumsum``/``cumprod``
    run on the array itself: for bf16, on its fp32 values, the result rounded back."""
    import triton.language as tl

    def scalar_or_block(like, data):
        # ``to_tensor`` makes a block of any array with a shape; a scalar's one element goes alone
        return data if like.type.is_block() else data.reshape(-1)[0]

    def on_values(method: Callable) -> Callable:
        def run(self, input, *args, **kwargs):
            value = input[0] if isinstance(input, tuple) else input
            if value.dtype.scalar != tl.bfloat16:
                return method(self, input, *args, **kwargs)
            widened = self.to_tensor(scalar_or_block(value, bf16_bits_to_fp32(value.handle.data)), tl.float32)
            result = method(self, (widened, *input[1:]) if isinstance(input, tuple) else widened, *args, **kwargs)

            def narrow(t):
                if getattr(t, "dtype", None) is not None and t.dtype.scalar == tl.float32:
                    return self.to_tensor(scalar_or_block(t, fp32_to_bf16_bits(t.handle.data)), tl.bfloat16)
                return t

            if isinstance(result, (list, tuple)):
                return type(result)(narrow(t) for t in result)
            return narrow(result)
        return run

    for cls, names in ((interpreter.ReduceOps, ("min_max", "sum")), (interpreter.ScanOps, ("cumsum", "cumprod"))):
        for name in names:
            method = getattr(cls, name, None)
            if method is not None:
                setattr(cls, name, on_values(method))


# -- program order -------------------------------------------------------------------------------

class ProgramOrder:
    """Maps the interpreter's in-order program indices through a fresh random permutation of the
    grid while ``shuffled`` is set (every program still runs exactly once)."""

    def __init__(self):
        self.shuffled = False
        self._permutation: Optional[np.ndarray] = None
        self._dims = (1, 1, 1)

    def install(self) -> None:
        from triton.runtime import interpreter

        builder = interpreter.interpreter_builder
        set_dim, set_idx = builder.set_grid_dim, builder.set_grid_idx
        order = self

        def set_grid_dim(x, y, z):
            order.memory.start_launch()
            order._dims = (int(x), int(y), int(z))
            total = order._dims[0] * order._dims[1] * order._dims[2]
            order._permutation = None
            if order.shuffled and total > 1:
                rng = np.random.default_rng(secrets.randbits(64))
                order._permutation = rng.permutation(total)
            return set_dim(x, y, z)

        def set_grid_idx(x, y, z):
            order.memory.start_program()
            if order._permutation is not None:
                _gx, gy, gz = order._dims
                linear = int(order._permutation[(x * gy + y) * gz + z])
                x, rest = divmod(linear, gy * gz)
                y, z = divmod(rest, gz)
            return set_idx(x, y, z)

        builder.set_grid_dim = set_grid_dim
        builder.set_grid_idx = set_grid_idx
        self.memory = ConcurrentMemoryView(self)
        self.memory.install(builder)


class ConcurrentMemoryView:
    """Within one launch, a plain load of what another program stored reads the value from before
    that program's store (see the module docstring). Active while ``order.shuffled`` is set."""

    _ATOMICS = ("create_atomic_rmw", "create_atomic_cas", "create_atomic_load", "create_atomic_store",
                "create_atomic_poll")

    def __init__(self, order: ProgramOrder):
        self.order = order
        self._program = -1
        self._synchronised = False
        self._writer: dict[int, int] = {}  # address -> the program that stored it last
        self._before: dict[int, object] = {}  # address -> its value before the launch's first store
        self._low, self._high = None, None

    def start_launch(self) -> None:
        self._program = -1
        self._writer.clear()
        self._before.clear()
        self._low = self._high = None

    def start_program(self) -> None:
        self._program += 1
        self._synchronised = False

    def install(self, builder) -> None:
        from triton.runtime import interpreter

        load, store = builder.create_masked_load, builder.create_masked_store
        view = self

        def create_masked_load(ptrs, mask, other, *policies, **named):
            result = load(ptrs, mask, other, *policies, **named)
            if view.order.shuffled and not view._synchronised and view._writer:
                view._see_before_other_programs(ptrs.data, _mask_values(mask), result)
            return result

        def create_masked_store(ptrs, value, mask, *policies, **named):
            if view.order.shuffled:
                np_dtype = interpreter._get_np_dtype(ptrs.get_element_ty())
                view._record_store(ptrs.data, _mask_values(mask), np_dtype)
            return store(ptrs, value, mask, *policies, **named)

        builder.create_masked_load = create_masked_load
        builder.create_masked_store = create_masked_store
        for name in self._ATOMICS:
            if hasattr(builder, name):
                setattr(builder, name, self._synchronising(getattr(builder, name)))

    def _synchronising(self, atomic: Callable) -> Callable:
        def run(*args, **kwargs):
            self._synchronised = True
            return atomic(*args, **kwargs)
        return run

    def _record_store(self, addresses: np.ndarray, mask: np.ndarray, np_dtype) -> None:
        from triton.runtime import interpreter

        chosen = addresses[np.broadcast_to(mask, addresses.shape)]
        if chosen.size == 0:
            return
        new = [a for a in chosen.tolist() if a not in self._before]
        if new:
            where = np.array(new, dtype=addresses.dtype)
            values = interpreter._interpreter.load(where, np.ones(where.shape, dtype=bool),
                                                   np.zeros(where.shape, dtype=np_dtype), np_dtype)
            self._before.update(zip(new, values.tolist()))
        self._writer.update(dict.fromkeys(chosen.tolist(), self._program))
        low, high = int(chosen.min()), int(chosen.max())
        self._low = low if self._low is None else min(self._low, low)
        self._high = high if self._high is None else max(self._high, high)

    def _see_before_other_programs(self, addresses: np.ndarray, mask: np.ndarray, result) -> None:
        flat = addresses.reshape(-1)
        loaded = np.broadcast_to(mask, addresses.shape).reshape(-1)
        near = np.flatnonzero(loaded & (flat >= self._low) & (flat <= self._high))
        if near.size == 0:
            return
        values = result.data.reshape(-1)
        for index in near.tolist():
            address = int(flat[index])
            writer = self._writer.get(address)
            if writer is not None and writer != self._program:
                values[index] = self._before[address]
