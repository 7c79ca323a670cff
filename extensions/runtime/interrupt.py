""""Save now" requests that reach a training loop from a thread, a signal or another process.

The spot watcher (in-process thread or ``checkpoint_manager.py --action watch`` beside the trainer)
asks for a checkpoint; the training loop polls ``SaveSignal.save_requested()`` at every step
boundary, saves, calls ``acknowledge()``, and stops if ``stop_requested()``. A request is an event
(same process), a flag file under the run's logs (another process), or SIGUSR1 (save and go on) /
SIGTERM or a first Ctrl-C (SIGINT: save and stop). A second Ctrl-C aborts at once, without saving.
"""
from __future__ import annotations

import json
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Optional


class SaveSignal:
    def __init__(self, flag_path: Path):
        self.flag_path = Path(flag_path)
        self._save = threading.Event()
        self._stop = threading.Event()
        self._saved = threading.Event()
        self.reason: Optional[str] = None
        self._interrupted = False
        # A request from a signal handler, taken over by the next poll: a handler may not touch the
        # events, whose lock the code it interrupted can hold (a deadlock, not a save).
        self._signalled: list[tuple[str, bool]] = []

    @classmethod
    def for_run(cls, paths) -> "SaveSignal":
        return cls(paths.save_request)

    def install_signal_handlers(self) -> None:
        """SIGUSR1: save at the next step and continue. SIGTERM and a first SIGINT (Ctrl-C): save at
        the next step and stop. A second SIGINT raises KeyboardInterrupt: abort now, no save."""
        if threading.current_thread() is not threading.main_thread():
            return
        signal.signal(signal.SIGUSR1, lambda *_: self._signalled.append(("SIGUSR1", False)))
        signal.signal(signal.SIGTERM, lambda *_: self._signalled.append(("SIGTERM", True)))
        signal.signal(signal.SIGINT, self._on_interrupt)

    def _on_interrupt(self, signum, frame) -> None:
        if self._interrupted:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            raise KeyboardInterrupt
        self._interrupted = True
        self._signalled.append(("SIGINT", True))
        try:
            print("\nCtrl-C: saving a checkpoint at the next step boundary, then stopping; "
                  "press Ctrl-C again to abort at once without saving", file=sys.stderr, flush=True)
        except RuntimeError:  # the interrupted code was writing to stderr itself
            pass

    def _take_signalled(self) -> None:
        while self._signalled:
            reason, stop = self._signalled.pop(0)
            self.request(reason, stop=stop, write_flag=False)

    def request(self, reason: str, stop: bool = False, write_flag: bool = True) -> None:
        self.reason = reason
        self._saved.clear()
        if stop:
            self._stop.set()
        self._save.set()
        if write_flag:
            self.flag_path.parent.mkdir(parents=True, exist_ok=True)
            self.flag_path.write_text(json.dumps({"reason": reason, "stop": stop, "time": time.time()}))

    def _read_flag(self) -> None:
        try:
            data = json.loads(self.flag_path.read_text())
        except (OSError, ValueError):
            return
        if not self._save.is_set():
            self.reason = str(data.get("reason", "flag file"))
            if data.get("stop"):
                self._stop.set()
            self._save.set()

    def save_requested(self) -> bool:
        self._take_signalled()
        if not self._save.is_set() and self.flag_path.exists():
            self._read_flag()
        return self._save.is_set()

    def stop_requested(self) -> bool:
        self.save_requested()
        return self._stop.is_set()

    def acknowledge(self, checkpoint: Optional[Path] = None) -> None:
        """Called by the training loop once the requested checkpoint is complete."""
        self._save.clear()
        self._saved.set()
        try:
            self.flag_path.unlink()
        except FileNotFoundError:
            pass
        ack = self.flag_path.with_name("save_done.json")
        ack.parent.mkdir(parents=True, exist_ok=True)
        ack.write_text(json.dumps({"checkpoint": str(checkpoint) if checkpoint else None, "time": time.time()}))

    def wait_saved(self, timeout: float) -> bool:
        """For the watcher in the same process: block until the loop acknowledged the save."""
        return self._saved.wait(timeout)

    @property
    def ack_path(self) -> Path:
        return self.flag_path.with_name("save_done.json")

    def wait_acknowledged(self, since: float, timeout: float, poll_s: float = 0.1) -> Optional[dict]:
        """For a watcher in another process: the acknowledgement written after ``since``, or None."""
        end = time.monotonic() + max(0.0, timeout)
        while True:
            try:
                ack = json.loads(self.ack_path.read_text())
                if float(ack.get("time", 0)) >= since:
                    return ack
            except (OSError, ValueError, TypeError):
                pass
            if self._saved.is_set():
                return {"checkpoint": None, "time": time.time()}
            if time.monotonic() >= end:
                return None
            time.sleep(poll_s)

    def clear_request(self) -> bool:
        """Drop a request nobody served (a flag left by an interrupted run); True if one existed."""
        self._save.clear()
        self._stop.clear()
        try:
            self.flag_path.unlink()
            return True
        except FileNotFoundError:
            return False
