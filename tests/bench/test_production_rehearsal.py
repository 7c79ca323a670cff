"""The production rehearsal (bench/production_rehearsal.py): its random model, its arithmetic, and a
whole rehearsal at tiny scale on the CPU (real verifier, real checkpoint, loopback S3)."""
from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from project_paths import FIXTURES_DIR, PROJECT_ROOT

sys.path.insert(0, str(PROJECT_ROOT / "bench"))

from rehearsal_inputs import TINY, build_code_tokenizer, build_random_model, sample_variant  # noqa: E402
from rehearsal_report import FullRun, ModelShape, Rates, markdown_table, project  # noqa: E402

from extensions.config import load_config  # noqa: E402


@pytest.fixture(scope="module")
def tokenizer():
    return build_code_tokenizer(["import torch\nclass Model(nn.Module):\n    def forward(self, x):\n        return x\n"] * 4, 300)


def test_model_built_on_meta_is_initialised_like_a_normal_one(tokenizer):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    dims = {**TINY, "vocab_size": len(tokenizer)}
    model = build_random_model(dims, tokenizer, torch.device("cpu"), torch.float32, seed=0)
    reference = Qwen2ForCausalLM(Qwen2Config(**dims))
    assert not any(p.is_meta for p in model.parameters())
    for (name, mine), (_, theirs) in zip(model.named_buffers(), reference.named_buffers()):
        assert torch.equal(mine, theirs), name  # rotary frequencies recomputed, not left as garbage
    params = dict(model.named_parameters())
    assert torch.equal(params["model.norm.weight"], torch.ones_like(params["model.norm.weight"]))
    weight = params["model.layers.0.mlp.up_proj.weight"]
    assert abs(weight.std().item() - reference.config.initializer_range) < 0.005
    logits = model(torch.tensor([[1, 2, 3, 4]])).logits
    assert torch.isfinite(logits).all()


def test_sample_variants_are_distinct_programs_with_the_same_kernels():
    from extensions.verify.static.extract import extract_code, normalize_code

    kernel = (FIXTURES_DIR / "candidates" / "kernelbench" / "l1_019_relu.py").read_text()
    first, second = (extract_code(sample_variant(kernel, i)).code for i in (0, 1))
    assert normalize_code(first) != normalize_code(second)
    assert "relu_kernel_s1[" in second and "def relu_kernel_s1(" in second


def test_shape_counts_match_the_built_model_and_its_lora(tokenizer):
    import torch

    from extensions.models.loading import attach_lora

    cfg = load_config(PROJECT_ROOT / "configs" / "default.yaml")
    dims = {**TINY, "vocab_size": len(tokenizer)}
    model = build_random_model(dims, tokenizer, torch.device("cpu"), torch.float32, seed=0)
    shape = ModelShape.from_hf_config(model.config)
    assert shape.parameters() == sum(p.numel() for p in model.parameters())
    lora = attach_lora(model, cfg.lora)
    trainable = sum(p.numel() for p in lora.parameters() if p.requires_grad)
    assert shape.lora_parameters(cfg.lora.r, cfg.lora.target_modules) == trainable


def test_projection_follows_the_config_and_the_gpu_count():
    cfg = load_config(PROJECT_ROOT / "configs" / "default.yaml")
    plan = dict(kernelbook_rows=10_000, mean_example_tokens=1000.0, packed_fill=0.9, eval_tasks=250,
                kept_example_tokens=1500.0)
    rates = Rates(sft_tokens_per_s=2000.0, validation_tokens_per_s=6000.0, rl_chunk_s=30.0, rl_first_chunk_extra_s=40.0,
                  eval_chunk_s=50.0, verify_gpu_s_per_candidate=2.0, save_s=4.0)
    eight, four = (FullRun.plan(cfg, gpus=g, **plan) for g in (8, 4))
    step_tokens = cfg.sft.per_device_batch_size * cfg.sft.gradient_accumulation_steps * 8 * cfg.sft.max_seq_len * 0.9
    assert eight.sft_rows + eight.val_rows == round(10_000 * (1 - cfg.data.rl_fraction))
    assert eight.sft_steps == math.ceil(eight.sft_rows * 1000.0 / step_tokens)
    assert eight.rl_candidates_per_round == cfg.rl.tasks_per_round * cfg.rl.samples_per_task
    on_eight, on_four = project(eight, rates, 3.0), project(four, rates, 3.0)
    for run, projected in ((eight, on_eight), (four, on_four)):  # linear data-parallel scaling
        sft = next(p for p in projected.parts if p.key == "sft").seconds
        assert sft == pytest.approx(run.sft_tokens / (2000.0 * run.gpus) + run.val_tokens / (6000.0 * run.gpus))
    assert four.val_tokens >= eight.val_tokens  # fewer GPUs: more steps, as many or more validation passes
    assert on_eight.complete and on_eight.usd == pytest.approx(on_eight.seconds / 3600 * 8 * 3.0)

    unmeasured = project(eight, Rates(sft_tokens_per_s=2000.0, validation_tokens_per_s=6000.0), 3.0)
    assert not unmeasured.complete
    table = markdown_table([{"key": "sft", "work": "3 steps", "seconds": 30.0, "tokens_per_s_per_gpu": 2000.0,
                             "peak_allocated_gib": 30.0, "peak_reserved_gib": 33.0, "estimated_gib": 34.1}], unmeasured)
    assert "not measured" in table and "total (measured parts only)" in table
    assert "| +7.0 | +47.0 |" in table  # margins on 40 and 80 GB cards from the reserved peak
    assert len({line.count("|") for line in table.splitlines()}) == 1  # every row has every column


def test_tiny_rehearsal_runs_every_phase_on_cpu(kernelbench_jsonl, tmp_path):
    """The whole rehearsal on the CPU: SFT steps, sampling, the verifier judging real fixture kernels
    in the interpreter, a complete checkpoint, a sync to a loopback S3 server, evaluation generation."""
    out, work = tmp_path / "out", tmp_path / "run"
    command = [
        sys.executable, "bench/production_rehearsal.py", "--model-scale", "tiny", "--kernelbench", str(kernelbench_jsonl),
        "--usd-per-gpu-hour", "2.5", "--out", str(out), "--work-dir", str(work), "--no-progress",
        "--target-gpus", "1", "--sft-steps", "1", "--sft-warmup-steps", "0", "--real-kernels-per-task", "1",
        "--set", "sft.gradient_accumulation_steps=1", "--set", "rl.tasks_per_round=1", "--set", "rl.samples_per_task=2",
        "--set", "eval.num_tasks=8", "--set", "eval.generation_batch_size=2", "--set", "data.max_prompt_chars=1200",
    ]
    done = subprocess.run(command, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((out / "rehearsal.json").read_text())
    phases = {p["key"]: p for p in report["phases"]}
    assert list(phases) == ["sft", "rl_sampling", "rl_verification", "checkpoint_save", "s3_sync", "eval_generation"]
    assert not [p["error"] for p in phases.values() if p["error"]]

    assert phases["sft"]["tokens_per_s_per_gpu"] > 0
    sampled = phases["rl_sampling"]["ranks"][0]["batches"]
    assert len(sampled) == 2 and all(b["sequences"] == 2 for b in sampled)  # 1 task x 2 samples per batch
    verdicts = phases["rl_verification"]["ranks"][0]
    assert verdicts["candidates"] == 4
    assert verdicts["real_kernels"] == 1 and verdicts["correct"] == 1  # the fixture kernel passes, model text does not

    manifests = phases["s3_sync"]["ranks"][0]["manifests"]
    assert manifests == ["checkpoints/sft/checkpoint-1"]
    assert (work / "checkpoints" / "sft" / "checkpoint-1" / "manifest.json").is_file()
    eval_batch = phases["eval_generation"]["ranks"][0]["batches"][0]
    assert eval_batch["sequences"] == 2 and eval_batch["new_tokens"] > 0

    projection = report["projection"]
    assert projection["complete"] and projection["gpus"] == 1
    assert projection["usd"] == pytest.approx(projection["gpu_hours"] * 2.5)
    table = (out / "rehearsal.md").read_text()
    for name in ("SFT", "RL sampling", "RL verification", "checkpoint save", "S3 sync", "evaluation generation", "total"):
        assert f"| {name}" in table or f"**{name}" in table
    assert table.strip() in done.stdout


def test_configs_fit_their_cards_on_paper(kernelbench_jsonl):
    """default.yaml's largest batches fit an 80 GB card and a100-40gb.yaml's a 40 GB card, by the
    rehearsal's arithmetic on the longest prompts each phase can meet; a100-40gb.yaml differs from
    the default only in batch sizes."""
    import dataclasses

    from rehearsal_inputs import QWEN25_7B, TOKENIZER_VOCAB, read_fixture_kernels, read_kernelbench
    from rehearsal_report import CARDS_GIB, estimate_memory_gib
    from transformers import Qwen2Config

    from extensions.prompting.templates import INSTRUCTIONS, SYSTEM_PROMPT, build_messages
    from extensions.generation.sampling import render_prompt_ids

    tasks = read_kernelbench(kernelbench_jsonl)
    texts = [t["code"] for t in tasks] + list(read_fixture_kernels().values()) + [INSTRUCTIONS, SYSTEM_PROMPT]
    tokenizer = build_code_tokenizer(texts, TOKENIZER_VOCAB)
    longest_eval = max(map(len, render_prompt_ids(tokenizer, [build_messages(t["code"]) for t in tasks])))
    chars_per_token = sum(len(t["code"]) for t in tasks) / sum(len(tokenizer(t["code"])["input_ids"]) for t in tasks)
    shape = ModelShape.from_hf_config(Qwen2Config(**QWEN25_7B))

    default = load_config(PROJECT_ROOT / "configs" / "default.yaml")
    small = load_config(PROJECT_ROOT / "configs" / "a100-40gb.yaml")
    for cfg, card in ((default, "80 GB"), (small, "40 GB")):
        longest_rl = len(render_prompt_ids(tokenizer, [build_messages("")])[0]) + cfg.data.max_prompt_chars / chars_per_token
        peaks = estimate_memory_gib(shape, cfg, rl_batch=cfg.rl.generation_batch_size, longest_rl_prompt=int(longest_rl),
                                    eval_batch=cfg.eval.generation_batch_size, longest_eval_prompt=longest_eval)
        assert max(peaks.values()) < CARDS_GIB[card] - 4, (cfg.source, peaks)  # room for context and fragmentation

    def without_batches(cfg):
        values = dataclasses.asdict(cfg)
        for section, key in (("sft", "per_device_batch_size"), ("sft", "gradient_accumulation_steps"),
                             ("rl", "generation_batch_size"), ("eval", "generation_batch_size"), ("run", "run_id")):
            values[section].pop(key)
        values.pop("source")
        return values

    assert without_batches(small) == without_batches(default)
    tokens_per_step = [c.sft.per_device_batch_size * c.sft.gradient_accumulation_steps for c in (default, small)]
    assert tokens_per_step[0] == tokens_per_step[1]  # the same optimisation, in smaller micro-batches
