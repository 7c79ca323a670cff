"""Calibrated GPU timing: paired, interleaved, L2-flushed, device-synchronised, with statistics
that say how far the speedup can be trusted and flags for timer exploits. See ``docs/timing.md``.

Importing this package loads neither torch nor CUDA; ``measure_speedup`` does when called.
"""
from extensions.timing.lease import LOCK_DIR_ENV, GpuLease, LeaseTimeout, gpu_lease, lock_dir, lock_path
from extensions.timing.measure import make_runner, measure_speedup
from extensions.timing.report import SpeedupReport
from extensions.timing.schedule import CallTiming, SpeedupScheduler, TimingError, TimingSettings, TrialRunner

__all__ = [
    "LOCK_DIR_ENV",
    "CallTiming",
    "GpuLease",
    "LeaseTimeout",
    "SpeedupReport",
    "SpeedupScheduler",
    "TimingError",
    "TimingSettings",
    "TrialRunner",
    "gpu_lease",
    "lock_dir",
    "lock_path",
    "make_runner",
    "measure_speedup",
]
