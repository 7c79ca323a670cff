"""The candidate sandbox: real worker processes (bubblewrap where it works) running hostile code.

The static check would reject most of these candidates before they run; here they go straight to
the sandbox (``judge_candidate``) because the sandbox must hold even when a check upstream misses.
"""
from __future__ import annotations

import dataclasses
import json
import os
import socket
import sys
import textwrap
import threading
import uuid

import pytest

from extensions.config import VerifierConfig
from extensions.verify.api import _DevicePool, verify_code_unscreened
from extensions.verify.judge import ProblemPreparer, judge_candidate
from extensions.verify.sandbox import PROJECT_ROOT, SandboxedProcess, bwrap_works, choose_isolation

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


def candidate(at_import: str = "", forward_prelude: str = "pass") -> str:
    prelude = textwrap.indent(textwrap.dedent(forward_prelude).strip(), " " * 8).strip()
    return KERNEL + textwrap.dedent(at_import) + MODEL_NEW.format(forward_prelude=prelude)


@dataclasses.dataclass
class Ctx:
    config: VerifierConfig
    prepared: object
    pool: _DevicePool
    root: str

    def judge(self, code: str, isolation: str = "auto", **overrides):
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


def test_correct_candidate_passes_in_the_sandbox(ctx):
    result = ctx.judge(candidate())
    assert result.error is None and result.stage == "full" and result.correct
    assert result.isolation == ("bwrap" if bwrap_works() else "process")


@pytest.mark.parametrize("isolation", ["bwrap", "process"])
def test_timeout_kills_the_whole_process_group(ctx, isolation):
    if isolation == "bwrap" and not bwrap_works():
        pytest.skip("no bubblewrap")
    marker = f"sleeper-{uuid.uuid4().hex}"
    code = candidate(at_import=f"""
        import subprocess, sys, time
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "{marker}"])
        time.sleep(600)
    """)
    result = ctx.judge(code, isolation=isolation, timeout_s=6.0)
    assert result.error == "compile: timeout after 6s"
    assert result.stage == "static" and not result.correct
    assert _processes_with(marker) == []


def test_exit_calls_in_the_candidate_are_verdicts(ctx):
    at_import = ctx.judge(candidate(at_import="import sys\nsys.exit(0)\n"))
    assert at_import.stage == "static"
    assert at_import.error.startswith("compile: SystemExit") and "candidate line" in at_import.error
    in_forward = ctx.judge(candidate(forward_prelude="import os\nos._exit(3)"))
    assert in_forward.stage == "compile"
    assert in_forward.error.startswith("tiny: candidate process exited with status 3")


def test_output_flood_is_bounded_and_drained(tmp_path):
    flood = "import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(300):\n    sys.stdout.write(chunk)\n"
    proc = SandboxedProcess([sys.executable, "-c", flood], str(tmp_path), device="cpu", gpu_index=None,
                            isolation="process", max_output_bytes=4096)
    import time

    outcome = proc.finish(time.monotonic() + 120)
    assert outcome.returncode == 0 and not outcome.timed_out
    assert outcome.stdout_bytes == 300 << 20
    assert len(outcome.stdout) == 4096


def test_flooding_candidate_is_still_judged(ctx):
    code = candidate(at_import="import sys\nfor _ in range(200):\n    sys.stdout.write('y' * (1 << 20))\n")
    result = ctx.judge(code)
    assert result.correct, result.error
    assert result.details["output_bytes"]["stdout"] >= 200 << 20


def test_secrets_never_reach_the_candidate_or_the_result(ctx, monkeypatch):
    secret = f"s3cr3t-{uuid.uuid4().hex}"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    monkeypatch.setenv("HF_TOKEN", secret + "hf")
    monkeypatch.setenv("MY_API_KEY", secret + "key")
    code = candidate(at_import="""
        import os
        print(dict(os.environ))
        names = [k for k in os.environ if any(s in k.upper() for s in ("AWS", "HF_", "TOKEN", "SECRET", "KEY"))]
        hits = sum("s3cr3t-" in v for v in os.environ.values())
        raise RuntimeError(f"names={names} hits={hits}")
    """)
    result = ctx.judge(code)
    assert result.error.startswith("compile: RuntimeError: names=[] hits=0"), result.error
    assert secret not in json.dumps(result.to_dict())


@needs_bwrap
def test_writes_outside_the_sandbox_fail_under_bwrap(ctx, tmp_path):
    outside = [str(tmp_path / f"escape-{uuid.uuid4().hex}"), str(PROJECT_ROOT / f"escape-{uuid.uuid4().hex}"),
               os.path.expanduser(f"~/escape-{uuid.uuid4().hex}")]
    code = candidate(at_import=f"""
        written = []
        for path in {outside!r}:
            try:
                with open(path, "w") as fh:
                    fh.write("x")
                written.append(path)
            except OSError:
                pass
        for path in written:
            pass
    """)
    result = ctx.judge(code, isolation="bwrap")
    assert result.correct, result.error
    for path in outside:
        assert not os.path.exists(path), f"sandboxed candidate wrote {path}"


def test_process_fallback_does_not_protect_the_filesystem(ctx, tmp_path):
    """Documented limit: without bubblewrap, files the user can write stay writable."""
    target = tmp_path / "written-by-candidate"
    result = ctx.judge(candidate(at_import=f"open({str(target)!r}, 'w').write('x')\n"), isolation="process")
    assert result.isolation == "process" and result.correct
    assert target.exists()


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
    config = VerifierConfig(device="cpu", timeout_s=60, multi_input_num_tests=1)
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


def test_prespawned_workers_are_fresh_per_candidate(ctx):
    """A spare worker waits with torch/Triton imported; each still judges exactly one candidate,
    so a candidate that patches torch cannot reach the next one."""
    from extensions.verify.judge import WorkerLauncher

    launcher = WorkerLauncher(ctx.config, "cpu", choose_isolation("auto"), ctx.root, total=2, prespawn=True)
    poisoner = candidate(at_import="torch.verifier_poison = True")
    checker = candidate(at_import="if getattr(torch, 'verifier_poison', False):\n    raise RuntimeError('poisoned')\n")
    try:
        first = judge_candidate(poisoner, ctx.prepared, ctx.config, "cpu", ctx.pool,
                                choose_isolation("auto"), ctx.root, "first", launcher=launcher)
        spares = [p for procs in launcher._spares.values() for p in procs]
        assert len(spares) == 1 and spares[0].proc.poll() is None
        second = judge_candidate(checker, ctx.prepared, ctx.config, "cpu", ctx.pool,
                                 choose_isolation("auto"), ctx.root, "second", launcher=launcher)
        assert launcher._spares == {None: []}  # no third worker for two candidates
    finally:
        launcher.close()
    assert first.correct, first.error
    assert second.correct and second.error is None  # the poison lived only in the first process
    assert spares[0].proc.poll() is not None  # the spare served the second candidate and is gone
