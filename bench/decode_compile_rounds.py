"""Does compiling the decode step pay off across RL rounds?

    python bench/decode_compile_rounds.py            # GPU: ~0.5B Qwen2 (random weights) with LoRA, 3 rounds
    python bench/decode_compile_rounds.py --quick    # CPU dry run of the same code on a tiny model

The sampler compiles its decode step once per shape (``rl.compile_decode``, ``eval.compile_decode``)
and replays it as a CUDA graph. A compile costs tens of seconds; an RL round samples a few batches
whose prompt widths differ from round to round, and between rounds the LoRA weights change and the
model goes through train() and eval(). This runs that sequence as RL does (per round: sample
``--tasks`` x ``--samples`` sequences of new prompts, then one LoRA optimizer step) once with the
compiled step and once without, in one process each, and prints seconds per round and the number
of graphs torch.compile built.
"""
from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # rollout_throughput, beside this file


def build_model(quick: bool, device: str):
    """rollout_throughput's model (the Qwen2.5-0.5B shape, random weights) with LoRA on attention, as
    RL trains it; and its vocabulary size."""
    from peft import LoraConfig, get_peft_model

    from rollout_throughput import build_model as base_model

    model = base_model(quick, device)
    lora = LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], lora_dropout=0.0)
    return get_peft_model(model, lora), model.config.vocab_size


def one_run(args) -> dict:
    """The rounds in this process with ``args.compile`` on or off; seconds per round and graphs built."""
    import torch

    from extensions.generation.sampling import SamplingParams, sample_token_ids

    device = "cuda" if torch.cuda.is_available() and not args.quick else "cpu"
    model, vocab = build_model(args.quick, device)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    rng = random.Random(0)
    rounds = []
    for round_index in range(args.rounds):
        # New tasks every round: prompt widths differ, as they do between RL rounds.
        prompts = [[rng.randrange(10, vocab) for _ in range(rng.randrange(args.min_prompt, args.max_prompt))]
                   for _ in range(args.tasks)]
        params = SamplingParams(max_new_tokens=args.new_tokens, temperature=0.8, top_p=0.95, seed=round_index,
                                batch_size=args.tasks * args.samples, cuda_graphs=device == "cuda",
                                compile_step=args.compile)
        if device == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        sampled = sample_token_ids(model, prompts, args.samples, params, pad_token_id=0, eos_token_ids=[],
                                   progress=False)
        if device == "cuda":
            torch.cuda.synchronize()
        sampling_s = time.perf_counter() - started
        tokens = sum(len(seq) for per_prompt in sampled for seq in per_prompt)
        # One LoRA step on a sampled sequence: the weights change and the model trains between rounds.
        model.train()
        batch = torch.tensor([prompts[0] + sampled[0][0]], device=device)
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        model.eval()
        rounds.append({"round": round_index + 1, "sampling_s": round(sampling_s, 2), "tokens": tokens,
                       "tokens_per_s": round(tokens / sampling_s, 1)})
    graphs = None
    try:
        from torch._dynamo.utils import counters

        graphs = int(counters["stats"]["unique_graphs"])
    except Exception:  # the counter's name differs between torch versions: the row says n/a
        pass
    return {"compile": args.compile, "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
            "rounds": rounds, "graphs_built": graphs}


def table(results: list[dict]) -> str:
    lines = ["| decode step | round | sampling s | tokens | tokens/s | graphs built (whole run) |",
             "|---|---:|---:|---:|---:|---:|"]
    for result in results:
        label = "compiled + CUDA graph" if result["compile"] else "CUDA graph, not compiled"
        for row in result["rounds"]:
            lines.append(f"| {label} | {row['round']} | {row['sampling_s']:.2f} | {row['tokens']} | "
                         f"{row['tokens_per_s']:.0f} | {result['graphs_built'] if result['graphs_built'] is not None else 'n/a'} |")
        total = sum(row["sampling_s"] for row in result["rounds"])
        lines.append(f"| {label} | all | {total:.2f} | | | |")
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny model on the CPU, 2 rounds")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tasks", type=int, default=16)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=768)
    parser.add_argument("--min-prompt", type=int, default=300)
    parser.add_argument("--max-prompt", type=int, default=900)
    parser.add_argument("--compile", choices=("on", "off"), help="run one setting in this process (internal)")
    parser.add_argument("--out", help="write the table and JSON here")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.tasks, args.samples, args.new_tokens, args.min_prompt, args.max_prompt = 2, 2, 2, 8, 5, 20
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.compile is not None:  # a child: one setting, its result as JSON on the last line
        args.compile = args.compile == "on"
        print(json.dumps(one_run(args)))
        return 0
    results = []
    forwarded = [f"--rounds={args.rounds}", f"--tasks={args.tasks}", f"--samples={args.samples}",
                 f"--new-tokens={args.new_tokens}", f"--min-prompt={args.min_prompt}", f"--max-prompt={args.max_prompt}"]
    if args.quick:
        forwarded.append("--quick")
    for setting in ("on", "off"):  # a fresh process each: no compiled graph carries over
        done = subprocess.run([sys.executable, __file__, *forwarded, "--compile", setting],
                              capture_output=True, text=True)
        if done.returncode != 0:
            print(done.stderr[-3000:], file=sys.stderr)
            return done.returncode
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    text = table(results)
    print(f"device: {results[0]['device']}")
    print(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "decode_compile_rounds.json").write_text(json.dumps(results, indent=1))
        (out / "decode_compile_rounds.md").write_text(f"device: {results[0]['device']}\n\n{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
