"""Stand-ins for the stage scripts (prepare, train, evaluate) that write real checkpoints with
``extensions.runtime.checkpoints`` and resume from the newest complete one, so resume and pipeline tests
exercise the orchestration without training a model. ``KERNEL_RL_SCRIPTS_DIR`` points at them."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from extensions.runtime.paths import RunPaths

from s3_testing import PROJECT_ROOT, free_port

FAKE_COMMON = r'''
import argparse, hashlib, json, os, sys, time
from extensions.runtime import checkpoints as ck
from extensions.config import add_config_args, config_from_args
from extensions.runtime.interrupt import SaveSignal
from extensions.runtime.paths import RunPaths
from extensions.runtime.run_lock import lock_run
from extensions.runtime.freshness import stage_inputs

def setup(stage_flag=False, compare_flag=False):
    parser = argparse.ArgumentParser()
    if stage_flag:
        parser.add_argument("--stage", required=True, choices=["sft", "rl", "all"])
        parser.add_argument("--force", action="store_true")
    if compare_flag:
        parser.add_argument("--compare", action="store_true")
    add_config_args(parser)
    args = parser.parse_args()
    cfg = config_from_args(args)
    paths = RunPaths.from_config(cfg)
    lock_run(paths)  # as the real stages do: shared with the pipeline or resume that started us
    return args, cfg, paths

def maybe_fail(stage):
    if os.environ.get("FAKE_FAIL_STAGE") == stage:
        print(f"fake {stage}: failing on purpose", flush=True)
        sys.exit(int(os.environ.get("FAKE_FAIL_CODE", "7")))

def note(paths, text):
    paths.logs.mkdir(parents=True, exist_ok=True)
    with open(paths.logs / "fake_stages.log", "a") as handle:
        handle.write(text + "\n")
'''

FAKE_PREPARE = FAKE_COMMON + r'''
args, cfg, paths = setup()
maybe_fail("prepare")
note(paths, "prepare")
paths.processed.mkdir(parents=True, exist_ok=True)
for path in (paths.sft_train, paths.sft_val, paths.difficulty_labels, paths.rl_tasks, paths.eval_tasks):
    path.write_text(json.dumps({"file": path.name}) + "\n")
from extensions.data.pipeline import input_fingerprint
from extensions.data.retrieval import Example, build_index
build_index([Example("fake", "x = 1\n", "y = 2\n")], paths.retrieval_index)
paths.prepare_report.write_text(json.dumps({"kept": 5, "fingerprint": input_fingerprint(cfg.data, cfg.prompt)}) + "\n")
'''

FAKE_TRAINER = FAKE_COMMON + r'''
STEP_S = float(os.environ.get("FAKE_STEP_S", "0.03"))

def advance(state, i):
    return hashlib.sha256(f"{state}:{i}".encode()).hexdigest()

def save(directory, stage, state, index, cfg, paths):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "state.json").write_text(json.dumps({"state": state, "index": index}))
    with open(directory / "adapter_model.bin", "wb") as handle:  # slow enough to be killed mid-write
        for j in range(16):
            handle.write(hashlib.sha256(f"{state}{j}".encode()).digest() * 2048)
            handle.flush()
            time.sleep(0.002)
    ck.write_meta(directory, stage=stage, config=cfg, base_model="fake", data="fake",
                  inputs=stage_inputs(paths, cfg, stage),
                  step=index if stage == "sft" else None, round_index=index if stage == "rl" else None)
    ck.finalize(directory)

def train(stage, cfg, paths, save_signal):
    stage_dir = paths.stage_dir(stage)
    total = cfg.sft.max_steps if stage == "sft" else cfg.rl.num_rounds
    every = cfg.sft.save_every_steps if stage == "sft" else 1
    newest = ck.newest_complete(stage_dir)
    if newest is not None:
        data = json.loads((newest / "state.json").read_text())
        state, start = data["state"], data["index"]
        note(paths, f"{stage} resumed from {start}")
    elif stage == "rl":
        state, start = json.loads((paths.final("sft") / "state.json").read_text())["state"], 0
    else:
        state, start = "seed", 0
    print(f"fake {stage}: from {start} to {total}", flush=True)
    for i in range(start + 1, total + 1):
        time.sleep(STEP_S)
        state = advance(state, i)
        requested = save_signal.save_requested()
        if i % every == 0 or i == total or requested:
            target = paths.sft_checkpoint(i) if stage == "sft" else paths.rl_round(i)
            save(target, stage, state, i, cfg, paths)
            ck.prune(stage_dir, cfg.sft.keep_last_checkpoints)
            print(f"fake {stage}: saved {target.name}", flush=True)
            if requested:
                save_signal.acknowledge(target)
                if save_signal.stop_requested():
                    print(f"fake {stage}: stopping on request", flush=True)
                    return False
    ck.copy_checkpoint(ck.newest_complete(stage_dir), paths.final(stage))
    return True

args, cfg, paths = setup(stage_flag=True)
maybe_fail(args.stage)
save_signal = SaveSignal.for_run(paths)
save_signal.install_signal_handlers()
for stage in (["sft", "rl"] if args.stage == "all" else [args.stage]):
    if args.force:
        import shutil
        shutil.rmtree(paths.stage_dir(stage), ignore_errors=True)
        note(paths, f"{stage} forced")
    if ck.is_complete(paths.final(stage)):
        continue
    note(paths, f"{stage} started")
    if not train(stage, cfg, paths, save_signal):
        sys.exit(0)
'''

FAKE_EVALUATE = FAKE_COMMON + r'''
args, cfg, paths = setup(compare_flag=True)
maybe_fail("eval")
note(paths, "eval")
state = json.loads((paths.final("rl") / "state.json").read_text())
paths.outputs.mkdir(parents=True, exist_ok=True)
paths.compare_md.write_text("| model | score |\n")
from extensions.evaluation.commands import comparison_inputs
paths.compare_json.write_text(json.dumps({"rl_state": state, "inputs": comparison_inputs(cfg, paths)}) + "\n")
'''


def write_fake_stages(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "prepare_data.py").write_text(FAKE_PREPARE)
    (directory / "train_integrated.py").write_text(FAKE_TRAINER)
    (directory / "evaluate.py").write_text(FAKE_EVALUATE)
    return directory


def write_config(path: Path, root: Path, run_id: str = "fake-run", **sections) -> Path:
    text = f"""
run: {{root: "{root}", run_id: {run_id}}}
sft: {{max_steps: 12, save_every_steps: 2, keep_last_checkpoints: 2}}
rl: {{num_rounds: 4}}
checkpoint: {{prefix: runs, sync_interval_s: 0.5, spot_poll_interval_s: 0.2, metadata_endpoint: "http://127.0.0.1:{free_port()}",
             multipart_chunk_mb: 5, retry_backoff_s: 0.01, retry_backoff_max_s: 0.05, max_retries: 2,
             save_ack_timeout_s: 1}}
"""
    for section, body in sections.items():
        text += f"{section}: {body}\n"
    path.write_text(text)
    return path


def stage_env(scripts: Path) -> dict:
    return {**os.environ, "PYTHONPATH": str(PROJECT_ROOT), "KERNEL_RL_SCRIPTS_DIR": str(scripts),
            "PYTHON": sys.executable}


def final_states(paths: RunPaths) -> dict:
    return {stage: json.loads((paths.final(stage) / "state.json").read_text()) for stage in ("sft", "rl")}


def write_finished_run(cfg) -> RunPaths:
    """A finished run of ``cfg`` as the stages leave it: data with its fingerprint, both final
    adapters recording this config and their inputs, and the comparison of those adapters."""
    from extensions.runtime import checkpoints as ck
    from extensions.pipeline.stages import prepared_files
    from extensions.data.pipeline import input_fingerprint
    from extensions.evaluation.commands import comparison_inputs
    from extensions.runtime.freshness import stage_inputs

    paths = RunPaths.from_config(cfg)
    for path in prepared_files(paths):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"file": path.name}) + "\n")
    from extensions.data.retrieval import Example, build_index

    build_index([Example("fake", "x = 1\n", "y = 2\n")], paths.retrieval_index)
    paths.prepare_report.write_text(json.dumps({"fingerprint": input_fingerprint(cfg.data, cfg.prompt)}) + "\n")
    for stage in ("sft", "rl"):
        directory = paths.final(stage)
        directory.mkdir(parents=True)
        (directory / "adapter_model.safetensors").write_bytes(f"{stage} weights".encode())
        ck.write_meta(directory, stage=stage, config=cfg, base_model="m", data="d",
                      inputs=stage_inputs(paths, cfg, stage))
        ck.finalize(directory)
    paths.outputs.mkdir(parents=True)
    paths.compare_json.write_text(json.dumps({"inputs": comparison_inputs(cfg, paths)}) + "\n")
    return paths
