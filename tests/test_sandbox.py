"""The candidate sandbox: real worker processes (bubblewrap, and process isolation where a test
asks for it by name) running hostile code.

The static check would reject most of these candidates before they run; here they go straight to
the sandbox (``judge_candidate``) because the sandbox must hold even when a check upstream misses.
Each property is tested in every isolation mode that promises it.
"""
from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import pytest

from extensions.config import VerifierConfig
from extensions.verify.api import _DevicePool, verify_code_unscreened
from extensions.verify.judge import ProblemPreparer, judge_candidate
from extensions.verify.sandbox import (PROCESS_ISOLATION_WARNING, PROJECT_ROOT, SandboxedProcess,
                                       SandboxUnavailable, bwrap_problem, bwrap_works, choose_isolation,
                                       python_paths)

PROBLEM = textwrap.dedent("""
    import torch
    import torch.nn as nn

    class Model(nn.Module):
        def __init__(self, alpha):
            super().__init__()
            self.alpha = alpha

        def forward(self, x):
            return x * self.alpha + 1.0

    batch_size = 4
    dim = 40

    def get_inputs():
        return [torch.randn(batch_size, dim)]

    def get_init_inputs():
        return [2.5]
""")

KERNEL = textwrap.dedent("""
    import torch
    import torch.nn as nn
    import triton
    import triton.language as tl

    @triton.jit
    def affine_kernel(x_ptr, y_ptr, n, alpha, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask)
        tl.store(y_ptr + offs, x * alpha + 1.0, mask=mask)
""")

MODEL_NEW = textwrap.dedent("""
    class ModelNew(nn.Module):
        def __init__(self, alpha):
            super().__init__()
            self.alpha = alpha

        def forward(self, x):
            {forward_prelude}
            y = torch.empty_like(x)
            n = x.numel()
            affine_kernel[(triton.cdiv(n, 64),)](x, y, n, self.alpha, BLOCK=64)
            return y
""")

needs_bwrap = pytest.mark.skipif(not bwrap_works(), reason="bubblewrap cannot start a sandbox here")
# Every isolation mode; bwrap is skipped where it cannot start (process is always available).
BOTH_MODES = pytest.mark.parametrize("isolation", [
    pytest.param("bwrap", marks=needs_bwrap), "process"])


def candidate(at_import: str = "", forward_prelude: str = "pass") -> str:
    prelude = textwrap.indent(textwrap.dedent(forward_prelude).strip(), " " * 8).strip()
    return KERNEL + textwrap.dedent(at_import) + MODEL_NEW.format(forward_prelude=prelude)


@dataclasses.dataclass
class Ctx:
    config: VerifierConfig
    prepared: object
    pool: _DevicePool
    root: str

    def judge(self, code: str, isolation: str = "bwrap", **overrides):
        config = dataclasses.replace(self.config, **overrides)
        return judge_candidate(code, self.prepared, config, "cpu", self.pool, choose_isolation(isolation),
                               self.root, "c")


@pytest.fixture(scope="module")
def ctx(tmp_path_factory) -> Ctx:
    root = str(tmp_path_factory.mktemp("sandbox"))
    config = VerifierConfig(device="cpu", timeout_s=60, multi_input_num_tests=1,
                            multi_input_shape_variations=False)
    pool = _DevicePool("cpu", 1)
    prepared = ProblemPreparer(config, "cpu", root, pool).prepare(PROBLEM)
    assert prepared.ok, prepared.error
    return Ctx(config, prepared, pool, root)


def _processes_with(marker: str) -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if marker.encode() in fh.read():
                    found.append(pid)
        except OSError:
            continue
    return found




def _wait_gone(marker: str, seconds: float = 5.0) -> list[str]:
    deadline = time.monotonic() + seconds
    while _processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    return _processes_with(marker)


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
    assert _wait_gone(marker) == []


@BOTH_MODES
def test_setsid_grandchild_does_not_outlive_the_verdict(ctx, isolation, tmp_path):
    """A double-forked grandchild in its own session, still running after the worker is done, is
    killed with the worker; the file it would write after the verdict never appears."""
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
    assert result.correct, result.error
    assert _wait_gone(marker, 2.0) == []
    time.sleep(5)
    assert not late_file.exists()
    assert _processes_with(marker) == []


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
def test_secrets_never_reach_the_candidate_or_the_result(ctx, monkeypatch, isolation):
    secret = f"s3cr3t-{uuid.uuid4().hex}"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    monkeypatch.setenv("HF_TOKEN", secret + "hf")
    monkeypatch.setenv("MY_API_KEY", secret + "key")
    code = candidate(at_import="""
        import os
        print(dict(os.environ))
        names = [k for k in os.environ if any(s in k.upper() for s in ("AWS", "HF_", "TOKEN", "SECRET", "KEY"))]
        hits = sum("s3cr3t-" in v for v in os.environ.values())
        try:  # the parent is the fork server: a clean environment, and not readable at all
            parent_hits = open(f"/proc/{os.getppid()}/environ", "rb").read().count(b"s3cr3t-")
        except OSError:
            parent_hits = 0
        raise RuntimeError(f"names={names} hits={hits} parent_hits={parent_hits}")
    """)
    result = ctx.judge(code, isolation=isolation)
    assert result.error.startswith("compile: exception: RuntimeError: names=[] hits=0 parent_hits=0"), result.error
    assert secret not in json.dumps(result.to_dict())


@BOTH_MODES
def test_no_ancestor_environment_is_readable(ctx, isolation):
    """The environment of every process above the candidate (its fork server, the verifier that may
    hold cloud credentials, anything further up) is unreadable from inside, in both modes."""
    code = candidate(at_import="""
        import os
        readable, pid = [], os.getppid()
        while pid > 1:
            try:
                open(f"/proc/{pid}/environ", "rb").read()
                readable.append(pid)
            except OSError:
                pass
            try:
                stat = open(f"/proc/{pid}/stat", "rb").read()
                pid = int(stat[stat.rfind(b")") + 2:].split()[1])
            except (OSError, ValueError):
                break
        raise RuntimeError(f"readable_ancestors={len(readable)}")
    """)
    result = ctx.judge(code, isolation=isolation)
    assert "readable_ancestors=0 " in result.error, result.error


@needs_bwrap
def test_files_outside_the_sandbox_cannot_be_read_under_bwrap(ctx, tmp_path):
    """Only the Python installation, /usr, the verifier code and the candidate's own directory are
    visible: a secret planted anywhere else (here: a temporary directory, the checkout, the home
    directory, /etc) cannot be read, whatever its path."""
    planted = tmp_path / "credentials"
    planted.write_text("aws_secret_access_key = planted-secret-value\n")
    targets = [str(planted), str(PROJECT_ROOT / "README.md"), str(PROJECT_ROOT / "tests" / "conftest.py"),
               os.path.expanduser("~/.bashrc"), "/etc/hostname", "/etc/passwd", "/work"]
    code = candidate(at_import=f"""
        import os
        readable = []
        for path in {targets!r}:
            try:
                if os.path.isdir(path):
                    os.listdir(path)
                else:
                    open(path, "rb").read()
                readable.append(path)
            except OSError:
                pass
        raise RuntimeError("readable=" + str(len(readable)) + " root=" + ",".join(sorted(os.listdir("/"))))
    """)
    result = ctx.judge(code, isolation="bwrap")
    assert result.error_category == "exception"
    assert "readable=0 " in result.error, result.error
    top_level = set(result.error.split("root=")[1].split()[0].split(","))
    # Only the system directories, the sandbox's own and the first component of each Python path.
    allowed = {"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "proc", "dev", "sandbox", "sys"}
    allowed |= {path.strip("/").split("/")[0] for path in python_paths()}
    assert top_level <= allowed, top_level - allowed


@BOTH_MODES
def test_error_text_is_redacted(ctx, monkeypatch, isolation):
    """A candidate that raises what it read (file contents, keys, environment values, paths, long
    blobs, several lines) gets a category and one short redacted line."""
    monkeypatch.setenv("VERIFY_TEST_PARENT_VALUE", "parent-value-7f3a9c")
    key = "AKIA" + "Q7XJ4M2P9ZL8W3K5"
    blob = "c2VjcmV0LWZpbGUtY29udGVudHMtdGhhdC1zaG91bGQtbm90LWxlYXZl"
    code = candidate(at_import=f"""
        raise ValueError("key={key} blob={blob} path=/root/.aws/credentials env=parent-value-7f3a9c "
                         + "'" + "line of a file the candidate read " * 3 + "'" + "\\nsecond line" + "x" * 500)
    """)
    result = ctx.judge(code, isolation=isolation)
    assert result.error_category == "exception" and result.error.startswith("compile: exception: ValueError")
    for leaked in (key, blob, "/root/.aws", "parent-value-7f3a9c", "line of a file", "second line"):
        assert leaked not in result.error, result.error
    assert len(result.error) <= 200 and "\n" not in result.error


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


@needs_bwrap
def test_writes_outside_the_sandbox_fail_under_bwrap(ctx, tmp_path):
    outside = [str(tmp_path / f"escape-{uuid.uuid4().hex}"), str(PROJECT_ROOT / f"escape-{uuid.uuid4().hex}"),
               os.path.expanduser(f"~/escape-{uuid.uuid4().hex}"), f"/dev/shm/escape-{uuid.uuid4().hex}",
               f"/escape-{uuid.uuid4().hex}"]
    code = candidate(at_import=f"""
        for path in {outside!r}:
            try:
                with open(path, "w") as fh:
                    fh.write("x")
            except OSError:
                pass
    """)
    result = ctx.judge(code, isolation="bwrap")
    assert result.correct, result.error
    for path in outside:
        assert not os.path.exists(path), f"sandboxed candidate wrote {path}"


def test_process_isolation_never_writes_into_the_checkout(ctx):
    """Process isolation has no filesystem protection, but workers import the verifier from a
    private copy: a candidate rewriting what it imports does not touch the checkout."""
    name = f"planted_{uuid.uuid4().hex}.py"
    code = candidate(at_import=f"""
        import os
        import extensions
        package = os.path.dirname(extensions.__file__)
        try:
            os.chmod(package, 0o755)
            open(os.path.join(package, {name!r}), "w").write("x = 1")
        except OSError:
            pass
    """)
    result = ctx.judge(code, isolation="process")
    assert result.correct, result.error
    assert not (PROJECT_ROOT / "extensions" / name).exists()


@needs_bwrap
def test_no_network_under_bwrap(ctx):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.5)
    port = server.getsockname()[1]
    accepted = []

    def accept():
        try:
            accepted.append(server.accept())
        except OSError:
            pass

    code = candidate(at_import=f"""
        import socket
        try:
            socket.create_connection(("127.0.0.1", {port}), timeout=3).sendall(b"leak")
            reached = True
        except OSError:
            reached = False
        if reached:
            raise RuntimeError("network reachable")
    """)
    try:
        result = ctx.judge(code, isolation="bwrap")
        thread = threading.Thread(target=accept)
        thread.start()
        thread.join()
    finally:
        server.close()
    assert result.correct, result.error
    assert accepted == []


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
    code = candidate(at_import="""
        import json, os
        job = json.load(open("job.json"))
        seen = sorted(os.listdir("."))
        raise RuntimeError("keys=" + ",".join(sorted(job)) + " set_keys=" + ",".join(sorted(job["sets"][0]))
                           + " files=" + ",".join(seen))
    """)
    message = ctx.judge(code).error
    assert "keys=allow_library_gemm,device,init,inputs_file,memory_limit_mb,seed,sets,timing" in message
    assert "set_keys=inputs,name,timing " in message
    assert "expected" not in message.lower()
    files = message.split("files=")[1].split(" ")[0].split(",")
    assert all(not f.startswith("expected") for f in files) and "candidate.py" in files


@BOTH_MODES
def test_fork_server_children_are_fresh_and_private(ctx, isolation):
    """Candidates forked by the same server: one that patches torch and leaves files in its own
    directory (and, under bwrap, next to it in the server's writable directory) changes nothing
    the next one sees. Process isolation promises the same for memory and the own directory."""
    from extensions.verify.judge import WorkerLauncher

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


@BOTH_MODES
def test_a_candidate_cannot_tamper_with_siblings(sibling_batch, isolation):
    """A candidate that rewrites every input, job and candidate file it can find (and reads any
    output it finds) while honest siblings run: the siblings are never judged on tampered data and
    never called cheaters; under bwrap they cannot even be reached."""
    results = sibling_batch(isolation)
    tamperer, honest = results[0], results[1:]
    for result in honest:
        if isolation == "bwrap":
            assert result.correct, result.error
        else:  # process isolation: tampering is detected, never mistaken for the sibling's cheating
            assert result.correct or result.error_category == "sandbox", result.error
            assert result.flags == [], result.flags
    assert "stolen=0" in (tamperer.error or "") or isolation == "process"


@pytest.fixture
def sibling_batch(monkeypatch):
    from types import SimpleNamespace

    from extensions.verify import api
    from extensions.verify.api import VerifyRequest, verify_batch

    # The tamperer would be stopped by the static check; the sandbox must hold without it.
    monkeypatch.setattr(api, "_call_static_check",
                        lambda code, config: SimpleNamespace(ok=True, flags=[], errors=[]))

    tamper = candidate(at_import="""
        import glob, os, time
        stolen = 0
        deadline = time.time() + 8
        while time.time() < deadline:
            for pattern in ("/tmp/verify-*/**", "/sandbox/**"):
                for path in glob.glob(pattern, recursive=True):
                    if os.path.abspath(path).startswith(os.getcwd()):
                        continue
                    name = os.path.basename(path)
                    try:
                        if name.startswith("set_") and name.endswith(".safetensors"):
                            open(path, "rb").read()
                            stolen += 1
                        elif name in ("inputs.safetensors", "job.json", "candidate.py") or name.endswith(".safetensors"):
                            open(path, "wb").write(b"tampered")
                    except OSError:
                        pass
            time.sleep(0.05)
        raise RuntimeError(f"stolen={stolen}")
    """)

    def run(isolation: str):
        config = VerifierConfig(device="cpu", timeout_s=90, multi_input_num_tests=1, workers=2,
                                isolation=isolation)
        honest = [candidate(at_import=f"marker_{i} = {i}\n") for i in range(3)]
        requests = [VerifyRequest(PROBLEM, text, f"c{i}") for i, text in enumerate([tamper] + honest)]
        return verify_batch(requests, config, device="cpu", progress=False)

    return run


def test_redaction_unit():
    from extensions.verify.redact import category_error, redact_line, safe_name, sanitize_data

    os.environ["VERIFY_UNIT_SECRET"] = "unit-secret-value"
    try:
        line = redact_line("boom unit-secret-value /home/u/.ssh/id_rsa ghp_abcdefghijklmnop1234567890\nnext")
    finally:
        del os.environ["VERIFY_UNIT_SECRET"]
    assert line == "boom <env> <path> <redacted>"
    assert safe_name("aten::add.Tensor") == "aten::add.Tensor" and safe_name("a b\nc") == "?"
    assert sanitize_data({"speedup": 1.5, "note": "free text here", "flags": ["ok_flag"]}) == {
        "speedup": 1.5, "note": None, "flags": ["ok_flag"]}
    assert category_error("tiny", "mismatch", "output: shape (2,) != expected (3,)") == \
        "tiny: mismatch: output: shape (2,) != expected (3,)"
    with pytest.raises(ValueError):
        category_error("tiny", "made_up")


@needs_bwrap
def test_bwrap_works_from_a_virtualenv_under_tmp(tmp_path_factory):
    """A user's Python in a virtual environment under /tmp (with the system's packages) must still
    start inside the sandbox: its prefix is bound even though /tmp itself is not."""
    venv = tmp_path_factory.mktemp("venv") / "env"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
                   check=True, timeout=120)
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
