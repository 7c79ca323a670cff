"""Ctrl-C: the first one saves at the next step boundary and stops (exit 75), a second one aborts at
once; evaluation stops cleanly and keeps the generations it finished."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from extensions.runtime import checkpoints
from extensions.runtime.interrupt import SaveSignal
from extensions.runtime.paths import RunPaths
from extensions.training.stages import EXIT_STOPPED
from extensions.models.tiny import save_tiny_model, tiny_rl_tasks, tiny_sft_rows
from project_paths import FIXTURES_DIR, PROJECT_ROOT

FIXTURES = FIXTURES_DIR / "eval"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny_model"))


def _as_a_foreground_command() -> None:
    # A shell starts background jobs with SIGINT ignored, and the tests may run under one; a user's
    # Ctrl-C reaches a foreground command, whose Python turns SIGINT into KeyboardInterrupt.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _wait_for(condition, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while not condition():
        assert proc.poll() is None, f"exited early with {proc.returncode}: {proc.communicate()}"
        assert time.time() < deadline, "timed out"
        time.sleep(0.05)


def test_first_ctrl_c_asks_for_a_save_and_the_second_aborts(tmp_path):
    save_signal = SaveSignal(tmp_path / "save_request.json")
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)}
    try:
        save_signal.install_signal_handlers()
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
        assert save_signal.save_requested() and save_signal.stop_requested() and save_signal.reason == "SIGINT"
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def test_a_signal_that_interrupts_code_holding_the_requests_lock_is_not_a_deadlock(tmp_path):
    """A signal handler runs between two bytecodes of whatever the main thread was doing, also
    inside an Event's own set/clear/wait, which hold its lock: a handler that took that lock waited
    on itself forever (the spot watcher hung on its own SIGINT). The request must still arrive."""
    script = f"""
import os, signal, sys
sys.path.insert(0, {str(PROJECT_ROOT)!r})
from extensions.runtime.interrupt import SaveSignal
sig = SaveSignal({str(tmp_path / "save_request.json")!r})
sig.install_signal_handlers()
for name, held in (("SIGUSR1", sig._save), ("SIGTERM", sig._stop), ("SIGINT", sig._save)):
    with held._cond:  # what Event.set/clear/wait hold while they run
        os.kill(os.getpid(), getattr(signal, name))
        for _ in range(1000):  # the handler runs here, between bytecodes
            pass
    print(name, sig.save_requested(), sig.stop_requested(), sig.reason, flush=True)
    sig.acknowledge()
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:3] == ["SIGUSR1 True False SIGUSR1", "SIGTERM True True SIGTERM",
                                           "SIGINT True True SIGINT"], done.stdout


def _interrupt_training(tmp_path, model_dir, stage: str, settings: str, started) -> tuple:
    """Start ``train_integrated.py --stage STAGE`` on the tiny model with ``settings`` (YAML lines),
    send one Ctrl-C once ``started(paths)`` holds, and return (process, stdout, stderr, paths)."""
    root = tmp_path / "run"
    paths = RunPaths(root)
    paths.processed.mkdir(parents=True)
    paths.sft_train.write_text("".join(json.dumps(r) + "\n" for r in tiny_sft_rows(8)))
    paths.rl_tasks.write_text("".join(json.dumps(t) + "\n" for t in tiny_rl_tasks(2)))
    config = tmp_path / "run.yaml"
    config.write_text(f"""
run: {{root: "{root}"}}
model: {{name_or_path: "{model_dir}", dtype: float32}}
lora: {{r: 4, alpha: 8}}
{settings}
""")
    proc = subprocess.Popen([sys.executable, str(PROJECT_ROOT / "train_integrated.py"), "--config", str(config),
                             "--stage", stage, "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=PROJECT_ROOT, preexec_fn=_as_a_foreground_command)
    try:
        _wait_for(lambda: started(paths), proc)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc, out, err, paths


def test_ctrl_c_during_sft_saves_a_checkpoint_and_exits_75(tmp_path, model_dir):
    settings = """sft: {max_steps: 100000, save_every_steps: 0, eval_every_steps: 0, log_every_steps: 1, per_device_batch_size: 2,
       gradient_accumulation_steps: 1, max_seq_len: 2048, gradient_checkpointing: false}"""
    proc, out, err, paths = _interrupt_training(
        tmp_path, model_dir, "sft", settings,
        lambda paths: paths.metrics_log("sft").is_file() and paths.metrics_log("sft").read_text().count("\n") >= 2)
    assert proc.returncode == EXIT_STOPPED, out + err
    assert "Ctrl-C: saving a checkpoint at the next step boundary" in err and "Traceback" not in err
    saved = checkpoints.newest_complete(paths.stage_dir("sft"))
    assert saved is not None and checkpoints.read_meta(saved)["step"] >= 2
    assert not checkpoints.is_complete(paths.final("sft"))
    assert not paths.run_lock.exists()


def test_ctrl_c_during_rl_sampling_stops_at_the_next_decode_step(tmp_path, model_dir):
    """A batch that would decode 100,000 tokens: the first Ctrl-C stops it between two steps (exit
    75, nothing of the unfinished batch logged) instead of after the whole batch; the run resumes."""
    settings = """prompt: {mode: plain}
rl: {init: base, num_rounds: 1, tasks_per_round: 2, samples_per_task: 1, max_new_tokens: 100000,
      generation_batch_size: 2, cuda_graphs: false}"""

    def sampling(paths) -> bool:  # the round header is written just before sampling starts
        if not paths.rl_candidates_log(1).is_file():
            return False
        time.sleep(1.0)
        return True

    proc, out, err, paths = _interrupt_training(tmp_path, model_dir, "rl", settings, sampling)
    assert proc.returncode == EXIT_STOPPED, out + err
    assert "Traceback" not in err and "[rl] stopping on request (SIGINT)" in out
    records = [json.loads(line) for line in paths.rl_candidates_log(1).read_text().splitlines()]
    assert [r["type"] for r in records] == ["round"]  # the batch was abandoned, not finished
    assert not paths.run_lock.exists()


def test_ctrl_c_during_evaluation_keeps_finished_generations(tmp_path, model_dir):
    from extensions.config import ModelConfig
    from extensions.evaluation.generation_cache import pending_tasks
    from extensions.evaluation.inputs import load_tasks, read_generations
    from extensions.evaluation.runner import EvalSettings

    code = (FIXTURES / "tasks" / "relu.py").read_text()
    tasks_file = tmp_path / "tasks.jsonl"
    # Far more tasks than are generated before the signal lands, even on a loaded machine: the
    # interrupt must reach a generation that is still running.
    task_count = 400
    tasks_file.write_text("".join(json.dumps({"task_id": f"t{i}", "level": 1, "code": code}) + "\n" for i in range(task_count)))
    out = tmp_path / "out"
    generations = out / "generations_tiny.jsonl"
    settings = ["--set", "eval.max_new_tokens=24", "--set", "eval.generation_batch_size=1", "--set", "eval.temperature=0.7",
                "--set", f"model.name_or_path={model_dir}", "--set", "model.gguf_file=null", "--set", "prompt.mode=plain", "--set", "eval.turns=1",
                "--set", f"eval.num_tasks={task_count}", "--set", "model.dtype=float32"]
    proc = subprocess.Popen([sys.executable, str(PROJECT_ROOT / "evaluate.py"), "--model_path", str(model_dir),
                             "--tasks", str(tasks_file), "--name", "tiny", "--output_dir", str(out), "--smoke", *settings],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=PROJECT_ROOT,
                            preexec_fn=_as_a_foreground_command)
    try:
        _wait_for(lambda: generations.is_file() and generations.read_text().count("\n") >= 3, proc)
        proc.send_signal(signal.SIGINT)
        out_text, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out_text + err
    assert "evaluate: interrupted (Ctrl-C); finished generation chunks are saved" in err
    assert "Traceback" not in err
    kept = read_generations(generations)
    assert len(kept.rows) >= 2 and kept.header is not None
    tasks, _ = load_tasks(tasks_file)
    sampling = EvalSettings(samples_per_task=1, temperature=0.7, max_new_tokens=24, generation_batch_size=1)
    model_cfg = ModelConfig(name_or_path=str(model_dir), gguf_file=None, dtype="float32")
    left = pending_tasks(generations, tasks, str(model_dir), sampling, log=lambda _m: None, model_cfg=model_cfg)
    assert len(left) == task_count - len({row.task_id for row in kept.rows})  # a re-run generates only the rest
