"""Helpers for running everything on this machine: free loopback ports, single-host gloo."""

from __future__ import annotations

import os
import socket

__all__ = [
    "LOOPBACK",
    "free_port",
    "use_loopback_for_ddp",
]

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now (for a server or a DDP rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def use_loopback_for_ddp() -> None:
    """Point a single-host DDP job at 127.0.0.1 (rendezvous and gloo's interface).

    gloo otherwise binds to whatever address the host name resolves to. Sets a fresh free
    ``MASTER_PORT`` (one per job), and ``MASTER_ADDR`` and ``GLOO_SOCKET_IFNAME`` unless set.
    """
    os.environ.setdefault("MASTER_ADDR", LOOPBACK)
    os.environ["MASTER_PORT"] = str(free_port())
    names = {name for _, name in socket.if_nameindex()}
    for lo in ("lo", "lo0"):
        if lo in names:
            os.environ.setdefault("GLOO_SOCKET_IFNAME", lo)
            return
