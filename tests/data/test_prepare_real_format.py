"""KernelBook as it really ships (inductor's dialects) goes through prepare_data.py into SFT data
that the reward's verifier accepts, on CPU (the interpreter)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from extensions.data.canonical import detect_dialect
from extensions.data.kernelbook import normalise_row
from project_paths import FIXTURES_DIR, PROJECT_ROOT

FIXTURES = FIXTURES_DIR / "kernelbook_real"
ASYNC_FAMILIES = ("elementwise", "activation", "norm", "broadcast", "pooling")


def _subset(path: Path) -> Path:
    rows = [json.loads(line) for line in (FIXTURES / "inductor_kernelbook.jsonl").read_text().splitlines()]
    seen = set()
    for line in (FIXTURES / "inductor_async.jsonl").read_text().splitlines():
        row = json.loads(line)
        family = row["module_name"].split("_")[0]
        if family in ASYNC_FAMILIES and family not in seen:
            seen.add(family)
            rows.append(row)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    work = tmp_path_factory.mktemp("real-format")
    source = _subset(work / "kernelbook.jsonl")
    out = work / "processed"
    result = subprocess.run(
        [sys.executable, "prepare_data.py", "--smoke", "--kernelbook", str(source), "--out", str(out),
         "--set", "data.rl_task_ids=[]", "--set", "data.bundled_eval_tasks=false", "--no_progress"],
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return source, out, json.loads((out / "prepare_report.json").read_text()), result.stdout


def test_every_kept_pair_was_verified_and_both_dialects_are_kept(prepared):
    source, out, report, stdout = prepared
    tally = report["sources"]["kernelbook"]
    verification = report["verification"]
    assert verification["every_kept_pair_verified"] is True
    assert verification["devices"] == ["cpu"]
    assert tally["kept"] == verification["passed"] and verification["passed"] >= 10
    assert tally["read"] == tally["kept"] + sum(tally["dropped"].values())
    assert report["dialects"]["inductor_kernelbook"] >= 6 and report["dialects"]["inductor_async"] >= 4
    # the KernelBook-era Linear row hands its GEMM to cuBLAS: dropped, and said why
    assert tally["dropped"].get("solution_calls_library_kernel") == 1
    assert "verified pairs:" in stdout
    assert report["outputs"]["sft_train"] + report["outputs"]["sft_val"] == tally["kept"]


def test_sft_completions_are_clean_and_the_verifier_cli_accepts_them(prepared, tmp_path):
    source, out, _, _ = prepared
    tasks = {}
    for row in map(json.loads, source.read_text().splitlines()):
        if "extern_kernels." not in row["triton_code"]:
            tasks[row["uuid"]] = normalise_row(row).task_code
    rows = [json.loads(line) for name in ("sft_train.jsonl", "sft_val.jsonl")
            for line in (out / name).read_text().splitlines()]
    for row in rows:
        assert "torch._inductor" not in row["completion"] and "triton_helpers" not in row["completion"]
    picked = {}
    for row in rows:
        kind = "kernelbook" if row["uuid"].startswith("kbera-") else "async"
        picked.setdefault(kind, row)
    assert set(picked) == {"kernelbook", "async"}
    for kind, row in picked.items():
        problem_file = tmp_path / f"{kind}_problem.py"
        problem_file.write_text(tasks[row["uuid"]])
        candidate = tmp_path / f"{kind}_candidate.txt"
        candidate.write_text(row["completion"])  # the raw completion: fences and all, as a model writes it
        assert detect_dialect(row["completion"]) == "clean"
        result = subprocess.run([sys.executable, "-m", "extensions.verify", "--problem", str(problem_file),
                                 "--candidate", str(candidate), "--device", "cpu", "--json", "--timeout", "120"],
                                cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=600)
        verdict = json.loads(result.stdout.splitlines()[0])
        assert verdict["correct"] is True, (kind, verdict)
