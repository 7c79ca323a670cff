"""Rollout throughput: the project's batched sampler against two plain `generate` loops.

    python bench/rollout_throughput.py            # GPU: ~0.5B Qwen2 (random weights), 16 tasks x 8 samples, 512 new tokens
    python bench/rollout_throughput.py --quick    # CPU dry run of the same code on a tiny model

Compared, all generating exactly ``--new-tokens`` tokens per sequence (sampling at T=0.8, top-p 0.95):

- serial: one sample at a time with default ``generate`` (the original design's loop); a subset of
  ``--serial-subset`` sequences is timed and extrapolated to all tasks x samples (reported as such);
- per-task: one ``generate`` per task with ``num_return_sequences`` = samples; ``--per-task-subset``
  tasks are timed and extrapolated;
- sampler: ``extensions.sampling.sample_token_ids`` with every sequence of every task in one batch,
  dynamic KV cache, and again with ``cache_implementation="static"``.

Prompts are random token ids of realistic lengths (300-600), so no tokenizer or download is needed.
The roofline column is the memory-bandwidth bound of decoding: (weight bytes + KV-cache bytes read per
decode step) / measured step time, as a fraction of the device's peak bandwidth.
"""
from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PEAK_BANDWIDTH = {"H200": 4.8e12, "H100": 3.35e12, "A100": 2.0e12}  # bytes/s


def peak_bandwidth(device_name: str) -> float | None:
    for key, value in PEAK_BANDWIDTH.items():
        if key in device_name:
            return value
    return None


def build_model(quick: bool, device: str):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if quick:
        config = Qwen2Config(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
    else:  # the Qwen2.5-0.5B shape
        config = Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                             num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                             tie_word_embeddings=True)
    config.eos_token_id = None
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = Qwen2ForCausalLM(config).to(device=device, dtype=dtype).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def synchronize():
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def time_serial(model, prompts, samples, new_tokens, subset):
    import torch

    jobs = [(p, s) for p in range(len(prompts)) for s in range(samples)][:subset]
    device = next(model.parameters()).device
    synchronize()
    started = time.perf_counter()
    for p, _ in jobs:
        ids = torch.tensor([prompts[p]], device=device)
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=0.8, top_p=0.95,
                           max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=0)
    synchronize()
    per_sequence = (time.perf_counter() - started) / len(jobs)
    return per_sequence * len(prompts) * samples, len(jobs)


def time_per_task(model, prompts, samples, new_tokens, subset):
    import torch

    device = next(model.parameters()).device
    chosen = prompts[:subset]
    synchronize()
    started = time.perf_counter()
    for ids in chosen:
        ids = torch.tensor([ids], device=device)
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=0.8, top_p=0.95,
                           num_return_sequences=samples, max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=0)
    synchronize()
    return (time.perf_counter() - started) / len(chosen) * len(prompts), len(chosen)


def time_sampler(model, prompts, samples, new_tokens, cache):
    from extensions.sampling import SamplingParams, sample_token_ids

    params = SamplingParams(max_new_tokens=new_tokens, temperature=0.8, top_p=0.95, seed=0,
                            batch_size=len(prompts) * samples, cache_implementation=cache)
    synchronize()
    started = time.perf_counter()
    out = sample_token_ids(model, prompts, samples, params, pad_token_id=0, eos_token_ids=[], progress=False,
                           stop_at_eos=False)
    synchronize()
    elapsed = time.perf_counter() - started
    assert all(len(seq) == new_tokens for per_prompt in out for seq in per_prompt), "sampler stopped early"
    return elapsed


def decode_step_bytes(model, batch: int, mean_context: float) -> float:
    cfg = model.config
    bytes_per_value = next(model.parameters()).element_size()
    weights = sum(p.numel() for p in model.parameters()) * bytes_per_value
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * bytes_per_value * mean_context * batch
    return weights + kv


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny model on CPU, few tokens (a dry run)")
    parser.add_argument("--tasks", type=int, default=16)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=512)
    parser.add_argument("--prompt-min", type=int, default=300)
    parser.add_argument("--prompt-max", type=int, default=600)
    parser.add_argument("--serial-subset", type=int, default=4, help="sequences timed for the serial loop")
    parser.add_argument("--per-task-subset", type=int, default=4, help="tasks timed for the per-task loop")
    parser.add_argument("--no-static", action="store_true", help="skip the static-cache run")
    args = parser.parse_args(argv)

    import torch

    device = "cuda" if torch.cuda.is_available() and not args.quick else "cpu"
    if args.quick:
        args.tasks, args.samples, args.new_tokens = min(args.tasks, 4), min(args.samples, 2), min(args.new_tokens, 16)
        args.prompt_min, args.prompt_max, args.serial_subset, args.per_task_subset = 20, 40, 2, 2
    device_name = torch.cuda.get_device_name(0) if device == "cuda" else "CPU"
    model = build_model(args.quick, device)
    rng = random.Random(0)
    vocab = model.config.vocab_size
    prompts = [[rng.randrange(1, vocab) for _ in range(rng.randint(args.prompt_min, args.prompt_max))] for _ in range(args.tasks)]
    total_tokens = args.tasks * args.samples * args.new_tokens
    time_sampler(model, prompts[:2], 1, 4, None)  # warm-up (CUDA context, kernels)

    rows = []
    serial_s, serial_n = time_serial(model, prompts, args.samples, args.new_tokens, args.serial_subset)
    rows.append(("serial generate, 1 sample/call", serial_s, f"extrapolated from {serial_n} sequences"))
    per_task_s, per_task_n = time_per_task(model, prompts, args.samples, args.new_tokens, args.per_task_subset)
    rows.append((f"generate per task, num_return_sequences={args.samples}", per_task_s, f"extrapolated from {per_task_n} tasks"))
    sampler_s = time_sampler(model, prompts, args.samples, args.new_tokens, None)
    rows.append((f"project sampler, {args.tasks * args.samples} seqs/call, dynamic cache", sampler_s, "measured"))
    if not args.no_static:
        try:
            time_sampler(model, prompts[:2], 1, 4, "static")  # warm-up / compile
            static_s = time_sampler(model, prompts, args.samples, args.new_tokens, "static")
            rows.append((f"project sampler, {args.tasks * args.samples} seqs/call, static cache", static_s, "measured"))
        except Exception as exc:  # report, do not hide: the dynamic result still stands
            rows.append(("project sampler, static cache", float("nan"), f"failed: {type(exc).__name__}: {exc}"[:120]))

    peak = peak_bandwidth(device_name)
    mean_context = (args.prompt_min + args.prompt_max) / 2 + args.new_tokens / 2
    batch = args.tasks * args.samples
    print(f"\n### Rollout throughput on {device_name}\n")
    print(f"{args.tasks} tasks x {args.samples} samples x {args.new_tokens} new tokens, prompts {args.prompt_min}-{args.prompt_max} "
          f"tokens, {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M params, {next(model.parameters()).dtype}\n")
    print("| method | seconds | tokens/s | speedup vs per-task | roofline (bandwidth) | note |")
    print("|---|---:|---:|---:|---:|---|")
    for name, seconds, note in rows:
        rate = total_tokens / seconds if seconds == seconds else float("nan")
        speedup = per_task_s / seconds if seconds == seconds else float("nan")
        roofline = "n/a"
        if peak and seconds == seconds and name.startswith("project sampler"):
            step_time = seconds / args.new_tokens
            roofline = f"{decode_step_bytes(model, batch, mean_context) / step_time / peak:.1%}"
        print(f"| {name} | {seconds:.2f} | {rate:,.0f} | {speedup:.1f}x | {roofline} | {note} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
