"""Verdicts that arrive while the round still samples: the verifier seam that streams, and the
collector that logs each verdict as soon as it arrives.

A ``VerifyFn`` judges a list and returns the list's verdicts. A verifier that can also stream has
``open_session(expected)``, which returns a session with ``submit_many(requests) -> futures`` and
``close(stop=False)`` (``extensions.verify.VerifierSession`` is one). The project verifier
(``ProjectVerifier``, what ``make_verify_fn`` returns) is both; a round given a plain function (the
tests' fakes) judges in chunks after sampling, as rounds always did.

``VerdictStream`` is one round's session on one rank: each sampled chunk is submitted at once, and
each verdict goes to the round's candidate log from the thread that delivers it. Once the stream is
stopped nothing more is logged, so a verdict of a candidate whose worker the stop killed is never
taken for the candidate's own.
"""
from __future__ import annotations

import contextlib
import threading
import time
from concurrent.futures import Future
from typing import Any, Optional, Protocol, Sequence, runtime_checkable

from ..config.sections import VerifierConfig
from ..verify import VerifyRequest
from ..verify.result import VerifyResult
from .candidates import CandidateLog, verdict_record

Key = tuple[str, int]  # (task_id, sample_index)


class VerifySession(Protocol):
    def submit_many(self, requests: Sequence[VerifyRequest]) -> "list[Future[VerifyResult]]": ...

    def close(self, *, stop: bool = False) -> None: ...


@runtime_checkable
class StreamingVerifier(Protocol):
    """A ``VerifyFn`` that also opens sessions judging candidates as they are submitted."""

    def __call__(self, requests: list[VerifyRequest]) -> list[VerifyResult]: ...

    def open_session(self, expected: int = 0) -> VerifySession: ...


class ProjectVerifier:
    """The project verifier: ``verify_batch`` for a list, a ``VerifierSession`` for a stream
    (imported on first use)."""

    def __init__(self, config: VerifierConfig, device: Optional[str], *, progress: bool = True):
        self.config, self.device, self.progress = config, device, progress

    def __call__(self, requests: list[VerifyRequest]) -> list[VerifyResult]:
        from ..verify import verify_batch

        return verify_batch(requests, self.config, device=self.device, progress=self.progress)

    def open_session(self, expected: int = 0) -> VerifySession:
        from ..verify import VerifierSession

        return VerifierSession(self.config, device=self.device, progress=self.progress, expected=expected)


def result_dict(result: Any) -> dict:
    if isinstance(result, VerifyResult):
        return result.to_dict()
    if isinstance(result, dict):
        return VerifyResult.from_dict(result).to_dict()
    if hasattr(result, "to_dict"):
        return result.to_dict()
    raise TypeError(f"verifier returned {type(result).__name__}, expected VerifyResult")


class VerdictStream:
    """One session of one rank's round: ``submit`` candidates, ``wait`` for their verdicts, ``close``.

    The session is opened at once when ``expected`` candidates are to come (its start-up overlaps
    the first chunk's sampling), else on the first submission, so a rank with nothing to judge
    starts no verifier. ``verdicts`` holds every verdict logged so far, by key. ``busy_s`` is the
    wall time during which at least one submitted candidate had no verdict yet (the session had
    work)."""

    def __init__(self, verifier: StreamingVerifier, log: CandidateLog, expected: int = 0):
        self.verifier, self.log, self.expected = verifier, log, expected
        self.session: Optional[VerifySession] = verifier.open_session(expected=expected) if expected > 0 else None
        self.verdicts: dict[Key, dict] = {}
        self._changed = threading.Condition()
        self._outstanding = 0
        self._busy_since = 0.0
        self._busy_s = 0.0
        self._error: Optional[BaseException] = None
        self._stopped = False
        self._closed = False

    @property
    def busy_s(self) -> float:
        with self._changed:
            return self._busy_s + (time.perf_counter() - self._busy_since if self._outstanding else 0.0)

    def submit(self, candidates: Sequence[tuple[Key, str, VerifyRequest]]) -> None:
        """Hand ``(key, text, request)`` triples to the session; verdicts already known at once
        (screened out in the parent) are logged together, the rest as each arrives."""
        if not candidates:
            return
        with self._changed:
            if self._outstanding == 0:
                self._busy_since = time.perf_counter()
            self._outstanding += len(candidates)
        if self.session is None:
            self.session = self.verifier.open_session(expected=max(self.expected, len(candidates)))
        futures = self.session.submit_many([request for _, _, request in candidates])
        if len(futures) != len(candidates):
            raise RuntimeError(f"verifier returned {len(futures)} futures for {len(candidates)} candidates")
        done, running = [], []
        for (key, text, _), future in zip(candidates, futures):
            (done if future.done() else running).append((key, text, future))
        self._arrived(done)
        for key, text, future in running:  # one finished meanwhile is called back at once
            future.add_done_callback(lambda f, key=key, text=text: self._arrived([(key, text, f)]))

    def _arrived(self, arrivals: list[tuple[Key, str, Future]]) -> None:
        """Log what arrived (one append), from whichever thread delivered it; an error is kept
        for the round's thread, which raises it at its next ``check`` or ``wait``."""
        if not arrivals:
            return
        with self._changed:
            if self._stopped:
                return
            records = []
            for key, text, future in arrivals:
                self._outstanding -= 1
                try:
                    if future.cancelled():
                        raise RuntimeError(f"verification of {key[0]}#{key[1]} was cancelled")
                    if future.exception() is not None:
                        raise future.exception()
                    verdict = result_dict(future.result())
                except BaseException as exc:  # noqa: BLE001 - handed to the round's thread
                    self._error = self._error or exc
                    continue
                self.verdicts[key] = verdict
                records.append(verdict_record(key[0], key[1], text, verdict))
            if self._outstanding == 0:
                self._busy_s += time.perf_counter() - self._busy_since
            try:
                if records:
                    self.log.append(records)
            except BaseException as exc:  # noqa: BLE001 - a verdict not logged must not pass unseen
                self._error = self._error or exc
            self._changed.notify_all()

    def gpu_in_use(self):
        """The round's own GPU work is under way (a chunk decoding): correctness runs go on beside
        it, a timing run waits for it to end (``VerifierSession.device_in_use``; a session without
        one, or no session yet, times nothing meanwhile anyway)."""
        in_use = getattr(self.session, "device_in_use", None)
        return in_use() if callable(in_use) else contextlib.nullcontext()

    def check(self) -> None:
        """Raise the first error the session delivered (the verifier cannot run, a bad verdict)."""
        with self._changed:
            if self._error is not None:
                raise self._error

    def wait(self, should_stop, poll_s: float = 0.1) -> bool:
        """Block until every submitted candidate has its verdict (True) or ``should_stop()`` (False)."""
        while True:
            with self._changed:
                if self._error is not None:
                    raise self._error
                if self._outstanding == 0:
                    break
                self._changed.wait(poll_s)
            if should_stop():
                return False
        # A session that says whether candidates can run at all (VerifierSession.isolation) is
        # asked once: without a sandbox the round fails, as verify_batch fails its batch, even
        # where every candidate was screened out before needing one.
        ready = getattr(self.session, "isolation", None) if self.session is not None else None
        if callable(ready):
            ready()
        return True

    def close(self, *, stop: bool = False) -> None:
        """End the session. ``stop``: log nothing more, cancel what waits and kill what runs."""
        if self._closed:
            return
        self._closed = True
        if stop:
            with self._changed:
                self._stopped = True
        if self.session is not None:
            self.session.close(stop=stop)
