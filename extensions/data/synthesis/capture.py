"""One program through torch inductor on a GPU: the generated code, the graph's inputs and the
autotuner's launch choices, turned into a KernelBook-format row.

``torch.compile`` runs with dynamic shapes (no duck sizing; parameters passed as arguments, so
their sizes are dynamic too), in inference, as one graph; GEMM and convolution programs ask for inductor's Triton templates instead of library
calls. A backend that records the graph's placeholders before handing it to inductor tells which
argument of the generated ``call(args)`` is which: a forward argument, a parameter, or a size of
one of them. From that the row's solution class is written: the task's constructor, and a forward
that builds ``args`` and returns ``call(args)[0]``.

Needs CUDA; nothing here is imported by the CPU paths.
"""
from __future__ import annotations

import ast
import inspect
import re
import time
import types
from dataclasses import dataclass, field
from typing import Any, Optional

from ..canonical import Canonical, CanonicalizeError, LaunchConfig, canonicalize
from .programs import Program

_ARGUMENT = re.compile(r"^L\['args'\]\[(\d+)\]")
_SOURCE_ATOMS = [
    (re.compile(r"\.size\(\)\[(\d+)\]"), r".size(\1)"),
    (re.compile(r"\.stride\(\)\[(\d+)\]"), r".stride(\1)"),
]
_SIMPLE_EXPRESSION = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*(\.(size|stride)\(\d+\))?$")


@dataclass
class Captured:
    ok: bool
    reason: str = ""  # why not, a short name
    detail: str = ""
    row: Optional[dict[str, Any]] = None
    seconds: float = 0.0
    rules: list[str] = field(default_factory=list)


def source_expression(name: str, argument_names: list[str]) -> Optional[str]:
    """Dynamo's source name of a graph input (``L['args'][2]``, ``L['args'][0].size()[1]``) as an
    expression over ``self`` and the forward's arguments: ``args[i]`` is ``argument_names[i]``."""
    match = _ARGUMENT.match(name)
    if not match or int(match.group(1)) >= len(argument_names):
        return None
    text = argument_names[int(match.group(1))] + name[match.end():]
    for pattern, replacement in _SOURCE_ATOMS:
        text = pattern.sub(replacement, text)
    return text if _SIMPLE_EXPRESSION.match(text) else None


def solution_class(task_source: str, call_arguments: list[str]) -> str:
    """``class ModelNew``: the task's class with its forward replaced by one ``call``."""
    tree = ast.parse(task_source)
    model = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model")
    model.name = "ModelNew"
    for item in model.body:
        if isinstance(item, ast.FunctionDef) and item.name == "forward":
            item.body = ast.parse(f"return call([{', '.join(call_arguments)}])[0]").body
    return ast.unparse(model)


def _launch_configs(module: types.ModuleType) -> dict[str, LaunchConfig]:
    configs = {}
    for name, value in vars(module).items():
        launchers = getattr(value, "launchers", None)
        if launchers:
            config = launchers[0].config
            configs[name] = LaunchConfig(dict(config.kwargs), int(config.num_warps), int(config.num_stages))
    return configs


def _load(source: str) -> types.ModuleType:
    """The program as a module registered in ``sys.modules`` (dynamo resolves a function's globals
    through its module)."""
    import hashlib
    import sys

    name = "synthesized_program_" + hashlib.sha256(source.encode()).hexdigest()[:12]
    module = types.ModuleType(name)
    module.__file__ = f"{name}.py"
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    sys.modules[name] = module
    return module


def capture(program: Program) -> Captured:
    """Compile ``program`` with inductor on the current CUDA device and build its row."""
    import torch
    import torch._dynamo
    import torch._inductor.config as inductor_config
    from torch._inductor.codecache import PyCodeCache
    from torch._inductor.compile_fx import compile_fx
    from torch._inductor.utils import run_and_get_code

    started = time.perf_counter()

    def failed(reason: str, detail: str = "") -> Captured:
        return Captured(False, reason, detail[:300], seconds=time.perf_counter() - started)

    try:
        task = _load(program.source)
        torch.manual_seed(0)
        model = task.Model(*task.get_init_inputs()).cuda().eval()
        inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in task.get_inputs()]
    except Exception as exc:  # noqa: BLE001 - a program that does not run is counted, not fatal
        return failed("program_does_not_run", f"{type(exc).__name__}: {exc}")

    # Parameters and buffers go in as arguments (copies, so dynamo cannot trace back to the module's
    # own): module attributes are compiled at their sizes, arguments with dynamic ones, and the
    # verifier builds ModelNew at other constructor sizes.
    state_names = [name for name, _ in model.named_parameters()] + [name for name, _ in model.named_buffers()]
    state = dict(model.named_parameters())
    state.update(dict(model.named_buffers()))
    forward_names = list(inspect.signature(model.forward).parameters)
    argument_names = [f"self.{name}" for name in state_names] + forward_names

    def functional(*args):
        return torch.func.functional_call(model, dict(zip(state_names, args[:len(state_names)])),
                                          tuple(args[len(state_names):]))

    placeholders: list[list[str]] = []

    def recording_backend(graph_module, example_inputs):
        names = []
        for node in graph_module.graph.nodes:
            if node.op == "placeholder":
                source = getattr(node.meta.get("grapharg"), "source", None)
                name = getattr(source, "name", "") if source is not None else ""
                names.append(name() if callable(name) else str(name))  # a method before torch 2.12
        placeholders.append(names)
        return compile_fx(graph_module, example_inputs)

    torch._dynamo.reset()
    patches: dict[str, Any] = {"triton.cudagraphs": False}
    if program.uses_templates:
        patches.update({"max_autotune": True, "max_autotune_gemm_backends": "TRITON",
                        "max_autotune_conv_backends": "TRITON"})
    before = len(PyCodeCache.modules)
    try:
        with inductor_config.patch(patches), torch._dynamo.config.patch(
                automatic_dynamic_shapes=True, specialize_float=True), \
                torch.fx.experimental._config.patch(use_duck_shape=False), torch.no_grad():
            compiled = torch.compile(functional, backend=recording_backend, dynamic=True, fullgraph=True)
            _, codes = run_and_get_code(compiled, *[state[name].detach().clone() for name in state_names], *inputs)
    except Exception as exc:  # noqa: BLE001
        lines = [line for line in str(exc).splitlines() if line.strip() and not line.startswith("Set TORCHDYNAMO")]
        return failed("inductor_failed", f"{type(exc).__name__}: {' | '.join(lines[-2:])}")
    if len(codes) != 1 or len(placeholders) != 1:
        return failed("not_one_graph", f"{len(codes)} codes, {len(placeholders)} graphs")
    arguments = [source_expression(name, argument_names) for name in placeholders[0]]
    if not all(arguments):
        return failed("unmappable_graph_input", str(placeholders[0]))
    configs: dict[str, LaunchConfig] = {}
    for module in PyCodeCache.modules[before:]:
        configs.update(_launch_configs(module))
    raw = codes[0].rstrip() + "\n\n\n" + solution_class(program.source, arguments) + "\n"
    try:
        canonical: Canonical = canonicalize(raw, configs)
    except CanonicalizeError as exc:
        return failed(exc.reason, exc.detail)
    row = {
        "uuid": f"synth-{program.digest}",
        "entry_point": "Model",
        "python_code": program.source,
        "triton_code": canonical.code,
        "original_triton_code": raw,
        "repo_name": "synthesized",
        "module_name": program.name,
        "synthetic": True,
        "licenses": [],
        "stars": 0,
        "sha": program.digest,
        "repo_link": "",
    }
    return Captured(True, row=row, seconds=time.perf_counter() - started, rules=canonical.rules)
