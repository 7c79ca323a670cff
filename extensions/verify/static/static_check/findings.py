"""The static check's verdict: flag vocabulary, collected findings and the report."""
from __future__ import annotations

from dataclasses import dataclass

FLAG_DESCRIPTIONS: dict[str, str] = {
    "syntax_error": "the code does not parse as Python",
    "no_modelnew": "no module-level class ModelNew",
    "no_triton_kernel": "no @triton.jit kernel (directly or under @triton.autotune/@triton.heuristics)",
    "no_kernel_launch": "no Triton kernel is launched (kernel[grid](...)) from the forward path",
    "torch_compute": "PyTorch computes in the forward path: torch.*/F.* calls, tensor math methods, "
                     "nn module calls, torch.ops, torch._C, super().forward, or a PyTorch op "
                     "referenced as a value anywhere (aliasing)",
    "library_gemm": "library GEMM/convolution (torch.matmul, F.linear, F.conv2d, '@', nn.Linear, "
                    "nn.Conv*) in the forward path while the policy forbids it",
    "try_except_fallback": "a try whose body launches a kernel or whose handler computes: a hidden "
                           "fallback when the kernel fails",
    "concurrency": "threads, processes, async code or subprocesses",
    "cuda_stream": "CUDA stream or graph creation, stream context or stream switching",
    "monkeypatch": "changes torch/triton/numpy/builtins/Model/sys.modules or overrides torch "
                   "dispatch (__torch_function__)",
    "dynamic_code": "dynamic imports, exec/eval/compile, reflection (getattr with computed names or "
                    "on torch/triton, globals(), vars(), __dict__, __class__, __subclasses__, ...)",
    "introspection": "frame, tracer or garbage-collector inspection (sys._getframe, inspect, gc, "
                     "traceback, ctypes, sys.settrace)",
    "io_access": "file, network, process, signal or environment access (open, os, pathlib, socket, "
                 "pickle, torch.load/save, os.environ)",
    "reference_model": "uses the reference class Model or imports the problem module",
    "numpy_compute": "NumPy (imported or reached through .numpy())",
    "kernel_escape": "a @triton.jit body uses Python objects (torch, mutable module globals, "
                     "non-jit helpers) that only the CPU interpreter would run",
    "interpreter_only": "a @triton.jit function uses Python that Triton's compiler refuses (break, "
                        "continue, try, raise, lambda, dict/set/generator comprehensions, a for "
                        "loop not over a range, in, @, item assignment, builtins such as abs or "
                        "sum, ...) or a libdevice function CUDA's libdevice lacks: only the CPU "
                        "interpreter runs it",
    "forbidden_import": "imports a module outside the allow-list (torch, torch.nn, "
                        "torch.nn.functional, torch.nn.init, torch.autograd, triton, "
                        "triton.language and its math/libdevice modules, math, itertools, typing, "
                        "functools, dataclasses)",
    "forbidden_builtin": "a builtin outside the allow-list (getattr, eval, open, type, vars, ...: "
                         "never, in any position), or a name the module does not define",
    "private_access": "a private or dunder name or attribute (only __init__ and the module's own "
                      "_names), frame/code/class-graph attributes, str.format field access",
    "forbidden_api": "an attribute chain outside the public kernel-writing API of torch/triton, a "
                     "context manager, base class (a tensor type among them) or assignment outside "
                     "the allow-list, a redefined nn.Module method, an attribute hiding an "
                     "nn.Module or tensor method",
    "hidden_code": "code that runs without being called by name: decorators outside the "
                   "allow-list, calls in default arguments or class bodies, class keywords",
    "unsafe_grid": "a launch grid that is not a tuple or a function returning tuples",
    "host_extraction": "tensor data handed to Python in the forward path (.tolist(), .item(), "
                       ".numpy(), .cpu(), float()/int()/bool() of tensor elements, math.* on them, "
                       "a tensor's truth value in if/while/and/or/not, tensor data formatted into "
                       "a string)",
    "host_cast_compute": "a cast of tensor data to an integer or bool dtype in the forward path "
                         "(.to(torch.int64), .long(), .int(), .bool(), .type(...), copy_ or item "
                         "assignment into an integer tensor): on a floating tensor it truncates or "
                         "compares, the math of a rounding or masking task",
}

_FLAG_ORDER = {flag: i for i, flag in enumerate(FLAG_DESCRIPTIONS)}
_MESSAGES_PER_FLAG = 4


@dataclass
class StaticReport:
    ok: bool  # no error and no cheating flag
    flags: list[str]  # from FLAG_DESCRIPTIONS, in its order
    errors: list[str]  # readable problems with line numbers, e.g. "line 12: torch.matmul in forward path"
    allowed_library_calls: list[str]  # library GEMM/conv calls seen when the policy allows them
    kernel_names: list[str]  # @triton.jit functions defined



# --- findings ----------------------------------------------------------------------------------

class Findings:
    def __init__(self) -> None:
        self._messages: dict[str, list[tuple[int, str]]] = {}
        self._allowed: list[tuple[int, str]] = []

    def flag(self, flag: str, node_or_line, message: str) -> None:
        line = node_or_line if isinstance(node_or_line, int) else getattr(node_or_line, "lineno", 0)
        entry = (line, message)
        bucket = self._messages.setdefault(flag, [])
        if entry not in bucket:
            bucket.append(entry)

    def allow(self, line: int, message: str) -> None:
        if (line, message) not in self._allowed:
            self._allowed.append((line, message))

    def has(self, flag: str) -> bool:
        return flag in self._messages

    def report(self, kernel_names: list[str]) -> StaticReport:
        flags = sorted(self._messages, key=_FLAG_ORDER.__getitem__)
        errors = []
        for flag in flags:
            entries = sorted(self._messages[flag])
            for line, message in entries[:_MESSAGES_PER_FLAG]:
                errors.append(f"line {line}: {message}")
            if len(entries) > _MESSAGES_PER_FLAG:
                errors.append(f"({flag}: {len(entries) - _MESSAGES_PER_FLAG} more)")
        allowed = [f"line {line}: {message}" for line, message in sorted(self._allowed)]
        return StaticReport(not flags, flags, errors, allowed, kernel_names)
