"""The agent's listening socket: one event loop thread, a fixed pool of worker threads, and the
books on who is connected.

The loop accepts, reads, frames and writes for every connection (exporters.http.connection); the
workers only run handlers (auth, renders). So the thread count is fixed whatever the clients do,
and the caps here (connections in all and per address) bound the memory: each connection holds at
most ``max_header_bytes`` of input and one answer of output.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import resource
import socket
import sys
import threading
from collections import Counter
from typing import Any, Callable

from exporters.http.connection import Connection
from exporters.http.framing import HttpDate
from exporters.http.limits import ListenerLimits
from exporters.http.routes import Response, text

log = logging.getLogger("roofwatch.http")

READ_CHUNK = 16 * 1024
"""One read from a socket: a client's bytes reach the parser in pieces this big, never 256 kB."""
BACKLOG = 1024
"""The kernel's queue of connections not yet accepted; the loop accepts them in batches."""
CLOSE_GRACE_S = 1.0
GIL_SWITCH_S = 0.001
"""The event loop thread gives up the GIL at every socket call; each time, a busy thread (the collector,
a render) may keep it for the whole switch interval, 5 ms by default. Hundreds of calls a turn made
that seconds of lag under load (the convoy effect); 1 ms bounds it at a small cost to the busy threads."""
TURNED_AWAY_MAX = 64
"""Connections told "no room" (the report socket) that may wait a moment for their answer to be read."""
FILES_RESERVED = 256
"""Open files the rest of the agent may need besides the connections (drivers, /proc, logs)."""


def raise_open_files(wanted: int) -> None:
    """Lift the soft limit on open files towards the hard one (as Go does at start): systemd's soft
    default of 1024 would make the accept loop pause on EMFILE below ``max_connections``."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        if soft != resource.RLIM_INFINITY and soft < target:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (OSError, ValueError):
        log.warning("cannot raise the open-file limit to %d", wanted)


def bind(address: tuple[str, int]) -> socket.socket:
    """The listening socket, bound now so a busy port is an error at start (IPv6 for a v6 host)."""
    host, port = address
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host or ("::" if family == socket.AF_INET6 else "0.0.0.0"), port))
        sock.listen(BACKLOG)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


class Listener:
    def __init__(self, server: Any, sock: socket.socket, limits: ListenerLimits) -> None:
        """``server`` is the :class:`exporters.http.AgentHTTPServer` whose requests this serves
        (typed loosely: it imports this module)."""
        self.server = server
        self.sock = sock
        self.limits = limits
        raise_open_files(limits.max_connections + FILES_RESERVED)
        self.loop = asyncio.new_event_loop()
        self.read_buffer = memoryview(bytearray(READ_CHUNK))
        self.date = HttpDate()
        self.connections: dict[Connection, None] = {}
        """Open connections, oldest first (a dict keeps insertion order)."""
        self.per_client: Counter[str] = Counter()
        self._turned_away = 0
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._workers: list[threading.Thread] = []
        self._started = threading.Event()
        self._accepting_stopped = threading.Event()
        self._finished = threading.Event()
        self._stop_accepting: asyncio.Event | None = None
        self._close: asyncio.Event | None = None
        self._shutdown_requested = False
        self._closed = False
        self._running = False
        self._lock = threading.Lock()

    # -- the books ---------------------------------------------------------------------------------

    def admit(self, connection: Connection) -> bool:
        """Room for a new connection? Past the per-address cap: no. At the total cap, the oldest
        connection with no request in progress (one that never sent a whole request first) is
        closed to make room; if every connection is busy, the newcomer is refused."""
        client = connection.client
        if self.per_client[client] >= self.limits.max_connections_per_client:
            log.debug("connection from %s refused: %d open from that address", client, self.per_client[client])
            return False
        if len(self.connections) >= self.limits.max_connections:
            victim = (next((c for c in self.connections if c.evictable and c.first), None)
                      or next((c for c in self.connections if c.evictable), None))
            if victim is None:
                log.debug("connection from %s refused: %d open, all busy", client, len(self.connections))
                return False
            victim.evict()
        self.connections[connection] = None
        self.per_client[client] += 1
        return True

    def turn_away(self, transport: asyncio.BaseTransport, answer: bytes) -> None:
        """Answer a connection there is no room for, then close it a moment later. Closing at once, with
        its request unread, would make the kernel reset it and destroy the answer; at most
        ``TURNED_AWAY_MAX`` wait like that at once (past that: closed at once), outside the books."""
        assert isinstance(transport, asyncio.WriteTransport)
        transport.write(answer)
        if self._turned_away >= TURNED_AWAY_MAX or not transport.can_write_eof():
            transport.close()
            return
        self._turned_away += 1
        transport.write_eof()

        def close() -> None:
            self._turned_away -= 1
            transport.close()

        self.loop.call_later(CLOSE_GRACE_S, close)

    def forget(self, connection: Connection) -> None:
        if connection in self.connections:
            del self.connections[connection]
            self.per_client[connection.client] -= 1
            if self.per_client[connection.client] <= 0:
                del self.per_client[connection.client]

    # -- workers -----------------------------------------------------------------------------------

    def run(self, job: Callable[[], Response], done: Callable[[Response], None]) -> None:
        """``job`` in a worker thread; ``done`` with its answer back on the loop thread."""
        self._jobs.put((job, done))

    def _work(self) -> None:
        while True:
            item = self._jobs.get()
            if item is None:
                return
            job, done = item
            try:
                response = job()
            except Exception:  # a handler's bug: logged (and recorded by tests), the client gets a 500
                self.server.handle_error(None, None)
                response = text(500, "internal error", close=True)
            try:
                self.loop.call_soon_threadsafe(done, response)
            except RuntimeError:  # the loop is closed: the agent is stopping
                pass

    # -- running -----------------------------------------------------------------------------------

    def serve_forever(self) -> None:
        """Run the loop in this thread until :meth:`close`."""
        with self._lock:  # against a close() racing the start: either it finds the loop running, or we stop
            if self._shutdown_requested or self._closed:
                self._accepting_stopped.set()
                self._finished.set()
                return
            self._running = True
        self._workers = [threading.Thread(target=self._work, name=f"roofwatch-http-{i}", daemon=True)
                         for i in range(self.limits.workers)]
        for worker in self._workers:
            worker.start()
        if sys.getswitchinterval() > GIL_SWITCH_S:
            sys.setswitchinterval(GIL_SWITCH_S)
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._serve())
        finally:
            for _ in self._workers:
                self._jobs.put(None)
            self.loop.close()
            self._accepting_stopped.set()
            self._finished.set()

    async def _serve(self) -> None:
        self._stop_accepting, self._close = asyncio.Event(), asyncio.Event()
        server = await self.loop.create_server(lambda: Connection(self), sock=self.sock, backlog=BACKLOG)
        self._started.set()
        await self._stop_accepting.wait()
        server.close()  # no new connections; the open ones keep being answered while the agent drains
        self._accepting_stopped.set()
        await self._close.wait()
        for connection in list(self.connections):
            connection._close()
        deadline = self.loop.time() + CLOSE_GRACE_S
        while self.connections and self.loop.time() < deadline:
            await asyncio.sleep(0.02)
        for connection in list(self.connections):
            connection._abort()

    def _signal(self, which: str) -> None:
        event = self._stop_accepting if which == "stop" else self._close
        if event is not None:
            event.set()
            if which == "close" and self._stop_accepting is not None:
                self._stop_accepting.set()

    def shutdown(self) -> None:
        """Stop accepting (the open connections are still served); returns once no new one can come."""
        with self._lock:
            self._shutdown_requested = True
            if not self._running:
                return
        self._started.wait(5.0)
        if self.loop.is_closed():
            return
        try:
            self.loop.call_soon_threadsafe(self._signal, "stop")
        except RuntimeError:
            return
        self._accepting_stopped.wait(5.0)

    def close(self) -> None:
        """Close every connection (each gets a moment to take what it was sent) and the socket."""
        with self._lock:
            self._closed = True
            running = self._running
        if running:
            self._started.wait(5.0)
            try:
                self.loop.call_soon_threadsafe(self._signal, "close")
            except RuntimeError:
                pass
            self._finished.wait(CLOSE_GRACE_S + 4.0)
        elif not self.loop.is_closed():
            self.loop.close()
        self.sock.close()

    @property
    def open_connections(self) -> int:
        return len(self.connections)
