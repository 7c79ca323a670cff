"""The prompt templates: the system prompt, the instructions, the worked example and the message
layout of a task, its answer and its refinement turns. ``extensions.prompting.builder`` assembles a
task's prompt from these (with retrieved examples in ``raicl`` mode), so SFT, RL and evaluation ask
the model the same way.

A task is KernelBench-style PyTorch source (``class Model``, ``get_inputs``, ``get_init_inputs``);
the model answers with ``class ModelNew`` implemented with Triton kernels in a fenced Python block.

The conversation opens with one worked example (a user turn with a small task, an assistant turn
with its verified Triton answer): small code models asked without one write no launchable kernel at
all, and with it most of their answers compile, which is what gives RL rewards to learn from. The
example's operation (a scaled absolute difference) is deliberately none of the KernelBench level 1-2
problems nor a bundled task, so it leaks no answer; ``WORKED_EXAMPLE_TASK`` is exposed so that
benchmark splits can decontaminate against it too.
"""
from __future__ import annotations

import hashlib

SYSTEM_PROMPT = (
    "You are an expert GPU kernel engineer. You rewrite PyTorch modules as fast, correct Triton "
    "kernels."
)

INSTRUCTIONS = """\
Rewrite the PyTorch module below with custom Triton kernels.

Requirements:
- Define `class ModelNew(nn.Module)` with the same constructor arguments as `Model`.
- `ModelNew.forward` must compute the same outputs as `Model.forward` (same shapes and dtypes).
- Do the computation in `@triton.jit` kernels launched from `forward`; do not call PyTorch \
operators (torch.matmul, F.relu, ...) for the math, and do not use `Model`.
- A kernel sees only its own arguments: pass every value it needs (tensors, sizes, attributes such \
as `self.alpha`) as an argument, and use only `tl.*` operations inside it (no `self`, no `torch`).
- Keep parameters as `nn.Parameter`s initialised like the original so the weights match.
- fp32 outputs are checked against PyTorch's fp32 within 1e-4: call `tl.dot` with \
`input_precision="ieee"` (its default for fp32, TF32, is too coarse).
- Answer with the complete Python module in one ```python code block.

PyTorch module:
```python
{code}
```"""


WORKED_EXAMPLE_TASK = """\
import torch
import torch.nn as nn

SIZE = 4096


class Model(nn.Module):
    def __init__(self, alpha: float):
        super().__init__()
        self.alpha = alpha

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.abs(x - y) * self.alpha


def get_inputs():
    return [torch.randn(SIZE), torch.randn(SIZE)]


def get_init_inputs():
    return [0.5]
"""

WORKED_EXAMPLE_SOLUTION = """\
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def scaled_abs_diff_kernel(x_ptr, y_ptr, out_ptr, alpha, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
    y = tl.load(y_ptr + offsets, mask=mask, other=0.0)
    tl.store(out_ptr + offsets, tl.abs(x - y) * alpha, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, alpha: float):
        super().__init__()
        self.alpha = alpha

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = y.contiguous()
        out = torch.empty_like(x)
        n_elements = out.numel()
        BLOCK_SIZE = 1024
        grid = (triton.cdiv(n_elements, BLOCK_SIZE),)
        scaled_abs_diff_kernel[grid](x, y, out, self.alpha, n_elements, BLOCK_SIZE=BLOCK_SIZE)
        return out
"""


def build_messages(task_code: str) -> list[dict[str, str]]:
    """Chat messages asking for a Triton rewrite of ``task_code``, after the worked example."""
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": INSTRUCTIONS.format(code=WORKED_EXAMPLE_TASK.strip())},
        {"role": "assistant", "content": format_completion(WORKED_EXAMPLE_SOLUTION)},
        {"role": "user", "content": INSTRUCTIONS.format(code=task_code.strip())},
    ]


def format_completion(triton_code: str) -> str:
    """The assistant turn SFT trains on: the solution in one fenced block."""
    return f"```python\n{triton_code.strip()}\n```"


# How retrieved examples are laid out, recorded with generations so that saved answers to prompts
# laid out another way are not reused.
EXAMPLES_AS = "chat_turns"
CLOSING_LINE = "Answer with `class ModelNew` and the `@triton.jit` kernels it launches."


def add_worked_examples(messages: list[dict[str, str]],
                        examples: list[tuple[str, str]]) -> list[dict[str, str]]:
    """``messages`` with each (task, solution) pair shown as an earlier exchange, best match last.

    Each example is a user turn with its task and an assistant turn with its Triton rewrite, the
    shape of the fixed worked example: small models given the examples inside one long user turn
    mostly copied the task's ``class Model`` back instead of answering it (measured on the smoke
    model: 10 of 28 answers defined ``ModelNew``, against 22 of 28 as separate turns).
    """
    if not examples:
        return messages
    *head, last = messages
    shown = []
    for task, solution in reversed(examples):  # the most similar example sits next to the task
        shown += [{"role": "user", "content": INSTRUCTIONS.format(code=task.strip())},
                  {"role": "assistant", "content": format_completion(solution)}]
    return [*head, *shown, {**last, "content": f"{last['content']}\n\n{CLOSING_LINE}"}]


REFINE_INSTRUCTIONS = """\
The verifier checked your previous answer.

{feedback}

Write an improved version: the complete Python module with `class ModelNew` in one ```python code \
block."""


def refinement_turns(previous_response: str, feedback: str) -> list[dict[str, str]]:
    """The chat turns a refinement adds: the model's own previous answer, then the verdict on it."""
    return [
        {"role": "assistant", "content": previous_response},
        {"role": "user", "content": REFINE_INSTRUCTIONS.format(feedback=feedback.strip())},
    ]


def prompt_text_digest() -> str:
    """A short digest of the fixed prompt text: saved answers to prompts worded otherwise are not
    reused."""
    text = "\0".join((SYSTEM_PROMPT, INSTRUCTIONS, WORKED_EXAMPLE_TASK, WORKED_EXAMPLE_SOLUTION,
                      CLOSING_LINE, REFINE_INSTRUCTIONS))
    return hashlib.sha256(text.encode()).hexdigest()[:12]
