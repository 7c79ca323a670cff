"""Arithmetic of the production rehearsal (``bench/production_rehearsal.py``): what the full default
run does, how long it takes on N GPUs at the rates the rehearsal measured, what it costs, and how
much GPU memory each phase needs on paper. Plain Python, no torch.

Projection assumptions (printed with the table, so a reader can argue with them):

- data parallelism scales linearly: the LoRA gradient all-reduce (~40M values for a 7B model) is
  small next to a 32k-token step, so tokens/s per GPU is taken as measured on any GPU count;
- every sampled sequence runs to ``max_new_tokens`` (random weights never stop early), so sampling
  and evaluation times are upper bounds;
- verification costs what the rehearsal's mix of candidates cost per GPU (its real-kernel share is
  in the table's notes); a trained policy writes more kernels that compile and get timed;
- the evaluation judges three models (``evaluate.py --compare``: base, SFT, RL); loading each
  model's weights is not included;
- the periodic S3 sync runs in a background thread and is not on the critical path.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

GIB = 2**30
CARDS_GIB = {"40 GB": 40.0, "80 GB": 80.0}
KERNELBOOK_ROWS = 18162  # rows of GPUMODE/KernelBook's train split (before the preparation's drops)
EVALUATED_MODELS = 3  # evaluate.py --compare: base, SFT and RL
LORA_STATE_COPIES = 4  # fp32 LoRA weights, their gradients, AdamW's two moments
# Bytes per (token, vocabulary entry) around the loss: bf16 logits, their fp32 copy, the fp32
# log-softmax kept for backward and its fp32 gradient.
LOSS_BYTES_PER_LOGIT = 2 + 4 + 4 + 4


@dataclass(frozen=True)
class ModelShape:
    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    tied_embeddings: bool = False

    @classmethod
    def from_hf_config(cls, config) -> "ModelShape":
        return cls(vocab=config.vocab_size, hidden=config.hidden_size, intermediate=config.intermediate_size,
                   layers=config.num_hidden_layers, heads=config.num_attention_heads,
                   kv_heads=config.num_key_value_heads, tied_embeddings=bool(config.tie_word_embeddings))

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each projection of one decoder layer, by module name."""
        h, i, kv = self.hidden, self.intermediate, self.kv_dim
        return {"q_proj": (h, h), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (h, h),
                "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}

    def parameters(self) -> int:
        per_layer = sum(a * b for a, b in self.linear_shapes().values()) + self.hidden + 2 * self.kv_dim + 2 * self.hidden
        embeddings = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        return embeddings + self.layers * per_layer + self.hidden

    def lora_parameters(self, rank: int, targets) -> int:
        shapes = self.linear_shapes()
        return self.layers * sum(rank * (shapes[t][0] + shapes[t][1]) for t in targets if t in shapes)

    def kv_bytes_per_token(self, bytes_per_value: int = 2) -> int:
        return 2 * self.layers * self.kv_dim * bytes_per_value


def decode_memory_gib(shape: ModelShape, batch: int, longest_prompt: int, max_new_tokens: int) -> float:
    """Weights + static KV cache + the prefill's widest transient (one MLP of the padded batch)."""
    weights = shape.parameters() * 2
    cache = batch * (longest_prompt + max_new_tokens) * shape.kv_bytes_per_token()
    prefill_mlp = 3 * batch * longest_prompt * shape.intermediate * 2  # gate/act, up, their product
    return (weights + cache + prefill_mlp) / GIB


def sft_memory_gib(shape: ModelShape, *, rows: int, seq_len: int, lora_rank: int, targets) -> float:
    """Weights + LoRA state + checkpointed layer inputs + one layer recomputed + the loss's logits."""
    tokens = rows * seq_len
    weights = shape.parameters() * 2
    lora = shape.lora_parameters(lora_rank, targets) * 4 * LORA_STATE_COPIES
    checkpoints = shape.layers * tokens * shape.hidden * 2
    one_layer = tokens * (6 * shape.hidden + 2 * shape.kv_dim + 4 * shape.intermediate) * 2
    logits = tokens * shape.vocab * LOSS_BYTES_PER_LOGIT
    return (weights + lora + checkpoints + one_layer + logits) / GIB


def estimate_memory_gib(shape: ModelShape, cfg, *, rl_batch: int, longest_rl_prompt: int, eval_batch: int,
                        longest_eval_prompt: int) -> dict[str, float]:
    """Peak GPU memory per phase on paper, in GiB (the allocator's fragmentation not included)."""
    return {
        "sft": sft_memory_gib(shape, rows=cfg.sft.per_device_batch_size, seq_len=cfg.sft.max_seq_len,
                              lora_rank=cfg.lora.r, targets=cfg.lora.target_modules),
        "rl_sampling": decode_memory_gib(shape, rl_batch, longest_rl_prompt, cfg.rl.max_new_tokens),
        "eval_generation": decode_memory_gib(shape, eval_batch, longest_eval_prompt, cfg.eval.max_new_tokens),
    }


# -- the full run --------------------------------------------------------------------------------

@dataclass
class FullRun:
    """The amounts of work of the full default run on ``gpus`` GPUs."""

    gpus: int
    sft_rows: int
    val_rows: int
    sft_tokens: float
    sft_steps: int
    sft_validations: int
    val_tokens: float
    checkpoint_saves: int
    rl_rounds: int
    rl_chunks_per_rank: int
    rl_candidates_per_round: int
    rl_kept_tokens_per_round: float
    eval_tasks: int
    eval_chunks_per_worker: int
    eval_candidates: int

    @classmethod
    def plan(cls, cfg, *, gpus: int, kernelbook_rows: int, mean_example_tokens: float, packed_fill: float,
             eval_tasks: int, kept_example_tokens: float) -> "FullRun":
        data, sft, rl, ev = cfg.data, cfg.sft, cfg.rl, cfg.eval
        training_rows = kernelbook_rows * (1 - data.rl_fraction)
        val_rows = round(training_rows * data.val_fraction)
        sft_rows = round(training_rows) - val_rows
        tokens_per_step = sft.per_device_batch_size * sft.gradient_accumulation_steps * gpus * sft.max_seq_len * packed_fill
        if sft.max_steps > 0:
            steps = sft.max_steps
            sft_tokens = steps * tokens_per_step
        else:
            sft_tokens = sft_rows * mean_example_tokens * sft.num_epochs
            steps = max(1, math.ceil(sft_tokens / tokens_per_step))
        validations = (steps - 1) // sft.eval_every_steps + 1 if sft.eval_every_steps > 0 else 1
        saves = ((steps - 1) // sft.save_every_steps if sft.save_every_steps > 0 else 0) + 1 + rl.num_rounds
        rl_tasks_per_rank = math.ceil(rl.tasks_per_round / gpus)
        rl_tasks_per_chunk = max(1, rl.generation_batch_size // rl.samples_per_task)
        # evaluate.py cuts the tasks into batches of generation_batch_size and deals them to one
        # worker per GPU, so fewer batches than GPUs leave GPUs idle.
        eval_batches = math.ceil(eval_tasks / max(1, ev.generation_batch_size // ev.samples_per_task))
        return cls(
            gpus=gpus, sft_rows=sft_rows, val_rows=val_rows, sft_tokens=sft_tokens, sft_steps=steps,
            sft_validations=validations, val_tokens=val_rows * mean_example_tokens * validations,
            checkpoint_saves=saves, rl_rounds=rl.num_rounds,
            rl_chunks_per_rank=math.ceil(rl_tasks_per_rank / rl_tasks_per_chunk),
            rl_candidates_per_round=rl.tasks_per_round * rl.samples_per_task,
            rl_kept_tokens_per_round=rl.top_k * rl.tasks_per_round * kept_example_tokens,
            eval_tasks=eval_tasks, eval_chunks_per_worker=math.ceil(eval_batches / gpus),
            eval_candidates=eval_tasks * ev.samples_per_task,
        )


@dataclass
class Rates:
    """Per-GPU rates measured by the rehearsal (None: that phase was skipped)."""

    sft_tokens_per_s: Optional[float] = None
    validation_tokens_per_s: Optional[float] = None
    rl_chunk_s: Optional[float] = None  # one generate batch of a rank, compiled and warm
    rl_first_chunk_extra_s: float = 0.0  # compiling paid once per process
    eval_chunk_s: Optional[float] = None
    eval_first_chunk_extra_s: float = 0.0
    verify_gpu_s_per_candidate: Optional[float] = None
    save_s: Optional[float] = None


@dataclass
class ProjectedPart:
    key: str
    work: str
    seconds: Optional[float]  # None: not measured, left out of the total
    basis: str


@dataclass
class Projection:
    gpus: int
    usd_per_gpu_hour: float
    parts: list[ProjectedPart] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return all(p.seconds is not None for p in self.parts)

    @property
    def seconds(self) -> float:
        return sum(p.seconds for p in self.parts if p.seconds is not None)

    @property
    def gpu_hours(self) -> float:
        return self.seconds * self.gpus / 3600

    @property
    def usd(self) -> float:
        return self.gpu_hours * self.usd_per_gpu_hour

    def to_dict(self) -> dict:
        return {"gpus": self.gpus, "usd_per_gpu_hour": self.usd_per_gpu_hour, "complete": self.complete,
                "hours": self.seconds / 3600, "gpu_hours": self.gpu_hours, "usd": self.usd,
                "parts": [vars(p) for p in self.parts]}


def _per_gpu(amount: float, rate: Optional[float], gpus: int) -> Optional[float]:
    return None if not rate else amount / (rate * gpus)


def project(run: FullRun, rates: Rates, usd_per_gpu_hour: float) -> Projection:
    g = run.gpus
    sft = _per_gpu(run.sft_tokens, rates.sft_tokens_per_s, g)
    validation = _per_gpu(run.val_tokens, rates.validation_tokens_per_s, g)
    sampling = None if rates.rl_chunk_s is None else (
        run.rl_rounds * run.rl_chunks_per_rank * rates.rl_chunk_s + rates.rl_first_chunk_extra_s)
    verify_s = rates.verify_gpu_s_per_candidate
    generation = None if rates.eval_chunk_s is None else EVALUATED_MODELS * (
        run.eval_chunks_per_worker * rates.eval_chunk_s + rates.eval_first_chunk_extra_s)
    parts = [
        ProjectedPart("sft", f"{run.sft_steps} steps ({run.sft_rows} rows, {run.sft_tokens / 1e6:.1f}M tokens) "
                      f"+ {run.sft_validations} validation passes",
                      None if sft is None or validation is None else sft + validation, "SFT tokens/s per GPU"),
        ProjectedPart("rl_sampling", f"{run.rl_rounds} rounds x {run.rl_chunks_per_rank} generate batch(es) per GPU",
                      sampling, "seconds per generate batch"),
        ProjectedPart("rl_verification", f"{run.rl_rounds} rounds x {run.rl_candidates_per_round} candidates",
                      None if verify_s is None else run.rl_rounds * run.rl_candidates_per_round * verify_s / g,
                      "GPU-seconds per candidate"),
        ProjectedPart("rl_finetune", f"{run.rl_rounds} rounds x <= {run.rl_kept_tokens_per_round / 1e3:.0f}k kept tokens",
                      _per_gpu(run.rl_rounds * run.rl_kept_tokens_per_round, rates.sft_tokens_per_s, g),
                      "SFT tokens/s per GPU"),
        ProjectedPart("checkpoint_save", f"{run.checkpoint_saves} saves",
                      None if rates.save_s is None else run.checkpoint_saves * rates.save_s, "seconds per save"),
        ProjectedPart("eval_generation", f"{EVALUATED_MODELS} models x {run.eval_tasks} tasks "
                      f"({run.eval_chunks_per_worker} batch(es) per GPU)", generation, "seconds per generate batch"),
        ProjectedPart("eval_verification", f"{EVALUATED_MODELS} models x {run.eval_candidates} candidates",
                      None if verify_s is None else EVALUATED_MODELS * run.eval_candidates * verify_s / g,
                      "GPU-seconds per candidate"),
    ]
    return Projection(gpus=g, usd_per_gpu_hour=usd_per_gpu_hour, parts=parts)


# -- rates measured by the rehearsal ------------------------------------------------------------

def batch_seconds(phase: Optional[dict]) -> tuple[Optional[float], float]:
    """(seconds of a warm generate batch, extra seconds of each process's first batch)."""
    if not phase or phase.get("error"):
        return None, 0.0
    firsts = [r["batches"][0]["seconds"] for r in phase["ranks"] if r.get("batches")]
    later = [b["seconds"] for r in phase["ranks"] for b in r.get("batches", [])[1:]]
    if not firsts:
        return None, 0.0
    first = sum(firsts) / len(firsts)
    if not later:
        return first, 0.0
    warm = sum(later) / len(later)
    return warm, max(0.0, first - warm)


def measured_rates(phases: dict[str, dict], world: int) -> Rates:
    """Per-GPU rates from the gathered phases (``world`` processes, one GPU each)."""
    ok = {key: p for key, p in phases.items() if not p.get("error")}
    rates = Rates()
    if "sft" in ok:
        rates.sft_tokens_per_s = ok["sft"].get("tokens_per_s_per_gpu")
        rates.validation_tokens_per_s = ok["sft"]["ranks"][0]["validation_tokens_per_s_per_gpu"]
    rates.rl_chunk_s, rates.rl_first_chunk_extra_s = batch_seconds(ok.get("rl_sampling"))
    rates.eval_chunk_s, rates.eval_first_chunk_extra_s = batch_seconds(ok.get("eval_generation"))
    verification = ok.get("rl_verification")
    candidates = sum(r.get("candidates", 0) for r in verification["ranks"]) if verification else 0
    if candidates:
        rates.verify_gpu_s_per_candidate = verification["seconds"] * world / candidates
    if "checkpoint_save" in ok:
        rates.save_s = ok["checkpoint_save"]["seconds"]
    return rates


# -- the table -----------------------------------------------------------------------------------

# Row order of the table: (key, name); a key names a rehearsed phase, a projected part, or both.
ROWS = [("sft", "SFT"), ("rl_sampling", "RL sampling"), ("rl_verification", "RL verification"),
        ("rl_finetune", "RL fine-tuning"), ("checkpoint_save", "checkpoint save"), ("s3_sync", "S3 sync"),
        ("eval_generation", "evaluation generation"), ("eval_verification", "evaluation verification")]


def _fmt(value: Optional[float], spec: str = ".1f", none: str = "-") -> str:
    return none if value is None else format(value, spec)


def margin_gib(peak_gib: Optional[float], card: str) -> Optional[float]:
    return None if peak_gib is None else CARDS_GIB[card] - peak_gib


def _measured_cells(phase: Optional[dict]) -> list[str]:
    if phase is None:
        return ["-"] * 7
    peak = phase.get("peak_reserved_gib")
    memory = "-" if peak is None else f"{phase['peak_allocated_gib']:.1f} / {peak:.1f}"
    wall = f"failed: {phase['error']}" if phase.get("error") else _fmt(phase.get("seconds"))
    return [phase.get("work", ""), wall, _fmt(phase.get("tokens_per_s_per_gpu"), ",.0f"), memory,
            _fmt(phase.get("estimated_gib")), *(_fmt(margin_gib(peak, card), "+.1f") for card in CARDS_GIB)]


def _projected_cells(part: Optional[ProjectedPart], projection: Projection) -> list[str]:
    if part is None:
        return ["in the background", "-", "-", "-"]
    if part.seconds is None:
        return [part.work, "not measured", "-", "-"]
    gpu_hours = part.seconds * projection.gpus / 3600
    return [f"{part.work} (from {part.basis})", f"{part.seconds / 3600:.2f}", f"{gpu_hours:.1f}",
            f"{gpu_hours * projection.usd_per_gpu_hour:,.0f}"]


def markdown_table(phases: list[dict], projection: Projection) -> str:
    """One table: each phase as rehearsed (measured), and the full default run projected from it."""
    g = projection.gpus
    head = ["phase", "rehearsed", "wall s", "tokens/s per GPU", "peak GiB alloc / reserved", "on paper GiB",
            "margin 40 GB", "margin 80 GB", f"full run on {g} GPUs", "hours", "GPU-hours",
            f"USD at ${projection.usd_per_gpu_hour:.2f}/GPU-h"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 9 + "---:|" * 3]
    by_key = {p["key"]: p for p in phases}
    parts = {p.key: p for p in projection.parts}
    for key, name in ROWS:
        if key not in by_key and key not in parts:
            continue
        cells = [name, *_measured_cells(by_key.get(key)), *_projected_cells(parts.get(key), projection)]
        lines.append("| " + " | ".join(cells) + " |")
    total = "total" if projection.complete else "total (measured parts only)"
    lines.append(f"| **{total}** |" + " |" * 8 + f" **{projection.seconds / 3600:.2f}** | "
                 f"**{projection.gpu_hours:.1f}** | **{projection.usd:,.0f}** |")
    return "\n".join(lines)
