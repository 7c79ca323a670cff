"""Spot interruption notices, and what happens when one arrives.

``ImdsClient`` asks the EC2 instance metadata service the IMDSv2 way: PUT ``/latest/api/token``
with ``X-aws-ec2-metadata-token-ttl-seconds``, then GET ``/latest/meta-data/spot/instance-action``
with ``X-aws-ec2-metadata-token``; 404 means no notice. ``SpotWatcher`` polls it from a thread and
never dies of an unreachable service: it says so once and keeps polling quietly. ``watcher_for``
starts one only where the machine is an EC2 instance, or where the config forces it (ec2_detect.py).

``InterruptionHandler`` turns a notice (or SIGTERM) into: a save request through ``SaveSignal``
(its flag file reaches a trainer in another process), a bounded wait for the trainer's
acknowledgement, then an emergency sync of what is new, logging how long each part took against
the notice's deadline (its ``time`` field, two minutes after the notice).
"""
from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Optional

from ..runtime.interrupt import SaveSignal
from ..runtime.io import atomic_write_json
from .ec2_detect import SpotPolling, spot_polling

log = logging.getLogger(__name__)

TOKEN_PATH = "/latest/api/token"
INSTANCE_ACTION_PATH = "/latest/meta-data/spot/instance-action"


class ImdsUnavailable(RuntimeError):
    """The metadata service did not answer (not on EC2, or IMDS disabled)."""


@dataclass(frozen=True)
class SpotNotice:
    action: str  # terminate | stop | hibernate (from IMDS) or sigterm
    deadline_unix: float
    received_unix: float
    raw: str

    @classmethod
    def parse(cls, body: str, received_unix: float, default_deadline_s: float) -> "SpotNotice":
        """``{"action": "terminate", "time": "2017-09-18T08:22:00Z"}``; a bad time means the default."""
        action, deadline = "unknown", received_unix + default_deadline_s
        try:
            data = json.loads(body)
            action = str(data.get("action", action))
            stamp = str(data["time"]).replace("Z", "+00:00")
            deadline = datetime.fromisoformat(stamp).timestamp()
        except (ValueError, KeyError, TypeError, AttributeError):
            log.warning("spot notice %r has no readable time; assuming %.0f s", body[:200], default_deadline_s)
        return cls(action, deadline, received_unix, body)

    @classmethod
    def from_signal(cls, name: str, deadline_s: float) -> "SpotNotice":
        now = time.time()
        return cls(name, now + deadline_s, now, name)


class ImdsClient:
    def __init__(self, endpoint: str, timeout_s: float = 1.0, token_ttl_s: int = 21600):
        self.endpoint = endpoint.rstrip("/")
        self.timeout_s = timeout_s
        self.token_ttl_s = token_ttl_s
        self._token: Optional[str] = None
        self._token_expires = 0.0
        # IMDS is link-local: never send it through an HTTP proxy from the environment.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def _open(self, request: urllib.request.Request) -> tuple[int, str]:
        try:
            with self._opener.open(request, timeout=self.timeout_s) as response:
                return response.status, response.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as exc:
            return exc.code, ""
        except (urllib.error.URLError, OSError) as exc:
            raise ImdsUnavailable(f"{self.endpoint}: {exc}") from exc

    def token(self, refresh: bool = False) -> str:
        if refresh or self._token is None or time.monotonic() >= self._token_expires:
            request = urllib.request.Request(self.endpoint + TOKEN_PATH, method="PUT",
                                             headers={"X-aws-ec2-metadata-token-ttl-seconds": str(self.token_ttl_s)})
            status, body = self._open(request)
            if status != 200 or not body:
                raise ImdsUnavailable(f"{self.endpoint}: token request answered HTTP {status}")
            self._token = body.strip()
            self._token_expires = time.monotonic() + max(1, self.token_ttl_s - 60)
        return self._token

    def instance_action(self) -> Optional[str]:
        """The notice's JSON text, or None when there is no notice (HTTP 404)."""
        for attempt in range(2):
            request = urllib.request.Request(self.endpoint + INSTANCE_ACTION_PATH,
                                             headers={"X-aws-ec2-metadata-token": self.token(refresh=attempt > 0)})
            status, body = self._open(request)
            if status == 200:
                return body
            if status == 404:
                return None
            if status != 401:  # 401: the token expired; fetch a new one once
                raise ImdsUnavailable(f"{self.endpoint}: instance-action answered HTTP {status}")
        raise ImdsUnavailable(f"{self.endpoint}: token refused twice")


class SpotWatcher:
    """Polls for a spot notice every ``poll_interval_s`` and calls ``on_notice`` once per notice."""

    def __init__(self, imds: ImdsClient, poll_interval_s: float, on_notice: Callable[[SpotNotice], Any],
                 default_deadline_s: float = 120.0):
        self.imds = imds
        self.poll_interval_s = poll_interval_s
        self.on_notice = on_notice
        self.default_deadline_s = default_deadline_s
        self.notice: Optional[SpotNotice] = None
        self.reachable: Optional[bool] = None
        self.polls = 0
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def poll_once(self) -> Optional[SpotNotice]:
        self.polls += 1
        try:
            body = self.imds.instance_action()
        except ImdsUnavailable as exc:
            if self.reachable is not False:
                log.warning("no instance metadata service (%s): not on EC2? Spot notices will only "
                            "arrive as SIGTERM; polling continues quietly", exc)
            self.reachable = False
            return None
        if self.reachable is False:
            log.info("instance metadata service reachable again at %s", self.imds.endpoint)
        self.reachable = True
        if body is None:
            return None
        return SpotNotice.parse(body, time.time(), self.default_deadline_s)

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="spot-watcher", daemon=True)
        self._thread.start()

    def stop(self, timeout: Optional[float] = None) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return bool(self._thread and self._thread.is_alive())

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                notice = self.poll_once()
                if notice is not None and (self.notice is None or notice.raw != self.notice.raw):
                    self.notice = notice
                    log.warning("SPOT NOTICE: %s at %s (%.0f s from now)", notice.action,
                                time.strftime("%H:%M:%S", time.localtime(notice.deadline_unix)),
                                notice.deadline_unix - time.time())
                    self.on_notice(notice)
            except Exception:  # noqa: BLE001 - the watcher outlives any single failure
                log.exception("spot watcher: handling a poll failed; still watching")
            self._stop.wait(self.poll_interval_s)


def watcher_for(settings, on_notice: Callable[[SpotNotice], Any],
                sys_root: Path = Path("/sys")) -> tuple[Optional[SpotWatcher], SpotPolling]:
    """The watcher that ``settings`` (the ``checkpoint`` section) asks for on this machine: None
    where the metadata service is not to be polled (``spot_watch`` off, or auto off EC2)."""
    polling = spot_polling(settings.spot_watch, sys_root)
    if not polling.enabled:
        return None, polling
    watcher = SpotWatcher(ImdsClient(settings.metadata_endpoint), settings.spot_poll_interval_s,
                          on_notice, settings.notice_deadline_s)
    return watcher, polling


@dataclass
class InterruptionReport:
    action: str
    received_unix: float
    deadline_unix: float
    save_requested_unix: float
    save_acknowledged: bool
    checkpoint: Optional[str]
    ack_wait_s: float
    sync_s: float
    sync_ok: bool
    sync_summary: str
    finished_unix: float

    @property
    def margin_s(self) -> float:
        return self.deadline_unix - self.finished_unix

    @property
    def within_deadline(self) -> bool:
        return self.margin_s >= 0

    def to_json(self) -> dict:
        return {**asdict(self), "margin_s": self.margin_s, "within_deadline": self.within_deadline}


class InterruptionHandler:
    """Save now, wait for the trainer (bounded), then sync what is new before the deadline.

    ``manager`` is a CheckpointManager (or None without S3: the save alone is still worth it);
    ``settings`` the config's ``checkpoint`` section.
    """

    def __init__(self, save_signal: SaveSignal, manager, settings, report_path: Optional[Path] = None):
        self.save_signal = save_signal
        self.manager = manager
        self.settings = settings
        self.report_path = report_path
        self.reports: list[InterruptionReport] = []
        self._lock = threading.Lock()

    def handle(self, notice: SpotNotice) -> InterruptionReport:
        with self._lock:
            return self._handle(notice)

    def _handle(self, notice: SpotNotice) -> InterruptionReport:
        def left() -> float:
            return notice.deadline_unix - time.time()

        requested = time.time()
        self.save_signal.request(f"spot {notice.action}", stop=True)
        log.warning("spot %s: checkpoint requested (%.1f s to the deadline)", notice.action, left())

        ack_budget = max(0.0, min(self.settings.save_ack_timeout_s, left() - self.settings.emergency_reserve_s))
        ack = self.save_signal.wait_acknowledged(since=requested, timeout=ack_budget)
        ack_wait = time.time() - requested
        if ack is not None:
            log.warning("spot %s: trainer saved %s after %.1f s (%.1f s left)", notice.action,
                        ack.get("checkpoint"), ack_wait, left())
        else:
            log.warning("spot %s: no save acknowledged within %.1f s (no trainer running, or it is mid-step); "
                        "syncing what exists (%.1f s left)", notice.action, ack_budget, left())

        sync_start = time.time()
        if self.manager is not None:
            sync = self.manager.emergency_sync(deadline_unix=notice.deadline_unix)
            sync_ok, summary = sync.ok, sync.summary()
        else:
            sync_ok, summary = False, "no S3 bucket configured: nothing synced"
        sync_s = time.time() - sync_start
        report = InterruptionReport(
            action=notice.action, received_unix=notice.received_unix, deadline_unix=notice.deadline_unix,
            save_requested_unix=requested, save_acknowledged=ack is not None,
            checkpoint=(ack or {}).get("checkpoint"), ack_wait_s=ack_wait, sync_s=sync_s, sync_ok=sync_ok,
            sync_summary=summary, finished_unix=time.time(),
        )
        level = logging.WARNING if report.within_deadline and sync_ok else logging.ERROR
        log.log(level, "spot %s handled: save %.1f s, emergency %s; %.1f s before the deadline",
                notice.action, ack_wait, summary, report.margin_s)
        if self.report_path is not None:
            atomic_write_json(self.report_path, report.to_json())
        self.reports.append(report)
        return report
