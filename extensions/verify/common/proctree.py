"""A worker's whole process tree, read from ``/proc``: who descends from it, how much memory it
holds, and killing all of it so that nothing a candidate started outlives its verdict.

A candidate can leave its process group (``setsid``) and double-fork so that its grandchild is
re-parented; workers therefore make themselves child subreapers (``PR_SET_CHILD_SUBREAPER``), which
keeps every orphan of theirs inside their subtree, and ``kill_tree`` stops the whole subtree first
(no new forks) and then kills it, repeating until nothing is left.
"""
from __future__ import annotations

import ctypes
import os
import signal
import time
from typing import Iterable, Optional

PR_SET_CHILD_SUBREAPER = 36
PR_SET_PDEATHSIG = 1


def _prctl(option: int, value: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def become_subreaper() -> bool:
    """Orphans of this process's descendants are re-parented to it instead of to init."""
    return _prctl(PR_SET_CHILD_SUBREAPER, 1)


def stop_being_subreaper() -> bool:
    return _prctl(PR_SET_CHILD_SUBREAPER, 0)


def die_with_parent() -> bool:
    return _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def parent_of(pid: int) -> Optional[int]:
    """``pid``'s parent, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    # The command name may contain spaces and parentheses: the fields start after the last ')'.
    fields = data[data.rfind(b")") + 2:].split()
    try:
        return int(fields[1])
    except (IndexError, ValueError):
        return None


def children_map() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            parent = parent_of(int(name))
            if parent is not None:
                tree.setdefault(parent, []).append(int(name))
    return tree


def _children_of(pid: int) -> Optional[list[int]]:
    """``pid``'s children from the kernel's per-thread lists (``/proc/PID/task/TID/children``), or
    None where a list cannot be read (a kernel without them, a permission): then only a scan of
    every process is to be trusted. A process or thread that exits meanwhile has no children."""
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return []
    except OSError:
        return None
    children: list[int] = []
    for tid in threads:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as fh:
                children.extend(int(child) for child in fh.read().split())
        except (FileNotFoundError, ProcessLookupError):
            if not os.path.exists(f"/proc/{pid}/task/{tid}"):
                continue  # the thread (or the process) is gone
            return None  # the file does not exist: no such lists in this kernel
        except (OSError, ValueError):
            return None
    return children


def descendants(root: int, tree: Optional[dict[int, list[int]]] = None) -> list[int]:
    """Every process below ``root`` (not ``root`` itself), parents before children. Walked down
    from ``root`` through the kernel's children lists: a scan of every process on the machine
    (the fallback) costs tens of milliseconds on a busy host, and the memory watch asks often."""
    if tree is None:
        found, stack = [], [root]
        while stack:
            children = _children_of(stack.pop())
            if children is None:
                return descendants(root, children_map())
            found.extend(children)
            stack.extend(children)
        return found
    found, stack = [], list(tree.get(root, []))
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(tree.get(pid, []))
    return found


def is_zombie(pid: int) -> bool:
    """Already dead, waiting to be reaped (or gone entirely)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return True
    return data[data.rfind(b")") + 2:][:1] in (b"Z", b"X")


def is_stopped(pid: int) -> bool:
    """Stopped by a signal or a tracer (state T or t): it runs nothing until continued."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return False
    return data[data.rfind(b")") + 2:][:1] in (b"T", b"t")


def live_descendants(root: int) -> list[int]:
    return [pid for pid in descendants(root) if not is_zombie(pid)]


def _status_kb(pid: int, keys: Iterable[str]) -> dict[str, int]:
    wanted = set(keys)
    values: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                if key in wanted:
                    parts = rest.split()
                    if parts and parts[0].isdigit():
                        values[key] = int(parts[0])
    except OSError:
        pass
    return values


def namespace_pid(pid: int) -> Optional[int]:
    """The pid of host process ``pid`` inside its innermost PID namespace."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("NSpid:"):
                    return int(line.split()[-1])
    except (OSError, ValueError):
        pass
    return None


def resident_kb(pids: Iterable[int]) -> int:
    """Memory the processes hold: the larger of their summed current RSS and the highest peak RSS
    of any one of them (a short spike between two polls is still seen through the peak)."""
    total, peak = 0, 0
    for pid in pids:
        values = _status_kb(pid, ("VmRSS", "VmHWM"))
        total += values.get("VmRSS", 0)
        peak = max(peak, values.get("VmHWM", 0))
    return max(total, peak)


def runqueue_wait_s(pids: Iterable[int]) -> float:
    """Seconds the processes' threads spent ready to run but waiting for a CPU (the second field
    of ``/proc/<pid>/task/<tid>/schedstat``): what a loaded machine took from them. 0 where the
    kernel keeps no such counts."""
    total = 0
    for pid in pids:
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as handle:
                    total += int(handle.read().split()[1])
            except (OSError, ValueError, IndexError):
                continue
    return total / 1e9


def _signal_all(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def kill_tree(root: int, include_root: bool = True, rounds: int = 20) -> None:
    """Stop, then kill, ``root``'s whole subtree (and ``root``). The subtree is frozen with SIGSTOP
    before anything dies, so no process can fork or be re-parented out of it meanwhile."""
    for _ in range(rounds):
        below = descendants(root)
        targets = below + ([root] if include_root else [])
        if include_root and parent_of(root) is None:
            targets = below
        if not targets:
            return
        _signal_all(targets, signal.SIGSTOP)
        # Anything forked between the listing and the stop shows up in a second listing.
        again = descendants(root)
        _signal_all([p for p in again if p not in below], signal.SIGSTOP)
        _signal_all(list(dict.fromkeys(again + targets)), signal.SIGKILL)
        time.sleep(0.01)
        if not descendants(root):
            return


def processes_with_env_marker(marker: str) -> list[int]:
    """Processes whose environment holds ``marker`` (a per-sandbox variable): what is left of a
    sandbox even if a process escaped its tree by clearing a subreaper."""
    needle = marker.encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as fh:
                if needle in fh.read():
                    found.append(int(name))
        except OSError:
            continue
    return found


def kill_marked(marker: str, keep: Iterable[int] = ()) -> None:
    """Kill the tree of every process whose environment holds ``marker``, but those in ``keep``."""
    kept = set(keep)
    for pid in processes_with_env_marker(marker):
        if pid not in kept:
            kill_tree(pid)
