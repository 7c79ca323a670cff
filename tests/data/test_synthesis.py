"""The synthesizer's CPU-side parts: the program generator, the graph-input mapping, the solution
class, resuming captured rows through the verifier, and the CLI's answer on a machine without CUDA.
(Capturing with inductor needs a GPU: bench/device_session.sh synthesize runs it there.)"""
from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import types
from collections import Counter

from extensions.data.synthesis.build import SynthesisOptions, captured_path, dropped_path, report_path, synthesize
from extensions.data.synthesis.capture import solution_class, source_expression
from extensions.data.synthesis.programs import FAMILIES, draw_programs
from project_paths import FIXTURES_DIR, PROJECT_ROOT

FIXTURES = FIXTURES_DIR / "kernelbook_real"


def _run_program(source: str):
    module = types.ModuleType("program")
    exec(source, module.__dict__)
    return module, module.Model(*module.get_init_inputs())(*module.get_inputs())


def test_programs_are_deterministic_runnable_and_cover_every_family():
    programs = draw_programs(240, seed=7)
    assert [p.source for p in programs] == [p.source for p in draw_programs(240, seed=7)]
    assert [p.source for p in draw_programs(40, seed=7)] == [p.source for p in programs[:40]]  # a larger draw extends
    assert set(Counter(p.family for p in programs)) == set(FAMILIES)
    assert len({p.digest for p in programs}) == len(programs)
    for program in programs:
        module, output = _run_program(program.source)
        constants = {k: v for k, v in vars(module).items() if isinstance(v, int) and not k.startswith("_")}
        assert constants, program.name  # sizes are module-level constants, which the verifier varies
        sizes = [v for v in constants.values()]
        assert len(set(sizes)) == len(sizes), (program.name, constants)  # no two dimensions equal
        assert all(v >= 2 for v in sizes)
        init = ast.parse(program.source)
        forward = next(n for n in ast.walk(init) if isinstance(n, ast.FunctionDef) and n.name == "get_init_inputs")
        assert not re.search(r"\d\.\d", ast.unparse(forward)), program.name  # no float in the constructor


def test_graph_inputs_map_to_parameters_forward_arguments_and_their_sizes():
    names = ["self.linear.weight", "self.linear.bias", "x"]
    assert source_expression("L['args'][0]", names) == "self.linear.weight"
    assert source_expression("L['args'][2].size()[1]", names) == "x.size(1)"
    assert source_expression("L['args'][0].stride()[0]", names) == "self.linear.weight.stride(0)"
    assert source_expression("L['args'][3]", names) is None
    assert source_expression("G['model']._modules['linear']", names) is None


def test_solution_class_keeps_the_constructor_and_calls_the_wrapper():
    program = next(p for p in draw_programs(200, seed=3) if p.family == "gemm" and "nn.Linear" in p.source)
    text = solution_class(program.source, ["self.linear.weight", "self.linear.bias", "x.size(0)", "x"])
    tree = ast.parse(text)
    cls = tree.body[0]
    assert cls.name == "ModelNew"
    init = next(f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__init__")
    assert "nn.Linear(in_features, out_features)" in ast.unparse(init)
    assert "return call([self.linear.weight, self.linear.bias, x.size(0), x])[0]" in text


def test_captured_rows_are_verified_on_resume_and_a_rerun_does_nothing(tmp_path):
    rows = [json.loads(line) for line in (FIXTURES / "inductor_async.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r["module_name"].startswith(("elementwise", "activation"))][:2]
    modules = []
    for row in rows:
        path = tmp_path / f"{row['module_name']}.py"
        path.write_text(row["python_code"])
        modules.append(path)
    out = tmp_path / "pairs.jsonl"
    captured = [{**row, "sha": __import__("hashlib").sha256(row["python_code"].encode()).hexdigest()[:16]}
                for row in rows]
    captured_path(out).write_text("".join(json.dumps(r) + "\n" for r in captured))
    options = SynthesisOptions(out=out, count=0, module_files=modules, verify_device="cpu", progress=False,
                               capture_workers=1)
    report = synthesize(options)
    assert report.pairs_built == 2 and report.tried == 0  # verified without compiling again
    kept = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["sha"] for r in kept} == {r["sha"] for r in captured}
    assert all(r["verified"]["device"] == "cpu" for r in kept)
    saved = json.loads(report_path(out).read_text())
    assert saved["pairs_in_file"] == 2 and len(saved["runs"]) == 1
    again = synthesize(options)
    assert again.already_done == 2 and again.pairs_built == 0
    assert len(json.loads(report_path(out).read_text())["runs"]) == 2
    assert not dropped_path(out).read_text().strip()


def test_cli_without_cuda_says_so_in_one_line(tmp_path):
    result = subprocess.run([sys.executable, "-m", "extensions.data.synthesis", "--out", str(tmp_path / "p.jsonl"),
                             "--count", "3"], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "no CUDA device" in result.stderr
    missing = subprocess.run([sys.executable, "-m", "extensions.data.synthesis", "--out", str(tmp_path / "p.jsonl"),
                              "--modules", str(tmp_path / "nope.py")], cwd=PROJECT_ROOT, capture_output=True, text=True,
                             timeout=120)
    assert missing.returncode == 2 and "file not found" in missing.stderr


def _recorded_options(out, **overrides) -> SynthesisOptions:
    from synthesis_support import FAMILIES_RECORDED, recorded_capture

    settings = dict(out=out, count=3, families=FAMILIES_RECORDED, verify_device="cpu", progress=False,
                    capture_workers=1, capture=recorded_capture)
    return SynthesisOptions(**{**settings, **overrides})


def test_captures_stream_into_the_verifier_and_every_program_is_accounted_for(tmp_path, monkeypatch):
    """...and capture waits for the verifier rather than running ahead of it (verification is the
    bottleneck on a GPU machine; captures made far ahead take the CPU it needs): with room for one
    row, each capture waits for the previous verdict."""
    monkeypatch.setenv("KERNEL_RL_VERIFY_CACHE", str(tmp_path / "verdicts.jsonl"))  # judged here, not recalled
    out = tmp_path / "pairs.jsonl"
    report = synthesize(_recorded_options(out, capture_ahead=1, verify_workers=1))
    assert report.most_unjudged == 1 and json.loads(report_path(out).read_text())["most_unjudged"] == 1
    kept = [json.loads(line) for line in out.read_text().splitlines()]
    dropped = [json.loads(line) for line in dropped_path(out).read_text().splitlines()]
    captured = captured_path(out).read_text().splitlines()
    assert report.tried == report.captured == len(captured) > 0
    assert report.pairs_built == len(kept) == report.captured  # the recorded captures are correct pairs
    assert all(r["verified"]["device"] == "cpu" for r in kept)
    assert len(kept) + len(dropped) == report.programs == 3  # kept, or dropped with a reason
    assert not report.stopped_early


def test_a_deadline_leaves_captures_waiting_and_the_next_run_finishes_them(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNEL_RL_VERIFY_CACHE", str(tmp_path / "verdicts.jsonl"))
    out = tmp_path / "pairs.jsonl"
    # Past the deadline before the first verdict: what was captured waits in captured.jsonl.
    first = synthesize(_recorded_options(out, max_minutes=1e-4))
    assert first.stopped_early and first.pairs_built == 0
    second = synthesize(_recorded_options(out))
    kept = [json.loads(line) for line in out.read_text().splitlines()]
    dropped = [json.loads(line) for line in dropped_path(out).read_text().splitlines()]
    assert not second.stopped_early
    assert len({r["sha"] for r in kept}) == len(kept)  # nothing judged twice into the file
    assert len(kept) + len(dropped) == 3 and second.pairs_built == len(kept) > 0
    assert second.tried == 3 - first.captured - len(dropped)  # captures are not made again


def _operations(source: str) -> int:
    """Calls and arithmetic in ``forward``: what the kernel for the program has to compute."""
    forward = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef) and n.name == "forward")
    return sum(isinstance(n, (ast.Call, ast.BinOp)) for n in ast.walk(forward))


def test_short_programs_are_one_or_two_operations_and_survive_screening(tmp_path, kernelbench_jsonl):
    """A model trained on long chains writes long chains for a one-op problem; the short family is
    the data against that, and it is useless if the near-duplicate rule drops it as it drops most
    single activations (whose text is mostly the module around them)."""
    from extensions.data.synthesis.build import SynthesisReport, _Appender, screen_programs

    short = draw_programs(120, seed=3, families=("short",))
    counts = sorted(_operations(p.source) for p in short)
    # Two steps each; a few unary templates are themselves two or three (exp(-abs(x))).
    assert counts[len(counts) // 2] == 2 and counts[-1] <= 6, counts
    for program in short[:10]:
        _run_program(program.source)
    # The text rules are what drop single activations; tracing every KernelBench problem would
    # add half a minute and no program of this draw computes one of them.
    options = SynthesisOptions(out=tmp_path / "pairs.jsonl", eval_tasks=[kernelbench_jsonl],
                               decontaminate_by_computation=False)

    def kept(programs):
        return list(screen_programs(programs, options, SynthesisReport(), _Appender(tmp_path / "dropped.jsonl")))

    activations = draw_programs(120, seed=3, families=("activation",))
    # Single activations saturate near one per template and rank; short programs keep coming.
    assert len(kept(activations)) <= 0.4 * len(activations)
    assert len(kept(short)) >= 0.6 * len(short)


def test_a_later_run_drops_near_copies_of_pairs_already_in_the_output(tmp_path, kernelbench_jsonl):
    """A second run with another seed adds to the same file; it must not keep the first run's
    programs again under new sizes or constants (the first run's screening index is gone)."""
    from extensions.data.synthesis.build import SynthesisReport, _Appender, _kept_rows, _kept_sources, screen_programs

    options = SynthesisOptions(out=tmp_path / "pairs.jsonl", eval_tasks=[kernelbench_jsonl],
                               decontaminate_by_computation=False)

    def kept(programs, already=None):
        report = SynthesisReport()
        survivors = list(screen_programs(programs, options, report, _Appender(tmp_path / "dropped.jsonl"), already))
        return survivors, report

    first, _ = kept(draw_programs(60, seed=3, families=("short",)))
    with open(options.out, "w", encoding="utf-8") as handle:
        for program in first:
            handle.write(json.dumps({"sha": program.digest, "python_code": program.source}) + "\n")
    previous = _kept_sources(_kept_rows(options.out))
    assert set(previous) == {p.digest for p in first}

    second = draw_programs(60, seed=4, families=("short",))
    alone, _ = kept(second)
    after, report = kept(second, previous)
    assert {p.digest for p in after} < {p.digest for p in alone}
    assert report.dropped.get("near_duplicate", 0) > 0
    # The very programs of the first run are near-copies of themselves.
    again, _ = kept(first[:5], previous)
    assert again == []
