"""One timed region per GPU at a time, across processes and sandboxes.

A lease is an exclusive ``fcntl.flock`` on ``<lock dir>/gpu<N>.lock``. flock locks belong to the
open file, so they hold between any processes that open the same inode: the verifier binds the lock
directory into each bubblewrap sandbox (``KERNEL_TIMING_LOCK_DIR``) and sandboxed workers then
exclude each other exactly like plain processes. The kernel drops the lock when the holder dies, so
a killed worker never wedges a GPU.
"""
from __future__ import annotations

import errno
import os
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

LOCK_DIR_ENV = "KERNEL_TIMING_LOCK_DIR"
_POLL_S = 0.01


class LeaseTimeout(TimeoutError):
    """The GPU stayed leased by another process for longer than the caller would wait."""


@dataclass
class GpuLease:
    device_index: int
    lock_path: Path
    waited_s: float  # how long acquiring took: time spent behind other timed regions


def lock_dir() -> Path:
    """``$KERNEL_TIMING_LOCK_DIR``, else ``<system temp dir>/kernel-timing-locks``."""
    configured = os.environ.get(LOCK_DIR_ENV)
    return Path(configured) if configured else Path(tempfile.gettempdir()) / "kernel-timing-locks"


def lock_path(device_index: int, directory: Optional[os.PathLike] = None) -> Path:
    """The lock file of one GPU (``directory`` overrides ``lock_dir()``)."""
    if int(device_index) < 0:
        raise ValueError(f"device index must be >= 0, got {device_index}")
    folder = Path(directory) if directory is not None else lock_dir()
    return folder / f"gpu{int(device_index)}.lock"


@contextmanager
def gpu_lease(
    device_index: int, *, timeout_s: Optional[float] = None, directory: Optional[os.PathLike] = None
) -> Iterator[GpuLease]:
    """Hold GPU ``device_index`` exclusively for the ``with`` block.

    Blocks until the GPU is free, or raises ``LeaseTimeout`` after ``timeout_s`` seconds.
    """
    import fcntl  # POSIX only; imported here so the package imports everywhere

    path = lock_path(device_index, directory)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    started = time.monotonic()
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (fcntl.LOCK_NB if timeout_s is not None else 0))
                break
            except OSError as error:
                if error.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    raise
                if time.monotonic() - started >= timeout_s:
                    raise LeaseTimeout(
                        f"GPU {device_index} stayed leased for {timeout_s:.1f}s (lock {path})"
                    ) from None
                time.sleep(_POLL_S)
        lease = GpuLease(int(device_index), path, time.monotonic() - started)
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())  # who holds it, for a person debugging a stall
        except OSError:
            pass  # a read-only bind still locks; the note is only a courtesy
        try:
            yield lease
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
