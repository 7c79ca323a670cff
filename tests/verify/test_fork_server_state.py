"""A candidate cannot change what the next candidate forked from the same server inherits.

A forked child runs as its server's user, so the kernel lets it stop the server (SIGSTOP), lower
the server's resource limits (``prlimit``) and its scheduling priority. Every later child would
inherit the change: an honest candidate after such a one timed out or crashed. These candidates
reach ``os`` and ``resource`` directly (the static check refuses that; the sandbox must hold even
where a check upstream misses), and the honest candidate judged next by the same launcher must
still be judged correct, from an unchanged process.
"""
from __future__ import annotations

import dataclasses
import os

import pytest

from extensions.verify.parent.judge import WorkerLauncher, judge_candidate
from sandbox_support import BOTH_MODES, candidate, make_ctx

ctx = pytest.fixture(scope="module")(make_ctx)

STOPS_ITS_SERVER = candidate(at_import="""
    import os, signal
    os.kill(os.getppid(), signal.SIGSTOP)
""")

LOWERS_ITS_SERVERS_LIMITS = candidate(at_import="""
    import os, resource
    server = os.getppid()
    resource.prlimit(server, resource.RLIMIT_NOFILE, (32, 32))
    resource.prlimit(server, resource.RLIMIT_STACK, (1 << 20, 1 << 20))
    os.setpriority(os.PRIO_PROCESS, server, 19)
""")

# Honest, but it reports (as a failure) any limit or priority below what its server started with.
CHECKS_WHAT_IT_INHERITED = candidate(at_import="""
    import os, resource
    if resource.getrlimit(resource.RLIMIT_NOFILE)[1] != {nofile} \\
            or resource.getrlimit(resource.RLIMIT_STACK)[1] != {stack} \\
            or os.getpriority(os.PRIO_PROCESS, 0) != {nice}:
        raise RuntimeError("inherited a changed limit or priority")
""")


def _judge_in_turn(ctx, isolation, codes, timeout_s=30):
    config = dataclasses.replace(ctx.config, timeout_s=timeout_s)
    launcher = WorkerLauncher(config, "cpu", isolation, ctx.root, total=len(codes), prespawn=False, slots=[None])
    try:
        return [judge_candidate(code, ctx.prepared, config, "cpu", ctx.pool, isolation, ctx.root, f"c{i}",
                                launcher=launcher) for i, code in enumerate(codes)]
    finally:
        launcher.close()


def _honest_checker() -> str:
    import resource

    return CHECKS_WHAT_IT_INHERITED.replace("{nofile}", str(resource.getrlimit(resource.RLIMIT_NOFILE)[1])) \
        .replace("{stack}", str(resource.getrlimit(resource.RLIMIT_STACK)[1])) \
        .replace("{nice}", str(os.getpriority(os.PRIO_PROCESS, 0)))


@BOTH_MODES
def test_a_stopped_server_is_replaced(ctx, isolation):
    poisoner, honest = _judge_in_turn(ctx, isolation, [STOPS_ITS_SERVER, candidate()])
    # Judged as soon as the stop is seen, not after the time limit: a stopped server relays nothing.
    assert not poisoner.correct and "stopped the process it was forked from" in poisoner.error, poisoner.error
    assert honest.correct, honest.error
    assert "timeout" not in (honest.error or "")


@BOTH_MODES
def test_lowered_limits_and_priority_do_not_reach_the_next_child(ctx, isolation):
    _poisoner, honest = _judge_in_turn(ctx, isolation, [LOWERS_ITS_SERVERS_LIMITS, _honest_checker()])
    assert honest.correct, honest.error


@BOTH_MODES
def test_children_are_forked_ahead_only_for_candidates_still_to_come(ctx, isolation, monkeypatch):
    """With two servers per slot, each forks a child ahead while the other's runs; a child forked
    for a candidate that never comes would start CUDA for nothing on a GPU and take seconds to go
    when the batch closes. Three candidates: three children, none left waiting at the end."""
    from extensions.verify.parent.fork_servers import ForkServer

    forked = []
    original = ForkServer.fork

    def counting_fork(self, directory, inside):
        forked.append(directory)
        return original(self, directory, inside)

    monkeypatch.setattr(ForkServer, "fork", counting_fork)
    config = dataclasses.replace(ctx.config, timeout_s=30, fork_servers_per_slot=2)
    launcher = WorkerLauncher(config, "cpu", isolation, ctx.root, total=3, prespawn=False, slots=[None])
    try:
        results = [judge_candidate(candidate(), ctx.prepared, config, "cpu", ctx.pool, isolation, ctx.root, f"c{i}",
                                   launcher=launcher) for i in range(3)]
        assert all(r.correct for r in results), [r.error for r in results]
        for server in launcher._servers:
            server.prefork_done.wait(10)
        assert len(forked) == 3, forked
        assert all(server.next_worker is None for server in launcher._servers)
    finally:
        launcher.close()
