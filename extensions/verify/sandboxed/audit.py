"""Runtime audit of a candidate's forward, installed in the worker before the candidate is imported.

What it watches while ``forward`` runs:

* Triton launches: ``JITFunction.run`` and the interpreter's ``InterpretedFunction.run`` (what
  ``triton.jit`` returns under ``TRITON_INTERPRET=1``) are wrapped at class level; a forward with
  no launch is flagged ``no_triton_launch``.
* ATen operators that ran, through a ``TorchDispatchMode``: anything ``policy.aten_op_allowed``
  rejects is ``torch_compute``; library GEMM/conv is ``library_gemm`` (or, when the config allows
  it, the advisory ``library_gemm_allowed`` plus the op names in ``allowed_library_calls``). The
  interpreter's own bookkeeping inside a launch (``new_empty``/``set_``/``copy_``) is allowed by the
  policy anyway, so launches are audited like the rest of forward: a grid callable cannot hide math.
* Below Python: the C++ profiler records the CPU operator events of every thread of the process
  (``profile_all_threads``) while forward runs. Python dispatch modes can be popped by code in the
  process; these records cannot, so an op of the profiler's record that the policy rejects is
  ``torch_compute`` too, and a record that lost its start or end marker is ``audit_tampered``.
* Other threads (the dispatch mode is thread-local): Python thread starts are hooked and the OS
  task count of the process is compared before/after -> ``threads``.
* Casts of floating tensor data to an integer or bool dtype (``_to_copy``/``copy_`` whose source is
  floating and whose result is not) -> ``host_cast_compute``: the copy truncated or compared.
* NumPy round trips (``Tensor.numpy``/``__array__``) -> ``numpy_compute``; host extraction of
  tensor data (``tolist``, ``item``, and the ``_local_scalar_dense`` behind ``float(t)``) beyond a
  few scalars -> ``host_compute``; processes started (``os.fork``/``posix_spawn``/``system``,
  ``subprocess``) -> ``subprocess``. Calls whose nearest caller outside torch is Triton itself (the
  interpreter, the compiler, the autotuner) do not count; calls from the candidate's code do, inside
  a launch as well (a grid object's methods run there).
* Construction: importing the candidate and building ``ModelNew`` run under the same audit
  (``construction``): threads or processes started there are flagged, and the ops that ran are
  reported in ``init_ops``.
* Output provenance: the storages Triton launches received, and copies/views the dispatch mode saw
  derived from them, are recorded; an output in any other storage was not written by a kernel
  (``torch.tensor(python_values)``, NumPy, a subprocess's answer) -> ``output_not_from_kernel``
  (checked by the worker).
* CUDA only: the kernels the GPU ran (``torch.profiler``, CUDA activity, chrome trace) must be
  Triton's (the launched function names) or allowed copies/fills -> ``non_triton_kernel``; a kernel
  on another stream than the forward's current stream -> ``side_stream``; allowed copies and fills
  taking most of the GPU time (a decoy Triton launch next to the real work) -> ``decoy_kernel``.
* Its own hooks are checked after every forward; a removed hook is ``audit_tampered``.

This is defence in depth behind the static check: code running in the same process can, in
principle, undo in-process hooks, which is why the static check rejects reflection and
monkeypatching and why the parent (not the worker) decides correctness.
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections import Counter
from dataclasses import dataclass, field

from extensions.timing.cuda_trace import read_device_events

from ..static.policy import ALLOWED_CUDA_KERNEL_FRAGMENTS, LIBRARY_GEMM_ATEN_OPS, aten_op_allowed

# Scalars forward may read back to the host (a scale parameter's item()); beyond this many elements
# the data went through Python.
HOST_EXTRACTION_LIMIT = 64
# Below this share of the GPU time in Triton kernels, copies and fills did the work next to a
# decoy launch. Only judged when the kernels took long enough for their durations to mean
# something. Not one half, nor one fifth: a correct RMSNorm that makes its (16, 64, 256, 256) input
# channels-last and its output back gives its one coalesced Triton pass less than a fifth of the
# time beside two strided transposing copies, and was rejected on an H100 at both thresholds. A
# decoy launch does next to nothing; what forward may run besides Triton is copies and fills
# (``policy``), so only a problem whose answer is a copy could be answered by them at all.
MIN_TRITON_GPU_SHARE = 0.05
MIN_GPU_TIME_FOR_SHARE_US = 50.0
# Names in the profiler's record that are wrappers with no math of their own (the dispatch mode
# never sees them: they run above it).
PROFILER_ONLY_OPS = frozenset({"resolve_conj", "resolve_neg", "type_as", "is_same_size", "is_complex",
                               "is_floating_point", "conj", "_conj", "_neg_view", "lift", "result_type",
                               "detach_", "reshape_as"})
_START_MARKER = "verifier::audit_start"
_END_MARKER = "verifier::audit_end"


@dataclass
class ForwardReport:
    launches: int = 0
    kernel_names: set = field(default_factory=set)
    ops: Counter = field(default_factory=Counter)
    threads_started: int = 0
    processes_started: int = 0
    # Storages a Triton launch received, plus what allowed ops (copies, views) derived from them:
    # every output must live in one of these, or it was not produced by a kernel.
    kernel_storages: set = field(default_factory=set)
    numpy_calls: int = 0
    extracted_elements: int = 0  # tensor elements read back into Python (tolist, item, float(t))
    integer_casts: int = 0  # floating tensor data converted to an integer or bool dtype
    new_tasks: int = 0
    profiled_ops: Counter = field(default_factory=Counter)  # every thread, from the C++ profiler
    markers_seen: bool = True
    cuda_kernels: list = field(default_factory=list)  # (name, stream)
    flags: list = field(default_factory=list)
    disallowed_ops: list = field(default_factory=list)
    library_calls: list = field(default_factory=list)
    details: dict = field(default_factory=dict)


def warm_up_profiler(cuda: bool = False) -> None:
    """Start and stop the C++ profiler once: its first start initialises Kineto (seconds; with
    ``cuda``, CUPTI as well), which a worker does while it waits for its candidate rather than
    inside the first audited call."""
    from torch.profiler import ProfilerActivity, _ExperimentalConfig, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with contextlib.suppress(Exception):
        with profile(activities=activities, experimental_config=_ExperimentalConfig(profile_all_threads=True)):
            pass


def _task_count() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def _package_dir(name: str) -> str:
    module = sys.modules.get(name)
    return os.path.dirname(getattr(module, "__file__", "") or "") + os.sep if module else "\0"


def _internal_caller() -> bool:
    """Whether the nearest caller outside torch and the standard library is Triton (its interpreter,
    compiler, autotuner): then a host read, thread or process is Triton's own business."""
    torch_dir, triton_dir = _package_dir("torch"), _package_dir("triton")
    stdlib_dir = os.path.dirname(os.__file__) + os.sep
    frame = sys._getframe(2)
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename == __file__ or filename.startswith(torch_dir) or (
                filename.startswith(stdlib_dir) and "site-packages" not in filename):
            frame = frame.f_back
            continue
        return filename.startswith(triton_dir)
    return False


class RuntimeAudit:
    def __init__(self, allow_library_gemm: bool, device: str, trace_dir: str = "."):
        self.allow_library_gemm = allow_library_gemm
        self.device = device
        self.trace_dir = trace_dir
        self.active = False
        self.report = ForwardReport()
        self.launch_depth = 0
        self._wrappers: dict = {}
        self._mode = None

    # -- installation (before the candidate is imported) --------------------------------------
    def install(self) -> None:
        import _thread

        import torch

        self._wrap_method_of("triton.runtime.jit", "JITFunction", "run", self._launch_wrapper)
        self._wrap_method_of("triton.runtime.interpreter", "InterpretedFunction", "run", self._launch_wrapper)
        self._wrap_attr(threading.Thread, "start", self._thread_wrapper)
        self._wrap_attr(_thread, "start_new_thread", self._thread_wrapper)
        if hasattr(_thread, "start_joinable_thread"):
            self._wrap_attr(_thread, "start_joinable_thread", self._thread_wrapper)
        import _posixsubprocess

        import posix

        # ``os`` re-exports ``posix``'s functions: each module's name is wrapped, or ``posix.fork``
        # would start a process unseen.
        for owner in (os, posix):
            for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system"):
                self._wrap_attr(owner, name, self._process_wrapper)
        self._wrap_attr(_posixsubprocess, "fork_exec", self._process_wrapper)
        import subprocess

        self._wrap_attr(subprocess, "_fork_exec", self._process_wrapper)
        self._wrap_attr(torch.Tensor, "numpy", self._numpy_wrapper)
        self._wrap_attr(torch.Tensor, "__array__", self._numpy_wrapper)
        self._wrap_attr(torch.Tensor, "tolist", self._extraction_wrapper)
        self._wrap_attr(torch.Tensor, "item", self._extraction_wrapper)
        self._mode = _make_dispatch_mode(self)

    def _wrap_method_of(self, module_name: str, class_name: str, attr: str, make) -> None:
        import importlib

        try:
            owner = getattr(importlib.import_module(module_name), class_name)
        except (ImportError, AttributeError):
            return  # this Triton has no such class (e.g. no interpreter module)
        self._wrap_attr(owner, attr, make)

    def _wrap_attr(self, owner, attr: str, make) -> None:
        original = getattr(owner, attr, None)
        if original is None:
            return
        wrapper = make(original)
        setattr(owner, attr, wrapper)
        self._wrappers[(owner, attr)] = wrapper

    def _launch_wrapper(self, original):
        audit = self

        def run(kernel, *args, **kwargs):
            if kwargs.get("warmup") or not audit.active:
                return original(kernel, *args, **kwargs)
            audit.report.launches += 1
            audit.report.kernel_storages |= _storage_ptrs((args, kwargs))
            fn = getattr(kernel, "fn", None)
            audit.report.kernel_names.add(getattr(fn, "__name__", None) or getattr(kernel, "__name__", "?"))
            audit.launch_depth += 1
            try:
                return original(kernel, *args, **kwargs)
            finally:
                audit.launch_depth -= 1

        run.__wrapped__ = original
        return run

    def _thread_wrapper(self, original):
        audit = self

        def start(*args, **kwargs):
            if audit.active and not _internal_caller():  # Triton's compiler may use threads
                audit.report.threads_started += 1
            return original(*args, **kwargs)

        start.__wrapped__ = original
        return start

    def _process_wrapper(self, original):
        audit = self

        def spawn(*args, **kwargs):
            if audit.active and not _internal_caller():  # Triton's compiler runs ptxas
                audit.report.processes_started += 1
            return original(*args, **kwargs)

        spawn.__wrapped__ = original
        return spawn

    def _numpy_wrapper(self, original):
        audit = self

        def to_numpy(*args, **kwargs):
            if audit.active and not _internal_caller():
                audit.report.numpy_calls += 1
            return original(*args, **kwargs)

        to_numpy.__wrapped__ = original
        return to_numpy

    def _extraction_wrapper(self, original):
        audit = self

        def extract(tensor, *args, **kwargs):
            if audit.active and not _internal_caller():
                # item() also shows in the profiler as _local_scalar_dense: counted there instead.
                if original.__name__ != "item":
                    audit.report.extracted_elements += tensor.numel()
            return original(tensor, *args, **kwargs)

        extract.__wrapped__ = original
        return extract

    def hooks_intact(self) -> bool:
        return all(getattr(owner, attr, None) is wrapper for (owner, attr), wrapper in self._wrappers.items())

    # -- one audited forward --------------------------------------------------------------------
    @contextlib.contextmanager
    def forward(self):
        """Audit everything inside the block; the report is ``self.report`` (finalised on exit)."""
        with self._audited(construction=False) as report:
            yield report

    @contextlib.contextmanager
    def construction(self):
        """Audit importing the candidate and building ``ModelNew``: threads and processes started
        there are flagged (work left running for forward); the ops are reported, not judged (a
        constructor may legitimately transform its parameters)."""
        with self._audited(construction=True) as report:
            yield report

    @contextlib.contextmanager
    def _audited(self, construction: bool):
        import torch

        self.report = ForwardReport()
        profiler = self._start_profiler()
        stream = torch.cuda.current_stream() if self.device != "cpu" and not construction else None
        tasks_before = _task_count()
        mode_intact = True
        self.active = True
        try:
            with self._mode:
                yield self.report
                mode_intact = _current_mode() is self._mode
        finally:
            self.active = False
            if profiler is not None:
                if self.device != "cpu":
                    torch.cuda.synchronize()
                self._stop_profiler(profiler, stream)
            # On CUDA the driver, CUPTI and Triton's compiler start threads of their own; there
            # only Python-level thread starts count.
            if self.device == "cpu" and not construction:
                self.report.new_tasks = max(0, _task_count() - tasks_before)
            self._finalise(mode_intact, construction)

    def _start_profiler(self):
        """The C++ profiler (every thread; CUDA kernels too on a GPU), started, with its start
        marker (and a probe fill on forward's stream on CUDA); None (and a note in the report)
        where it cannot start, so the other checks still run."""
        import torch
        from torch.profiler import ProfilerActivity, _ExperimentalConfig, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device != "cpu" else [])
        try:
            profiler = profile(activities=activities,
                               experimental_config=_ExperimentalConfig(profile_all_threads=True))
            profiler.__enter__()
        except Exception as exc:  # noqa: BLE001 - the profiler (or CUPTI) unavailable here
            self.report.details["profiler_error"] = f"{type(exc).__name__}: {str(exc)[:100]}"
            return None
        with torch.profiler.record_function(_START_MARKER):
            if self.device != "cpu":
                _probe_stream(self.device)
        return profiler

    def _stop_profiler(self, profiler, stream) -> None:
        import torch

        with torch.profiler.record_function(_END_MARKER):
            pass
        try:
            profiler.__exit__(None, None, None)
            events = profiler.events()
        except Exception as exc:  # noqa: BLE001 - stopped or broken from inside: tampering
            self.report.markers_seen = False
            self.report.details["profiler_error"] = f"{type(exc).__name__}: {str(exc)[:100]}"
            return
        # Host-side records only: on CUDA a range that launched GPU work is also reported as a
        # GPU user annotation of the same name, which is not a second marker.
        names = Counter(event.name for event in events if _on_host(event))
        self.report.markers_seen = names[_START_MARKER] == 1 and names[_END_MARKER] == 1
        self.report.profiled_ops = Counter({name: count for name, count in names.items()
                                            if "::" in name and not name.startswith("verifier::")})
        if self.device != "cpu":
            self._read_cuda_trace(profiler, stream)

    def _read_cuda_trace(self, profiler, stream) -> None:
        try:
            events = read_device_events(profiler, os.path.join(self.trace_dir, "forward_trace.json"))
        except (OSError, ValueError, RuntimeError) as exc:
            self.report.details["cuda_trace_error"] = f"{type(exc).__name__}: {str(exc)[:100]}"
            return
        kernels = sorted((event.ts, event.name, event.stream, event.duration_us)
                         for event in events if event.category == "kernel")
        self.report.cuda_kernels = [(name, stream, duration) for _ts, name, stream, duration in kernels]

    def _finalise(self, mode_intact: bool, construction: bool) -> None:
        report = self.report
        flags = []
        # The dispatch mode's record (this thread) and the profiler's (every thread, below Python):
        # an op either one saw is judged.
        seen = Counter(report.ops)
        for name, count in report.profiled_ops.items():
            if _base(name) not in PROFILER_ONLY_OPS:
                seen[name] = max(seen[name], count)
        report.extracted_elements += report.profiled_ops.get("aten::_local_scalar_dense", 0)
        for op, _count in sorted(seen.items()):
            if aten_op_allowed(op, self.allow_library_gemm):
                if _base(op) in LIBRARY_GEMM_ATEN_OPS:
                    report.library_calls.append(op)
                continue
            report.disallowed_ops.append(op)
        if construction:
            # A constructor may transform its own parameters with PyTorch; what ran is reported.
            report.details["init_ops"] = sorted(set(report.disallowed_ops))[:20]
            report.disallowed_ops, report.library_calls = [], []
        gemm = [op for op in report.disallowed_ops if _base(op) in LIBRARY_GEMM_ATEN_OPS]
        if gemm:
            flags.append("library_gemm")
        if len(gemm) < len(report.disallowed_ops):
            flags.append("torch_compute")
        if report.library_calls:
            flags.append("library_gemm_allowed")
        if report.launches == 0 and not construction:
            flags.append("no_triton_launch")
        if report.threads_started or report.new_tasks:
            flags.append("threads")
        if report.processes_started:
            flags.append("subprocess")
        if report.numpy_calls and not construction:
            flags.append("numpy_compute")
        if report.integer_casts and not construction:
            flags.append("host_cast_compute")
            report.details["integer_casts"] = report.integer_casts
        if report.extracted_elements > HOST_EXTRACTION_LIMIT and not construction:
            flags.append("host_compute")
            report.details["extracted_elements"] = report.extracted_elements
        if not mode_intact or not self.hooks_intact() or not report.markers_seen:
            flags.append("audit_tampered")
        if report.cuda_kernels and not construction:
            flags += _cuda_kernel_flags(report)
        report.flags = flags


def _on_host(event) -> bool:
    from torch.autograd import DeviceType

    return getattr(event, "device_type", DeviceType.CPU) == DeviceType.CPU


def _base(op: str) -> str:
    return op.split("::", 1)[-1].split(".", 1)[0]


def _cuda_kernel_flags(report: ForwardReport) -> list[str]:
    flags = []
    # The probe fill runs first on the forward's stream: its stream id is the expected one.
    expected_stream = report.cuda_kernels[0][1]
    foreign = []
    triton_us = other_us = 0.0
    for name, stream, duration in report.cuda_kernels[1:]:
        if stream != expected_stream:
            if "side_stream" not in flags:
                flags.append("side_stream")
        is_triton = any(name == k or name.startswith(k) for k in report.kernel_names if k)
        if is_triton:
            triton_us += duration
        else:
            other_us += duration
            if not any(f in name for f in ALLOWED_CUDA_KERNEL_FRAGMENTS):
                foreign.append(name)
    if foreign:
        flags.append("non_triton_kernel")
        report.details["non_triton_kernels"] = sorted(set(foreign))[:10]
    total = triton_us + other_us
    if total > 0:
        report.details["triton_gpu_share"] = round(triton_us / total, 4)
        if total >= MIN_GPU_TIME_FOR_SHARE_US and triton_us / total < MIN_TRITON_GPU_SHARE:
            flags.append("decoy_kernel")
    return flags


def _storage_ptrs(tree) -> set:
    import torch
    from torch.utils._pytree import tree_leaves

    ptrs = set()
    for leaf in tree_leaves(tree):
        if isinstance(leaf, torch.Tensor) and leaf.numel() > 0:
            ptrs.add(leaf.untyped_storage().data_ptr())
        elif hasattr(leaf, "base") and isinstance(getattr(leaf, "base", None), torch.Tensor):
            ptrs.add(leaf.base.untyped_storage().data_ptr())  # a TensorDescriptor
    return ptrs


def _probe_stream(device: str) -> None:
    import torch

    torch.empty(1, device=device).fill_(0)


def _current_mode():
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    return _get_current_dispatch_mode()


# Copies that can change a dtype: ``.to``/``.long()``/``.bool()``/``type_as`` reach ``_to_copy``,
# a store into another tensor ``copy_``.
_CASTING_OPS = frozenset({"_to_copy", "copy_"})


def _floating_to_integers(op: str, args, out) -> bool:
    """Whether ``op`` (``_to_copy`` or ``copy_``) turned floating data into an integer or bool
    tensor: truncation or a comparison done by the copy, the whole answer of a rounding or masking
    task. Judged by the dtypes the tensors really have (an integer input narrowed to int32, a bool
    mask made int8, is a copy), which the static check cannot see."""
    import torch

    source, target = (args[1], args[0]) if op == "copy_" else (args[0], out)
    if not (isinstance(source, torch.Tensor) and isinstance(target, torch.Tensor)):
        return False
    floating = source.is_floating_point() or source.is_complex()
    return floating and not (target.is_floating_point() or target.is_complex())


def _make_dispatch_mode(audit: RuntimeAudit):
    from torch.utils._python_dispatch import TorchDispatchMode

    class _AuditMode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            report = audit.report
            name = func.overloadpacket.__name__
            report.ops[f"aten::{name}.{func._overloadname}"] += 1
            out = func(*args, **(kwargs or {}))
            if name in _CASTING_OPS and _floating_to_integers(name, args, out) and not _internal_caller():
                report.integer_casts += 1
            if report.kernel_storages and _storage_ptrs((args, kwargs)) & report.kernel_storages:
                report.kernel_storages |= _storage_ptrs(out)  # a copy or view of kernel output
            return out

    return _AuditMode()
