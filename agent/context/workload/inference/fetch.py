"""What the inference scraper touches outside the agent: HTTP to the server, and the process table.

Kept apart from agent.context.workload.inference.scraper so the scraper's bookkeeping reads without socket details. Both
functions are called from the scraper's thread only, never from a collection cycle.
"""

from __future__ import annotations

import ipaddress
import socket
import time
import urllib.error
import urllib.request
import zlib
from urllib.parse import urlsplit

import psutil


class ResponseTooLarge(Exception):
    """The body exceeds the cap: a misdirected URL (a file server, a log) must not eat the agent's memory."""


def http_fetch(url: str, timeout_s: float, max_bytes: int) -> bytes:
    """GET ``url``: gzip accepted, proxies ignored (an agent-wide HTTP_PROXY is
    meant for the outside world, not a server on this node), at most ``max_bytes`` read
    (decompressed included), ``timeout_s`` per socket operation and for the whole body."""
    deadline = time.monotonic() + timeout_s
    request = urllib.request.Request(url, headers={
        "Accept": "text/plain;version=0.0.4;q=1.0, */*;q=0.1", "Accept-Encoding": "gzip",
        "User-Agent": "roofwatch-inference"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(request, timeout=timeout_s) as response:
        declared = response.headers.get("Content-Length", "")
        if declared.isdigit() and int(declared) > max_bytes:
            raise ResponseTooLarge(f"response larger than {max_bytes} bytes (Content-Length {declared})")
        chunks, size = [], 0
        while True:
            if time.monotonic() > deadline:
                raise TimeoutError(f"body not received within {timeout_s:g} s")
            chunk = response.read1(min(65536, max_bytes + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > max_bytes:
                raise ResponseTooLarge(f"response larger than {max_bytes} bytes")
        body = b"".join(chunks)
        if response.headers.get("Content-Encoding", "").strip().lower() == "gzip":
            inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
            body = inflater.decompress(body, max_bytes + 1)
            if len(body) > max_bytes or inflater.unconsumed_tail:
                raise ResponseTooLarge(f"decompressed response larger than {max_bytes} bytes")
        return body


def describe_error(exc: BaseException, timeout_s: float) -> str:
    """One line for status and logs, naming the likely cause."""
    if isinstance(exc, urllib.error.HTTPError):
        hint = " (is the server's metrics endpoint enabled? SGLang needs --enable-metrics)" if exc.code == 404 else ""
        return f"HTTP {exc.code} {exc.reason}{hint}"
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(reason, (TimeoutError, socket.timeout)):
        return f"timed out after {timeout_s:g} s"
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused (server not running or wrong port)"
    return f"{type(reason).__name__}: {reason}" if not isinstance(reason, str) else reason


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
