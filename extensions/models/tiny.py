"""A tiny random causal LM with a locally trained tokenizer, saved like a hub checkpoint.

Used by the tests and by the ``--quick`` CPU dry runs of the benchmarks: a 2-layer Qwen2 with a
byte-level BPE tokenizer and a ChatML chat template, so every code path that loads a model by
directory (``ModelConfig.name_or_path``) runs without a download.
"""
from __future__ import annotations

from pathlib import Path

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_TRAINING_TEXTS = [
    "import torch\nimport torch.nn as nn\nimport triton\nimport triton.language as tl\n",
    "class ModelNew(nn.Module):\n    def __init__(self):\n        super().__init__()\n",
    "    def forward(self, x):\n        out = torch.empty_like(x)\n        return out\n",
    "@triton.jit\ndef relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):\n",
    "    pid = tl.program_id(0)\n    offs = pid * BLOCK + tl.arange(0, BLOCK)\n",
    "    mask = offs < n\n    x = tl.load(x_ptr + offs, mask=mask)\n    tl.store(out_ptr + offs, x, mask=mask)\n",
    "Rewrite the PyTorch module below with custom Triton kernels. ```python\n```",
    "You are an expert GPU kernel engineer. def get_inputs(): return [torch.randn(16, 16)]",
]
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _training_texts() -> list[str]:
    """Code snippets and the project's own prompt text: a real tokenizer encodes English and code
    compactly, and a tiny one trained on bytes of code alone would spend ~1,800 tokens on the
    instructions, leaving a test's SFT example no room within a 2,048-token window."""
    from ..prompting.templates import INSTRUCTIONS, SYSTEM_PROMPT, WORKED_EXAMPLE_SOLUTION, WORKED_EXAMPLE_TASK

    return _TRAINING_TEXTS * 4 + [SYSTEM_PROMPT, INSTRUCTIONS, WORKED_EXAMPLE_TASK, WORKED_EXAMPLE_SOLUTION]


def build_tiny_tokenizer(vocab_size: int = 512):
    """A byte-level BPE tokenizer (every string encodes and decodes exactly) with ChatML specials."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    backend.train_from_iterator(_training_texts(), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def build_tiny_qwen2(vocab_size: int, *, hidden_size: int = 64, num_layers: int = 2, seed: int = 0,
                     eos_token_id: int | None = None, pad_token_id: int | None = None):
    """A randomly initialised Qwen2 causal LM small enough to train in a CPU test."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=2048, tie_word_embeddings=True,
        eos_token_id=eos_token_id, pad_token_id=pad_token_id, bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = eos_token_id
    model.generation_config.pad_token_id = pad_token_id
    return model


def save_tiny_model(directory: str | Path, *, hidden_size: int = 64, num_layers: int = 2, seed: int = 0) -> Path:
    """Write a tiny Qwen2 + tokenizer to ``directory`` (loadable by ``extensions.models.loading``)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_qwen2(
        len(tokenizer), hidden_size=hidden_size, num_layers=num_layers, seed=seed,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


_TINY_TASK = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x) * {scale}


def get_inputs():
    return [torch.randn(16, {width})]


def get_init_inputs():
    return []
'''

_TINY_SOLUTION = '''import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_scale_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, tl.maximum(x, 0.0) * {scale}, mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        out = torch.empty_like(x)
        n = x.numel()
        relu_scale_kernel[(triton.cdiv(n, 256),)](x, out, n, BLOCK=256)
        return out
'''


def tiny_task_code(index: int) -> str:
    """A small KernelBench-style problem (ReLU times a constant), different per index."""
    return _TINY_TASK.format(scale=index + 2, width=16 * (index % 3 + 1))


def tiny_solution_code(index: int) -> str:
    """A correct Triton solution of ``tiny_task_code(index)``."""
    return _TINY_SOLUTION.format(scale=float(index + 2))


def tiny_sft_rows(count: int, start: int = 0) -> list[dict]:
    from ..prompting.templates import build_messages, format_completion

    return [{"uuid": f"tiny-{i}", "level": 1, "prompt": build_messages(tiny_task_code(i)),
             "completion": format_completion(tiny_solution_code(i))} for i in range(start, start + count)]


def tiny_rl_tasks(count: int, levels: tuple[int, ...] = (1, 2)) -> list[dict]:
    return [{"task_id": f"task-{i}", "level": levels[i % len(levels)], "name": f"relu_scale_{i}",
             "code": tiny_task_code(i)} for i in range(count)]
