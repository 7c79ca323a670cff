"""Decontamination by what a program computes: operator-graph signatures, the data stage's count,
the synthesizer's filter and the learning-signal split."""
from __future__ import annotations

import json

import pytest

from extensions.data.kernelbook import normalise_row
from project_paths import PROJECT_ROOT
from extensions.data.operator_graph import ComputationIndex, SignatureTracer, trace_signature

HEADER = "import math\nimport torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n"
INPUTS = "\n\ndef get_inputs():\n    return [torch.rand(16, 64)]\n\n\ndef get_init_inputs():\n    return []\n"


def program(forward: str, init: str = "pass", name: str = "Model") -> str:
    return (HEADER + f"class {name}(nn.Module):\n    def __init__(self):\n        super().__init__()\n        {init}\n\n"
            f"    def forward(self, x):\n        {forward}\n" + INPUTS)


GELU_SPELLINGS = {
    "module": program("return self.act(x)", "self.act = nn.GELU()"),
    "functional": program("return F.gelu(x)"),
    "full_path": program("return torch.nn.functional.gelu(x)"),
    "reshaped": program("return F.gelu(x.view(-1)).view_as(x).contiguous()"),
}
GELU_ERF = program("return x * 0.5 * (1 + torch.erf(x / math.sqrt(2)))")
GELU_THEN_SCALE = program("return F.gelu(x) * 2.0")


@pytest.fixture(scope="module")
def kernelbench_rows(kernelbench_jsonl) -> dict[str, dict]:
    rows = (json.loads(line) for line in kernelbench_jsonl.read_text().splitlines())
    return {row["name"]: row for row in rows if row["level"] in (1, 2)}


@pytest.fixture(scope="module")
def tracer():
    with SignatureTracer(persist=False) as tracer:
        yield tracer


def test_every_gelu_spelling_is_kernelbench_gelu(kernelbench_rows, tracer):
    reference = tracer.signature(kernelbench_rows["26_GELU_"]["code"])
    assert reference.traceable and reference.ops == ("aten.gelu",)
    for spelling, source in GELU_SPELLINGS.items():
        signature = tracer.signature(source)
        assert signature.computation == reference.computation, spelling
    # Views around the call are layout, not computation: the exact graph differs, the computation not.
    assert tracer.signature(GELU_SPELLINGS["functional"]).graph == reference.graph
    assert tracer.signature(GELU_SPELLINGS["reshaped"]).graph != reference.graph


def test_gelu_then_scale_and_the_erf_formula_are_other_computations(kernelbench_rows, tracer):
    reference = tracer.signature(kernelbench_rows["26_GELU_"]["code"])
    scaled = tracer.signature(GELU_THEN_SCALE)
    assert scaled.traceable and scaled.computation != reference.computation
    assert scaled.ops == ("aten.gelu", "aten.mul")
    # The hand-written formula traces to mul/div/erf/add, not aten.gelu: documented as not the same.
    erf = tracer.signature(GELU_ERF)
    assert erf.traceable and "aten.erf" in erf.ops and erf.computation != reference.computation
    tanh = tracer.signature(program("return F.gelu(x, approximate='tanh')"))
    assert tanh.computation != reference.computation  # the string picks another function


def test_same_input_twice_is_not_two_inputs(tracer):
    square = tracer.signature(program("return x * x"))
    product = tracer.signature(HEADER + "class Model(nn.Module):\n    def forward(self, a, b):\n        return a * b\n"
                               "\n\ndef get_inputs():\n    return [torch.rand(4), torch.rand(4)]\n\n\n"
                               "def get_init_inputs():\n    return []\n")
    assert square.traceable and product.traceable and square.computation != product.computation


def test_commutative_arguments_and_constants_do_not_matter(tracer):
    a = tracer.signature(program("return torch.relu(x) + x"))
    b = tracer.signature(program("return x + F.relu(x)"))
    assert a.graph == b.graph
    assert tracer.signature(program("return x * 3.0")).graph == tracer.signature(program("return x * 0.5")).graph


def test_a_kernelbook_row_is_traced_in_its_kernelbench_form(kernelbench_rows, tracer):
    row = {"uuid": "kb-gelu", "entry_point": "GeluAct", "repo_name": "somewhere",
           "python_code": program("return self.act(x)", "self.act = nn.GELU()", name="GeluAct")
           .replace("return []", "return [[], {}]"),
           "triton_code": "import torch\nimport triton\n\n@triton.jit\ndef k(x):\n    pass\n\n\n"
                          "class GeluActNew(torch.nn.Module):\n    def forward(self, x):\n        return x\n"}
    pair = normalise_row(row, drop_library_kernel_solutions=False)
    index = ComputationIndex()
    index.add("L1_26_GELU_", tracer.signature(kernelbench_rows["26_GELU_"]["code"]))
    match = index.match(tracer.signature(pair.task_code))
    assert match is not None and match.key == "L1_26_GELU_" and match.exact


def test_untraceable_programs_are_reported_not_dropped(tracer):
    failing = [
        program("return x if bool(x.sum() > 0) else -x"),  # a branch on the data
        program("raise RuntimeError('no')"),
        HEADER + "class Model(nn.Module):\n    pass\n",  # no get_inputs
        "this is not python",
    ]
    index = ComputationIndex()
    index.add("relu", tracer.signature(program("return torch.relu(x)")))
    for source in failing:
        signature = tracer.signature(source)
        assert not signature.traceable and signature.error
        assert index.match(signature) is None
    index.add("broken", tracer.signature(failing[0]))
    assert index.untraceable == ["broken"]


def test_a_hanging_program_times_out_and_the_next_one_traces(tmp_path):
    cache = tmp_path / "signatures.jsonl"
    with SignatureTracer(timeout_s=3.0, cache_file=cache) as tracer:
        hung = tracer.signature(program("while True:\n            pass"))
        assert not hung.traceable and hung.error.startswith("timeout")
        assert tracer.signature(program("return torch.tanh(x)")).ops == ("aten.tanh",)
    with SignatureTracer(timeout_s=3.0, cache_file=cache) as again:  # from the file, no worker
        assert again.signature(program("return torch.tanh(x)")).ops == ("aten.tanh",)
        assert again.traced == 0 and again._process is None


def test_in_process_trace_matches_the_worker(tracer):
    assert trace_signature(GELU_SPELLINGS["module"]) == tracer.signature(GELU_SPELLINGS["module"])


# -- the data stage -------------------------------------------------------------------------------------
def _kernelbook_row(uuid: str, source: str) -> dict:
    solution = ("import torch\nimport torch.nn as nn\nimport triton\nimport triton.language as tl\n\n\n"
                "@triton.jit\ndef copy_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):\n"
                "    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)\n"
                "    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)\n\n\n"
                "class ModelNew(nn.Module):\n    def forward(self, x):\n        out = torch.empty_like(x)\n"
                "        copy_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)\n"
                "        return out\n")
    return {"uuid": uuid, "entry_point": "Model", "python_code": source.replace("return []", "return [[], {}]"),
            "triton_code": solution, "repo_name": "somewhere"}


def test_data_stage_drops_a_respelled_eval_problem_and_counts_it(tmp_path, kernelbench_rows):
    from extensions.config import load_config
    from extensions.data import format_summary, prepare

    kernelbench = tmp_path / "kernelbench.jsonl"
    kernelbench.write_text("".join(json.dumps(kernelbench_rows[name]) + "\n" for name in ("26_GELU_", "19_ReLU")))
    kernelbook = tmp_path / "kernelbook.jsonl"
    rows = [_kernelbook_row("gelu-module", GELU_SPELLINGS["module"]),
            _kernelbook_row("gelu-scaled", GELU_THEN_SCALE),
            _kernelbook_row("gelu-erf", GELU_ERF),
            _kernelbook_row("softsign", program("return x / (1 + x.abs())"))]
    kernelbook.write_text("".join(json.dumps(row) + "\n" for row in rows))
    cfg = load_config(PROJECT_ROOT / "configs" / "smoke.yaml",
                      [f"data.kernelbook={kernelbook}", f"data.kernelbench={kernelbench}", "data.kernelbench_levels=[1]",
                       "data.bundled_eval_tasks=false", "data.verify_pairs=false", "data.val_fraction=0.0",
                       "data.rl_fraction=0.0", "data.rl_task_ids=[]"])
    report = prepare(cfg, tmp_path / "out", progress=False).report
    tally = report["sources"]["kernelbook"]
    assert tally["read"] == 4 and tally["kept"] == 3
    assert tally["dropped"] == {"same_computation_as_eval_problem": 1}
    decontamination = report["decontamination"]
    assert decontamination["by_text"] == 0 and decontamination["by_computation"] == 1
    assert decontamination["dropped"] == [{"uuid": "gelu-module", "eval_task": "L1_26_GELU_", "exact_graph": True,
                                          "ops": ["aten.gelu"]}]
    assert decontamination["untraceable_pairs"] == 0 and decontamination["untraceable_eval_tasks"] == []
    kept = {json.loads(line)["uuid"] for line in (tmp_path / "out" / "sft_train.jsonl").open()}
    assert kept == {"gelu-scaled", "gelu-erf", "softsign"}
    assert "1 by computation" in format_summary(report)


def test_synthesizer_screens_programs_by_computation(tmp_path, kernelbench_rows):
    from extensions.data.synthesis.build import SynthesisOptions, SynthesisReport, _Appender, screen_programs
    from extensions.data.synthesis.programs import Program

    eval_tasks = tmp_path / "eval.jsonl"
    eval_tasks.write_text(json.dumps(kernelbench_rows["26_GELU_"]) + "\n")
    programs = [Program("gelu_0", "activation", GELU_SPELLINGS["module"], False),
                Program("gelu_scale_0", "activation", GELU_THEN_SCALE, False)]
    report = SynthesisReport()
    dropped = _Appender(tmp_path / "dropped.jsonl")
    kept = list(screen_programs(programs, SynthesisOptions(out=tmp_path / "out.jsonl", eval_tasks=[eval_tasks]),
                                report, dropped))  # screened as the capture loop asks for them
    dropped.close()
    assert [p.name for p in kept] == ["gelu_scale_0"]
    assert report.dropped == {"same_computation_as_eval_problem": 1}
    row = json.loads((tmp_path / "dropped.jsonl").read_text())
    assert row["name"] == "gelu_0" and row["detail"].startswith("1_26_GELU_")


# -- the learning-signal split --------------------------------------------------------------------------
def test_split_drops_rl_problems_computing_a_heldout_one(learning_signal, kernelbench_rows):
    gelu = kernelbench_rows["26_GELU_"]
    twin = {"level": 1, "problem_id": 999, "name": "999_gelu_module", "code": GELU_SPELLINGS["module"]}
    split, heldout, rl = learning_signal.make_split([gelu, twin], heldout_per_level=1, rl_per_level=1, threshold=0.85)
    assert len(heldout) == 1 and rl == []  # text far apart, computation the same
    (dropped,) = split["dropped"]["rl_same_computation_as_heldout"]
    assert {dropped["rl"], dropped["heldout"]} == {gelu["name"], twin["name"]} and dropped["exact_graph"]
    text_only, _, rl = learning_signal.make_split([gelu, twin], heldout_per_level=1, rl_per_level=1, threshold=0.85,
                                                  by_computation=False)
    assert len(rl) == 1 and not text_only["dropped"]["rl_near_heldout"]


def test_split_holds_out_24_problems_per_level(learning_signal, kernelbench_jsonl):
    problems = learning_signal.read_problems(kernelbench_jsonl, (1, 2))
    split, heldout, rl = learning_signal.make_split(problems, heldout_per_level=24, rl_per_level=12, threshold=0.85)
    assert [sum(1 for p in heldout if p["level"] == level) for level in (1, 2)] == [24, 24]
    assert [sum(1 for p in rl if p["level"] == level) for level in (1, 2)] == [12, 12]
    signatures = dict(zip((p["name"] for p in problems),
                          learning_signal.computation_signatures([p["code"] for p in problems])))
    heldout_computations = {signatures[p["name"]].computation for p in heldout} - {None}
    assert not any(signatures[p["name"]].computation in heldout_computations for p in rl)
    assert split["dropped"]["rl_same_computation_as_heldout"]  # level 1 repeats mm and convolution
    json.dumps(split)
