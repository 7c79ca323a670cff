"""``python -m extensions.verify`` as outside checks call it: a real subprocess, JSON lines, exit codes."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from extensions.verify.cli import format_table
from extensions.verify.result import VerifyResult

PROBLEM = textwrap.dedent("""
    import torch
    import torch.nn as nn

    class Model(nn.Module):
        def forward(self, x):
            return x * 2.0

    batch_size = 2
    dim = 24

    def get_inputs():
        return [torch.randn(batch_size, dim)]

    def get_init_inputs():
        return []
""")

CANDIDATE = textwrap.dedent("""
    import torch
    import torch.nn as nn
    import triton
    import triton.language as tl

    @triton.jit
    def double_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) * FACTOR, mask=mask)

    class ModelNew(nn.Module):
        def forward(self, x):
            y = torch.empty_like(x)
            double_kernel[(triton.cdiv(x.numel(), 32),)](x, y, x.numel(), BLOCK=32)
            return y
""")


def run_cli(project_root, *args, timeout=600):
    return subprocess.run([sys.executable, "-m", "extensions.verify", *args], cwd=project_root,
                          capture_output=True, text=True, timeout=timeout)


def test_json_lines_in_order_and_exit_zero(project_root, tmp_path):
    problem = tmp_path / "problem.py"
    problem.write_text(PROBLEM)
    wrong = tmp_path / "wrong.md"
    wrong.write_text("```python\n" + CANDIDATE.replace("FACTOR", "3.0") + "```\n")
    right = tmp_path / "right.py"
    right.write_text(CANDIDATE.replace("FACTOR", "2.0"))
    missing = tmp_path / "missing.py"
    done = run_cli(project_root, "--problem", str(problem), "--candidate", str(wrong), "--candidate", str(right),
                   "--candidate", str(missing), "--device", "cpu", "--timeout", "90", "--json",
                   "--set", "verifier.multi_input_num_tests=2")
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [line["candidate"] for line in lines] == [str(wrong), str(right), str(missing)]
    for line in lines:
        assert {"candidate", "correct", "stage", "reward", "error", "flags", "speedup", "isolation"} <= set(line)
    first, second, third = lines
    assert (first["correct"], first["stage"], first["reward"]) == (False, "compile", 0.3)
    assert first["error"].startswith("tiny: ")
    assert (second["correct"], second["stage"], second["reward"], second["error"]) == (True, "full", 0.7, None)
    assert second["speedup"] is None and second["flags"] == []
    assert (third["correct"], third["stage"]) == (False, "none")
    assert third["error"].startswith("extract: cannot read candidate file")


def test_unreadable_problem_is_a_verifier_failure(project_root, tmp_path):
    candidate = tmp_path / "c.py"
    candidate.write_text(CANDIDATE)
    done = run_cli(project_root, "--problem", str(tmp_path / "nope.py"), "--candidate", str(candidate),
                   "--device", "cpu", "--json", timeout=120)
    assert done.returncode == 2
    assert done.stdout == ""
    assert "cannot read problem file" in done.stderr and "Traceback" not in done.stderr


def test_problem_whose_reference_fails_is_a_verifier_failure(project_root, tmp_path):
    problem = tmp_path / "broken.py"
    problem.write_text(PROBLEM.replace("return x * 2.0", "raise ValueError('broken reference')"))
    candidate = tmp_path / "c.py"
    candidate.write_text(CANDIDATE.replace("FACTOR", "2.0"))
    done = run_cli(project_root, "--problem", str(problem), "--candidate", str(candidate), "--device", "cpu",
                   "--json", timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    (line,) = [json.loads(x) for x in done.stdout.splitlines()]
    assert line["correct"] is False and "broken reference" in line["error"]
    assert "the problem could not be prepared" in done.stderr


def test_table_output():
    rows = [VerifyResult("a.py", correct=True, stage="full", reward=0.7),
            VerifyResult("b.py", stage="compile", reward=0.3, error="tiny: output: shape (2,) != expected (3,)",
                         flags=["torch_compute"])]
    table = format_table(rows).splitlines()
    assert table[0].split() == ["candidate", "correct", "stage", "reward", "speedup", "flags", "error"]
    assert table[1].split()[:5] == ["a.py", "yes", "full", "0.70", "-"]
    assert "torch_compute" in table[2] and table[2].endswith("tiny: output: shape (2,) != expected (3,)")


def test_the_config_it_used_is_named_on_stderr(project_root, tmp_path):
    """Stdout stays the verdicts alone; stderr says which config judged them (configs/default.yaml
    on every machine unless --config or --smoke says otherwise)."""
    candidate = tmp_path / "c.py"
    candidate.write_text("")
    done = run_cli(project_root, "--problem", str(tmp_path / "nope.py"), "--candidate", str(candidate),
                   "--device", "cpu", "--json", timeout=120)
    assert "verify: config " in done.stderr and "default.yaml" in done.stderr and done.stdout == ""
    smoke = run_cli(project_root, "--problem", str(tmp_path / "nope.py"), "--candidate", str(candidate),
                    "--device", "cpu", "--smoke", timeout=120)
    assert "smoke.yaml" in smoke.stderr and "unrecognized arguments" not in smoke.stderr
