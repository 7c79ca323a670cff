"""The candidate sandbox's mechanics: real worker processes (bubblewrap, and process isolation where
a test asks for it by name) running hostile code: verdicts, timeouts, surviving processes, memory
caps, output floods, fork servers and their fresh children, clean-up.

The static check would reject most of these candidates before they run; here they go straight to
the sandbox (``judge_candidate``) because the sandbox must hold even when a check upstream misses.
Each property is tested in every isolation mode that promises it. What may leak out of the sandbox
is tested in ``test_sandbox_leaks.py``.
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
import uuid

import pytest

from extensions.config import VerifierConfig
from extensions.verify.api import verify_code_unscreened
from extensions.verify.parent.judge import judge_candidate
from extensions.verify.parent.sandbox import (PROCESS_ISOLATION_WARNING, PROJECT_ROOT, SandboxedProcess,
                                       SandboxUnavailable, bwrap_problem, bwrap_works, choose_isolation)
from sandbox_support import (BOTH_MODES, PROBLEM, candidate, make_ctx, needs_bwrap, processes_with,
                             wait_gone)

ctx = pytest.fixture(scope="module")(make_ctx)


@BOTH_MODES
def test_correct_candidate_passes_and_says_which_isolation(ctx, isolation):
    result = ctx.judge(candidate(), isolation=isolation)
    assert result.error is None and result.stage == "full" and result.correct, result.error
    assert result.isolation == isolation
    assert result.warnings == ([PROCESS_ISOLATION_WARNING] if isolation == "process" else [])


def test_auto_never_falls_back_to_process_silently(monkeypatch):
    import shutil

    bwrap_problem.cache_clear()
    monkeypatch.setattr(shutil, "which", lambda name: None)
    try:
        with pytest.raises(SandboxUnavailable, match="bubblewrap.*verifier.isolation: process"):
            choose_isolation("auto")
        assert choose_isolation("process") == "process"  # only when asked for by name
    finally:
        monkeypatch.undo()
        bwrap_problem.cache_clear()


def test_a_batch_without_its_sandbox_stops_at_once_and_leaves_no_reference_running(monkeypatch):
    """The sandbox is probed while the batch's references already run; where bubblewrap cannot
    start, the batch raises the probe's error without judging anything, and the references that
    were started are stopped, not waited for."""
    import shutil

    from extensions.verify import VerifyRequest, verify_batch
    from extensions.verify.api import VerifierError

    slow_problem = PROBLEM + "\nimport time as _t\n_t.sleep(60)\n"  # the reference is still loading it
    bwrap_problem.cache_clear()
    monkeypatch.setattr(shutil, "which", lambda name: None)
    started = time.monotonic()
    try:
        with pytest.raises(VerifierError, match="bubblewrap"):
            verify_batch([VerifyRequest(slow_problem, candidate(), "c")],
                         VerifierConfig(device="cpu", isolation="auto", timeout_s=60), progress=False)
    finally:
        monkeypatch.undo()
        bwrap_problem.cache_clear()
    assert time.monotonic() - started < 30
    assert not wait_gone("extensions.verify.reference.reference_worker")


@BOTH_MODES
def test_timeout_kills_the_whole_process_tree(ctx, isolation):
    marker = f"sleeper-{uuid.uuid4().hex}"
    code = candidate(at_import=f"""
        import subprocess, sys, time
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "{marker}"])
        time.sleep(600)
    """)
    result = ctx.judge(code, isolation=isolation, timeout_s=6.0)
    assert result.error == "compile: timeout: after 6s" and result.error_category == "timeout"
    assert result.stage == "static" and not result.correct
    assert wait_gone(marker) == []


@BOTH_MODES
def test_setsid_grandchild_does_not_outlive_the_verdict(ctx, isolation, tmp_path):
    """A double-forked grandchild in its own session, still running after the worker is done, is
    killed with the worker; the file it would write after the verdict never appears. (The import
    audit also sees the process start: the verdict is the audit's, given before the grandchild's
    write is due.)"""
    marker = f"survivor-{uuid.uuid4().hex}"
    late_file = tmp_path / "written-after-the-verdict"
    # Under bwrap the host path is invisible; the grandchild then writes into its own directory.
    target = str(late_file) if isolation == "process" else "late.txt"
    code = candidate(at_import=f"""
        import os, subprocess, sys
        script = "import os, time\\nos.setsid()\\nif os.fork():\\n    os._exit(0)\\ntime.sleep(4)\\nopen({target!r}, 'w').write('alive')\\n"
        subprocess.Popen([sys.executable, "-c", script, "{marker}"], start_new_session=True).wait()
    """)
    result = ctx.judge(code, isolation=isolation)
    assert not result.correct and "subprocess" in result.flags, result
    assert wait_gone(marker, 2.0) == []
    time.sleep(5)
    assert not late_file.exists()
    assert processes_with(marker) == []


@BOTH_MODES
def test_a_helper_that_kills_its_fork_server_does_not_outlive_the_verdict(ctx, isolation):
    """A helper forked through ``posix.fork`` (the same function as ``os.fork``, under another
    module's name) waits for the worker to exit, kills the fork server it was re-parented to and
    lives on with init as its parent, outside every tree the parent walks. The fork is flagged, and
    the helper is found by the sandbox's marker and killed with the candidate."""
    marker = f"helper-{uuid.uuid4().hex}"
    code = candidate(at_import=f"""
        import os, posix, signal, time
        if posix.fork() == 0:
            try:
                parent = os.getppid()
                while os.getppid() == parent:
                    time.sleep(0.001)
                os.kill(os.getppid(), signal.SIGKILL)
                os.execv("/bin/sh", ["sh", "-c", "sleep 40", "{marker}"])
            finally:
                os._exit(0)
    """)
    result = ctx.judge(code, isolation=isolation)
    assert not result.correct and "subprocess" in result.flags, result
    assert wait_gone(marker, 3.0) == []


def test_exit_calls_in_the_candidate_are_verdicts(ctx):
    at_import = ctx.judge(candidate(at_import="import sys\nsys.exit(0)\n"))
    assert at_import.stage == "static" and at_import.error_category == "exception"
    assert at_import.error.startswith("compile: exception: SystemExit") and "candidate line" in at_import.error
    in_forward = ctx.judge(candidate(forward_prelude="import os\nos._exit(3)"))
    assert in_forward.stage == "compile" and in_forward.error_category == "crashed"
    assert in_forward.error.startswith("tiny: crashed: exit status 3")


def test_output_flood_is_bounded_and_drained(tmp_path):
    flood = "import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(300):\n    sys.stdout.write(chunk)\n"
    proc = SandboxedProcess([sys.executable, "-c", flood], str(tmp_path), device="cpu", gpu_index=None,
                            isolation="process", max_output_bytes=4096)
    outcome = proc.finish(time.monotonic() + 120)
    assert outcome.returncode == 0 and not outcome.timed_out
    assert outcome.stdout_bytes == 300 << 20
    assert len(outcome.stdout) == 4096


def test_flooding_candidate_is_still_judged(ctx):
    code = candidate(at_import="import sys\nfor _ in range(200):\n    sys.stdout.write('y' * (1 << 20))\n")
    result = ctx.judge(code)
    assert result.correct, result.error
    assert result.details["output_bytes"]["stdout"] >= 200 << 20


@BOTH_MODES
def test_memory_cap_kills_a_large_allocation(ctx, isolation):
    """3.4 GB of host memory in one candidate: refused (data limit) or killed (resident memory
    watch), either way the verdict names memory_limit."""
    code = candidate(at_import="""
        hog = torch.ones(850_000_000)
    """)
    result = ctx.judge(code, isolation=isolation)
    assert not result.correct and result.error_category == "memory_limit", result.error


def test_memory_watch_catches_what_the_data_limit_does_not_see(ctx):
    """Shared anonymous memory is not counted by RLIMIT_DATA (nor is what CUDA's runtime maps):
    the parent's watch on the tree's resident memory still kills the candidate."""
    code = candidate(at_import="""
        import mmap
        block = mmap.mmap(-1, 600 << 20)
        for offset in range(0, 600 << 20, 4096):
            block[offset] = 1
        import time
        time.sleep(30)
    """)
    result = ctx.judge(code, memory_limit_mb=300, timeout_s=60)
    assert not result.correct and result.error_category == "memory_limit", result.error
    assert result.details.get("memory_exceeded")


def test_memory_cap_allows_one_set_not_the_whole_batch_of_sets():
    """The cap grows with what the worker holds at once (one set, the timing sets, the models),
    not with every set of the problem: with the cap grown by all of them, a candidate holding
    6 GB of host memory passed on CUDA."""
    import torch

    from extensions.verify.parent.candidate_run import _memory_limit_mb
    from extensions.verify.parent.reference_data import PreparedProblem
    from extensions.verify.common.tensor_io import pack

    def prepared(num_sets: int, model_bytes: int = 0) -> PreparedProblem:
        inputs, expected, sets = {}, {}, []
        for index in range(num_sets):
            sets.append({"name": f"s{index}", "timing": index < 2,
                         "inputs": pack([torch.zeros(1 << 18)], f"s{index}.in", inputs),  # 1 MiB
                         "expected": pack(torch.zeros(1 << 18), f"s{index}.out", expected)})
        return PreparedProblem(True, sets=sets, inputs=inputs, expected=expected, model_bytes=model_bytes)

    config = VerifierConfig(memory_limit_mb=3072)
    assert _memory_limit_mb(config, prepared(3), timing=False) == 3072 + 6  # one set's 2 MiB, three times
    assert _memory_limit_mb(config, prepared(30), timing=False) == 3072 + 6
    # The two timing sets' inputs, and up to two of each one's timed outputs kept for the parent.
    assert _memory_limit_mb(config, prepared(30), timing=True) == 3072 + 6 + 2 + 4
    assert _memory_limit_mb(config, prepared(3, model_bytes=100 << 20), timing=False) == 3072 + 6 + 200
    assert _memory_limit_mb(VerifierConfig(memory_limit_mb=0), prepared(3), timing=False) == 0


def test_working_directories_are_removed(monkeypatch, tmp_path):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    for isolation in ("bwrap", "process") if bwrap_works() else ("process",):
        config = VerifierConfig(device="cpu", timeout_s=60, multi_input_num_tests=1, isolation=isolation)
        result = verify_code_unscreened(PROBLEM, candidate(at_import="open('left-behind.txt', 'w').write('x')\n"),
                                        config, device="cpu")
        assert result.correct, result.error
        assert os.listdir(tmp_path) == []


def test_worker_never_receives_expected_outputs(ctx):
    """The job and the init inputs are deleted before the candidate is imported and no input set
    exists yet: an importing candidate sees its own file only (no job, inputs or expected outputs)."""
    code = candidate(at_import="""
        import os
        seen = sorted(os.listdir("."))
        raise RuntimeError("files=" + ",".join(seen) + " end")
    """)
    result = ctx.judge(code)
    files = result.error.split("files=")[1].split(" end")[0].split(",")
    assert "candidate.py" in files
    assert not any(f.startswith(("job", "init", "set_", "expected", "inputs")) for f in files), files


@BOTH_MODES
def test_fork_server_children_are_fresh_and_private(ctx, isolation):
    """Candidates forked by the same server: one that patches torch and leaves files in its own
    directory (and, under bwrap, next to it in the server's writable directory) changes nothing
    the next one sees. Process isolation promises the same for memory and the own directory."""
    from extensions.verify.parent.judge import WorkerLauncher

    launcher = WorkerLauncher(ctx.config, "cpu", isolation, ctx.root, total=2, prespawn=False, slots=[None])
    poisoner = candidate(at_import="""
        import os
        torch.verifier_poison = True
        if os.getcwd().startswith("/sandbox/"):
            open(os.path.join(os.path.dirname(os.getcwd()), "left-for-the-next.txt"), "w").write("x")
        open("own.txt", "w").write("x")
    """)
    checker = candidate(at_import="""
        import os
        if getattr(torch, 'verifier_poison', False):
            raise RuntimeError('poisoned')
        here = sorted(os.listdir("."))
        beside = sorted(os.listdir(os.path.dirname(os.getcwd())))
        if "own.txt" in here or "left-for-the-next.txt" in beside:
            raise RuntimeError("files of the previous candidate are visible")
    """)
    try:
        first = judge_candidate(poisoner, ctx.prepared, ctx.config, "cpu", ctx.pool, isolation, ctx.root,
                                "first", launcher=launcher)
        second = judge_candidate(checker, ctx.prepared, ctx.config, "cpu", ctx.pool, isolation, ctx.root,
                                 "second", launcher=launcher)
        servers = list(launcher._servers)
    finally:
        launcher.close()
    assert first.correct, first.error
    assert second.correct and second.error is None, second.error
    assert len(servers) == 1  # both candidates came from one server's forks


def test_fresh_process_per_candidate_still_works(ctx):
    result = ctx.judge(candidate(), fork_server=False)
    assert result.correct, result.error


def test_fresh_workers_started_ahead_are_handed_out(ctx):
    """``fork_server: false`` with ``prespawn_workers`` (every CUDA batch; CPU with cores to spare):
    taking a worker starts the next candidate's ahead. Starting it once deadlocked on the
    launcher's own lock, and the batch hung with no verdict."""
    from extensions.verify.parent.judge import WorkerLauncher

    config = dataclasses.replace(ctx.config, fork_server=False, timeout_s=30)
    launcher = WorkerLauncher(config, "cpu", "process", ctx.root, total=3, prespawn=True, slots=[None])
    verdicts = []
    judging = threading.Thread(target=lambda: verdicts.extend(
        judge_candidate(candidate(), ctx.prepared, config, "cpu", ctx.pool, "process", ctx.root, f"c{i}",
                        launcher=launcher) for i in range(3)), daemon=True)
    judging.start()
    judging.join(180)
    if judging.is_alive():  # its lock is held: closing the launcher would hang as well
        pytest.fail("the launcher hung while starting a worker ahead")
    spares_left = sum(len(procs) for procs in launcher._spares.values())
    launcher.close()
    assert [v.correct for v in verdicts] == [True] * 3, [v.error for v in verdicts]
    assert spares_left == 0  # none started for a candidate that never came


@needs_bwrap
def test_bwrap_works_from_a_virtualenv_under_tmp(tmp_path_factory):
    """A user's Python in a virtual environment under /tmp (with the system's packages) must still
    start inside the sandbox: its prefix is bound even though /tmp itself is not."""
    venv = tmp_path_factory.mktemp("venv") / "env"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
                   check=True, timeout=120)
    # --system-site-packages reaches the base installation, not the environment these tests run in
    # (a user's own virtualenv holding torch): hand the new one this environment's site directories.
    import site

    running = [p for p in [*site.getsitepackages(), *sys.path] if p and os.path.isabs(p)
               and ("site-packages" in p or "dist-packages" in p)]
    nested_site = next((venv / "lib").glob("python*/site-packages"))
    (nested_site / "running_environment.pth").write_text("\n".join(dict.fromkeys(running)) + "\n")
    problem = tmp_path_factory.mktemp("files") / "problem.py"
    problem.write_text(PROBLEM)
    cand = problem.with_name("cand.py")
    cand.write_text(candidate())
    done = subprocess.run([str(venv / "bin" / "python"), "-m", "extensions.verify", "--problem", str(problem),
                           "--candidate", str(cand), "--device", "cpu", "--json",
                           "--set", "verifier.multi_input_num_tests=1", "--set", "verifier.isolation=bwrap"],
                          cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    line = json.loads(done.stdout.strip().splitlines()[-1])
    assert line["correct"] and line["isolation"] == "bwrap", line


@pytest.mark.gpu
def test_cuda_candidates_fork_from_a_server_that_never_touched_cuda():
    """On a GPU: the hermetic sandbox reaches the GPU (device nodes, driver libraries), children
    forked from one server each initialise CUDA themselves (the server never did), one server
    serves several candidates, and the resident-memory watch caps host memory next to CUDA."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    from extensions.verify.api import VerifyRequest, verify_batch

    config = VerifierConfig(device="cuda", timeout_s=300, multi_input_num_tests=2, workers=1,
                            enable_calibrated_timing=False)
    requests = [VerifyRequest(PROBLEM, candidate(at_import=f"marker = {i}\n"), f"c{i}") for i in range(3)]
    for result in verify_batch(requests, config, device="cuda", progress=False):
        assert result.correct and result.isolation == "bwrap", result.error
    hog = verify_code_unscreened(PROBLEM, candidate(at_import="hog = torch.ones(850_000_000)\n"), config,
                                 device="cuda")
    assert not hog.correct and hog.error_category == "memory_limit", hog.error


def _worker_in(directory, code: str):
    """A worker (plain subprocess) in ``directory`` with its job, init inputs and candidate written
    as the judge writes them; returns the process and the three hashes ``go`` carries."""
    from extensions.verify.parent.launcher import write_private
    from extensions.verify.common.tensor_io import pack, tensor_bytes

    init_tensors: dict = {}
    inits = [pack([2.5], "init0", init_tensors)]
    job = {"device": "cpu", "seed": 0, "inits": inits, "init_file": "init.safetensors",
           "sets": [{"name": "tiny", "timing": False, "init": 0, "repeat": False, "shuffle_programs": False}],
           "allow_library_gemm": False, "timing": None, "memory_limit_mb": 0}
    hashes = [write_private(str(directory / "job.json"), json.dumps(job).encode()),
              write_private(str(directory / "init.safetensors"), tensor_bytes(init_tensors)),
              write_private(str(directory / "candidate.py"), code.encode())]
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(PROJECT_ROOT), "TRITON_INTERPRET": "1",
           "HOME": str(directory)}
    proc = subprocess.Popen([sys.executable, "-m", "extensions.verify.sandboxed.worker"], cwd=directory, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return proc, hashes


def _status(path, proc, seconds: float = 120.0) -> dict:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert proc.poll() is None or path.exists(), proc.stderr.read()[-2000:]
        assert time.monotonic() < deadline, f"no {path.name}"
        time.sleep(0.05)
    return json.loads(path.read_text())


def test_a_file_altered_after_it_was_hashed_is_refused_before_use(tmp_path):
    """Another process rewrites the candidate after the parent hashed it, then a set's inputs after
    they were handed over: the worker refuses each as a sandbox failure, imports no altered code and
    runs nothing on altered inputs."""
    import torch

    from extensions.verify.parent.launcher import write_private
    from extensions.verify.common.tensor_io import pack, tensor_bytes

    altered_dir = tmp_path / "altered"
    altered_dir.mkdir()
    proc, hashes = _worker_in(altered_dir, candidate())
    (altered_dir / "candidate.py").write_text(candidate(at_import="open('imported.txt', 'w').write('x')"))
    proc.stdin.write("go " + " ".join(hashes) + "\n")
    proc.stdin.flush()
    status = _status(altered_dir / "compile.json", proc)
    proc.stdin.close()
    proc.wait(60)
    assert status["sandbox_error"] and not status["ok"] and "candidate.py" in status["error"]
    assert not (altered_dir / "imported.txt").exists()

    intact_dir = tmp_path / "intact"
    intact_dir.mkdir()
    proc, hashes = _worker_in(intact_dir, candidate())
    proc.stdin.write("go " + " ".join(hashes) + "\n")
    proc.stdin.flush()
    assert _status(intact_dir / "compile.json", proc)["ok"]
    assert not (intact_dir / "job.json").exists() and not (intact_dir / "init.safetensors").exists()
    tensors: dict = {}
    values = [pack([torch.randn(4, 40)], "in0", tensors)]
    tensors_sha = write_private(str(intact_dir / "set_0.in.safetensors"), tensor_bytes(tensors))
    json_sha = write_private(str(intact_dir / "set_0.in.json"), json.dumps({"values": values}).encode())
    tensors[next(iter(tensors))] = torch.zeros(4, 40)  # rewritten after it was hashed
    (intact_dir / "set_0.in.safetensors").write_bytes(tensor_bytes(tensors))
    proc.stdin.write(f"run {tensors_sha} {json_sha}\n")
    proc.stdin.flush()
    status = _status(intact_dir / "set_0.json", proc)
    proc.stdin.close()
    proc.wait(60)
    assert status["sandbox_error"] and not status["ok"] and "set_0.in.safetensors" in status["error"]
    assert not (intact_dir / "set_0.safetensors").exists()


def test_process_tree_from_the_kernels_children_lists_matches_a_full_scan():
    """The memory watch and the kill walk a candidate's tree down through the kernel's per-thread
    children lists; it must find what a scan of every process finds: children of every thread,
    grandchildren, and not an orphan that left the tree."""
    from extensions.verify.common import proctree

    script = ("import os, subprocess, sys, threading, time\n"
              "subprocess.Popen(['sleep', '30'])\n"
              "t = threading.Thread(target=lambda: subprocess.Popen(['sh', '-c', 'sleep 30 & sleep 30']))\n"
              "t.start(); t.join()\n"
              "subprocess.Popen(['sh', '-c', '(sleep 2 &)'])\n"
              "print('ready', flush=True); time.sleep(30)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # the orphaning shell exits on its own
            walked = proctree.descendants(proc.pid)
            scanned = proctree.descendants(proc.pid, proctree.children_map())
            if sorted(walked) == sorted(scanned) and len(walked) >= 4:
                break
            time.sleep(0.05)
        assert sorted(walked) == sorted(scanned), (walked, scanned)
        assert len(walked) >= 4  # sleep, the thread's shell and its two sleeps
    finally:
        proctree.kill_tree(proc.pid)
        proc.wait()
    assert proctree.descendants(proc.pid) == []
