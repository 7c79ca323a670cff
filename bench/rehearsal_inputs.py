"""Inputs of the production rehearsal (``bench/production_rehearsal.py``): KernelBench tasks, the
real kernels of the test fixtures, a locally trained tokenizer, a randomly initialised Qwen2 of any
size, and synthetic SFT rows. Nothing is downloaded."""
from __future__ import annotations

import ast
import json
import math
import random
import re
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
FIXTURES = PROJECT_ROOT / "tests" / "fixtures" / "candidates" / "kernelbench"
QWEN25_7B = dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                 num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=32768,
                 rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=False)
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=False)
TOKENIZER_VOCAB = 2048  # ~3.5 characters per token on the KernelBench sources, like Qwen's on code
_PROBLEM_HEADER = re.compile(r"^#\s*kernelbench:\s*level=(\d+)\s+problem_id=(\d+)", re.M)


def read_kernelbench(path: Path) -> list[dict]:
    if not path.is_file():
        raise SystemExit(f"--kernelbench: {path} not found (a JSONL of level, problem_id, name, code)")
    tasks = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        row = json.loads(line)
        if not all(k in row for k in ("level", "problem_id", "name", "code")):
            raise SystemExit(f"{path}:{number}: a KernelBench row needs level, problem_id, name and code")
        tasks.append({"task_id": f"L{row['level']}_{row['problem_id']}_{row['name']}", "level": int(row["level"]),
                      "key": [int(row["level"]), int(row["problem_id"])], "code": row["code"]})
    return tasks


def read_fixture_kernels() -> dict[tuple[int, int], str]:
    kernels = {}
    for path in sorted(FIXTURES.glob("*.py")):
        text = path.read_text()
        header = _PROBLEM_HEADER.search(text)
        if header:
            kernels[(int(header.group(1)), int(header.group(2)))] = text
    return kernels


def sample_variant(kernel: str, sample: int) -> str:
    """The kernel with its @triton.jit functions renamed for this sample: same program, new text."""
    names = [node.name for node in ast.walk(ast.parse(kernel)) if isinstance(node, ast.FunctionDef)
             and any("jit" in ast.unparse(d) for d in node.decorator_list)]
    for name in names:
        kernel = re.sub(rf"\b{name}\b", f"{name}_s{sample}", kernel)
    return f"Here is the Triton version.\n\n```python\n{kernel.strip()}\n```\n"


def build_code_tokenizer(texts: list[str], vocab_size: int):
    """A byte-level BPE tokenizer trained on ``texts``, with ChatML specials and chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from extensions.models.loading import DEFAULT_CHAT_TEMPLATE, prepare_tokenizer

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    backend.train_from_iterator(texts, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                        additional_special_tokens=["<|im_start|>"])
    tokenizer.chat_template = DEFAULT_CHAT_TEMPLATE
    prepare_tokenizer(tokenizer)
    return tokenizer


def build_random_model(dims: dict, tokenizer, device, dtype, seed: int):
    """A Qwen2 of ``dims`` built on the meta device, then materialised on ``device`` and initialised
    there (a 7B model never touches CPU memory)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**dims, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                         bos_token_id=None, attn_implementation="sdpa")
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # rotary frequencies are built in fp32 explicitly and stay so
    try:
        with torch.device("meta"):
            model = Qwen2ForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    model.to_empty(device=device)
    torch.manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            for tensor in (*module.parameters(recurse=False), *module.buffers(recurse=False)):
                tensor.__dict__.pop("_is_hf_initialized", None)
            model._init_weights(module)
    model.config.use_cache = False
    return model


def synthetic_sft_examples(count: int, median: int, max_len: int, vocab: int, seed: int):
    """Rows of log-normal length (KernelBook-like long tail), 40% of each a masked prompt."""
    from extensions.training.batching import IGNORE_INDEX, TokenizedExample

    rng = random.Random(seed)
    examples = []
    for _ in range(count):
        length = max(32, min(max_len, int(math.exp(rng.gauss(math.log(median), 0.8)))))
        ids = [rng.randrange(3, vocab) for _ in range(length)]
        prompt = int(length * 0.4)
        examples.append(TokenizedExample(input_ids=ids, labels=[IGNORE_INDEX] * prompt + ids[prompt:]))
    return examples


def select_tasks(args, cfg, tasks: list[dict], fixtures: dict, world: int) -> tuple[list, int, list, int, int]:
    """(RL tasks, RL tasks per batch, evaluation tasks, evaluation tasks per batch, evaluation task count).

    Each rank gets the batch shape it has in the full run on ``--target-gpus`` GPUs. Its first RL
    batch holds the longest prompts the data preparation lets through (the largest KV cache), the
    next ones the tasks that have a real kernel, so their verification runs real GPU work.
    """
    rl, ev = cfg.rl, cfg.eval
    rl_per_batch = min(max(1, rl.generation_batch_size // rl.samples_per_task), math.ceil(rl.tasks_per_round / args.target_gpus))
    pool = [t for t in tasks if t["level"] in (1, 2)]
    random.Random(cfg.run.seed).shuffle(pool)
    pool.sort(key=lambda t: tuple(t["key"]) not in fixtures)  # stable: the tasks with a real kernel first
    longest = sorted((t for t in tasks if len(t["code"]) <= cfg.data.max_prompt_chars), key=lambda t: -t["prompt_tokens"])
    first = longest[:rl_per_batch * world]
    rest = [t for t in pool if t not in first][:rl_per_batch * world * max(0, args.rl_batches_per_rank - 1)]
    levels = set(ev.levels) & set(cfg.data.kernelbench_levels)
    eval_all = [t for t in tasks if t["level"] in levels][:ev.num_tasks or None]
    eval_per_batch = max(1, ev.generation_batch_size // ev.samples_per_task)
    eval_tasks = sorted(eval_all, key=lambda t: -t["prompt_tokens"])[:eval_per_batch * args.eval_batches_per_rank * world]
    return first[:rl_per_batch * world] + rest, rl_per_batch, eval_tasks, eval_per_batch, len(eval_all)
