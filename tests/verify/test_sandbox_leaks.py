"""What may leave the candidate sandbox, and what may reach into it: environment secrets, other
processes' environments, files outside the candidate's directory, the network, error text that
carries what was read, the checkout the workers import from, and sibling candidates' files.
Each property is tested in every isolation mode that promises it.
"""
from __future__ import annotations

import json
import os
import socket
import tempfile
import threading
import uuid

import pytest

from extensions.config import VerifierConfig
from extensions.verify.parent.sandbox import PROJECT_ROOT, python_paths
from sandbox_support import BOTH_MODES, PROBLEM, candidate, make_ctx, needs_bwrap

ctx = pytest.fixture(scope="module")(make_ctx)


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


def test_redaction_unit():
    from extensions.verify.parent.redact import category_error, redact_line, safe_name, sanitize_data

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


@BOTH_MODES
def test_a_candidate_cannot_tamper_with_siblings(sibling_batch, isolation):
    """A candidate that rewrites every input, job and candidate file it can find (and reads any
    output it finds) while honest siblings run: the siblings are never judged on tampered data and
    never called cheaters; under bwrap they cannot even be reached."""
    import glob
    import tempfile

    pattern = os.path.join(tempfile.gettempdir(), "verify-cand-*")  # process isolation's private roots
    before = set(glob.glob(pattern))
    results = sibling_batch(isolation)
    tamperer, honest = results[0], results[1:]
    assert set(glob.glob(pattern)) - before == set(), "directories refilled by the tamperer were left behind"
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

    # Where the verifier puts its files: the temporary directory (one per test worker).
    tamper = candidate(at_import=f"""
        import glob, os, time
        stolen = 0
        deadline = time.time() + 8
        while time.time() < deadline:
            for pattern in ("{tempfile.gettempdir()}/verify-*/**", "/sandbox/**"):
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
        raise RuntimeError(f"stolen={{stolen}}")
    """)

    def run(isolation: str):
        config = VerifierConfig(device="cpu", timeout_s=90, multi_input_num_tests=1, workers=2,
                                isolation=isolation)
        honest = [candidate(at_import=f"marker_{i} = {i}\n") for i in range(3)]
        requests = [VerifyRequest(PROBLEM, text, f"c{i}") for i, text in enumerate([tamper] + honest)]
        return verify_batch(requests, config, device="cpu", progress=False)

    return run
