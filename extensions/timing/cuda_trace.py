"""The device-side events of a ``torch.profiler`` run with CUDA activity, read from its chrome trace.

Two checks look at where a candidate's GPU work ran: the timer's stream trace
(``CudaTrialRunner.trace_streams``) and the verifier's runtime audit (``RuntimeAudit``, run in the
sandboxed worker). Both read the same trace, so they share this reader: the two agree on which
events are device work and on what a stream id is, and the trace file is removed whatever happens.
It lives in the timer, the lower of the two layers, so the verifier may import it and the timer
still imports nothing of the verifier.

Importing this module does not load torch: the profiler comes from the caller.
"""
from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from typing import Any, Optional

# What CUPTI records running on the device: kernels, copies and fills. Everything else in the trace
# (CPU ops, runtime calls, user annotations, flows) is the host's view of it.
DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


@dataclass(frozen=True)
class DeviceEvent:
    category: str  # one of DEVICE_CATEGORIES
    name: str
    stream: Optional[int]  # the trace's ``args.stream``; None where it names none
    ts: float  # start in microseconds, as the trace wrote it (an int too); 0 where missing
    # Converted on use, so that a duration no caller reads never makes reading fail.
    dur: Any

    @property
    def duration_us(self) -> float:
        return float(self.dur or 0.0)


def read_device_events(profiler, path: str) -> list[DeviceEvent]:
    """The device events of ``profiler``'s trace, in the trace's order, exported to ``path`` (a
    scratch file in a directory the caller can write: a sandbox may allow only its working
    directory) and removed again, also when exporting or loading fails. Whatever the export, the
    file or the JSON parser raise is raised; a trace that is not a JSON object, or holds no device
    events, gives an empty list."""
    try:
        profiler.export_chrome_trace(path)
        with open(path) as fh:
            trace = json.load(fh)
    finally:
        with contextlib.suppress(OSError):
            os.remove(path)
    events = trace.get("traceEvents", []) if isinstance(trace, dict) else []
    return [DeviceEvent(category=e["cat"], name=e.get("name", ""), stream=(e.get("args") or {}).get("stream"),
                        ts=e.get("ts", 0), dur=e.get("dur"))
            for e in events if isinstance(e, dict) and e.get("cat") in DEVICE_CATEGORIES]
