"""The per-GPU gate: correctness runs share a GPU, a timing run has it alone, and while the RL
sampler decodes on it (``host``) correctness runs go on and timing waits.

What a user relies on: a kernel is never timed while the sampler's decode (or another candidate)
runs on its GPU, and overlapping sampling with verification does not stall the correctness runs
behind a timing run that could not start anyway."""
from __future__ import annotations

import threading
import time

from extensions.verify.parent.device_pool import GpuGate


def _in_thread(target) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def test_timing_waits_for_the_host_while_correctness_runs_go_on():
    gate, events = GpuGate(), []
    host_holds, host_release = threading.Event(), threading.Event()

    def host():
        with gate.host():
            host_holds.set()
            host_release.wait(10)
            events.append("host ends")

    def timing():
        with gate.exclusive():
            events.append("timing runs")

    def correctness():
        with gate.shared():
            events.append("correctness runs")

    threads = [_in_thread(host)]
    assert host_holds.wait(10)
    threads.append(_in_thread(timing))
    time.sleep(0.2)  # the timing run is queued behind the host
    threads.append(_in_thread(correctness))
    time.sleep(0.2)
    assert events == ["correctness runs"]  # not held back by the queued timing run
    host_release.set()
    for thread in threads:
        thread.join(10)
    assert events == ["correctness runs", "host ends", "timing runs"]


def test_the_host_waits_for_timing_runs_running_or_queued():
    gate, events = GpuGate(), []
    timing_runs, timing_release = threading.Event(), threading.Event()

    def timing(name, started=None):
        def run():
            with gate.exclusive():
                if started is not None:
                    started.set()
                    timing_release.wait(10)
                events.append(name)
        return run

    def host():
        with gate.host():
            events.append("host")

    threads = [_in_thread(timing("first timing", timing_runs))]
    assert timing_runs.wait(10)
    threads.append(_in_thread(timing("second timing")))
    time.sleep(0.2)
    threads.append(_in_thread(host))
    time.sleep(0.2)
    assert events == []  # the host waits for the running timing run and the queued one
    timing_release.set()
    for thread in threads:
        thread.join(10)
    assert events == ["first timing", "second timing", "host"]


def test_without_a_host_a_queued_timing_run_goes_first():
    gate, events = GpuGate(), []
    reading, release = threading.Event(), threading.Event()

    def long_read():
        with gate.shared():
            reading.set()
            release.wait(10)
        events.append("first read ends")

    def timing():
        with gate.exclusive():
            events.append("timing")

    def later_read():
        with gate.shared():
            events.append("later read")

    threads = [_in_thread(long_read)]
    assert reading.wait(10)
    threads.append(_in_thread(timing))
    time.sleep(0.2)
    threads.append(_in_thread(later_read))
    time.sleep(0.2)
    release.set()
    for thread in threads:
        thread.join(10)
    assert events.index("timing") < events.index("later read")  # timing never starves
