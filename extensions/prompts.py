"""The one prompt builder: SFT, RL and evaluation ask the model the same way.

A task is KernelBench-style PyTorch source (``class Model``, ``get_inputs``, ``get_init_inputs``);
the model answers with ``class ModelNew`` implemented with Triton kernels in a fenced Python block.
"""
from __future__ import annotations

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
- Keep parameters as `nn.Parameter`s initialised like the original so the weights match.
- Answer with the complete Python module in one ```python code block.

PyTorch module:
```python
{code}
```"""


def build_messages(task_code: str) -> list[dict[str, str]]:
    """Chat messages asking for a Triton rewrite of ``task_code``."""
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": INSTRUCTIONS.format(code=task_code.strip())},
    ]


def format_completion(triton_code: str) -> str:
    """The assistant turn SFT trains on: the solution in one fenced block."""
    return f"```python\n{triton_code.strip()}\n```"


EXAMPLES_INTRO = (
    "Worked examples: PyTorch modules similar to the task below, each rewritten with Triton kernels."
)

EXAMPLE_TEMPLATE = """\
Example {number}. PyTorch module:
```python
{task}
```
Triton rewrite:
```python
{solution}
```"""


def add_worked_examples(messages: list[dict[str, str]],
                        examples: list[tuple[str, str]]) -> list[dict[str, str]]:
    """``messages`` with (task, solution) pairs shown before the request in the last user turn."""
    if not examples:
        return messages
    shown = "\n\n".join(EXAMPLE_TEMPLATE.format(number=i, task=task.strip(), solution=solution.strip())
                        for i, (task, solution) in enumerate(examples, 1))
    *head, last = messages
    return [*head, {**last, "content": f"{EXAMPLES_INTRO}\n\n{shown}\n\nThe task.\n\n{last['content']}"}]


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
