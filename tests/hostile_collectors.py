"""OTLP collectors that mean harm, as real HTTP servers on loopback (raw sockets, so they can send what no
well-behaved server library would). The OTLP tests push into them, and so can a load test.

Each reads the whole request first, as a collector would (its headers are kept in :attr:`requests`), then:

- ``huge``: ``200`` with a body of ``body_bytes`` (1.5 GiB by default, declared in ``Content-Length``),
  sent for as long as the client reads; :attr:`sent` counts what the kernel took;
- ``redirect``: ``status`` (307 by default) with ``Location: location``;
- ``drip-headers``: the status line and headers one byte every ``every_s``;
- ``drip-body``: the headers at once, then the body one byte every ``every_s``;
- ``echo``: ``401`` with the request's ``Authorization`` in its reason phrase and body (a collector quoting
  the credentials back, to see that nothing repeats them).

Given several modes, it answers request after request with each in turn (request ``i`` by ``modes[i % n]``):
one collector that is every kind of hostile, as the hostile-neighbours load (benchmarks/neighbours_load.py)
pushes into; :attr:`served` says which mode answered each request.
"""

from __future__ import annotations

import socket
import socketserver
import ssl
import threading
from typing import Sequence

HUGE_BYTES = 1536 * 1024 * 1024
BLOCK = b"\0" * (1 << 20)


class HostileCollector:
    """``POST /v1/metrics`` on 127.0.0.1, any free port, answered by ``mode`` (or by each of several modes in
    turn); a context manager."""

    def __init__(self, mode: str | Sequence[str], *, body_bytes: int = HUGE_BYTES, status: int = 307,
                 location: str = "", every_s: float = 1.0, pad: int = 40) -> None:
        self.modes = (mode,) if isinstance(mode, str) else tuple(mode)
        self.body_bytes, self.status, self.location = body_bytes, status, location
        self.every_s, self.pad = every_s, pad
        self.requests: list[dict[str, str]] = []
        self.served: list[str] = []
        """The mode that answered each request, in the order they came."""
        self.sent = 0
        self.stop = threading.Event()
        self.cond = threading.Condition()
        owner = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                try:
                    headers = _read_request(self.request)
                    with owner.cond:
                        mode = owner.modes[len(owner.requests) % len(owner.modes)]
                        owner.requests.append(headers)
                        owner.served.append(mode)
                        owner.cond.notify_all()
                    owner._answer(self.request, headers, mode)
                except OSError:  # the client gave up or was cut off: that is the point
                    pass

        self._server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self.base_url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def wait_for(self, count: int, timeout: float = 30.0) -> bool:
        """True once ``count`` requests have arrived (without polling)."""
        with self.cond:
            return self.cond.wait_for(lambda: len(self.requests) >= count, timeout)

    def _answer(self, sock: socket.socket, headers: dict[str, str], mode: str) -> None:
        if mode == "huge":
            sock.sendall(_head(200, "OK", self.body_bytes))
            left = self.body_bytes
            while left > 0 and not self.stop.is_set():
                chunk = BLOCK[: min(left, len(BLOCK))]
                sock.sendall(chunk)
                left -= len(chunk)
                with self.cond:
                    self.sent += len(chunk)
        elif mode == "redirect":
            sock.sendall(_head(self.status, "Moved", 0, f"Location: {self.location}\r\n"))
        elif mode == "drip-headers":
            self._drip(sock, _head(200, "OK", 0, f"X-Pad: {'p' * self.pad}\r\n"))
        elif mode == "drip-body":
            sock.sendall(_head(200, "OK", self.pad))
            self._drip(sock, b"\0" * self.pad)
        elif mode == "echo":
            said = headers.get("authorization", "")
            body = f"no entry for {said}".encode()
            sock.sendall(_head(401, f"Unauthorized {said}", len(body)) + body)
        else:
            raise ValueError(mode)

    def _drip(self, sock: socket.socket, data: bytes) -> None:
        for i in range(len(data)):
            if self.stop.wait(self.every_s):
                return
            sock.sendall(data[i:i + 1])

    def close(self) -> None:
        self.stop.set()
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> HostileCollector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _head(status: int, reason: str, length: int, extra: str = "") -> bytes:
    return (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/x-protobuf\r\nContent-Length: {length}\r\n"
            f"{extra}\r\n").encode()


def _read_request(sock: socket.socket) -> dict[str, str]:
    """Read one request whole (headers, then ``Content-Length`` bytes); its headers, names lower-cased."""
    sock.settimeout(10.0)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("the client left before its headers")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    headers = {}
    for line in head.decode("latin-1").split("\r\n")[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    left = int(headers.get("content-length", "0")) - len(body)
    while left > 0:
        chunk = sock.recv(min(left, 65536))
        if not chunk:
            raise ConnectionError("the client left before its body")
        left -= len(chunk)
    return headers


class FailingTlsListener:
    """A TLS server whose certificate the client does not trust (signed by a CA only the test knows): every
    handshake fails on the client's side, as with a collector behind the wrong certificate."""

    def __init__(self, cert: str, key: str) -> None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)
        self.handshakes = 0
        owner = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                owner.handshakes += 1
                try:
                    with context.wrap_socket(self.request, server_side=True) as tls:
                        tls.recv(1)
                except OSError:  # the client refused the certificate: that is the point
                    pass

        self._server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.base_url = f"https://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
