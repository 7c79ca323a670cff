"""What a candidate's process may do to other processes of the same user, under process isolation.

Without bubblewrap a candidate runs as the verifier's own user, and Linux lets a process read
``/proc/<pid>/environ`` (and open ``/proc/<pid>/fd``, ``/proc/<pid>/mem``) of any process of that
user that is *dumpable*, and any process at all when it holds ``CAP_SYS_PTRACE`` (root does). So:

* ``verifier_undumpable()`` marks the verifier's process not dumpable while a process-isolated
  batch runs (its environment may hold cloud credentials), and restores the flag afterwards;
* ``drop_privileges()`` is called in the candidate's process before the candidate is imported:
  ``PR_SET_NO_NEW_PRIVS`` (no setuid binary can give privileges back) and every capability dropped
  (from the bounding, effective, permitted and inheritable sets), so even a verifier running as root
  leaves its candidates unable to read a non-dumpable process.
"""
from __future__ import annotations

import contextlib
import ctypes
import platform
import threading

PR_GET_DUMPABLE = 3
PR_SET_DUMPABLE = 4
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_CAPSET_SYSCALL = {"x86_64": 126, "aarch64": 91}
_LAST_CAP = 63

_lock = threading.Lock()
_depth = 0
_saved = 1


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _prctl(option: int, value: int = 0) -> int:
    try:
        return _libc().prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):
        return -1


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def drop_privileges() -> bool:
    """No new privileges and no capabilities for this process and its children. True when the
    capability sets are empty afterwards."""
    _prctl(PR_SET_NO_NEW_PRIVS, 1)
    for cap in range(_LAST_CAP + 1):
        _prctl(PR_CAPBSET_DROP, cap)  # fails harmlessly past the last capability the kernel has
    number = _CAPSET_SYSCALL.get(platform.machine())
    if number is None:
        return False
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    try:
        return _libc().syscall(number, ctypes.byref(header), data) == 0
    except (OSError, AttributeError):
        return False


def set_dumpable(dumpable: bool) -> bool:
    """A process that is not dumpable cannot be traced, nor its /proc files (environ, fd, mem) be
    opened, by processes of the same user without CAP_SYS_PTRACE."""
    return _prctl(PR_SET_DUMPABLE, 1 if dumpable else 0) == 0


@contextlib.contextmanager
def verifier_undumpable():
    """This process is not dumpable inside the block (nested and thread-safe)."""
    global _depth, _saved
    with _lock:
        if _depth == 0:
            _saved = _prctl(PR_GET_DUMPABLE)
            _prctl(PR_SET_DUMPABLE, 0)
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _saved in (1, 2):
                _prctl(PR_SET_DUMPABLE, 1)
