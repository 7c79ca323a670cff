"""Programs compared by what they compute: traced ATen operator graphs with shapes abstracted.

Text similarity (``dedup``) misses a copy spelled another way: ``nn.GELU()``, ``F.gelu`` and
``torch.nn.functional.gelu`` share few tokens, but all three run ``aten.gelu``. Here a
KernelBench-form program (``class Model``, ``get_inputs``, ``get_init_inputs``) is built on the
meta device and traced with ``make_fx`` under fake tensors (no data, no real compute), with its
parameters and buffers as graph inputs and mutations functionalised, and the graph is reduced to
two hashes:

``graph``
    The exact ATen graph: every node's overload (``aten.add.Tensor``) and its non-tensor
    arguments, with numbers (sizes, shapes, scalar constants) abstracted to ``#``; booleans,
    strings and dtypes kept, since they pick the function (``approximate='tanh'``, ``keepdim``).
``computation``
    The same dataflow graph, coarser: the nodes that only move or re-label data (view, reshape,
    expand, permute, transpose, squeeze, clone, contiguous, detach, dtype casts) are passed
    through, operators are named without their overload (``aten.add``), and only booleans and
    strings of the arguments stay. **Two programs are the same computation when their
    ``computation`` hashes are equal**; the decontamination rules drop on that, and report whether
    the exact graph matched too.

A node's label is a hash of its operator, its abstracted arguments, the labels of its tensor
inputs (sorted for commutative operators) and which of those inputs are the same node, so
``x * x`` differs from ``x * y``; graph inputs are all alike, so a weight held as a parameter and
the same tensor passed to ``forward`` are the same computation. Nodes that do not reach the output
do not count. Dropout is traced in eval mode, where it is the identity.

What is *not* the same computation: a formula written out by hand is not recognised as the
library operator it equals. ``x * 0.5 * (1 + torch.erf(x / math.sqrt(2)))`` is GELU, but it traces
to ``mul``/``div``/``erf``/``add`` nodes, not ``aten.gelu``; recognising it needs algebra on the
graph, which this does not attempt (the text rule still applies to such rows).

Programs that fail to trace (an exception, a timeout, more than ``MAX_TRACED_OPERATORS``
operator calls, a branch on data) get a signature with ``error`` set: the caller counts them as untraceable and keeps
its text rule for them; nothing is dropped for failing to trace.

Row code runs as the data stage runs it when verifying pairs: in a separate process
(``SignatureTracer``), here one long-lived worker with a per-program timeout that is replaced when
a program hangs or kills it. Signatures are cached by the program's content hash, this module's
code and the torch version, in memory and in a JSON-lines file (``$KERNEL_RL_SIGNATURE_CACHE``,
else ``~/.cache/kernel-rl/operator_signatures.jsonl``), so a re-run traces nothing twice and starts
no worker. A timeout is cached too (the recurrent KernelBench level-3 models trace for minutes):
delete the file to try again on a less loaded machine.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import operator
import os
import select
import subprocess
import sys
import tempfile
import time
import types
import warnings
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Hashable, Iterable, Optional

# Operators that only re-label, move or copy data: passed through in the ``computation`` hash.
LAYOUT_OPS = frozenset({
    "aten.view", "aten._unsafe_view", "aten.reshape", "aten.expand", "aten.expand_as", "aten.view_as",
    "aten.t", "aten.transpose", "aten.permute", "aten.squeeze", "aten.unsqueeze", "aten.flatten",
    "aten.unflatten", "aten.clone", "aten.contiguous", "aten.detach", "aten.alias", "aten.lift_fresh_copy",
    "aten._to_copy", "aten.to", "aten.copy", "aten.view_copy", "aten._reshape_alias", "aten.as_strided",
    "aten.alias_copy", "aten.t_copy", "aten.transpose_copy", "aten.permute_copy", "aten.squeeze_copy",
    "aten.unsqueeze_copy", "aten.expand_copy",
})
# Copies that leave data as it is: passed through in both hashes.
IDENTITY_OPS = frozenset({"aten.clone", "aten.contiguous", "aten.detach", "aten.alias", "aten.lift_fresh_copy"})
COMMUTATIVE_OPS = frozenset({
    "aten.add", "aten.mul", "aten.maximum", "aten.minimum", "aten.eq", "aten.ne", "aten.logical_and",
    "aten.logical_or", "aten.logical_xor", "aten.bitwise_and", "aten.bitwise_or", "aten.bitwise_xor",
    "aten.hypot", "aten.fmax", "aten.fmin",
})
DEFAULT_TIMEOUT_S = 10.0
MAX_TRACED_OPERATORS = 5000  # KernelBench's largest level-3 CNN (DenseNet201) calls about 2000
CACHE_ENV = "KERNEL_RL_SIGNATURE_CACHE"
_WORKER_START_TIMEOUT_S = 180.0  # importing torch and the first trace, on a loaded machine


@dataclass(frozen=True)
class Signature:
    """What a program computes, or why that could not be found (``error``)."""

    graph: Optional[str] = None  # the exact ATen graph's hash
    computation: Optional[str] = None  # the coarse graph's hash: equal means the same computation
    ops: tuple[str, ...] = ()  # the compute operators in traced order, for reports
    error: str = ""  # why the program did not trace (then both hashes are None)

    @property
    def traceable(self) -> bool:
        return self.computation is not None

    def to_dict(self) -> dict[str, Any]:
        return {"graph": self.graph, "computation": self.computation, "ops": list(self.ops), "error": self.error}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Signature":
        return cls(data.get("graph"), data.get("computation"), tuple(data.get("ops") or ()), data.get("error") or "")


def cache_path() -> Path:
    return Path(os.environ.get(CACHE_ENV) or "~/.cache/kernel-rl/operator_signatures.jsonl").expanduser()


@lru_cache(maxsize=1)
def _code_digest() -> str:
    import torch

    return hashlib.sha256(Path(__file__).read_bytes() + torch.__version__.encode()).hexdigest()[:16]


def content_key(source: str, entry_point: str = "Model") -> str:
    """The cache key: the program, its entry point, this module's code and the torch version."""
    return hashlib.sha256(f"{_code_digest()}\0{entry_point}\0{source}".encode("utf-8", "surrogatepass")).hexdigest()


# -- the graph to hashes -------------------------------------------------------------------------------
def _op_names(target) -> tuple[str, str]:
    """(overload name, packet name without an in-place underscore) of a call target."""
    if target is operator.getitem:
        return "getitem", "getitem"
    overload = str(target)
    packet = str(getattr(target, "overloadpacket", target))
    if packet.endswith("_") and not packet.endswith("__"):
        packet = packet[:-1]
    return overload, packet


def _abstract(value: Any, labels: dict, exact: bool) -> Any:
    """A non-tensor argument with numbers abstracted (and, in the coarse view, all but bools and
    strings dropped); a node becomes its label."""
    import torch
    from torch.fx import Node

    if isinstance(value, Node):
        return labels[value]
    if isinstance(value, bool) or isinstance(value, str) or value is None:
        return value
    if isinstance(value, (int, float, complex, torch.SymInt, torch.SymFloat)):
        return "#" if exact else "_"
    if isinstance(value, (list, tuple)):
        items = [_abstract(v, labels, exact) for v in value]
        if all(item in ("#", "_") for item in items):  # a shape or a list of sizes, whatever its length
            return "[#]" if exact else "_"
        return tuple(items)
    if isinstance(value, torch.dtype):
        return str(value) if exact else "_"
    return "_"  # devices, layouts, memory formats: where data lives, not what is computed


def _digest(value: Any) -> str:
    return hashlib.sha256(repr(value).encode()).hexdigest()[:20]


def graph_hashes(graph) -> tuple[str, str, tuple[str, ...]]:
    """(exact hash, computation hash, compute ops) of an FX graph of ATen operators."""
    from torch.fx import Node

    exact: dict[Node, str] = {}
    coarse: dict[Node, str] = {}
    ops: list[str] = []
    output = None
    for node in graph.nodes:
        if node.op == "placeholder":
            exact[node] = coarse[node] = "input"
        elif node.op == "get_attr":
            exact[node] = coarse[node] = "constant"
        elif node.op == "output":
            output = node
        elif node.op == "call_function":
            overload, packet = _op_names(node.target)
            tensor_args = [a for a in node.args if isinstance(a, Node)]
            if packet in IDENTITY_OPS and tensor_args:
                exact[node], coarse[node] = exact[tensor_args[0]], coarse[tensor_args[0]]
                continue
            exact[node] = _node_label(node, overload, packet, exact, exact=True)
            if packet in LAYOUT_OPS and tensor_args:
                coarse[node] = coarse[tensor_args[0]]
            else:
                coarse[node] = _node_label(node, packet, packet, coarse, exact=False)
                if packet != "getitem":
                    ops.append(packet)
        else:  # call_module / call_method do not appear in make_fx graphs
            raise ValueError(f"unexpected node kind {node.op}")
    if output is None:
        raise ValueError("graph without an output")
    outputs = output.args[0] if isinstance(output.args[0], (list, tuple)) else [output.args[0]]
    return (_digest([_abstract(o, exact, True) for o in outputs]),
            _digest([_abstract(o, coarse, False) for o in outputs]), tuple(ops))


def _arguments(node) -> list:
    """The call's arguments in schema order with the defaults filled in: ``leaky_relu(x)`` and
    ``leaky_relu(x, 0.2)`` are one operator on one tensor, whether or not the slope was written."""
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return [*node.args, *(v for _, v in sorted(node.kwargs.items()))]
    values = []
    for position, argument in enumerate(schema.arguments):
        if position < len(node.args):
            values.append(node.args[position])
        elif argument.name in node.kwargs:
            values.append(node.kwargs[argument.name])
        else:
            values.append(argument.default_value if argument.has_default_value() else None)
    return values


def _node_label(node, name: str, packet: str, labels: dict, exact: bool) -> str:
    from torch.fx import Node

    values = _arguments(node)
    args = [_abstract(a, labels, exact) for a in values]
    tensors = [a for a in values if isinstance(a, Node)]
    if packet in COMMUTATIVE_OPS and len(args) >= 2 and isinstance(values[0], Node) and isinstance(values[1], Node):
        args[:2] = sorted(args[:2])
    if packet == "getitem":
        args[1] = node.args[1]  # which output of a multi-output operator: part of the dataflow
    # Which tensor inputs are one node: x * x is not x * y, though both inputs read "input".
    sharing = [next(i for i, t in enumerate(tensors) if t is tensor) for tensor in tensors]
    return _digest((name, args, sharing))


# -- tracing (runs row code: call it in a worker, see SignatureTracer) ---------------------------------
class GraphTooLarge(RuntimeError):
    """The program runs more operators than a signature is taken of."""


def _operator_budget(limit: int):
    """A dispatch mode that stops a trace after ``limit`` operator calls: a recurrent model unrolled
    over hundreds of time steps would otherwise trace for minutes only to be called untraceable."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class OperatorBudget(TorchDispatchMode):
        calls = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.calls += 1
            if self.calls > limit:
                raise GraphTooLarge(f"more than {limit} operator calls")
            return func(*args, **(kwargs or {}))

    return OperatorBudget()


def trace_graph(source: str, entry_point: str = "Model"):
    """The ATen graph of ``entry_point(*get_init_inputs())`` applied to ``get_inputs()``, traced on
    the meta device under fake tensors. Executes ``source``."""
    import torch
    from torch.func import functional_call, functionalize
    from torch.fx.experimental.proxy_tensor import make_fx

    module = types.ModuleType("traced_program")
    with torch.device("meta"):
        exec(compile(source, "<program>", "exec"), module.__dict__)  # noqa: S102 - see the module docstring
        model_class = getattr(module, entry_point, None)
        if model_class is None:
            raise ValueError(f"no {entry_point} in the program")
        init_inputs = module.get_init_inputs()
        if isinstance(init_inputs, dict):
            model = model_class(**init_inputs)
        else:
            model = model_class(*init_inputs)
        inputs = list(module.get_inputs())
    model.eval()
    state = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    names = list(state)

    def run(params, *args):
        with _operator_budget(MAX_TRACED_OPERATORS):
            return functional_call(model, dict(zip(names, params)), args)

    traced = make_fx(functionalize(run), tracing_mode="fake", _allow_non_fake_inputs=True)(list(state.values()), *inputs)
    return traced.graph


def trace_signature(source: str, entry_point: str = "Model") -> Signature:
    """The signature of ``source``, in this process; never raises for the program's faults."""
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            graph = trace_graph(source, entry_point)
        exact, coarse, ops = graph_hashes(graph)
        return Signature(exact, coarse, ops)
    except Exception as exc:  # noqa: BLE001 - any failure of the program makes it untraceable
        return Signature(error=f"{type(exc).__name__}: {str(exc)[:200]}")


def serve(requests, replies) -> None:
    """The worker's loop: one JSON request per line (``source``, ``entry_point``) in, one JSON
    signature per line out, until the input closes."""
    import torch

    torch.set_num_threads(1)
    os.chdir(tempfile.mkdtemp(prefix="operator-graph-"))  # a program that writes files writes them here
    trace_signature(_WARM_UP)
    replies.write(json.dumps({"ready": True}) + "\n")
    replies.flush()
    for line in requests:
        request = json.loads(line)
        replies.write(json.dumps(trace_signature(request["source"], request["entry_point"]).to_dict()) + "\n")
        replies.flush()


_WARM_UP = ("import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x + 1\n"
            "def get_inputs():\n    return [torch.rand(2)]\ndef get_init_inputs():\n    return []\n")
# The worker answers on a private copy of its stdout: whatever a program prints goes to stderr.
_WORKER = ("import os, sys\nreplies = os.fdopen(os.dup(1), 'w')\nos.dup2(2, 1)\n"
           "from extensions.data.operator_graph import serve\nserve(sys.stdin, replies)\n")


# -- the tracer: a worker process with a timeout, and a cache ------------------------------------------
@dataclass
class SignatureTracer:
    """Signatures of programs, each traced in a worker process under ``timeout_s``.

    Use as a context manager (or call ``close``). A program that times out or kills the worker is
    untraceable, and the next program gets a fresh worker; a worker that cannot start makes every
    program untraceable rather than failing the caller.
    """

    timeout_s: float = DEFAULT_TIMEOUT_S
    cache_file: Optional[Path] = None  # None: cache_path(); the in-memory cache always applies
    persist: bool = True  # read and append the cache file
    cache: dict[str, Signature] = field(default_factory=dict)
    traced: int = 0  # programs traced by the worker (not found in a cache)
    seconds: float = 0.0
    _process: Optional[subprocess.Popen] = None
    _fresh: dict[str, Signature] = field(default_factory=dict)
    _loaded: bool = False

    def __enter__(self) -> "SignatureTracer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _load(self) -> None:
        self._loaded = True
        path = self.cache_file or cache_path()
        if not self.persist or not path.is_file():
            return
        with open(path, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                try:
                    row = json.loads(line)
                    self.cache.setdefault(row["key"], Signature.from_dict(row))
                except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
                    continue  # a line cut short by a dying machine

    def _save(self) -> None:
        entries, self._fresh = self._fresh, {}
        if not self.persist or not entries:
            return
        path = self.cache_file or cache_path()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a", encoding="utf-8") as handle:
                fcntl.flock(handle, fcntl.LOCK_EX)
                for key, signature in entries.items():
                    handle.write(json.dumps({"key": key, **signature.to_dict()}) + "\n")
        except OSError as exc:  # an unwritable cache costs a re-trace next time, never the run
            print(f"warning: signature cache {path} cannot be written ({exc.strerror or exc})", file=sys.stderr)

    def close(self) -> None:
        self._save()
        if self._process is None:
            return
        self._process.stdin.close()
        try:
            self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._process.stdout.close()
        self._process = None

    def _kill(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            for stream in (self._process.stdin, self._process.stdout):
                with contextlib.suppress(OSError):
                    stream.close()
        self._process = None

    def _reply(self, timeout_s: float) -> Optional[dict]:
        """The worker's next line, or None when it is late or gone."""
        ready, _, _ = select.select([self._process.stdout], [], [], timeout_s)
        if not ready:
            return None
        line = self._process.stdout.readline()
        return json.loads(line) if line else None

    def _start(self) -> Optional[str]:
        root = Path(__file__).resolve().parents[2]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])),
               "CUDA_VISIBLE_DEVICES": ""}  # meta tensors only: the worker needs no GPU
        try:
            self._process = subprocess.Popen([sys.executable, "-c", _WORKER], stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        except OSError as exc:
            return f"the tracing worker did not start ({exc})"
        if self._reply(_WORKER_START_TIMEOUT_S) is None:
            self._kill()
            return "the tracing worker did not start"
        return None

    def signature(self, source: str, entry_point: str = "Model") -> Signature:
        if not self._loaded:
            self._load()
        key = content_key(source, entry_point)
        if key in self.cache:
            return self.cache[key]
        started = time.time()
        result = self._trace(source, entry_point)
        self.seconds += time.time() - started
        self.traced += 1
        self.cache[key] = result
        self._fresh[key] = result
        return result

    def _trace(self, source: str, entry_point: str) -> Signature:
        if self._process is None:
            failure = self._start()
            if failure:
                return Signature(error=failure)
        try:
            self._process.stdin.write(json.dumps({"source": source, "entry_point": entry_point}) + "\n")
            self._process.stdin.flush()
            reply = self._reply(self.timeout_s)
        except (OSError, ValueError) as exc:
            self._kill()
            return Signature(error=f"the tracing worker died ({type(exc).__name__})")
        if reply is None:
            late = self._process.poll() is None
            self._kill()
            return Signature(error=f"timeout: no graph in {self.timeout_s:g} s" if late else "the tracing worker died")
        return Signature.from_dict(reply)

    def signatures(self, sources: Iterable[str], entry_point: str = "Model") -> list[Signature]:
        return [self.signature(source, entry_point) for source in sources]


# -- matching ------------------------------------------------------------------------------------------
@dataclass
class ComputationMatch:
    key: Hashable  # the indexed program it matches
    exact: bool  # the exact ATen graph matched too


@dataclass
class ComputationIndex:
    """Signatures of reference programs (the evaluation tasks), searchable by computation."""

    _by_computation: dict[str, list[tuple[Hashable, Optional[str]]]] = field(default_factory=dict)
    untraceable: list[Hashable] = field(default_factory=list)

    def __len__(self) -> int:
        return sum(len(v) for v in self._by_computation.values())

    def add(self, key: Hashable, signature: Signature) -> None:
        if not signature.traceable:
            self.untraceable.append(key)
            return
        self._by_computation.setdefault(signature.computation, []).append((key, signature.graph))

    def match(self, signature: Signature) -> Optional[ComputationMatch]:
        """The first indexed program that is the same computation (an exact-graph match first)."""
        if not signature.traceable:
            return None
        entries = self._by_computation.get(signature.computation)
        if not entries:
            return None
        for key, graph in entries:
            if graph == signature.graph:
                return ComputationMatch(key, True)
        return ComputationMatch(entries[0][0], False)
