"""SFT throughput per GPU: the project's batching (packed, length-grouped) against padded batches.

    python bench/sft_throughput.py            # GPU: ~0.5B Qwen2 (random weights) + LoRA r=16, bf16
    python bench/sft_throughput.py --quick    # CPU dry run of the same code on a tiny model

Every mode trains the same examples through ``extensions.training.trainer.AdapterTrainer`` (the
code SFT runs): packed rows (varlen attention on CUDA), length-grouped and padded batches (padded to
their longest example), and padded to ``max_seq_len`` (a fixed-length collator's batches), with gradient checkpointing, on sequence lengths drawn from a long-tailed
(log-normal) distribution like KernelBook's, 40% of each example a masked prompt. Throughput counts
real tokens only (padding excluded). MFU = 6 x parameters x tokens/s / peak bf16 FLOP/s (the usual
full-fine-tuning estimate; LoRA's backward skips the frozen weight gradients, so it overstates the
work actually needed by about a third).
"""
from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12}


def peak_flops(device_name: str) -> float | None:
    for key, value in PEAK_BF16_FLOPS.items():
        if key in device_name:
            return value
    return None


def long_tailed_lengths(count: int, median: int, max_len: int, seed: int = 0) -> list[int]:
    import math

    rng = random.Random(seed)
    return [max(32, min(max_len, int(math.exp(rng.gauss(math.log(median), 0.8))))) for _ in range(count)]


def make_examples(lengths, vocab: int, seed: int = 0):
    from extensions.training.batching import IGNORE_INDEX, TokenizedExample

    rng = random.Random(seed)
    examples = []
    for length in lengths:
        ids = [rng.randrange(1, vocab) for _ in range(length)]
        prompt = int(length * 0.4)
        examples.append(TokenizedExample(input_ids=ids, labels=[IGNORE_INDEX] * prompt + ids[prompt:]))
    return examples


def build_model(quick: bool, device: str, attn: str):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if quick:
        config = Qwen2Config(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192)
    else:
        config = Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                             num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                             tie_word_embeddings=True)
    config._attn_implementation = attn
    config.use_cache = False
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    return Qwen2ForCausalLM(config).to(device=device, dtype=dtype)


def run_mode(mode: str, examples, args, device: str):
    import torch

    from extensions.config import LoraConfig, ModelConfig
    from extensions.models.loading import attach_lora, enable_gradient_checkpointing
    from extensions.training.distributed import make_dist
    from extensions.training.trainer import AdapterTrainer, OptimSettings, StepPlan

    model = build_model(args.quick, device, args.attn)
    params = sum(p.numel() for p in model.parameters())
    model = attach_lora(model, LoraConfig(r=16, alpha=32, dropout=0.05))
    enable_gradient_checkpointing(model)
    batch = args.packed_rows if mode == "packed" else args.padded_batch
    # "padded_to_max": every batch padded to max_seq_len, as a fixed-length collator does.
    settings = OptimSettings(learning_rate=1e-4, per_device_batch_size=batch, gradient_accumulation_steps=1,
                             max_seq_len=args.max_seq_len, batching="padded" if mode == "padded_to_max" else mode,
                             warmup_ratio=0.0, pad_to_multiple_of=args.max_seq_len if mode == "padded_to_max" else None)
    plan = StepPlan(examples, settings, seed=0, world_size=1)
    dist = make_dist(ModelConfig(dtype="auto"))
    trainer = AdapterTrainer(model, dist, settings, pad_token_id=0, total_steps=plan.steps_per_epoch)
    attention = model.config._attn_implementation
    for step in range(min(args.warmup_steps, plan.steps_per_epoch)):
        trainer.train_step(plan, step)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    tokens, started = 0, time.perf_counter()
    steps = range(args.warmup_steps, plan.steps_per_epoch)
    for step in steps:
        tokens += trainer.train_step(plan, step)["tokens"]
    if device == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - started
    memory = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else float("nan")
    del trainer, model
    if device == "cuda":
        torch.cuda.empty_cache()
    return {"tokens_per_s": tokens / elapsed, "steps": len(steps), "tokens": tokens, "params": params, "memory_gib": memory,
            "attention": attention}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny model on CPU (a dry run)")
    parser.add_argument("--examples", type=int, default=384)
    parser.add_argument("--median-len", type=int, default=900)
    parser.add_argument("--max-seq-len", type=int, default=4096)
    parser.add_argument("--packed-rows", type=int, default=2, help="packed rows of max-seq-len per micro-batch")
    parser.add_argument("--padded-batch", type=int, default=4, help="examples per padded micro-batch")
    parser.add_argument("--warmup-steps", type=int, default=2)
    parser.add_argument("--attn", default="sdpa", help="attention implementation (sdpa, flash_attention_2, eager)")
    parser.add_argument("--modes", default="packed,length_grouped,padded,padded_to_max")
    args = parser.parse_args(argv)

    import torch

    device = "cuda" if torch.cuda.is_available() and not args.quick else "cpu"
    if args.quick:
        args.examples, args.median_len, args.max_seq_len, args.warmup_steps = 24, 48, 256, 1
    device_name = torch.cuda.get_device_name(0) if device == "cuda" else "CPU"
    vocab = 1024 if args.quick else 151936
    lengths = long_tailed_lengths(args.examples, args.median_len, args.max_seq_len)
    examples = make_examples(lengths, vocab)
    results = {mode: run_mode(mode, examples, args, device) for mode in args.modes.split(",")}
    peak = peak_flops(device_name)
    baseline = results.get("padded", {}).get("tokens_per_s")
    fixed = results.get("padded_to_max", {}).get("tokens_per_s")
    print(f"\n### SFT throughput on {device_name}\n")
    print(f"{args.examples} examples, lengths median {args.median_len} (log-normal, max {args.max_seq_len}), "
          f"mean {sum(lengths) / len(lengths):.0f}; LoRA r=16; attention {args.attn}; gradient checkpointing\n")
    print("| batching | attention | tokens/s per GPU | vs padded to longest | vs padded to max_seq_len | MFU | peak memory GiB | timed steps |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for mode, r in results.items():
        speedup = f"{r['tokens_per_s'] / baseline:.2f}x" if baseline else "n/a"
        versus_fixed = f"{r['tokens_per_s'] / fixed:.2f}x" if fixed else "n/a"
        mfu = f"{6 * r['params'] * r['tokens_per_s'] / peak:.1%}" if peak else "n/a"
        print(f"| {mode} | {r['attention']} | {r['tokens_per_s']:,.0f} | {speedup} | {versus_fixed} | {mfu} | "
              f"{r['memory_gib']:.1f} | {r['steps']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
