"""The verifier's pre-built Triton cache and its per-phase timings.

Every candidate's private Triton cache starts as a copy of C modules a trusted warm-up built once
per batch: a candidate that rewrites its copy must change nothing another candidate loads, and the
parent's copy must stay as built. The per-phase seconds are what the throughput benchmark reads.
"""
from __future__ import annotations

import os

import pytest

from extensions.verify.parent.judge import WorkerLauncher, judge_candidate
from extensions.verify.common.phases import PhaseClock, sanitize_phases
from extensions.verify.parent.triton_cache import SeedBuild, TritonCacheSeed, cache_dir_of
from sandbox_support import BOTH_MODES, candidate, descendants, make_ctx, wait_no_descendants

ctx = pytest.fixture(scope="module")(make_ctx)

SEEDED = os.path.join("0" * 16, "cuda_utils.cpython-test.so")


def test_seed_keeps_only_the_c_modules_of_a_cache(tmp_path):
    (tmp_path / "aa").mkdir()
    (tmp_path / "aa" / "cuda_utils.cpython-test.so").write_bytes(b"driver utilities")
    (tmp_path / "bb").mkdir()
    (tmp_path / "bb" / "__triton_launcher.cpython-test.so").write_bytes(b"a launcher")
    (tmp_path / "cc").mkdir()
    (tmp_path / "cc" / "kernel.cubin").write_bytes(b"a compiled kernel")
    (tmp_path / "cc" / "kernel.json").write_text("{}")
    os.symlink("/etc/hostname", tmp_path / "cc" / "linked.so")

    files = TritonCacheSeed.collect(str(tmp_path))

    assert files == {os.path.join("aa", "cuda_utils.cpython-test.so"): b"driver utilities",
                     os.path.join("bb", "__triton_launcher.cpython-test.so"): b"a launcher"}


def test_seed_is_written_as_private_files_and_never_through_a_planted_link(tmp_path):
    seed = TritonCacheSeed({SEEDED: b"pristine"})
    cache = tmp_path / "home" / ".triton" / "cache"
    assert seed.write_into(str(cache)) == 1
    written = cache / SEEDED
    assert written.read_bytes() == b"pristine"
    assert written.stat().st_mode & 0o077 == 0

    planted = tmp_path / "other"
    (planted / SEEDED).parent.mkdir(parents=True)
    outside = tmp_path / "outside.so"
    outside.write_bytes(b"theirs")
    os.symlink(outside, planted / SEEDED)
    assert seed.write_into(str(planted)) == 0
    assert outside.read_bytes() == b"theirs"


@BOTH_MODES
@pytest.mark.parametrize("fork_server", [True, False], ids=["fork", "fresh"])
def test_a_candidate_rewriting_its_seeded_cache_reaches_no_sibling(ctx, isolation, fork_server):
    """The first candidate finds the seeded module in its own Triton cache and overwrites it (and
    tries to replace the whole cache directory); the next candidate still finds the pristine copy,
    and the parent's seed is unchanged."""
    import dataclasses

    config = dataclasses.replace(ctx.config, fork_server=fork_server)
    launcher = WorkerLauncher(config, "cpu", isolation, ctx.root, total=2, prespawn=False, slots=[None])
    launcher.use_seed(TritonCacheSeed({SEEDED: b"pristine"}, "test seed"))
    seeded = f"os.path.join(os.environ['TRITON_CACHE_DIR'], {SEEDED!r})"
    poisoner = candidate(at_import=f"""
        import os, shutil
        if open({seeded}, "rb").read() != b"pristine":
            raise RuntimeError("no seeded copy")
        open({seeded}, "wb").write(b"poison")
        shutil.rmtree(os.path.dirname(os.environ['TRITON_CACHE_DIR']))
        os.makedirs(os.path.dirname({seeded}))
        open({seeded}, "wb").write(b"poison")
    """)
    checker = candidate(at_import=f"""
        import os
        if open({seeded}, "rb").read() != b"pristine":
            raise RuntimeError("the seeded cache was changed by another candidate")
    """)
    try:
        first = judge_candidate(poisoner, ctx.prepared, config, "cpu", ctx.pool, isolation, ctx.root,
                                "first", launcher=launcher)
        second = judge_candidate(checker, ctx.prepared, config, "cpu", ctx.pool, isolation, ctx.root,
                                 "second", launcher=launcher)
    finally:
        launcher.close()
    assert first.correct, first.error
    assert second.correct and second.error is None, second.error
    assert launcher.triton_seed.files == {SEEDED: b"pristine"}
    assert second.details["triton_cache_seed"] == "test seed"


def test_a_warm_up_stopped_by_its_closing_session_is_killed_and_leaves_no_process(tmp_path):
    """A session starts the warm-up with its first candidate; one that closes before the warm-up
    ends (every candidate rejected in a second) must not leave it running."""
    before = set(descendants())
    build = SeedBuild.start(str(tmp_path), device="cpu", gpu_index=None, isolation="process", timeout_s=60)
    build.stop()
    assert "exited -9" in build.result().note, build.result().note
    assert not build.result().files
    assert set(wait_no_descendants()) <= before


def test_cache_directory_is_inside_the_candidates_own_directory(tmp_path):
    assert cache_dir_of(str(tmp_path)).startswith(str(tmp_path) + os.sep)


def test_judged_candidate_reports_where_its_time_went(ctx):
    result = ctx.judge(candidate())
    assert result.correct, result.error
    phases = result.details["phase_s"]
    for name in ("take_worker", "hand_over_job", "correctness", "finish", "release_worker"):
        assert phases["parent"][name] >= 0, name
    for name in ("import", "build", "first_set", "other_sets", "audit_install"):
        assert phases["worker"][name] >= 0, name
    assert phases["parent"]["correctness"] >= phases["worker"]["first_set"]
    assert result.details["problem_prepare_s"] > 0


def test_worker_phase_seconds_are_kept_only_as_plain_numbers():
    hostile = {"import": 1.5, "Bad Name": 1.0, "x" * 60: 1.0, "build": "3", "first_set": float("nan"),
               "other_sets": -1, "timing": True, "triton_c_build": 2}
    assert sanitize_phases(hostile) == {"import": 1.5, "triton_c_build": 2.0}
    assert sanitize_phases(["import", 1.0]) == {}


def test_phase_clock_adds_up_repeated_phases_and_times_c_builds(monkeypatch):
    import types

    clock = PhaseClock()
    clock.add("first_set", 0.5)
    clock.add("first_set", 0.25)
    assert clock.as_dict() == {"first_set": 0.75}

    built = []
    fake = types.ModuleType("triton.runtime.build")
    fake._build = lambda *args: built.append(args) or "module.so"
    monkeypatch.setitem(__import__("sys").modules, "triton.runtime.build", fake)
    clock.count_c_builds()
    clock.count_c_builds()  # installing twice must not time a build twice
    assert fake._build("name", "src.c") == "module.so"
    assert built == [("name", "src.c")]
    assert clock.counts["triton_c_build"] == 1


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA device")
def test_warm_up_seeds_triton_driver_utilities_on_cuda(tmp_path):
    """On a GPU the trusted warm-up leaves Triton's C modules (at least the driver utilities) in
    its cache, and a candidate whose cache was seeded runs no C compiler for them."""
    from extensions.config import VerifierConfig
    from extensions.verify.api import verify_code_unscreened

    seed = TritonCacheSeed.build(str(tmp_path), device="cuda", gpu_index=0, isolation="process", timeout_s=300)
    assert any("cuda_utils" in name for name in seed.files), seed.note
    config = VerifierConfig(device="cuda", isolation="process", enable_calibrated_timing=False)
    result = verify_code_unscreened(
        __import__("sandbox_support").PROBLEM, candidate(), config, device="cuda")
    assert result.correct, result.error
    assert result.details["phase_s"]["worker"].get("triton_c_build", 0.0) < 0.5


def test_a_slot_with_two_fork_servers_alternates_and_judges_every_candidate(ctx):
    """With two servers per slot (each forking its next child ahead of its candidate) both servers
    start and every candidate of the slot is judged as with one server."""
    import dataclasses

    config = dataclasses.replace(ctx.config, fork_servers_per_slot=2)
    launcher = WorkerLauncher(config, "cpu", "process", ctx.root, total=3, prespawn=False, slots=[None])
    try:
        results = [judge_candidate(candidate(), ctx.prepared, config, "cpu", ctx.pool, "process", ctx.root,
                                   f"c{i}", launcher=launcher) for i in range(3)]
        servers = list(launcher._servers)
    finally:
        launcher.close()
    assert all(r.correct and r.error is None for r in results), [r.error for r in results]
    assert len(servers) == 2


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA device")
def test_a_cuda_session_hands_its_early_warm_up_to_the_workers():
    """A session starts the warm-up with its first candidate, beside the sandbox probe, and the
    workers it then starts seed their caches from that build: the candidate runs no C compiler."""
    from extensions.config import VerifierConfig
    from extensions.verify import VerifierSession, VerifyRequest

    config = VerifierConfig(device="cuda", isolation="process", enable_calibrated_timing=False)
    with VerifierSession(config, device="cuda") as session:
        result = session.submit(VerifyRequest(__import__("sandbox_support").PROBLEM, candidate())).result(timeout=300)
        launcher = session._launcher.result()
        assert launcher._seed_build is session._seed_build
    assert result.correct, result.error
    assert "C modules" in result.details["triton_cache_seed"], result.details["triton_cache_seed"]
    assert result.details["phase_s"]["worker"].get("triton_c_build", 0.0) < 0.5
