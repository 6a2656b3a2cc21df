"""What the inference scraper touches outside the agent: HTTP to the server, and the process table.

Kept apart from agent.context.workload.inference.scraper so the scraper's bookkeeping reads without socket details. Both
functions are called from the scraper's thread only, never from a collection cycle.
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

import psutil

from agent.context.neighbour_http import FetchFailed, fetch


class ResponseTooLarge(Exception):
    """The body exceeds the cap: a misdirected URL (a file server, a log) must not eat the agent's memory."""


class HttpStatus(Exception):
    """The server answered, but not with 2xx."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(f"HTTP {code} {reason}")
        self.code, self.reason = code, reason


def http_fetch(url: str, timeout_s: float, max_bytes: int) -> bytes:
    """GET ``url`` (gzip accepted, proxies ignored, at most ``max_bytes`` read, decompressed included)
    within ``timeout_s`` in all, from connecting to the last byte (agent.context.neighbour_http): a
    server that answers a byte a second costs its own scrape, never the reader's thread."""
    try:
        reply = fetch(url, timeout_s=timeout_s, max_bytes=max_bytes, gzip=True, headers={
            "Accept": "text/plain;version=0.0.4;q=1.0, */*;q=0.1", "User-Agent": "roofwatch-inference"})
    except FetchFailed as exc:
        if exc.kind == "too_large":
            raise ResponseTooLarge(str(exc)) from None
        raise
    if not 200 <= reply.status < 300:
        raise HttpStatus(reply.status, reply.reason)
    return reply.body


def describe_error(exc: BaseException, timeout_s: float) -> str:
    """One line for status and logs, naming the likely cause."""
    if isinstance(exc, HttpStatus):
        hint = " (is the server's metrics endpoint enabled? SGLang needs --enable-metrics)" if exc.code == 404 else ""
        return f"HTTP {exc.code} {exc.reason}{hint}"
    if isinstance(exc, FetchFailed):
        if exc.kind == "refused":
            return "connection refused (server not running or wrong port)"
        if exc.kind in ("timeout", "deadline"):  # the deadline is the timeout: one bound from connect to end
            return f"timed out after {timeout_s:g} s"
        return str(exc)
    if isinstance(exc, (TimeoutError, socket.timeout)):
        return f"timed out after {timeout_s:g} s"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused (server not running or wrong port)"
    return f"{type(exc).__name__}: {exc}"


def _is_local(host: str) -> bool:
    """Whether ``host`` names this machine, without a DNS lookup (which has no timeout)."""
    name = host.strip("[]").lower()
    if name in ("localhost", "localhost.localdomain") or name == socket.gethostname().lower():
        return True
    try:
        ip = ipaddress.ip_address(name.split("%")[0])
    except ValueError:
        return False
    if ip.is_loopback or ip.is_unspecified:
        return True
    try:
        return any(a.address.split("%")[0] == str(ip) for addrs in psutil.net_if_addrs().values() for a in addrs)
    except (psutil.Error, OSError):
        return False


def server_pids(url: str, port: int) -> tuple[frozenset[int], str | None]:
    """PIDs of the process listening on ``port`` and its descendants (vLLM/SGLang workers are children
    of the API server; TGI's shards are children of ``text-generation-launcher``, the router's parent).
    Returns (pids, problem): an empty set and a reason when they cannot be found. Never raises."""
    host = urlsplit(url).hostname or ""
    if not _is_local(host):
        return frozenset(), f"{host} is not this machine: set gpus to say which GPUs it serves"
    try:
        connections = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError) as exc:
        return frozenset(), f"cannot list listening sockets ({type(exc).__name__}): run privileged or set gpus"
    listeners = {c.pid for c in connections
                 if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid}
    if not listeners:
        return frozenset(), (f"no visible process listens on port {port} (another network namespace, or another "
                             "user's process without privileges): set gpus")
    pids = set(listeners)
    for pid in listeners:
        try:
            proc = psutil.Process(pid)
            pids.update(child.pid for child in proc.children(recursive=True))
            parent = proc.parent()
            if parent is not None and parent.name() == "text-generation-launcher":
                pids.update(child.pid for child in parent.children(recursive=True))
        except (psutil.Error, OSError):
            continue
    return frozenset(pids), None
