"""Production rehearsal: the default config at 7B scale with random weights, phase by phase, on all
GPUs of the machine, and what the full default run would take and cost.

    python bench/production_rehearsal.py --kernelbench KB.jsonl --usd-per-gpu-hour 2.5 --out DIR
    accelerate launch --num_processes 2 bench/production_rehearsal.py --kernelbench KB.jsonl ...
    python bench/production_rehearsal.py --model-scale tiny ...   # the same code on CPU, tiny model

The model is Qwen2.5-7B's architecture (built on the meta device, materialised on the GPU in bf16
with the library's own initialisation; nothing is downloaded) with the config's LoRA, and a
byte-level BPE tokenizer trained here on the KernelBench sources (about as many characters per
token on code as Qwen's). Phases, each timed with its peak GPU memory (skip with ``--phases``):

- ``sft``: optimizer steps of the config's batch (packed rows, accumulation, gradient
  checkpointing, data parallel under accelerate) on synthetic rows whose lengths follow a
  log-normal around ``--sft-median-tokens``; then a validation-loss pass;
- ``rl_sampling``: generate batches of the shape each rank has in the full run on
  ``--target-gpus`` GPUs (its share of ``tasks_per_round`` x ``samples_per_task``) through the
  project's sampler, on KernelBench level-1/2 problems;
- ``rl_verification``: the round's candidates through the verifier, ``verify_chunk_size`` at a time;
  for tasks with a real kernel in tests/fixtures/candidates/kernelbench/ the first
  ``--real-kernels-per-task`` samples are that kernel (kernel functions renamed per sample, so none
  is a duplicate), the rest are the random model's text, which fails at extraction;
- ``checkpoint_save``: the adapter, optimizer and RNG checkpoint, then ``s3_sync``: one sync of the
  run to an S3 server on loopback (moto);
- ``eval_generation``: greedy generation on the evaluation tasks with the adapter merged, the
  longest prompts first (the batch whose KV cache is largest).

Prints one markdown table (measured phases, memory margins, projection of the full run) and writes
``rehearsal.json`` and ``rehearsal.md`` under ``--out``. Arithmetic: ``bench/rehearsal_report.py``.
"""
from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import shutil
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

PROJECT_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT_ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from rehearsal_inputs import (QWEN25_7B, TINY, TOKENIZER_VOCAB, build_code_tokenizer, build_random_model,  # noqa: E402
                              read_fixture_kernels, read_kernelbench, sample_variant, select_tasks,
                              synthetic_sft_examples)
from rehearsal_report import (GIB, KERNELBOOK_ROWS, FullRun, ModelShape, estimate_memory_gib,  # noqa: E402
                              markdown_table, measured_rates, project)

# The same phases at toy sizes, so a CPU runs them in seconds.
TINY_OVERRIDES = ("sft.max_seq_len=256", "rl.max_new_tokens=16", "eval.max_new_tokens=16",
                  "verifier.multi_input_num_tests=2")
PHASES = ("sft", "rl_sampling", "rl_verification", "checkpoint_save", "s3_sync", "eval_generation")


# -- the rehearsal ---------------------------------------------------------------------------------

@dataclass
class Rehearsal:
    args: argparse.Namespace
    cfg: Any
    dist: Any
    device: Any
    tokenizer: Any
    trainer: Any
    rl_tasks: list[dict]
    eval_tasks: list[dict]
    eval_task_count: int
    fixtures: dict
    rl_tasks_per_batch: int
    eval_tasks_per_batch: int
    samples: dict = field(default_factory=dict)  # this rank's task_id -> sampled texts
    chars_per_token: float = 3.5  # of the tokenizer on the task sources
    template_tokens: int = 0  # tokens of the prompt around a task's code
    sft_steps_done: int = 0
    sft_mean_tokens: float = 0.0
    sft_packed_fill: float = 1.0

    @property
    def policy(self):
        return self.dist.unwrap(self.trainer.model)

    @property
    def paths(self):
        from extensions.runtime.paths import RunPaths

        return RunPaths.from_config(self.cfg)


def _cuda(ctx: Rehearsal) -> bool:
    return ctx.device.type == "cuda"


def run_phase(ctx: Rehearsal, key: str, work: Callable[[Rehearsal], dict]) -> dict:
    """Run one phase on every rank; wall time, peak memory and details gathered from all ranks.

    A phase that fails (out of memory, a missing package) is recorded with its error and the next
    phase runs, so one failure does not hide the other measurements.
    """
    import torch

    if ctx.dist.is_main:
        print(f"[rehearsal] {key} ...", flush=True)
    if _cuda(ctx):
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    ctx.dist.barrier()
    started = time.perf_counter()
    details, error = {}, None
    try:
        details = work(ctx) or {}
    except Exception as exc:  # noqa: BLE001 - recorded in the report, the rehearsal goes on
        error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
        traceback.print_exc()
    gc.collect()
    local = {"seconds": time.perf_counter() - started, "error": error, **details}
    if _cuda(ctx):
        torch.cuda.synchronize()
        local["peak_allocated_gib"] = torch.cuda.max_memory_allocated() / GIB
        local["peak_reserved_gib"] = torch.cuda.max_memory_reserved() / GIB
    ranks = ctx.dist.gather_objects([local])
    merged = {"key": key, "seconds": max(r["seconds"] for r in ranks), "error": next((r["error"] for r in ranks if r["error"]), None),
              "ranks": ranks}
    for peak in ("peak_allocated_gib", "peak_reserved_gib"):
        if all(peak in r for r in ranks):
            merged[peak] = max(r[peak] for r in ranks)
    tokens = sum(r.get("tokens", 0) for r in ranks)
    if tokens and not merged["error"]:
        busy = max(r.get("rate_seconds", r["seconds"]) for r in ranks)
        merged["tokens_per_s_per_gpu"] = tokens / busy / ctx.dist.world_size
    if ctx.dist.is_main:
        print(f"[rehearsal] {key}: {merged['seconds']:.1f} s" + (f", FAILED: {merged['error']}" if merged["error"] else ""),
              flush=True)
    return merged


def sft_phase(ctx: Rehearsal) -> dict:
    from extensions.training.trainer import StepPlan

    args, sft, dist = ctx.args, ctx.cfg.sft, ctx.dist
    settings = ctx.trainer.settings
    needed = args.sft_warmup_steps + args.sft_steps
    count = needed * settings.per_device_batch_size * settings.gradient_accumulation_steps * dist.world_size
    while True:  # enough rows for the steps, whatever the packing
        examples = synthetic_sft_examples(count, args.sft_median_tokens, sft.max_seq_len, ctx.tokenizer.vocab_size,
                                          seed=ctx.cfg.run.seed)
        plan = StepPlan(examples, settings, seed=ctx.cfg.run.seed, world_size=dist.world_size)
        if plan.steps_per_epoch >= needed:
            break
        count *= 2
    ctx.sft_mean_tokens = sum(map(len, examples)) / len(examples)
    rows = sum(len(b) for b in plan.epoch_batches(0))
    ctx.sft_packed_fill = sum(map(len, examples)) / (rows * sft.max_seq_len) if sft.batching == "packed" else 1.0
    for step in range(args.sft_warmup_steps):
        ctx.trainer.train_step(plan, step)
    timed = [ctx.trainer.train_step(plan, step) for step in range(args.sft_warmup_steps, needed)]
    ctx.sft_steps_done = needed
    validation = synthetic_sft_examples(settings.per_device_batch_size * dist.world_size * 4, args.sft_median_tokens,
                                        sft.max_seq_len, ctx.tokenizer.vocab_size, seed=ctx.cfg.run.seed + 1)
    started = time.perf_counter()
    ctx.trainer.evaluate(validation)
    validation_s = time.perf_counter() - started
    validation_tokens = sum(map(len, validation))
    # train_step counts the tokens of every rank; rank 0 reports them for all.
    return {"tokens": sum(s["tokens"] for s in timed) if dist.is_main else 0,
            "rate_seconds": sum(s["step_seconds"] for s in timed),
            "step_tokens": [s["tokens"] for s in timed], "step_seconds": [s["step_seconds"] for s in timed],
            "validation_tokens_per_s_per_gpu": validation_tokens / validation_s / dist.world_size,
            "packed_fill": ctx.sft_packed_fill, "mean_example_tokens": ctx.sft_mean_tokens,
            "work": f"{args.sft_steps} steps of {settings.per_device_batch_size} x {sft.max_seq_len} tokens x "
                    f"{settings.gradient_accumulation_steps} accumulation (+{args.sft_warmup_steps} warm-up)"}


def generate(ctx: Rehearsal, model, tasks: list[dict], n: int, per_batch: int, *, max_new_tokens: int,
             temperature: float, top_p: float, seed: int, compile_step: bool, cuda_graphs: bool) -> tuple[dict, dict]:
    """This rank's share of ``tasks`` through the project's sampler, ``per_batch`` tasks per batch."""
    import torch

    from extensions.generation.decoding import DecodeStats
    from extensions.prompting.templates import build_messages
    from extensions.generation.sampling import SamplingParams, render_prompt_ids, sample_token_ids

    mine = ctx.dist.shard(tasks)
    model_eos = model.generation_config.eos_token_id
    eos = sorted({ctx.tokenizer.eos_token_id, *([] if model_eos is None else [model_eos])})
    texts, batches = {}, []
    for index, start in enumerate(range(0, len(mine), per_batch)):
        chunk = mine[start:start + per_batch]
        prompt_ids = render_prompt_ids(ctx.tokenizer, [build_messages(t["code"]) for t in chunk])
        params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                                seed=seed + 1009 * ctx.dist.rank + index, batch_size=per_batch * n,
                                cuda_graphs=cuda_graphs, compile_step=compile_step)
        stats = DecodeStats()
        if _cuda(ctx):
            torch.cuda.synchronize()
        started = time.perf_counter()
        ids = sample_token_ids(model, prompt_ids, n, params, pad_token_id=ctx.tokenizer.pad_token_id,
                               eos_token_ids=eos, progress=ctx.args.progress, stats=stats)
        if _cuda(ctx):
            torch.cuda.synchronize()
        batches.append({"tasks": len(chunk), "sequences": len(chunk) * n, "seconds": time.perf_counter() - started,
                        "longest_prompt": max(map(len, prompt_ids)), "mean_prompt": sum(map(len, prompt_ids)) / len(chunk),
                        "new_tokens": sum(len(x) for per in ids for x in per), "steps": stats.steps,
                        "cuda_graph": stats.graph_used, "compiled": stats.compiled})
        for task, per_task in zip(chunk, ids):
            texts[task["task_id"]] = [ctx.tokenizer.decode(x, skip_special_tokens=True) for x in per_task]
    # Throughput of warm batches: a process's first batch also compiles the decode step.
    warm = batches[1:] or batches
    return texts, {"batches": batches, "tokens": sum(b["new_tokens"] for b in warm),
                   "rate_seconds": sum(b["seconds"] for b in warm)}


def rl_sampling_phase(ctx: Rehearsal) -> dict:
    rl = ctx.cfg.rl
    texts, details = generate(ctx, ctx.policy, ctx.rl_tasks, rl.samples_per_task, ctx.rl_tasks_per_batch,
                              max_new_tokens=rl.max_new_tokens, temperature=rl.temperature, top_p=rl.top_p,
                              seed=ctx.cfg.run.seed, compile_step=rl.compile_decode, cuda_graphs=rl.cuda_graphs)
    ctx.samples = texts
    details["work"] = (f"{len(ctx.rl_tasks)} tasks x {rl.samples_per_task} samples x {rl.max_new_tokens} new tokens, "
                       f"{ctx.rl_tasks_per_batch * rl.samples_per_task} sequences per batch")
    return details


def rl_verification_phase(ctx: Rehearsal) -> dict:
    from extensions.verify import VerifyRequest, summarize_results, verify_batch

    cfg = ctx.cfg
    n, real = cfg.rl.samples_per_task, ctx.args.real_kernels_per_task
    requests, real_count = [], 0
    for task in ctx.dist.shard(ctx.rl_tasks):
        kernel = ctx.fixtures.get(tuple(task["key"]))
        sampled = ctx.samples.get(task["task_id"], [""] * n)
        for i in range(n):
            real_kernel = kernel is not None and i < real
            real_count += real_kernel
            text = sample_variant(kernel, i) if real_kernel else sampled[i]
            requests.append(VerifyRequest(task["code"], text, f"{task['task_id']}/{i}"))
    device = ctx.dist.verifier_device(cfg.verifier.device)
    chunk = max(1, cfg.rl.verify_chunk_size)
    results = []
    for start in range(0, len(requests), chunk):
        results += verify_batch(requests[start:start + chunk], cfg.verifier, device=device, progress=ctx.args.progress)
    summary = summarize_results(results)
    return {"candidates": len(results), "real_kernels": real_count, "correct": summary["correct"],
            "timed": sum(1 for r in results if r.speedup is not None), "rejected_at": summary["rejected_at"]}


def checkpoint_save_phase(ctx: Rehearsal) -> dict:
    from extensions.training.saving import save_adapter_checkpoint
    from extensions.training.state import TrainerState

    trainer = ctx.trainer
    directory = save_adapter_checkpoint(
        ctx.paths.sft_checkpoint(ctx.sft_steps_done), dist=ctx.dist, model=trainer.model, cfg=ctx.cfg, stage="sft",
        data={"rehearsal": "synthetic rows"}, optimizer=trainer.optimizer, scheduler=trainer.scheduler,
        trainer_state=TrainerState(step=ctx.sft_steps_done, total_steps=ctx.sft_steps_done), step=ctx.sft_steps_done)
    size = sum(p.stat().st_size for p in Path(directory).rglob("*") if p.is_file())
    return {"bytes": size, "work": f"adapter + optimizer + RNG, {size / 1e6:.0f} MB"}


def s3_sync_phase(ctx: Rehearsal) -> dict:
    """One sync of the run to a loopback S3 server (moto), from rank 0 as in the pipeline."""
    if not ctx.dist.is_main:
        return {}
    import socket
    import uuid

    try:
        from moto.server import ThreadedMotoServer
    except ImportError as exc:
        raise RuntimeError(f"the loopback S3 server needs moto[server] ({exc})") from exc
    import boto3

    from extensions.cloud.location import S3Location
    from extensions.cloud.s3_sync import CheckpointManager

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    loopback = {"AWS_ACCESS_KEY_ID": "rehearsal", "AWS_SECRET_ACCESS_KEY": "rehearsal",
                "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}
    saved = {name: os.environ.get(name) for name in loopback}
    os.environ.update(loopback)
    try:
        bucket = f"rehearsal-{uuid.uuid4().hex[:8]}"
        boto3.client("s3").create_bucket(Bucket=bucket)
        location = S3Location(bucket, ctx.cfg.checkpoint.prefix, ctx.cfg.run.run_id)
        report = CheckpointManager(ctx.cfg.checkpoint, ctx.paths, location).sync_once()
        if not report.ok:
            raise RuntimeError(report.summary())
        return {"uploaded_bytes": report.uploaded_bytes, "uploaded_files": report.uploaded_files,
                "manifests": report.manifests_uploaded, "uri": location.uri,
                "work": f"{report.uploaded_bytes / 1e6:.0f} MB to loopback S3 (moto)"}
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        server.stop()


def eval_generation_phase(ctx: Rehearsal) -> dict:
    ev = ctx.cfg.eval
    policy = ctx.policy
    merged = policy.merge_and_unload() if hasattr(policy, "merge_and_unload") else policy  # as evaluate.py loads it
    _, details = generate(ctx, merged, ctx.eval_tasks, ev.samples_per_task, ctx.eval_tasks_per_batch,
                          max_new_tokens=ev.max_new_tokens, temperature=ev.temperature, top_p=ev.top_p,
                          seed=ev.seed, compile_step=ev.compile_decode, cuda_graphs=True)
    details["work"] = (f"{len(ctx.eval_tasks)} longest of {ctx.eval_task_count} tasks x {ev.samples_per_task} x "
                       f"{ev.max_new_tokens} new tokens, {ctx.eval_tasks_per_batch * ev.samples_per_task} per batch")
    return details


PHASE_WORK = {"sft": sft_phase, "rl_sampling": rl_sampling_phase, "rl_verification": rl_verification_phase,
              "checkpoint_save": checkpoint_save_phase, "s3_sync": s3_sync_phase, "eval_generation": eval_generation_phase}


# -- set-up, rates, report -------------------------------------------------------------------------

def setup(args) -> Rehearsal:
    import torch

    from extensions.config import config_from_args
    from extensions.prompting.templates import INSTRUCTIONS, SYSTEM_PROMPT, build_messages
    from extensions.generation.sampling import render_prompt_ids
    from extensions.training.distributed import make_dist
    from extensions.training.trainer import AdapterTrainer, OptimSettings
    from extensions.models.loading import attach_lora, enable_gradient_checkpointing

    tiny = args.model_scale == "tiny"
    if not tiny and not torch.cuda.is_available():
        raise SystemExit("--model-scale 7b needs a CUDA GPU (15 GB of bf16 weights); use --model-scale tiny on a CPU")
    cfg = config_from_args(args, [*(TINY_OVERRIDES if tiny else ()), f"run.root={args.work_dir}", "run.run_id=rehearsal"])
    dist = make_dist(cfg.model)
    if dist.is_main:
        shutil.rmtree(args.work_dir, ignore_errors=True)
    dist.barrier()
    tasks = read_kernelbench(Path(args.kernelbench))
    fixtures = read_fixture_kernels()
    tokenizer = build_code_tokenizer([t["code"] for t in tasks] + list(fixtures.values()) + [INSTRUCTIONS, SYSTEM_PROMPT],
                                     TOKENIZER_VOCAB)
    for task, ids in zip(tasks, render_prompt_ids(tokenizer, [build_messages(t["code"]) for t in tasks])):
        task["prompt_tokens"] = len(ids)
    rl_tasks, rl_per_batch, eval_tasks, eval_per_batch, eval_count = select_tasks(args, cfg, tasks, fixtures, dist.world_size)
    code_tokens = sum(len(tokenizer(t["code"])["input_ids"]) for t in tasks)
    template_tokens = len(render_prompt_ids(tokenizer, [build_messages("")])[0])
    device = dist.device
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    dims = {**TINY, "vocab_size": len(tokenizer)} if tiny else QWEN25_7B
    started = time.perf_counter()
    model = build_random_model(dims, tokenizer, device, dtype, seed=cfg.run.seed)
    model = attach_lora(model, cfg.lora)
    if cfg.sft.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    trainer = AdapterTrainer(model, dist, OptimSettings.from_sft(cfg.sft), pad_token_id=tokenizer.pad_token_id,
                             total_steps=args.sft_warmup_steps + args.sft_steps)
    if dist.is_main:
        print(f"[rehearsal] {sum(p.numel() for p in model.parameters()) / 1e9:.2f}B parameters on {device} "
              f"({dtype}) in {time.perf_counter() - started:.1f} s; {dist.world_size} process(es)", flush=True)
    return Rehearsal(args=args, cfg=cfg, dist=dist, device=device, tokenizer=tokenizer, trainer=trainer,
                     rl_tasks=rl_tasks, eval_tasks=eval_tasks, eval_task_count=eval_count, fixtures=fixtures,
                     rl_tasks_per_batch=rl_per_batch, eval_tasks_per_batch=eval_per_batch,
                     chars_per_token=sum(len(t["code"]) for t in tasks) / code_tokens, template_tokens=template_tokens)


def build_report(ctx: Rehearsal, phases: list[dict]) -> dict:
    import torch

    from transformers import Qwen2Config

    args, cfg, world = ctx.args, ctx.cfg, ctx.dist.world_size
    by_key = {p["key"]: p for p in phases}
    for phase in phases:
        phase["work"] = phase["ranks"][0].get("work", "")
    if "rl_verification" in by_key:
        ranks = by_key["rl_verification"]["ranks"]
        total = {k: sum(r.get(k, 0) for r in ranks) for k in ("candidates", "real_kernels", "correct", "timed")}
        by_key["rl_verification"]["work"] = (f"{total['candidates']} candidates ({total['real_kernels']} real kernels: "
                                             f"{total['correct']} correct, {total['timed']} timed)")
    rates = measured_rates(by_key, world)
    dims = {**TINY, "vocab_size": len(ctx.tokenizer)} if args.model_scale == "tiny" else QWEN25_7B
    shape = ModelShape.from_hf_config(Qwen2Config(**dims))
    longest = {key: max((b["longest_prompt"] for r in by_key[key]["ranks"] for b in r.get("batches", [])), default=0)
               for key in ("rl_sampling", "eval_generation") if key in by_key}
    paper = estimate_memory_gib(shape, cfg, rl_batch=ctx.rl_tasks_per_batch * cfg.rl.samples_per_task,
                                longest_rl_prompt=longest.get("rl_sampling", 0),
                                eval_batch=ctx.eval_tasks_per_batch * cfg.eval.samples_per_task,
                                longest_eval_prompt=longest.get("eval_generation", 0))
    for key, gib in paper.items():
        if key in by_key:
            by_key[key]["estimated_gib"] = gib
    # The full run's worst batches: RL prompts as long as the data preparation lets through.
    longest_rl_allowed = ctx.template_tokens + round(cfg.data.max_prompt_chars / ctx.chars_per_token)
    worst = estimate_memory_gib(shape, cfg, rl_batch=ctx.rl_tasks_per_batch * cfg.rl.samples_per_task,
                                longest_rl_prompt=longest_rl_allowed,
                                eval_batch=ctx.eval_tasks_per_batch * cfg.eval.samples_per_task,
                                longest_eval_prompt=max((t["prompt_tokens"] for t in ctx.eval_tasks), default=0))
    worst_note = (f"On paper, the full run's largest batches need {worst['sft']:.1f} GiB (SFT), "
                  f"{worst['rl_sampling']:.1f} GiB (RL sampling, prompts up to {longest_rl_allowed} tokens = "
                  f"data.max_prompt_chars) and {worst['eval_generation']:.1f} GiB (evaluation).")
    kept_tokens = (sum(t["prompt_tokens"] for t in ctx.rl_tasks) / max(1, len(ctx.rl_tasks))
                   + sum(len(ctx.tokenizer(k)["input_ids"]) for k in ctx.fixtures.values()) / max(1, len(ctx.fixtures)))
    run = FullRun.plan(cfg, gpus=args.target_gpus, kernelbook_rows=args.kernelbook_rows,
                       mean_example_tokens=ctx.sft_mean_tokens or args.sft_median_tokens,
                       packed_fill=ctx.sft_packed_fill, eval_tasks=ctx.eval_task_count, kept_example_tokens=kept_tokens)
    projection = project(run, rates, args.usd_per_gpu_hour)
    device = torch.cuda.get_device_name(ctx.device) if _cuda(ctx) else "CPU"
    return {"device": device, "processes": world, "model_scale": args.model_scale, "config": cfg.source,
            "model_dims": dims, "parameters": shape.parameters(), "target_gpus": args.target_gpus,
            "tokenizer": {"vocab": len(ctx.tokenizer), "chars_per_token": ctx.chars_per_token}, "phases": phases,
            "memory_on_paper_gib": paper, "memory_on_paper_full_run_gib": worst, "memory_note": worst_note,
            "rates": asdict(rates), "full_run": asdict(run), "projection": projection.to_dict(),
            "table": markdown_table(phases, projection), "arguments": {k: v for k, v in vars(args).items()}}


def parse_args(argv=None) -> argparse.Namespace:
    from extensions.config import add_config_args

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernelbench", required=True, help="KernelBench JSONL (level, problem_id, name, code)")
    parser.add_argument("--usd-per-gpu-hour", type=float, required=True, help="hourly price of one GPU")
    parser.add_argument("--out", default=os.environ.get("OUT", "outputs/rehearsal"), help="where rehearsal.json/.md go")
    parser.add_argument("--work-dir", default="/tmp/kernel-rl-rehearsal", help="run root (checkpoints); wiped first")
    parser.add_argument("--model-scale", choices=("7b", "tiny"), default="7b",
                        help="7b: Qwen2.5-7B architecture; tiny: a 2-layer Qwen2 on the same code path (CPU tests)")
    parser.add_argument("--phases", default=",".join(PHASES), help=f"comma-separated subset of {','.join(PHASES)}")
    parser.add_argument("--target-gpus", type=int, default=8, help="GPUs of the projected full run (batch shapes follow it)")
    parser.add_argument("--kernelbook-rows", type=int, default=KERNELBOOK_ROWS, help="KernelBook rows the full run prepares")
    parser.add_argument("--sft-steps", type=int, default=3, help="timed SFT optimizer steps")
    parser.add_argument("--sft-warmup-steps", type=int, default=1, help="SFT steps before timing")
    parser.add_argument("--sft-median-tokens", type=int, default=None, help="median synthetic row length (7b: 900)")
    parser.add_argument("--rl-batches-per-rank", type=int, default=2, help="RL generate batches sampled per rank")
    parser.add_argument("--eval-batches-per-rank", type=int, default=1, help="evaluation generate batches per rank")
    parser.add_argument("--real-kernels-per-task", type=int, default=3,
                        help="samples of a task with a fixture kernel that are that kernel (the rest: model text)")
    parser.add_argument("--no-progress", dest="progress", action="store_false")
    add_config_args(parser)
    args = parser.parse_args(argv)
    unknown = sorted(set(args.phases.split(",")) - set(PHASES))
    if unknown:
        parser.error(f"unknown phase(s) {unknown}; choose among {', '.join(PHASES)}")
    if args.sft_median_tokens is None:
        args.sft_median_tokens = 64 if args.model_scale == "tiny" else 900
    if min(args.target_gpus, args.sft_steps, args.rl_batches_per_rank, args.eval_batches_per_rank) < 1 or args.sft_warmup_steps < 0:
        parser.error("--target-gpus, --sft-steps and the batches per rank must be >= 1, --sft-warmup-steps >= 0")
    return args


def write_report(ctx: Rehearsal, phases: list[dict]) -> str:
    """rehearsal.json and rehearsal.md under --out (rewritten after every phase, so a run cut short
    by a time limit still leaves what it measured); returns the markdown."""
    report = build_report(ctx, phases)
    out = Path(ctx.args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "rehearsal.json").write_text(json.dumps(report, indent=2, default=str))
    header = (f"### Production rehearsal on {report['processes']} x {report['device']} "
              f"({ctx.args.model_scale}, {report['parameters'] / 1e9:.2f}B parameters, random weights)\n")
    text = f"{header}\n{report['table']}\n\n{report['memory_note']}\n"
    (out / "rehearsal.md").write_text(text)
    return text


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    ctx = setup(args)
    phases = []
    for key in PHASES:
        if key in args.phases.split(","):
            phases.append(run_phase(ctx, key, PHASE_WORK[key]))
            text = write_report(ctx, phases) if ctx.dist.is_main else ""
    if ctx.dist.is_main:
        print("\n" + text, flush=True)
        print(f"[rehearsal] wrote {Path(args.out) / 'rehearsal.json'}", flush=True)
    return 1 if any(p.get("error") for p in phases) else 0


if __name__ == "__main__":
    sys.exit(main())
