"""The port a child server listens on, read from its own socket.

A port picked by binding port 0 and releasing it is free only until another program binds it, and
under a loaded test suite one does: the server told to use it then fails to start or, worse, a
stranger answers in its place (VictoriaMetrics answers Prometheus' ``/-/ready`` and every range query,
empty). So the servers the fleet benchmark starts (Prometheus, VictoriaMetrics, vmalert), which all
accept ``127.0.0.1:0``, choose their own port and this reads it from the kernel.
"""

from __future__ import annotations

import subprocess
import time

import psutil


def listening_port(process: subprocess.Popen, what: str, timeout_s: float = 600.0) -> int:
    """The loopback TCP port ``process`` listens on, once it does; raises if it exits or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        port = _own_port(process.pid)
        if port:
            return port
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited ({process.returncode}) before it listened")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not listening after {timeout_s:.0f} s")
        time.sleep(0.1)


def _own_port(pid: int) -> int | None:
    try:
        owner = psutil.Process(pid)
        connections = getattr(owner, "net_connections", None) or owner.connections  # psutil < 6
        ports = sorted(c.laddr.port for c in connections(kind="tcp4")
                       if c.status == psutil.CONN_LISTEN and c.laddr.ip == "127.0.0.1")
    except psutil.Error:  # exited, or a zombie until reaped: the caller's poll() says so
        return None
    return ports[0] if ports else None
