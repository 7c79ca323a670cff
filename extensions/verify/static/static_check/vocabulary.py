"""Qualified names the static check recognises, and the verdicts on PyTorch names it reaches."""
from __future__ import annotations

import functools
from typing import Optional

from extensions.verify.static import policy

# Qualified-name prefixes (dotted) that raise a flag wherever they appear: imports and references.
CATEGORY_PREFIXES: dict[str, tuple[str, ...]] = {
    "concurrency": (
        "threading", "_thread", "multiprocessing", "concurrent", "asyncio", "subprocess",
        "os.fork", "os.forkpty", "os.spawnl", "os.spawnv", "os.spawnlp", "os.spawnvp",
        "os.posix_spawn", "os.system", "os.popen", "torch.multiprocessing", "torch.jit.fork",
        "torch.jit._fork", "torch.jit.wait", "torch.futures", "torch.distributed",
    ),
    "cuda_stream": (
        "torch.cuda.Stream", "torch.cuda.stream", "torch.cuda.set_stream",
        "torch.cuda.current_stream", "torch.cuda.default_stream", "torch.cuda.ExternalStream",
        "torch.cuda.StreamContext", "torch.cuda.streams", "torch.cuda.graph", "torch.cuda.graphs",
        "torch.cuda.CUDAGraph", "torch.cuda.make_graphed_callables", "torch.Stream",
    ),
    "io_access": (
        "os", "pathlib", "socket", "urllib", "requests", "http", "shutil", "pickle", "signal",
        "tempfile", "glob", "io", "sqlite3", "ftplib", "smtplib", "ssl", "mmap", "fcntl", "dill",
        "cloudpickle", "joblib", "shelve", "marshal", "torch.load", "torch.save", "torch.hub",
        "torch.from_file", "torch.serialization", "numpy.load", "numpy.save", "numpy.fromfile",
        "sys.stdin", "sys.argv",
    ),
    "introspection": (
        "inspect", "gc", "traceback", "ctypes", "dis", "faulthandler", "tracemalloc",
        "sys._getframe", "sys._current_frames", "sys.settrace", "sys.setprofile", "sys.gettrace",
        "sys.getprofile", "sys.exc_info", "threading.settrace", "threading.setprofile",
    ),
    "dynamic_code": (
        "importlib", "imp", "types", "code", "codeop", "runpy", "pkgutil", "zipimport",
        "torch.utils.cpp_extension",
    ),
    "monkeypatch": (
        "builtins", "sys.modules", "sys.meta_path", "sys.path_hooks", "sys.path", "torch.library",
        "torch.overrides", "unittest.mock", "mock",
    ),
    "numpy_compute": ("numpy",),
}
# Unresolved names that still mean a CUDA stream or graph.
STREAM_NAMES = frozenset({
    "Stream", "ExternalStream", "set_stream", "current_stream", "default_stream", "StreamContext",
    "CUDAGraph",
})
LIBRARY_ROOTS = frozenset({"torch", "triton", "numpy"})
REFERENCE_MODULE_WORDS = ("problem", "reference", "kernelbench", "task")

BUILTIN_CATEGORIES = {
    "exec": "dynamic_code", "eval": "dynamic_code", "compile": "dynamic_code",
    "__import__": "dynamic_code", "globals": "dynamic_code", "vars": "dynamic_code",
    "locals": "dynamic_code", "open": "io_access", "input": "io_access",
    "breakpoint": "introspection", "__builtins__": "monkeypatch",
}
DYNAMIC_ATTRIBUTES = frozenset({
    "__dict__", "__class__", "__subclasses__", "__getattribute__", "__bases__", "__mro__",
    "__base__", "__import__", "__loader__", "__spec__", "__reduce__", "__reduce_ex__",
    "__setattr__", "__delattr__", "__wrapped__",
})
FRAME_ATTRIBUTES = frozenset({
    "f_back", "f_globals", "f_locals", "f_code", "f_builtins", "gi_frame", "cr_frame", "tb_frame",
    "tb_next", "__code__", "__globals__", "__closure__",
})
DISPATCH_OVERRIDES = frozenset({"__torch_function__", "__torch_dispatch__"})

# torch.<name> values that are not computations: dtypes, layouts, constants, submodules.
TORCH_VALUES = frozenset({
    "dtype", "layout", "memory_format", "strided", "sparse_coo", "sparse_csr", "jagged",
    "contiguous_format", "preserve_format", "channels_last", "channels_last_3d", "inf", "nan",
    "pi", "e", "newaxis", "__version__", "version", "types",
    "bfloat16", "bool", "cdouble", "cfloat", "chalf", "complex128", "complex32", "complex64",
    "double", "float", "float16", "float32", "float64", "float8_e4m3fn", "float8_e4m3fnuz",
    "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2", "half", "int",
    "int16", "int32", "int64", "int8", "long", "short", "uint16", "uint32", "uint64", "uint8",
    "qint8", "qint32", "quint8",
})
TORCH_SUBMODULES = frozenset({
    "nn", "cuda", "backends", "autograd", "functional", "init", "utils", "jit", "distributed",
    "fx", "library", "testing", "linalg", "fft", "special", "sparse", "amp", "cpu", "mps", "xpu",
    "profiler", "overrides", "hub", "futures", "multiprocessing", "compiler", "export", "random",
    "masked", "nested", "quantization", "ao", "onnx", "package", "storage", "version", "types",
})
TRITON_JIT = frozenset({"triton.jit", "triton.runtime.jit", "triton.runtime.jit.jit"})
TRITON_WRAPPERS = frozenset({
    "triton.autotune", "triton.heuristics", "triton.runtime.autotune", "triton.runtime.heuristics",
    "triton.runtime.autotuner.autotune", "triton.runtime.autotuner.heuristics",
})
FORWARD_ENTRY_METHODS = ("forward", "__call__")
LOCAL_MARK = "$."  # qualified names of things the candidate module itself defines



# --- verdicts on qualified names ---------------------------------------------------------------

def torch_call_verdict(q: str) -> Optional[str]:
    """Flag for calling ``q`` (a torch.* name) in the forward path; None when allowed."""
    parts = q.split(".")
    if len(parts) < 2 or categories(q):
        return None  # module-wide categories (streams, io, ...) are reported on their own
    head, last = parts[1], parts[-1]
    if head in ("ops", "_C") or any(is_private(p) for p in parts[1:]):
        return "torch_compute"
    if head == "nn":
        if len(parts) >= 4 and parts[2] == "functional":
            return "library_gemm" if last in policy.LIBRARY_GEMM_TORCH_FUNCTIONS else "torch_compute"
        if last[:1].isupper():
            if last in policy.NN_MODULES_WITHOUT_COMPUTE or last in ("Parameter", "Buffer"):
                return None
            return "library_gemm" if last in policy.NN_LIBRARY_GEMM_MODULES else "torch_compute"
        return "torch_compute"
    if head == "cuda":
        return None if last in policy.ALLOWED_TORCH_CUDA_FUNCTIONS or last[:1].isupper() \
            else "torch_compute"
    if head == "Tensor" and len(parts) == 3:
        return method_verdict(last)
    if len(parts) == 2:
        if last in policy.ALLOWED_TORCH_FUNCTIONS or last in TORCH_VALUES or last[:1].isupper():
            return None
        return "library_gemm" if last in policy.LIBRARY_GEMM_TORCH_FUNCTIONS else "torch_compute"
    if last[:1].isupper():
        return None
    return "torch_compute"


def torch_reference_verdict(q: str) -> Optional[str]:
    """Flag for naming ``q`` (a torch.* name) as a value: only known PyTorch ops count."""
    parts = q.split(".")
    if len(parts) < 2:
        return None
    head, last = parts[1], parts[-1]
    if last[:1].isupper() or (last.startswith("__") and last.endswith("__")):
        return None
    if head in ("ops", "_C"):
        return "torch_compute"
    if head == "nn" and len(parts) == 4 and parts[2] == "functional":
        return "library_gemm" if last in policy.LIBRARY_GEMM_TORCH_FUNCTIONS else "torch_compute"
    if head == "Tensor" and len(parts) == 3:
        return method_verdict(last)
    if head in ("linalg", "fft", "special") and len(parts) == 3:
        return "torch_compute"
    if len(parts) == 2 and not (last in policy.ALLOWED_TORCH_FUNCTIONS or last in TORCH_VALUES
                                or last in TORCH_SUBMODULES or is_private(last)):
        return "library_gemm" if last in policy.LIBRARY_GEMM_TORCH_FUNCTIONS else "torch_compute"
    return None


def method_verdict(name: str) -> Optional[str]:
    if name in policy.TENSOR_LIBRARY_GEMM_METHODS:
        return "library_gemm"
    return "torch_compute" if name in policy.TENSOR_COMPUTE_METHODS else None


@functools.lru_cache(maxsize=4096)
def categories(q: str) -> tuple[str, ...]:
    # Library modules re-export the standard library (torch.os, triton.sys): judge every tail.
    parts = q.split(".")
    tails = [q] + [".".join(parts[i:]) for i in range(1, len(parts))]
    return tuple(
        flag for flag, prefixes in CATEGORY_PREFIXES.items()
        if any(t == p or t.startswith(p + ".") for t in tails for p in prefixes
               if t == q or p.split(".")[0] not in LIBRARY_ROOTS)
    )


def is_private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))
