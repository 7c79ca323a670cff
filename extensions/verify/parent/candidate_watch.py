"""Watching a running candidate from the trusted parent: its memory cap and its next status file.

A fresh sandboxed worker (``sandbox.SandboxedProcess``) and a fork server's child
(``forkserver.ForkedWorker``) differ only in which processes make up the candidate and how they
are killed; both are watched the same way, from outside, through ``/proc``.
"""
from __future__ import annotations

import os
import time
from typing import Optional

from ..common import proctree

# How often the memory of the candidate's tree is measured while waiting, and how long to sleep
# between looks for the status file.
MEMORY_CHECK_INTERVAL_S = 0.05
FILE_POLL_INTERVAL_S = 0.02
# How often the time its threads waited for a CPU is read (every thread's schedstat file).
STARVATION_CHECK_INTERVAL_S = 0.5


class CandidateWatch:
    """Mixin: ``check_memory`` and ``wait_for_file`` over the subclass's ``watched_pids``,
    ``poll``, ``kill`` and ``path``. ``memory_limit_kb`` caps the resident memory the tree holds
    beyond ``baseline_kb``; above it the tree is killed and ``memory_exceeded`` set."""

    memory_limit_kb: int = 0
    baseline_kb: int = 0
    memory_exceeded: bool = False
    timed_out: bool = False
    stopped_server: bool = False  # the candidate stopped the fork server its process came from
    # Seconds the candidate's threads waited for a CPU while watched (highest reading): a deadline
    # moves out by that much, up to the length of the first budget it was watched under, so a
    # verdict does not depend on what else the machine runs (a correct kernel taking 100 s of a
    # 120 s budget alone timed out beside a second verifier). A candidate that never gets a CPU
    # still stops at twice its budget.
    starved_s: float = 0.0
    _first_budget_s: Optional[float] = None

    def watched_pids(self) -> list[int]:
        raise NotImplementedError

    def poll(self) -> Optional[int]:
        raise NotImplementedError

    def kill(self) -> None:
        raise NotImplementedError

    def path(self, name: str) -> str:
        raise NotImplementedError

    def check_memory(self) -> bool:
        """False (and the tree killed) when the candidate went above its memory cap."""
        if self.memory_limit_kb <= 0 or self.memory_exceeded:
            return not self.memory_exceeded
        if proctree.resident_kb(self.watched_pids()) - self.baseline_kb > self.memory_limit_kb:
            self.memory_exceeded = True
            self.kill()
        return not self.memory_exceeded

    def wait_for_file(self, name: str, deadline: float) -> bool:
        """Wait until the worker wrote ``name`` (atomically), exited, or the deadline passed
        (then the tree is killed and ``timed_out`` set); False also when the memory cap was hit.
        The deadline moves out by the time the tree waited for a CPU (``starved_s``)."""
        target = self.path(name)
        checked = starvation_checked = 0.0
        if self._first_budget_s is None:
            self._first_budget_s = max(0.0, deadline - time.monotonic())
        while True:
            now = time.monotonic()
            if now - checked > MEMORY_CHECK_INTERVAL_S:
                checked = now
                if not self.check_memory():
                    return False
            if now - starvation_checked > STARVATION_CHECK_INTERVAL_S:
                starvation_checked = now
                self.starved_s = max(self.starved_s, proctree.runqueue_wait_s(self.watched_pids()))
            if os.path.exists(target):
                return self.check_memory()
            if self.poll() is not None:
                return os.path.exists(target) and self.check_memory()
            if now >= deadline + min(self.starved_s, self._first_budget_s):
                self.kill()
                self.timed_out = True
                return False
            time.sleep(FILE_POLL_INTERVAL_S)
