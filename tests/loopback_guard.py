"""Sockets that connect to loopback addresses only, so a test cannot reach the network by mistake.

``install(monkeypatch.setattr)`` guards the test's own process; ``sitecustomize_text()`` is the
same guard as a ``sitecustomize.py`` that a subprocess runs at start (see hub_testing).
"""
import ipaddress
import socket


def _check(sock, address) -> None:
    if sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    host = address[0]
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback:
        raise ConnectionRefusedError(f"test guard: no connection to {host} (loopback only)")


def _guarded(connect):
    def connect_loopback_only(self, address):
        _check(self, address)
        return connect(self, address)

    return connect_loopback_only


def install(patch=setattr) -> None:
    patch(socket.socket, "connect", _guarded(socket.socket.connect))
    patch(socket.socket, "connect_ex", _guarded(socket.socket.connect_ex))


def sitecustomize_text() -> str:
    with open(__file__, encoding="utf-8") as handle:
        return handle.read() + "\n\ninstall()\n"
