"""Rollout throughput: the project's batched sampler against two plain `generate` loops.

    python bench/rollout_throughput.py            # GPU: ~0.5B Qwen2 (random weights), 16 tasks x 8 samples, 512 new tokens
    python bench/rollout_throughput.py --quick    # CPU dry run of the same code on a tiny model

Compared, all generating exactly ``--new-tokens`` tokens per sequence (sampling at T=0.8, top-p 0.95):

- serial: one sample at a time with default ``generate`` (the original design's loop); a subset of
  ``--serial-subset`` sequences is timed and extrapolated to all tasks x samples (reported as such);
- per-task: one ``generate`` per task with ``num_return_sequences`` = samples; ``--per-task-subset``
  tasks are timed and extrapolated;
- batched generate: default ``generate`` with every sequence of every task in one left-padded batch;
- sampler: ``extensions.generation.sampling.sample_token_ids`` with the same single batch (static KV cache,
  grouped decode attention), as configured by default on a GPU (the decode step compiled with
  ``torch.compile`` and replayed as a CUDA graph; timed on its second call, the first compiles),
  then without compiling, then without compiling or CUDA graph.

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


def time_batched_generate(model, prompts, samples, new_tokens):
    import torch

    from extensions.generation.sampling import left_pad

    device = next(model.parameters()).device
    ids, attention = left_pad([p for p in prompts for _ in range(samples)], 0)
    synchronize()
    started = time.perf_counter()
    with torch.no_grad():
        model.generate(input_ids=ids.to(device), attention_mask=attention.to(device), do_sample=True, temperature=0.8,
                       top_p=0.95, max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=0)
    synchronize()
    return time.perf_counter() - started


def time_sampler(model, prompts, samples, new_tokens, cuda_graphs, compile_step=False):
    """Seconds for the project's sampler to decode every sequence in one batch."""
    from extensions.generation.decoding import DecodeStats
    from extensions.generation.sampling import SamplingParams, sample_token_ids

    params = SamplingParams(max_new_tokens=new_tokens, temperature=0.8, top_p=0.95, seed=0,
                            batch_size=len(prompts) * samples, cuda_graphs=cuda_graphs, compile_step=compile_step)
    stats = DecodeStats()
    synchronize()
    started = time.perf_counter()
    out = sample_token_ids(model, prompts, samples, params, pad_token_id=0, eos_token_ids=[], progress=False,
                           stop_at_eos=False, stats=stats)
    synchronize()
    elapsed = time.perf_counter() - started
    assert all(len(seq) == new_tokens for per_prompt in out for seq in per_prompt), "sampler stopped early"
    return elapsed, stats


def time_pick_tokens(batch: int, vocab: int, device: str, repeats: int = 50) -> float:
    """Seconds per call of the sampler's token choice (T=0.8, top-p 0.95) on random logits."""
    import torch

    from extensions.generation.decoding import pick_tokens

    logits = torch.randn(batch, vocab, device=device, dtype=torch.bfloat16 if device == "cuda" else torch.float32)
    generator = torch.Generator(device=device).manual_seed(0)
    pick_tokens(logits, 0.8, 0.95, generator, compiled=device == "cuda")
    synchronize()
    started = time.perf_counter()
    for _ in range(repeats):
        pick_tokens(logits, 0.8, 0.95, generator, compiled=device == "cuda")
    synchronize()
    return (time.perf_counter() - started) / repeats


def profile_sampler(model, prompts, samples, device: str, steps: int = 8) -> None:
    """Top GPU kernels of an eager (graph-less) sampler run, and kernels launched per decode step."""
    from torch.profiler import ProfilerActivity, profile

    from extensions.generation.sampling import SamplingParams, sample_token_ids

    params = SamplingParams(max_new_tokens=steps, temperature=0.8, top_p=0.95, seed=0,
                            batch_size=len(prompts) * samples, cuda_graphs=False)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        sample_token_ids(model, prompts, samples, params, pad_token_id=0, eos_token_ids=[], progress=False,
                         stop_at_eos=False)
        synchronize()
    kernels = [e for e in prof.events() if getattr(e, "device_type", None) is not None and "CUDA" in str(e.device_type)]
    print(f"\nProfile of {steps} eager decode steps (prefill included): {len(kernels)} GPU kernels, "
          f"~{len(kernels) / steps:.0f} per step")
    key = "self_cuda_time_total" if device == "cuda" else "self_cpu_time_total"
    try:
        print(prof.key_averages().table(sort_by=key, row_limit=18, max_name_column_width=60))
    except Exception as exc:  # column names differ across torch versions
        print(f"(table unavailable: {exc})")


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
    parser.add_argument("--only-sampler", action="store_true", help="skip the generate() baselines")
    parser.add_argument("--profile", action="store_true", help="print the top kernels of a short eager decode")
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
    time_sampler(model, prompts[:2], 1, 4, True)  # warm-up (CUDA context, kernels)
    batch = args.tasks * args.samples

    rows = []
    per_task_s = batched_s = float("nan")
    if not args.only_sampler:
        serial_s, serial_n = time_serial(model, prompts, args.samples, args.new_tokens, args.serial_subset)
        rows.append(("serial generate, 1 sample/call", serial_s, f"extrapolated from {serial_n} sequences"))
        per_task_s, per_task_n = time_per_task(model, prompts, args.samples, args.new_tokens, args.per_task_subset)
        rows.append((f"generate per task, num_return_sequences={args.samples}", per_task_s,
                     f"extrapolated from {per_task_n} tasks"))
        batched_s = time_batched_generate(model, prompts, args.samples, args.new_tokens)
        rows.append((f"default generate, {batch} seqs/call", batched_s, "measured"))
    eager_s, _ = time_sampler(model, prompts, args.samples, args.new_tokens, False)
    rows.append((f"project sampler, {batch} seqs/call, no CUDA graph, not compiled", eager_s, "measured"))
    graph_s, stats = time_sampler(model, prompts, args.samples, args.new_tokens, True)
    note = "measured, CUDA graph" if stats.graph_used else f"measured, eager: {stats.graph_error}"
    rows.append((f"project sampler, {batch} seqs/call, not compiled", graph_s, note))
    # The default: compiled step, captured as a CUDA graph. The first call at a shape compiles.
    first_s, _ = time_sampler(model, prompts, args.samples, args.new_tokens, True, compile_step=True)
    default_s, stats = time_sampler(model, prompts, args.samples, args.new_tokens, True, compile_step=True)
    note = (f"measured (second call; the first, compiling, took {first_s:.1f} s); "
            f"graph={'yes' if stats.graph_used else 'no'}, compiled={'yes' if stats.compiled else 'no'}")
    rows.append((f"project sampler, {batch} seqs/call (default)", default_s, note))

    peak = peak_bandwidth(device_name)
    mean_context = (args.prompt_min + args.prompt_max) / 2 + args.new_tokens / 2
    print(f"\n### Rollout throughput on {device_name}\n")
    print(f"{args.tasks} tasks x {args.samples} samples x {args.new_tokens} new tokens, prompts {args.prompt_min}-{args.prompt_max} "
          f"tokens, {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M params, {next(model.parameters()).dtype}\n")
    print("| method | seconds | tokens/s | vs per-task generate | vs batched generate | roofline (bandwidth) | note |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for name, seconds, note in rows:
        # Every row does the same decode steps; the roofline charges each step its weight and KV reads.
        roofline = "n/a"
        if peak:
            per_step_batch = 1 if name.startswith("serial") else (args.samples if "per task" in name else batch)
            steps = args.new_tokens * batch // per_step_batch
            roofline = f"{decode_step_bytes(model, per_step_batch, mean_context) * steps / seconds / peak:.1%}"
        print(f"| {name} | {seconds:.2f} | {total_tokens / seconds:,.0f} | {per_task_s / seconds:.1f}x | "
              f"{batched_s / seconds:.1f}x | {roofline} | {note} |")
    if args.profile:
        profile_sampler(model, prompts, args.samples, device)
    pick_s = time_pick_tokens(batch, vocab, device)
    print(f"\nProject sampler (default): {default_s / args.new_tokens * 1e3:.2f} ms per decode step (prefill included), "
          f"of which {pick_s * 1e3:.2f} ms choose the tokens (temperature, top-p sort, sample).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
