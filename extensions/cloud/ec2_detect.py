"""Is this machine an EC2 instance? Answered from local files only, never from the network.

The spot watcher polls the instance metadata address (169.254.169.254) only on EC2: anywhere else
that address belongs to nobody, and polling it every few seconds is both useless and the kind of
traffic a laptop's firewall or a corporate proxy complains about. EC2 identifies itself through
the firmware tables Linux exposes under /sys:

* Nitro instances: ``/sys/devices/virtual/dmi/id/sys_vendor`` and ``board_vendor`` read
  ``Amazon EC2``;
* Xen instances: ``/sys/hypervisor/uuid`` (and the DMI ``product_uuid``, root-readable only on some
  kernels) start with ``ec2``; their ``bios_version`` contains ``amazon``.

``checkpoint.spot_watch`` chooses: ``auto`` polls where these say EC2, ``on`` always polls (a
container without /sys, a metadata stand-in), ``off`` never does.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

SPOT_WATCH_MODES = ("auto", "on", "off")
_DMI = Path("devices/virtual/dmi/id")


@dataclass(frozen=True)
class SpotPolling:
    enabled: bool
    reason: str


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:  # missing, or root-only (product_uuid)
        return ""


def ec2_evidence(sys_root: Path = Path("/sys")) -> str | None:
    """The first local sign that this is an EC2 instance (a short description), or None."""
    for name in ("sys_vendor", "board_vendor"):
        if _read(sys_root / _DMI / name) == "Amazon EC2":
            return f"{name} is 'Amazon EC2'"
    for relative in (Path("hypervisor/uuid"), _DMI / "product_uuid"):
        if _read(sys_root / relative).lower().startswith("ec2"):
            return f"{relative} starts with 'ec2'"
    if "amazon" in _read(sys_root / _DMI / "bios_version").lower():
        return "bios_version names Amazon"
    return None


def spot_polling(mode: str | bool, sys_root: Path = Path("/sys")) -> SpotPolling:
    """Whether the watcher should poll the metadata service, and why (for its log). ``mode`` may
    be a bool: YAML 1.1 reads ``spot_watch: on`` as true."""
    if isinstance(mode, bool):
        mode = "on" if mode else "off"
    if mode not in SPOT_WATCH_MODES:
        raise ValueError(f"checkpoint.spot_watch must be one of {', '.join(SPOT_WATCH_MODES)}, got {mode!r}")
    if mode == "on":
        return SpotPolling(True, "checkpoint.spot_watch is 'on'")
    if mode == "off":
        return SpotPolling(False, "checkpoint.spot_watch is 'off'")
    evidence = ec2_evidence(sys_root)
    if evidence is None:
        return SpotPolling(False, "not an EC2 instance (no EC2 sign under /sys; "
                                  "set checkpoint.spot_watch=on to poll anyway)")
    return SpotPolling(True, f"EC2 instance ({evidence})")
