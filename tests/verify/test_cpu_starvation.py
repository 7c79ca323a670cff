"""A candidate's time budget does not shrink when the machine is busy.

The parent watches the candidate's process tree; the time its threads spent ready to run but
waiting for a CPU moves the deadline out (up to one budget more), so a correct kernel that fits
its budget alone is not timed out beside a second verifier, while one that idles or spins for
ever still stops. Real processes, pinned to one CPU to make the contention certain."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from extensions.verify.parent.candidate_watch import CandidateWatch

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or not os.path.exists("/proc/self/schedstat"),
                                reason="needs Linux CPU affinity and scheduler statistics")

SPIN = "import os\nos.sched_setaffinity(0, {0})\nwhile True:\n    pass\n"
SLEEP = "import time\ntime.sleep(60)\n"


class WatchedProcess(CandidateWatch):
    def __init__(self, code: str, folder: str):
        self.proc = subprocess.Popen([sys.executable, "-c", code])
        self.folder = folder

    def watched_pids(self) -> list[int]:
        return [self.proc.pid]

    def poll(self):
        return self.proc.poll()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def path(self, name: str) -> str:
        return os.path.join(self.folder, name)


@pytest.fixture
def busy_cpu():
    """Three processes spinning on CPU 0."""
    hogs = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(3)]
    yield
    for hog in hogs:
        hog.kill()
        hog.wait()


def test_time_spent_waiting_for_a_cpu_moves_the_deadline_out(busy_cpu, tmp_path):
    watch = WatchedProcess(SPIN, str(tmp_path))
    started = time.monotonic()
    assert watch.wait_for_file("set_0.json", started + 1.5) is False
    waited = time.monotonic() - started
    assert watch.timed_out and watch.poll() is not None
    # Sharing one CPU with three others, it ran about a quarter of the time: the deadline moved
    # out by what it waited, up to one more budget.
    assert watch.starved_s > 0.5
    assert 2.0 < waited < 1.5 * 2 + 1.0


def test_a_candidate_that_only_sleeps_gets_no_more_time(tmp_path):
    watch = WatchedProcess(SLEEP, str(tmp_path))
    started = time.monotonic()
    assert watch.wait_for_file("set_0.json", started + 1.5) is False
    assert watch.timed_out and watch.starved_s < 0.3
    assert time.monotonic() - started < 1.5 + 0.3 + 0.5
