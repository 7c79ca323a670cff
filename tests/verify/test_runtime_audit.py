"""The runtime layer on its own, without the static check in front of it: what gets past a static
screen must still be caught in the worker, and what the interpreter lacks must not reject correct
kernels. Real fixtures from tests/fixtures/candidates, real sandboxed workers, the Triton interpreter.
"""
from __future__ import annotations

import textwrap

import pytest

import candidate_catalog as catalog
from extensions.config import VerifierConfig
from extensions.verify import VerifyRequest, verify_batch
from extensions.verify.api import verify_code_unscreened

# Audit-blinding fixtures judged from the compile stage on (the static check skipped): the flags the
# worker's audit alone must raise.
RUNTIME_CATCHES = {
    "cheats/rt_tolist_python_copy_kernel.py": {"host_compute"},
    "cheats/rt_item_loop_python_compute.py": {"host_compute"},
    "cheats/rt_grid_dunder_numpy.py": {"numpy_compute"},
    "cheats/rt_disable_modes_in_enter.py": {"torch_compute"},
    "cheats/rt_disable_modes_attribute_chain.py": {"torch_compute"},
    "cheats/rt_import_thread_worker.py": {"threads", "torch_compute"},
}


def _fixture(label: str) -> catalog.CandidateFile:
    folder, name = label.split("/")
    return next(f for f in catalog.load_folder(folder, require_expectation=False) if f.name == name)


@pytest.fixture(scope="module")
def config() -> VerifierConfig:
    return VerifierConfig(device="cpu", timeout_s=120, multi_input_num_tests=2)


@pytest.fixture(scope="module")
def problems(kernelbench_jsonl):
    keys = {_fixture(label).problem_key for label in RUNTIME_CATCHES} | {(1, 19)}
    return catalog.load_problems(kernelbench_jsonl, keys)


@pytest.mark.parametrize("label", sorted(RUNTIME_CATCHES))
def test_runtime_audit_catches_what_passes_a_static_screen(label, problems, config):
    fixture = _fixture(label)
    result = verify_code_unscreened(problems[fixture.problem_key]["code"], fixture.text, config, device="cpu")
    assert not result.correct and result.reward == 0.0, result
    assert RUNTIME_CATCHES[label] & set(result.flags), f"{label}: {result.flags} {result.error}"


RELU_LAUNCH = textwrap.dedent("""
    import torch
    import torch.nn as nn
    import triton
    import triton.language as tl


    @triton.jit
    def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(y_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)


    class ModelNew(nn.Module):
        def __init__(self):
            super().__init__()
            {init}

        def forward(self, x):
            x = x.contiguous()
            y = torch.empty_like(x)
            n = x.numel()
            {forward}
            relu_kernel[(triton.cdiv(n, 1024),)](x, y, n, BLOCK=1024)
            return y
""")


def relu(init: str = "pass", forward: str = "pass") -> str:
    return RELU_LAUNCH.replace("{init}", init).replace("{forward}", forward)


def test_a_few_scalars_read_back_are_not_host_compute(problems, config):
    """Reading a scalar or two (a size, a scale) is ordinary; only bulk reads are flagged."""
    code = relu(forward="first = float(x.reshape(-1)[0]); _ = x.reshape(-1)[:8].tolist()")
    result = verify_code_unscreened(problems[(1, 19)]["code"], code, config, device="cpu")
    # reduced_size: advisory, the CPU sets stay far below the problem's billion-odd elements
    assert result.correct and result.flags == ["reduced_size"], result


def test_worker_code_rebound_by_the_candidate_is_audit_tampering(problems, config):
    # The hook test an attacker would want to silence: "is this caller Triton's own code?"
    code = relu(init="import sys; sys.modules['extensions.verify.sandboxed.audit']._internal_caller = lambda: True")
    result = verify_code_unscreened(problems[(1, 19)]["code"], code, config, device="cpu")
    assert not result.correct and "audit_tampered" in result.flags, result


def test_policy_data_rebound_by_the_candidate_is_audit_tampering(problems, config):
    """No code changes: the allow-list the audit reads is rebound to admit the ops forward uses."""
    code = relu(init="import sys; p = sys.modules['extensions.verify.static.policy']; "
                     "p.ALLOWED_ATEN_OPS = p.ALLOWED_ATEN_OPS | {'mul', 'gt'}",
                forward="x = x * (x > 0)")
    result = verify_code_unscreened(problems[(1, 19)]["code"], code, config, device="cpu")
    assert not result.correct and "audit_tampered" in result.flags, result


def test_a_thread_started_while_building_the_model_is_flagged(problems, config):
    code = relu(init="import threading; threading.Thread(target=lambda: None).start()")
    result = verify_code_unscreened(problems[(1, 19)]["code"], code, config, device="cpu")
    assert not result.correct and "threads" in result.flags, result


def test_the_job_and_seeds_are_gone_before_construction(problems, config):
    """Nothing in the sandbox tells the constructor which inputs will come."""
    code = relu(init="import os; assert not [f for f in os.listdir('.') if f.startswith(('job', 'init', 'set_', "
                     "'timing', 'inputs', 'expected'))], os.listdir('.')")
    result = verify_code_unscreened(problems[(1, 19)]["code"], code, config, device="cpu")
    assert result.correct, result.error


def test_inputs_differ_between_batches(problems, config):
    """Input seeds are drawn per batch: the same candidate sees other values in the next batch."""
    code = relu(forward="assert float(x.reshape(-1)[0]) != 0.0 or True")
    first = verify_code_unscreened(problems[(1, 19)]["code"], code, config, device="cpu")
    assert first.correct
    from extensions.verify.parent.judge import draw_secret

    draws = {draw_secret()["input_seed"] for _ in range(4)}
    assert len(draws) == 4 and all(0 <= seed < 2 ** 62 for seed in draws)


def test_docstring_twins_are_judged_separately(problems, config, monkeypatch):
    """The twin reads its own docstring; with a key that ignored docstrings it would inherit the
    honest sibling's verdict (or the sibling its rejection). The static check refuses reading a
    docstring (``type``, ``__doc__``): the de-duplication key must hold without it."""
    from types import SimpleNamespace

    from extensions.verify import api

    monkeypatch.setattr(api, "_call_static_check", lambda code, cfg: SimpleNamespace(ok=True, flags=[], errors=[]))
    twin = _fixture("cheats/rt_docstring_twin.py").text
    honest = twin.replace('    """half"""\n\n', "")
    assert honest != twin
    problem = problems[(1, 19)]["code"]
    results = verify_batch([VerifyRequest(problem, honest, "honest"), VerifyRequest(problem, twin, "twin")],
                           config, device="cpu", progress=False)
    assert results[0].correct and not results[0].cached
    assert not results[1].correct and not results[1].cached


def test_interpreter_support_autotune_libdevice_tf32_and_program_order():
    """In the worker's interpreter: a multi-config autotune runs one config per input set, in
    turn from the rotation's offset, libdevice computes, tl.dot at its default rounds fp32 operands to TF32 as a GPU does (IEEE stays exact),
    and a shuffled program order changes the answer of an order-dependent kernel only."""
    import subprocess
    import sys

    script = textwrap.dedent("""
        import torch, triton, triton.language as tl
        from extensions.verify.sandboxed import interpreter_compat
        interpreter = interpreter_compat.install()
        order = interpreter.order
        from triton.language.extra import libdevice

        @triton.autotune(configs=[triton.Config({'BLOCK': 64}), triton.Config({'BLOCK': 128})], key=['n'])
        @triton.jit
        def special(x, y, n, BLOCK: tl.constexpr):
            o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            m = o < n
            v = tl.load(x + o, mask=m)
            tl.store(y + o, libdevice.erf(v) + libdevice.tanh(v) + libdevice.pow(v, 2.0), mask=m)

        @triton.jit
        def chained(out):
            pid = tl.program_id(0)
            prev = tl.load(out + pid - 1, mask=pid > 0, other=0)
            tl.store(out + pid, prev + 1)

        @triton.jit
        def dot16(a, b, c, IEEE: tl.constexpr):
            r = tl.arange(0, 16)
            x = tl.load(a + r[:, None] * 16 + r[None, :])
            w = tl.load(b + r[:, None] * 16 + r[None, :])
            if IEEE:
                p = tl.dot(x, w, input_precision="ieee")
            else:
                p = tl.dot(x, w)
            tl.store(c + r[:, None] * 16 + r[None, :], p)

        a, b = torch.randn(16, 16), torch.randn(16, 16)
        tf32 = lambda t: ((t.view(torch.int32) + 0x1000) & ~0x1FFF).view(torch.float32)
        default, ieee = torch.empty(16, 16), torch.empty(16, 16)
        dot16[(1,)](a, b, default, IEEE=False); dot16[(1,)](a, b, ieee, IEEE=True)
        assert torch.allclose(ieee, a @ b, atol=1e-5) and (default - a @ b).abs().max() > 1e-4
        assert torch.allclose(default, tf32(a) @ tf32(b), atol=1e-5)

        x = torch.randn(1000); y = torch.empty_like(x)
        special[lambda meta: (triton.cdiv(1000, meta['BLOCK']),)](x, y, 1000)
        assert torch.allclose(y, torch.erf(x) + torch.tanh(x) + x * x, atol=1e-5), (y - torch.erf(x)).abs().max()
        first = (interpreter.autotune.offset % 2)
        assert special.best_config.kwargs == {'BLOCK': (64, 128)[first]}
        interpreter.start_set(1, shuffled=False)
        special[lambda meta: (triton.cdiv(1000, meta['BLOCK']),)](x, y, 1000)
        assert special.best_config.kwargs == {'BLOCK': (64, 128)[1 - first]}
        ordered = torch.zeros(64, dtype=torch.int32); chained[(64,)](ordered)
        assert ordered.tolist() == list(range(1, 65))
        order.shuffled = True
        shuffled = torch.zeros(64, dtype=torch.int32); chained[(64,)](shuffled)
        assert shuffled.tolist() != list(range(1, 65))
        print("ok")
    """)
    from conftest import PROJECT_ROOT

    done = subprocess.run([sys.executable, "-c", script], cwd=PROJECT_ROOT, capture_output=True, text=True,
                          env={"TRITON_INTERPRET": "1", "PATH": "/usr/bin:/bin"}, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]


def test_timer_fingerprint_bound_accepts_close_and_rejects_wrong_outputs():
    import torch

    from extensions.timing.runners import fingerprint, fingerprints_close

    config = VerifierConfig()
    reference = torch.randn(64, 33)
    close = reference + 1e-6
    wrong = reference.clone()
    wrong[5, 7] += 0.5
    assert fingerprints_close(fingerprint(reference), fingerprint(close), config)
    assert not fingerprints_close(fingerprint(reference), fingerprint(wrong), config)
    assert not fingerprints_close(fingerprint(reference), fingerprint(reference[:, :32]), config)


def test_timer_notices_a_rebound_clock(monkeypatch):
    import time

    import torch

    from extensions.timing.runners import HostTrialRunner

    from extensions.verify.common.compare import compare_outputs

    runner = HostTrialRunner(torch.nn.Identity(), torch.nn.Identity(), [[torch.randn(4)]], VerifierConfig(),
                             compare_outputs)
    assert runner.timers_intact()
    monkeypatch.setattr(time, "perf_counter", lambda: 0.0)
    assert not runner.timers_intact()


def test_a_candidate_hiding_work_from_the_timer_is_never_correct():
    from extensions.verify.reward import compute_reward, is_cheating

    assert is_cheating(["side_stream_suspected"]) and is_cheating(["timer_patched"])
    assert compute_reward("timing", ["side_stream_suspected"], 3.0, VerifierConfig().reward_weights) == 0.0
    assert not is_cheating(["reduced_size"])


def test_layout_copies_beside_a_real_triton_pass_are_not_a_decoy():
    """The GPU-time share on the profiler's kernel list (name, stream, microseconds): a permute in
    and out around one Triton pass (a third or a tenth of the time in Triton) is a correct kernel; a
    one-element launch beside a transposing copy is a decoy."""
    from extensions.verify.sandboxed.audit import ForwardReport, _cuda_kernel_flags

    def flags_for(kernels):
        report = ForwardReport(kernel_names={"rms_rows_kernel"})
        report.cuda_kernels = [("fill_kernel_probe", 7, 1.0)] + [(name, 7, us) for name, us in kernels]
        return _cuda_kernel_flags(report), report.details["triton_gpu_share"]

    flags, share = flags_for([("direct_copy_kernel", 120.0), ("rms_rows_kernel", 110.0), ("direct_copy_kernel", 120.0)])
    assert flags == [] and 0.3 < share < 0.35
    # Strided transposing copies run far below the bandwidth of one coalesced pass.
    flags, share = flags_for([("direct_copy_kernel", 500.0), ("rms_rows_kernel", 110.0), ("direct_copy_kernel", 500.0)])
    assert flags == [] and 0.09 < share < 0.11
    flags, share = flags_for([("rms_rows_kernel", 2.0), ("direct_copy_kernel", 240.0)])
    assert flags == ["decoy_kernel"] and share < 0.01


# -- CUDA: run on a GPU machine with ``python -m pytest -q -m gpu tests/verify/test_runtime_audit.py`` ---------

def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


CUDA_PROBLEM_SIZES = "batch_size = 256\ndim = 65536"


@pytest.fixture(scope="module")
def cuda_config() -> VerifierConfig:
    return VerifierConfig(device="cuda", timeout_s=300, multi_input_num_tests=2, timing_num_warmup=3,
                          timing_num_trials=10, timing_budget_s=0.5)


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_available(), reason="needs a CUDA device")
def test_cuda_uninitialised_tail_fails_the_second_run(problems, cuda_config):
    """Writes only the first half of the output: the first run may find zeros in fresh memory; the
    second, after freed memory was filled with NaN, cannot."""
    code = RELU_LAUNCH.replace("{init}", "pass").replace("{forward}", "n = n // 2")
    result = verify_code_unscreened(problems[(1, 19)]["code"], code, cuda_config, device="cuda")
    assert not result.correct, result


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_available(), reason="needs a CUDA device")
def test_cuda_copies_doing_the_work_next_to_a_decoy_launch_are_flagged(kernelbench_jsonl, cuda_config):
    """Transpose-like work done by a copy kernel (x.t().contiguous()) with a one-element Triton
    launch beside it: the Triton kernels' share of GPU time is tiny."""
    problem = textwrap.dedent("""
        import torch
        import torch.nn as nn

        class Model(nn.Module):
            def forward(self, x):
                return x.t().contiguous()

        rows = 4096
        cols = 4096

        def get_inputs():
            return [torch.randn(rows, cols)]

        def get_init_inputs():
            return []
    """)
    launch = "relu_kernel[(triton.cdiv(n, 1024),)](x, y, n, BLOCK=1024)\n        return y"
    assert launch in relu()
    code = relu().replace(launch, "relu_kernel[(1,)](x, y, 1, BLOCK=16)\n        return x.t().contiguous()")
    result = verify_code_unscreened(problem, code, cuda_config, device="cuda")
    assert not result.correct and "decoy_kernel" in result.flags, result


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_available(), reason="needs a CUDA device")
def test_cuda_multi_config_autotune_is_accepted_and_timed(kernelbench_jsonl, cuda_config):
    fixture = _fixture("kernelbench/rt_autotune_relu.py")
    problem = catalog.load_problems(kernelbench_jsonl, {fixture.problem_key})[fixture.problem_key]["code"]
    result = verify_code_unscreened(problem, fixture.text, cuda_config, device="cuda")
    assert result.correct and result.stage == "timing", (result.flags, result.error)
    assert "subprocess" not in result.flags


def test_rt_fixtures_are_judged_alike_in_process_isolation(kernelbench_jsonl):
    """The default suites run under bubblewrap; the runtime fixtures' verdicts hold under plain
    process isolation too."""
    files = [f for folder in ("cheats", "wrong", "kernelbench")
             for f in catalog.load_folder(folder, require_expectation=False) if f.name.startswith("rt_")]
    problems = catalog.load_problems(kernelbench_jsonl, {f.problem_key for f in files})
    requests = [VerifyRequest(problems[f.problem_key]["code"], f.text, label=f"{f.path.parent.name}/{f.name}")
                for f in files]
    results = verify_batch(requests, VerifierConfig(isolation="process"), device="cpu", progress=False)
    for fixture, result in zip(files, results):
        assert result.isolation == ("none" if result.stage == "extract" else "process"), result
        should_pass = fixture.path.parent.name == "kernelbench"
        assert result.correct == should_pass, f"{result.candidate}: {result.flags} {result.error}"
        if fixture.path.parent.name == "cheats":
            assert result.reward == 0.0 and result.flags, result.candidate


def test_a_cpu_verdict_below_the_problems_own_size_says_reduced_size():
    from extensions.verify.parent.candidate_run import CandidateRun
    from extensions.verify.parent.judge import PreparedProblem
    from extensions.verify.result import VerifyResult

    def verdict(shrunk: bool, sets_run: list[str], problem_numel: int = 400) -> VerifyResult:
        run = CandidateRun.__new__(CandidateRun)
        run.device = "cpu"
        run.prepared = PreparedProblem(True, shrunk=shrunk, problem_numel=problem_numel, sets=[
            {"name": "base", "kind": "base", "numel": 100},
            {"name": "large", "kind": "wide", "numel": 400, "above_cap": True},
        ])
        run.result = VerifyResult("x", details={"sets_run": sets_run})
        run._check_size_coverage()
        return run.result

    assert verdict(shrunk=True, sets_run=["base", "large"]).flags == []
    skipped = verdict(shrunk=True, sets_run=["base"])
    assert skipped.flags == ["reduced_size"] and "cap" in skipped.details["reduced_size"]
    assert verdict(shrunk=False, sets_run=["base"]).flags == []  # the problem's own sizes ran
    # Above the cap but below the problem's own size (a kernel that writes only the first 2^18
    # elements passes there): the verdict still holds at reduced size only.
    short = verdict(shrunk=True, sets_run=["base", "large"], problem_numel=1_600_000_000)
    assert short.flags == ["reduced_size"] and "1600000000" in short.details["reduced_size"]


def test_an_output_the_model_still_holds_is_told_from_garbage():
    """A buffer kept as a tensor, a view or its storage object is held; one left only in a
    reference cycle (as Triton's interpreter leaves every launch's arguments) is not."""
    import gc

    import torch

    from extensions.timing.tensors import held_elsewhere, plain_output

    kept = []

    def forward(keep):
        out = torch.empty(3, 4)
        if keep == "tensor":
            kept.append(out)
        elif keep == "view":
            kept.append(out.view(-1)[2:])
        elif keep == "storage":
            kept.append(out.untyped_storage())
        elif keep == "cycle":
            box = [out]
            box.append(box)
        return (out.view(4, 3), out[0]) if keep == "two views" else out.t()

    enabled = gc.isenabled()
    gc.disable()
    try:
        for keep in ("tensor", "view", "storage", "cycle", "two views", "nothing"):
            kept.clear()
            output = plain_output(forward(keep))
            assert bool(held_elsewhere(output)) == (keep in ("tensor", "view", "storage")), keep
        mine = torch.empty(4)
        kept.append(mine)
        assert not held_elsewhere(plain_output(mine), {mine.untyped_storage().data_ptr()})
    finally:
        if enabled:
            gc.enable()
