"""The typed sections of the pipeline config, one dataclass per YAML section.

Defaults are those of the 8 x A100/H100 run with Qwen2.5-Coder-7B-Instruct; ``configs/smoke.yaml``
overrides what a CPU run needs. Each stage owns the fields of its own section.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import ClassVar, Literal, Optional, Union

from .errors import ConfigError

# A model repository on the Hugging Face hub: owner/name, each part as the hub allows it.
HUB_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")


@dataclass
class RunConfig:
    """Where a run lives and what it is called; ``extensions.runtime.paths.RunPaths`` derives every path."""

    root: str = "."
    run_id: str = "default"
    seed: int = 1234


@dataclass
class ModelConfig:
    # A hub id, a local directory, "pkg:MODULE" (the directory of an installed Python package), or
    # "fetch:NAME" (a GGUF model fetched and sha256-verified by `python -m extensions.models fetch NAME`).
    name_or_path: str = "Qwen/Qwen2.5-Coder-7B-Instruct"
    gguf_file: Optional[str] = None  # a GGUF file inside name_or_path (fetch: models default to theirs)
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"  # auto: bf16 on GPU, fp32 on CPU
    quantization: Literal["none", "8bit", "4bit"] = "none"
    device_map: Optional[str] = None  # "auto" shards one model over all visible GPUs
    attn_implementation: Optional[str] = None
    trust_remote_code: bool = False


@dataclass
class LoraConfig:
    r: int = 16
    alpha: int = 32
    dropout: float = 0.05
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )


@dataclass
class DataConfig:
    kernelbook: str = "GPUMODE/KernelBook"  # hub id or local .jsonl/.json/.parquet file; several: comma-joined
    kernelbench: str = "ScalingIntelligence/KernelBench"  # hub id, a local JSONL, or "none"
    kernelbench_levels: list[int] = field(default_factory=lambda: [1, 2, 3])
    bundled_eval_tasks: bool = False  # add the project's own evaluation tasks to eval_tasks.jsonl
    max_samples: Optional[int] = None
    val_fraction: float = 0.05
    rl_fraction: float = 0.2  # share of kept KernelBook tasks held out as RL tasks
    # KernelBook uuids held out as RL tasks whatever their hash (the bundled pairs' are
    # "bundled-<file stem>"); ids not among the kept rows are named in the prepare report.
    rl_task_ids: list[str] = field(default_factory=list)
    near_duplicate_threshold: float = 0.9
    decontamination_threshold: float = 0.85
    # Also drop a training row that computes what an evaluation task computes, however it is
    # spelled: equal traced operator graphs with shapes abstracted (extensions/data/operator_graph.py).
    decontaminate_by_computation: bool = True
    max_prompt_chars: int = 12000  # longer normalised tasks are dropped (task_too_long)
    max_completion_chars: int = 16000  # longer solutions are dropped (solution_too_long)
    # Drop solutions that hand the math to vendor kernels (inductor's extern_kernels.mm, aten.*):
    # the verifier rejects them, so training on them teaches what RL then punishes.
    drop_library_kernel_solutions: bool = True
    # Judge every kept pair with the verifier (CUDA if visible, else the interpreter) and drop the
    # ones it rejects, so SFT and retrieval teach only what the reward accepts. Verdicts are cached
    # by content (extensions/data/pair_verification.py); false is for experiments on raw data only.
    verify_pairs: bool = True
    # Worked-example index over the SFT training pairs (data/processed/retrieval/), for prompt.mode
    # raicl. lexical: BM25 over the normalised code tokens (bm25s, no download); dense: a
    # sentence-transformers embedding model and FAISS (both installed by the user).
    retrieval: Literal["lexical", "dense"] = "lexical"
    retrieval_dense_model: str = "flax-sentence-embeddings/st-codesearch-distilroberta-base"


@dataclass
class PromptConfig:
    """How a task is asked: the same builder serves SFT data, RL rollouts and evaluation."""

    # plain: the task alone; raicl: the task after the raicl_k most similar KernelBook pairs
    # (retrieval-augmented in-context learning), from the index prepare_data.py builds.
    mode: Literal["plain", "raicl"] = "plain"
    raicl_k: int = 3
    # Characters of worked examples (task + solution) one prompt may hold; an example that does not
    # fit is left out (counted), so long pairs cannot push the task out of the context.
    raicl_max_example_chars: int = 12000
    # Multi-turn prompts (task + earlier kernels + feedback) above this many tokens drop their
    # oldest refinement rounds first; the latest round always stays.
    max_prompt_tokens: int = 6144


@dataclass
class SFTConfig:
    learning_rate: float = 2e-4
    num_epochs: float = 1.0
    max_steps: int = -1  # > 0 overrides num_epochs
    per_device_batch_size: int = 4
    gradient_accumulation_steps: int = 4
    warmup_ratio: float = 0.03
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    max_seq_len: int = 4096
    batching: Literal["packed", "length_grouped", "padded"] = "packed"
    gradient_checkpointing: bool = True
    save_every_steps: int = 100
    eval_every_steps: int = 100
    keep_last_checkpoints: int = 3
    log_every_steps: int = 10


@dataclass
class CurriculumConfig:
    curriculum_start_p: float = 0.1
    curriculum_end_p: float = 0.5
    curriculum_trigger_threshold: float = 0.4
    curriculum_step: float = 0.1  # how far the level-2 share moves per round once triggered
    curriculum_window: int = 3  # rounds in the moving level-1 correct rate
    curriculum_level3_end_p: float = 0.2  # level 3 opens only after level 2 is mastered; 0 excludes it


@dataclass
class RewardWeightsConfig:
    """The reward table: the reward of each verifier stage reached (``verifier.reward_weights``). The
    CLI's ``reward``, every verdict's and RL's default preset all read it; a cheating flag gives 0."""

    none: float = 0.0  # no code block could be extracted
    extract: float = 0.0  # code extracted, failed the static check
    static: float = 0.0  # passed the static check, failed to compile
    compile: float = 0.3
    tiny: float = 0.5
    full: float = 0.7
    speed: float = 0.3  # timed: full + speed * min(speedup / speedup_saturation, 1)
    speedup_saturation: float = 2.0


@dataclass
class RLConfig:
    # TRL's GRPOConfig names for the same settings, accepted in YAML and --set (docs/training.md):
    # alias -> (key here, value translation or None). TRL's loss_type "grpo" averages each sample
    # over its own tokens (sequence); "bnpo" and "dapo" normalise over the step's tokens (token).
    KEY_ALIASES: ClassVar[dict[str, tuple[str, Optional[dict]]]] = {
        "num_generations": ("samples_per_task", None),
        "max_completion_length": ("max_new_tokens", None),
        "epsilon": ("clip_eps_low", None),
        "epsilon_high": ("clip_eps_high", None),
        "num_iterations": ("ppo_epochs", None),
        "loss_type": ("loss_normalization", {"grpo": "sequence", "bnpo": "token", "dapo": "token"}),
        "scale_rewards": ("scale_advantages", {True: True, False: False, "group": True, "none": False}),
    }
    # What the first round's policy is: the SFT stage's final adapter (required), or the base model
    # with a fresh LoRA adapter.
    init: Literal["sft", "base"] = "sft"
    num_rounds: int = 10
    tasks_per_round: int = 32
    samples_per_task: int = 10  # N of Best-of-N
    top_k: int = 3  # K kept per task
    reward_threshold: float = 0.3
    learning_rate: float = 5e-6
    epochs_per_round: int = 1
    per_device_batch_size: int = 2
    gradient_accumulation_steps: int = 4
    max_new_tokens: int = 2048
    temperature: float = 0.8
    top_p: float = 0.95
    generation_batch_size: int = 64  # sequences decoded together
    cuda_graphs: bool = True  # replay each decode step as a CUDA graph (single-GPU models)
    # torch.compile the decode step on a GPU. Off by default: each compile takes about a minute and
    # new prompt widths compile again, so three RL rounds took 125 s compiled against 28 s not
    # (bench/results/decode_compile_rounds_h100.md); it pays off only over dozens of rounds.
    compile_decode: bool = False
    # Verify each sampled chunk while the next one samples (one verifier session per round and
    # rank); false: verify after sampling, verify_chunk_size candidates per verifier call.
    overlap_verification: bool = True
    # Candidates per verifier call where verification does not overlap sampling (overlap off, a
    # verifier that does not stream, multi-turn rounds), each call's verdicts logged together.
    verify_chunk_size: int = 32
    keep_last_rounds: int = 3  # complete round-NNN checkpoints kept
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)
    # best_of_n: expert iteration (SFT on the top_k per task); grpo / rloo / reinforce: clipped
    # token-level policy gradient; reward_weighted: SFT on every sample weighted by its reward.
    algorithm: Literal["best_of_n", "grpo", "rloo", "reinforce", "reward_weighted"] = "best_of_n"
    # verifier: the reward table (verifier.reward_weights); format / correctness / speed: presets
    # moving the weight from format and compiling to correctness, then speed; weights: the same as
    # verifier (the name of the days when the table had a copy here).
    reward_preset: Literal["verifier", "format", "correctness", "speed", "weights"] = "verifier"
    # Your own reward, "module:function" (importable from the working directory or PYTHONPATH):
    # fn(prompts, completions, verdicts, **kw) -> list[float], called once per round. The verifier
    # stays the gate: a cheating flag scores 0 and a candidate that is not correct scores at most
    # what reward_preset gives it (docs/training.md, "Your own reward").
    reward_fn: Optional[str] = None
    ppo_epochs: int = 1  # passes over a round's rollouts (policy-gradient algorithms)
    clip_eps_low: float = 0.2  # ratio clipped to [1 - clip_eps_low, 1 + clip_eps_high]
    clip_eps_high: float = 0.28
    loss_normalization: Literal["token", "sequence"] = "token"  # token: sum over the step / its tokens
    scale_advantages: bool = True  # grpo: divide by the group std (false: Dr. GRPO)
    beta: float = 0.0  # KL penalty to the base model (adapters disabled); 0: no reference forward
    baseline_momentum: float = 0.9  # reinforce: running baseline b <- m b + (1 - m) round mean
    # Multi-turn rollouts: each trajectory refines its kernel on the verifier's feedback for up to
    # max_turns turns (1: one attempt per sample); turn t trains on R_t = s_t + gamma * R_{t+1}.
    max_turns: int = 1
    gamma: float = 0.4

    def check(self, where: str = "rl") -> None:
        # ``weights`` named a copy of the reward table kept here; the table is the verifier's now,
        # which is what ``verifier`` reads.
        if self.reward_preset == "weights":
            self.reward_preset = "verifier"


@dataclass
class VerifierConfig:
    device: Literal["auto", "cpu", "cuda"] = "auto"
    timeout_s: float = 120.0
    workers: int = 0  # 0: one per CPU core (CPU); CUDA: one per 2 cores and per 10 GB, 2-8 per GPU (timing one at a time)
    max_output_bytes: int = 65536
    # auto = bwrap, failing loudly where bubblewrap cannot start; process only when named here.
    isolation: Literal["auto", "bwrap", "process"] = "auto"
    # One sandboxed server per worker slot imports torch/Triton once and forks a fresh child per
    # candidate (before any CUDA initialisation). False: a fresh sandboxed process per candidate.
    fork_server: bool = True
    # Fork servers per worker slot; each forks its next child ahead, which starts CUDA and the
    # profiler while another server's candidate runs. 0: two on CUDA, one on CPU.
    fork_servers_per_slot: int = 0
    # Without the fork server: start each slot's next worker (imports done, no candidate yet) while
    # the current one runs; on GPUs and where CPU cores are left over. One candidate per worker.
    prespawn_workers: bool = True
    # CUDA: a trusted warm-up builds Triton's C modules (driver utilities, launchers of common
    # kernel signatures) once per batch; each candidate's private Triton cache starts as a copy.
    prebuilt_triton_cache: bool = True
    # A batch's trusted reference processes build one problem after another (torch imported and
    # CUDA started once per process, not per problem); a process that fails or times out is
    # replaced. False: a fresh process per problem.
    reference_server: bool = True
    # Reference processes at once. 0: as many as the worker slots on CPU; on CUDA half the slots,
    # at least two (each is one more CUDA context sharing the GPU's time slices: docs/benchmarks.md).
    reference_processes: int = 0
    # Host memory a candidate's processes may take beyond the worker's own (interpreter, torch,
    # Triton); above it the tree is killed (memory_limit). 0: no cap.
    memory_limit_mb: int = 3072
    # multi-input correctness
    enable_multi_input: bool = True
    multi_input_num_tests: int = 5
    multi_input_shape_variations: bool = True
    multi_input_value_variations: bool = True
    atol_fp32: float = 1e-4
    rtol_fp32: float = 1e-4
    atol_low_precision: float = 1e-2
    rtol_low_precision: float = 1e-2
    cpu_max_input_numel: int = 65536  # KernelBench sizes are for big GPUs; shrink for the interpreter
    # On CUDA inputs cross the sandbox as files; 0 keeps the problem's own sizes.
    cuda_max_input_numel: int = 1 << 25
    # ||out - ref|| / ||ref|| bound, so a near-zero output cannot hide under atol on small references
    max_relative_error: float = 1e-2
    min_reference_norm: float = 1e-6  # below this the reference is ~0 and only atol/rtol apply
    seed: int = 42  # construction seed (get_init_inputs, Model, ModelNew); input seeds are drawn per batch
    # staged evaluation
    enable_staged_eval: bool = True
    staged_skip_timing_on_failure: bool = True
    staged_tiny_batch_first: bool = True
    # timing (GPU only)
    enable_calibrated_timing: bool = True
    timing_num_warmup: int = 10
    timing_num_trials: int = 50
    timing_use_events: bool = True
    timing_budget_s: float = 2.0
    timing_max_cv: float = 0.02
    timing_max_remeasure: int = 2
    speedup_review_bound: float = 10.0
    timing_mode: Literal["counts", "budget"] = "budget"  # budget: trials cut to fit timing_budget_s
    # excluded: each call is queued in full behind a gate before its timed region opens, so host
    # launch time is not timed (the reward's mode); included: eager timing, launch time counts
    timing_launch_cost: Literal["excluded", "included"] = "excluded"
    timing_min_trials: int = 10  # floor on paired trials, however small the budget
    timing_max_trials: int = 1000  # ceiling on paired trials in budget mode
    timing_bootstrap_samples: int = 1000  # resamples for the speedup's 95% CI
    timing_seed: int = 0  # bootstrap and output-check sampling
    timing_output_checks: int = 3  # timed pairs whose outputs are compared (plus the final probe)
    timing_side_stream_tolerance_us: float = 5.0  # device-wait excess over the reference that counts as hidden work
    # ... and the share of the candidate's own time it must also exceed: honest modules differ by
    # a device after-effect of their memory traffic (tens of us after multi-GB writes)
    timing_side_stream_min_share: float = 0.1
    timing_wall_slack_ms: float = 1.0  # event time may trail host wall time by this much before it is suspicious
    timing_memo_ratio: float = 1.5  # fresh-input call this much slower than repeats: memoisation suspected
    # policy
    allow_library_gemm: bool = False
    # The reward table (docs/verifier.md): every verdict's reward, the CLI's and RL's default.
    reward_weights: RewardWeightsConfig = field(default_factory=RewardWeightsConfig)

    def check(self, where: str = "verifier") -> None:
        if self.reward_weights.speedup_saturation <= 0:
            raise ConfigError(f"{where}.reward_weights.speedup_saturation must be > 0, "
                              f"got {self.reward_weights.speedup_saturation}")


# Keys a release before this one read, and the keys that now hold their values (a one-line warning
# says so when one is used). ``rl.reward_weights`` was a second copy of the reward table, the
# ``verifier.reward_*`` keys a third; the table now lives once, in ``verifier.reward_weights``.
_TABLE = "verifier.reward_weights"
DEPRECATED_KEYS: dict[str, tuple[str, ...]] = {
    "verifier.reward_static_fail": (f"{_TABLE}.none", f"{_TABLE}.extract", f"{_TABLE}.static"),
    "verifier.reward_compiled": (f"{_TABLE}.compile",),
    "verifier.reward_tiny_correct": (f"{_TABLE}.tiny",),
    "verifier.reward_full_correct": (f"{_TABLE}.full",),
    "verifier.reward_speed_weight": (f"{_TABLE}.speed",),
    "verifier.reward_speedup_saturation": (f"{_TABLE}.speedup_saturation",),
}
# Whole sections that moved: every key below the old name now lives below the new one.
MOVED_SECTIONS: dict[str, str] = {"rl.reward_weights": _TABLE}


@dataclass
class EvalConfig:
    num_tasks: Optional[int] = None
    levels: list[int] = field(default_factory=lambda: [1, 2, 3])
    samples_per_task: int = 1
    temperature: float = 0.0  # 0: greedy
    top_p: float = 0.95
    max_new_tokens: int = 2048
    seed: int = 1234
    generation_batch_size: int = 64
    # torch.compile the decode step on a GPU; off by default, as for rl (every evaluated model is a
    # fresh load, so each would pay the minute of compiling again).
    compile_decode: bool = False
    # Processes that generate, one per GPU; 0: one per visible GPU (1 when model.device_map is set).
    generation_workers: int = 0
    # Refinement turns per trajectory (evaluate.py --turns): turn t sees the task, its previous
    # kernel and the verifier's feedback; a trajectory stops at a correct kernel. 1: one attempt.
    turns: int = 1
    bootstrap_samples: int = 2000


@dataclass
class CheckpointConfig:
    bucket: Optional[str] = None
    prefix: str = "kernel-rl"
    sync_interval_s: float = 600.0
    keep_last: int = 3
    sync_dirs: list[str] = field(default_factory=lambda: ["checkpoints", "data", "outputs", "logs"])
    # Poll the instance metadata service for spot notices: auto (only where /sys says this is an
    # EC2 instance), on (always, e.g. in a container that hides /sys), off (never; SIGTERM still works).
    # YAML 1.1 reads a bare on/off as true/false: both spellings are accepted.
    spot_watch: Union[Literal["auto", "on", "off"], bool] = "auto"
    spot_poll_interval_s: float = 5.0
    metadata_endpoint: str = "http://169.254.169.254"
    upload_concurrency: int = 16  # threads per file (multipart parts in flight)
    file_concurrency: int = 4  # files uploaded or downloaded at once
    multipart_chunk_mb: int = 16  # also the multipart threshold; S3 ETags are computed with it
    max_retries: int = 8
    retry_backoff_s: float = 1.0  # first retry delay, doubled per attempt up to retry_backoff_max_s
    retry_backoff_max_s: float = 30.0
    noncurrent_version_days: int = 7  # `setup`: lifecycle expiry of overwritten/deleted versions
    notice_deadline_s: float = 120.0  # when a notice has no parseable `time`, and for SIGTERM
    save_ack_timeout_s: float = 60.0  # longest wait for the trainer to confirm the requested save
    emergency_reserve_s: float = 30.0  # time before the deadline kept for the emergency sync
    # Publishing (transformers' TrainingArguments names): the RL stage's final adapter is pushed to
    # hub_model_id when the stage ends, with its model card; `python -m extensions.export
    # --push-to-hub` pushes a merged model (docs/training.md, "Publishing to the Hugging Face hub").
    push_to_hub: bool = False
    hub_model_id: Optional[str] = None  # owner/name
    hub_private: bool = True  # a repository the push creates is private

    def check(self, where: str = "checkpoint") -> None:
        """Settings that are valid one by one but not together."""
        if self.hub_model_id is not None and not HUB_REPO_ID.match(self.hub_model_id):
            raise ConfigError(f"{where}.hub_model_id: {self.hub_model_id!r} is not a hub repository id; "
                              "give it as owner/name (e.g. alice/qwen-coder-triton-lora)")
        if self.push_to_hub and not self.hub_model_id:
            raise ConfigError(f"{where}.push_to_hub is true but {where}.hub_model_id is not set: name the "
                              f"repository as owner/name, e.g. --set {where}.hub_model_id=alice/qwen-coder-triton-lora")


@dataclass
class LoggingConfig:
    """Where training metrics go besides logs/<stage>_metrics.jsonl (always written)."""

    # Experiment trackers, through accelerate: tensorboard (logs/tensorboard/<stage>), wandb, mlflow.
    # wandb and mlflow are not dependencies: install the package of the one you name. [] = JSONL only.
    report_to: list[Literal["tensorboard", "wandb", "mlflow"]] = field(default_factory=lambda: ["tensorboard"])
    # TensorBoard histograms of an RL round's rewards, speedups and advantages on every round whose
    # index is a multiple of this (1: every round; 0: never); fewer keeps long runs' event files small.
    histogram_every: int = 1

    def check(self, where: str = "logging") -> None:
        if self.histogram_every < 0:
            raise ConfigError(f"{where}.histogram_every: {self.histogram_every} is below 0 "
                              "(0 turns the histograms off, N logs them every N rounds)")


@dataclass
class PipelineConfig:
    """The whole config: one field per YAML section."""

    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    data: DataConfig = field(default_factory=DataConfig)
    prompt: PromptConfig = field(default_factory=PromptConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    rl: RLConfig = field(default_factory=RLConfig)
    verifier: VerifierConfig = field(default_factory=VerifierConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    # The file this config came from, so checkpoints can name it in meta.json, and why that file
    # was taken when the command line named none (see extensions.config.machine).
    source: Optional[str] = None
    source_reason: Optional[str] = None

