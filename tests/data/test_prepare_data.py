"""prepare_data.py end to end: planted defects are counted by reason, the good rows come out in
KernelBench form, splits are deterministic, reruns are no-ops unless forced."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from extensions.config import load_config
from extensions.data import format_summary, prepare
from extensions.data import rejections as R
from extensions.data.bundled import bundled_pairs
from extensions.data.kernelbook import flatten_init_inputs, normalise_row, rename_class
from extensions.data.sources import SourceError
from extensions.data.splits import split_ids
from project_paths import PROJECT_ROOT

GOOD = ("relu_pair", "leaky", "clamp", "row_sum", "layer_norm", "linear", "scaled_matmul")


def _bundled(stem: str) -> dict:
    return dict(next(row for row in bundled_pairs() if row["module_name"] == stem))


def _good_rows() -> list[dict]:
    rows = [_bundled(stem) for stem in ("hardswish", "leaky_relu", "clamp", "row_sum", "layer_norm",
                                         "linear", "scaled_matmul")]
    for i, row in enumerate(rows):
        row["uuid"] = f"good-{i}"
    return rows


def _kernelbench_copy(kernelbench_jsonl: Path, name: str, new_class: str) -> dict:
    """A KernelBench problem renamed, stripped of docstrings and comments, reformatted, in
    KernelBook form, paired with a (syntactically valid) Triton solution."""
    row = next(json.loads(l) for l in kernelbench_jsonl.read_text().splitlines() if json.loads(l)["name"] == name)
    import ast

    class Rename(ast.NodeTransformer):
        def visit_Name(self, node):
            node.id = {"Model": new_class, "x": "inp"}.get(node.id, node.id)
            return node

        def visit_arg(self, node):
            node.arg = "inp" if node.arg == "x" else node.arg
            return node

        def visit_ClassDef(self, node):
            node.name = new_class if node.name == "Model" else node.name
            return self.generic_visit(node)

    tree = Rename().visit(ast.parse(row["code"]))
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            node.body = body[1:] or [ast.Pass()]
    code = ast.unparse(tree).replace("return []", "return [[], {}]")
    solution = _bundled("relu")["triton_code"].replace("class ReluActivationNew", f"class {new_class}New")
    return {"uuid": f"copy-{name}", "entry_point": new_class, "python_code": "# copied\n" + code,
            "triton_code": solution, "repo_name": "somewhere"}


def _planted_jsonl(path: Path, kernelbench_jsonl: Path) -> dict[str, int]:
    good = _good_rows()
    lines: list[bytes] = [json.dumps(row).encode() for row in good]
    expected: dict[str, int] = {}

    def plant(reason: str, line: bytes) -> None:
        lines.append(line)
        expected[reason] = expected.get(reason, 0) + 1

    base = _bundled("silu")
    plant(R.MALFORMED_JSON, b'{"uuid": "broken", "python_code": ')
    plant(R.UNDECODABLE_BYTES, b'{"uuid": "bytes", "python_code": "\xff\xfe"}')
    plant(R.NOT_AN_OBJECT, b'[1, 2, 3]')
    plant(f"{R.MISSING_FIELD}:python_code", json.dumps({k: v for k, v in base.items() if k != "python_code"}).encode())
    plant(f"{R.EMPTY_FIELD}:triton_code", json.dumps({**base, "uuid": "e", "triton_code": "  ",
                                                      "original_triton_code": ""}).encode())
    plant(R.TASK_SYNTAX_ERROR, json.dumps({**base, "uuid": "s", "python_code": "class Silu(:\n"}).encode())
    plant(R.NO_ENTRY_POINT_CLASS, json.dumps({**base, "uuid": "n", "entry_point": "Missing"}).encode())
    plant(R.SOLUTION_CALLS_LIBRARY_KERNEL, json.dumps({**base, "uuid": "lib", "triton_code": base["triton_code"]
                                                       + "\ndef f(a, b):\n    return extern_kernels.mm(a, b)\n"}).encode())
    plant(R.EXACT_DUPLICATE, json.dumps({**good[0], "uuid": "dup-1"}).encode())
    reformatted = {**good[1], "uuid": "dup-2", "python_code": "# a comment\n" + good[1]["python_code"].replace(
        "return F.leaky_relu(x, self.negative_slope)", "return F.leaky_relu(x,   self.negative_slope)  # same")}
    plant(R.EXACT_DUPLICATE, json.dumps(reformatted).encode())
    renamed = {**good[3], "uuid": "near-1", "entry_point": "SumLastDim",
               "python_code": good[3]["python_code"].replace("RowSum", "SumLastDim").replace("(self, x)", "(self, t)")
               .replace("torch.sum(x,", "torch.sum(t,").replace("ROWS = 16", "ROWS = 32"),
               "triton_code": good[3]["triton_code"].replace("RowSumNew", "SumLastDimNew")}
    plant(R.NEAR_DUPLICATE, json.dumps(renamed).encode())
    plant(R.CONTAMINATED, json.dumps(_kernelbench_copy(kernelbench_jsonl, "23_Softmax", "RowwiseSoftmax")).encode())
    plant(R.CONTAMINATED, json.dumps(_kernelbench_copy(kernelbench_jsonl, "76_Gemm_Add_ReLU", "GemmThing")).encode())
    # Two good rows compute what a KernelBench problem computes (leaky_relu is 20_LeakyReLU,
    # layer_norm 40_LayerNorm): the computation rule drops them after the text rules.
    expected[R.SAME_COMPUTATION] = 2
    path.write_bytes(b"\n".join(lines) + b"\n")
    kept = [row["uuid"] for row in good if row["uuid"] not in ("good-1", "good-4")]
    return {"read": len(lines), "kept": len(kept), "kept_uuids": set(kept), "dropped": expected}


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_cli_counts_every_planted_defect(tmp_path, kernelbench_jsonl, project_root):
    source = tmp_path / "kernelbook.jsonl"
    expected = _planted_jsonl(source, kernelbench_jsonl)
    out = tmp_path / "processed"
    proc = subprocess.run(
        [sys.executable, "prepare_data.py", "--smoke", "--kernelbook", str(source), "--kernelbench",
         str(kernelbench_jsonl), "--out", str(out), "--no_progress", "--set", "data.bundled_eval_tasks=false"],
        cwd=project_root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "malformed JSON" in proc.stderr and "line" in proc.stderr
    report = json.loads((out / "prepare_report.json").read_text())
    kernelbook = report["sources"]["kernelbook"]
    assert kernelbook["read"] == expected["read"]
    assert kernelbook["kept"] == expected["kept"]
    assert kernelbook["dropped"] == expected["dropped"]
    assert kernelbook["read"] == kernelbook["kept"] + sum(kernelbook["dropped"].values())
    assert report["sources"]["kernelbench"]["kept"] == 250
    assert "overlaps_eval_problem=2" in proc.stdout  # the summary table
    assert report["difficulty"]["kernelbench_agreement"]["agreement"] >= 0.9

    train, val, rl = (_read_jsonl(out / f) for f in ("sft_train.jsonl", "sft_val.jsonl", "rl_tasks.jsonl"))
    assert len(train) + len(val) + len(rl) == expected["kept"]
    labels = _read_jsonl(out / "difficulty_labels.jsonl")
    assert {row["uuid"] for row in labels} == expected["kept_uuids"]
    dropped = {(d["uuid"], d["eval_task"]) for d in report["decontamination"]["dropped"]}
    assert dropped == {("good-1", "L1_20_LeakyReLU"), ("good-4", "L1_40_LayerNorm")}
    assert report["decontamination"]["by_text"] == 2 and report["decontamination"]["by_computation"] == 2
    for row in train + val:
        assert set(row) == {"uuid", "level", "prompt", "completion"}
        assert row["prompt"][-1]["role"] == "user" and "class Model(nn.Module)" in row["prompt"][-1]["content"]
        assert "class ModelNew(nn.Module)" in row["completion"] and row["completion"].startswith("```python")
    for row in rl:
        assert set(row) == {"task_id", "level", "name", "code"} and "class Model(" in row["code"]
    eval_rows = _read_jsonl(out / "eval_tasks.jsonl")
    relu = next(row for row in eval_rows if row["task_id"] == "L1_19_ReLU")
    assert relu["level"] == 1 and relu["predicted_level"] in (1, 2, 3) and relu["source"] == "kernelbench"


def test_missing_source_exits_nonzero(tmp_path, project_root):
    proc = subprocess.run(
        [sys.executable, "prepare_data.py", "--smoke", "--kernelbook", str(tmp_path / "absent.jsonl"),
         "--out", str(tmp_path / "out")], cwd=project_root, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "absent.jsonl" in proc.stderr and "not found" in proc.stderr


def _config(source: str, **data):
    overrides = [f"data.kernelbook={source}", "data.kernelbench=none", "data.bundled_eval_tasks=false"]
    overrides += [f"data.{k}={v}" for k, v in data.items()]
    return load_config(PROJECT_ROOT / "configs" / "smoke.yaml", overrides)


def test_parquet_and_json_inputs_match_jsonl(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = _good_rows()
    (tmp_path / "kb.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "kb.json").write_text(json.dumps(rows))
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "kb.parquet")
    import gzip

    with gzip.open(tmp_path / "kb.jsonl.gz", "wt") as handle:
        handle.write("".join(json.dumps(r) + "\n" for r in rows))
    kept = {}
    for suffix in ("jsonl", "json", "parquet", "jsonl.gz"):
        outcome = prepare(_config(str(tmp_path / f"kb.{suffix}")), tmp_path / suffix, progress=False)
        tally = outcome.report["sources"]["kernelbook"]
        kept[suffix] = (tally["read"], tally["kept"])
        labels = (tmp_path / suffix / "difficulty_labels.jsonl").read_text()
        assert labels == (tmp_path / "jsonl" / "difficulty_labels.jsonl").read_text()
    assert set(kept.values()) == {(len(rows), len(rows))}


def test_sources_joined_by_commas_are_read_as_one_and_each_counts_for_freshness(tmp_path):
    """Pairs of one's own beside KernelBook: one spec, both files' rows, and a change to either
    makes the outputs stale."""
    rows = _good_rows()
    first, second = tmp_path / "kernelbook.jsonl", tmp_path / "synthesized.jsonl.gz"
    first.write_text("".join(json.dumps(r) + "\n" for r in rows[:3]))
    import gzip

    with gzip.open(second, "wt") as handle:
        handle.write("".join(json.dumps(r) + "\n" for r in rows[3:]))
    out = tmp_path / "out"
    joined = f"{first}, {second}"
    outcome = prepare(_config(joined), out, progress=False)
    tally = outcome.report["sources"]["kernelbook"]
    assert (tally["read"], tally["kept"]) == (len(rows), len(rows))
    assert prepare(_config(joined), out, progress=False).up_to_date
    with gzip.open(second, "wt") as handle:
        handle.write("".join(json.dumps(r) + "\n" for r in rows[3:-1]))
    assert not prepare(_config(joined), out, progress=False).up_to_date
    with pytest.raises(SourceError, match="absent.jsonl.*not found"):
        prepare(_config(f"{first},{tmp_path / 'absent.jsonl'}"), tmp_path / "other", progress=False)


def test_max_samples_idempotence_and_force(tmp_path, capsys):
    source = tmp_path / "kb.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in _good_rows()))
    out = tmp_path / "out"
    first = prepare(_config(str(source)), out, max_samples=4, progress=False)
    assert not first.up_to_date and first.report["sources"]["kernelbook"]["read"] == 4
    before = (out / "sft_train.jsonl").stat().st_mtime_ns
    second = prepare(_config(str(source)), out, max_samples=4, progress=False)
    assert second.up_to_date and (out / "sft_train.jsonl").stat().st_mtime_ns == before
    assert not prepare(_config(str(source)), out, max_samples=4, force=True, progress=False).up_to_date
    assert not prepare(_config(str(source)), out, max_samples=5, progress=False).up_to_date
    assert not prepare(_config(str(source), val_fraction=0.3), out, max_samples=5, progress=False).up_to_date
    source.write_text(source.read_text() + json.dumps({**_good_rows()[0], "uuid": "new"}) + "\n")
    assert not prepare(_config(str(source), val_fraction=0.3), out, max_samples=5, progress=False).up_to_date


def test_init_inputs_are_flattened():
    task = (
        "import torch\nimport torch.nn as nn\n"
        "class Model(nn.Module):\n"
        "    def __init__(self, a, b=3, c=4, *, d=1):\n        super().__init__()\n"
        "    def forward(self, x):\n        return x\n"
        "def get_inputs():\n    return [torch.rand(2)]\n"
    )
    flat = flatten_init_inputs(task + "def get_init_inputs():\n    return [[7], {'c': 5}]\n")
    assert "return [7, 3, 5]" in flat
    namespace = {}
    exec(flat, namespace)
    namespace["Model"](*namespace["get_init_inputs"]())
    assert "return [1, 2]" in flatten_init_inputs(task + "def get_init_inputs():\n    return [1, 2]\n")
    assert "return []" in flatten_init_inputs(task + "def get_init_inputs():\n    return [[], {}]\n")
    with pytest.raises(R.RowRejected) as err:
        flatten_init_inputs(task + "def get_init_inputs():\n    return [[], {'d': 2}]\n")
    assert err.value.reason == R.INIT_INPUTS_UNMAPPABLE
    with pytest.raises(R.RowRejected):
        flatten_init_inputs(task.replace("a, b=3", "a, b") + "def get_init_inputs():\n    return [[], {'c': 2}]\n")


def test_entry_point_renaming_is_ast_aware():
    source = ("class Net(nn.Module):\n    '''Net docs: NetNew, Net'''\n"
              "    def __init__(self):\n        super(Net, self).__init__()\n        self.Net = 1  # Net\n"
              "    def forward(self, x):\n        return other.Net(x) + NetHelper(x)\n")
    renamed = rename_class(source, "Net", "Model")
    assert renamed.startswith("class Model(nn.Module):")
    assert "super(Model, self)" in renamed
    assert "'''Net docs: NetNew, Net'''" in renamed and "self.Net = 1  # Net" in renamed
    assert "other.Net(x) + NetHelper(x)" in renamed

    pair = normalise_row(_bundled("clamp"))
    assert "class Model(nn.Module)" in pair.task_code and "ClampRange" not in pair.task_code
    assert "class ModelNew(nn.Module)" in pair.solution_code and "ClampRangeNew" not in pair.solution_code
    assert "return [-0.5, 0.75]" in pair.task_code


def test_split_is_deterministic_and_stable():
    ids = [f"id-{i}" for i in range(2000)]
    first = split_ids(ids, val_fraction=0.05, rl_fraction=0.2)
    again = split_ids(list(reversed(ids)), val_fraction=0.05, rl_fraction=0.2)
    assert set(first.rl) == set(again.rl) and set(first.val) == set(again.val)
    assert 0.15 < len(first.rl) / len(ids) < 0.25 and 0.02 < len(first.val) / len(ids) < 0.08
    subset = split_ids(ids[:500], val_fraction=0.05, rl_fraction=0.2)
    assert set(subset.rl) == set(first.rl) & set(ids[:500])
    tiny = split_ids(["a", "b", "c", "d"], val_fraction=0.05, rl_fraction=0.2)
    assert tiny.val and tiny.rl and tiny.train


def test_named_rl_tasks_are_held_out_whatever_their_hash():
    ids = [f"id-{i}" for i in range(200)]
    named = ["id-3", "id-50", "id-199"]
    split = split_ids(ids, val_fraction=0.1, rl_fraction=0.0, rl_ids=named)
    assert split.rl == named
    assert not set(named) & (set(split.train) | set(split.val))
    hashed = split_ids(ids, val_fraction=0.1, rl_fraction=0.2)
    both = split_ids(ids, val_fraction=0.1, rl_fraction=0.2, rl_ids=named)
    assert set(both.rl) == set(hashed.rl) | set(named)


def test_named_rl_tasks_in_prepare(tmp_path):
    names = ["bundled-add", "bundled-sigmoid", "bundled-absent"]
    cfg = load_config(PROJECT_ROOT / "configs" / "smoke.yaml",
                      ["data.rl_fraction=0.0", f"data.rl_task_ids=[{','.join(names)}]"])
    outcome = prepare(cfg, tmp_path / "out", progress=False)
    rl_ids = [json.loads(line)["task_id"] for line in (tmp_path / "out" / "rl_tasks.jsonl").open()]
    assert rl_ids == ["kb_bundled-add", "kb_bundled-sigmoid"]
    train = {json.loads(line)["uuid"] for line in (tmp_path / "out" / "sft_train.jsonl").open()}
    assert not train & {"bundled-add", "bundled-sigmoid"} and "bundled-mul_add" in train
    assert outcome.report["rl_task_ids_missing"] == ["bundled-absent"]
    assert "bundled-absent" in format_summary(outcome.report)


def test_a_missing_retrieval_package_stops_the_stage_before_any_pair_is_verified(tmp_path, project_root):
    # bm25s hidden as if not installed: the stage must say so at once, not after judging every pair.
    cache = tmp_path / "verdicts.jsonl"
    hide_and_run = ("import runpy, sys; sys.modules['bm25s'] = None; sys.argv = sys.argv[1:]; "
                    "runpy.run_path('prepare_data.py', run_name='__main__')")
    proc = subprocess.run(
        [sys.executable, "-c", hide_and_run, "prepare_data.py", "--smoke", "--out", str(tmp_path / "out"),
         "--no-progress", "--set", "data.verify_pairs=true", "--set", "data.retrieval=lexical"],
        cwd=project_root, capture_output=True, text=True, timeout=300,
        env={**os.environ, "KERNEL_RL_VERIFY_CACHE": str(cache)})
    assert proc.returncode != 0
    assert "bm25s" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not cache.exists()  # no pair was judged
    assert not (tmp_path / "out" / "prepare_report.json").exists()
