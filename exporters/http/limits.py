"""The listener's bounds against slow, idle and hostile clients, in one place.

Each number is what a client may cost the agent before it is answered or closed. Together they
bound the memory (connections x buffers) and the threads (a fixed worker pool) whatever the
clients do, so a scan, a slowloris or a client that never reads cannot starve the scrapes
Prometheus and the kubelet depend on. docs/reliability.md ("Hostile clients") lists each with
its test; the defaults follow Go's net/http and nginx in spirit (seconds, not minutes).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ListenerLimits:
    header_timeout_s: float = 10.0
    """From accepting a connection (the TLS handshake included), or from the first byte of a later
    request on it, to the end of the request's headers. Past it: 408 (if anything arrived) and close."""
    idle_timeout_s: float = 120.0
    """A keep-alive connection with no request in progress is closed after this long. Above
    Prometheus's usual 60 s interval, so a scraper keeps its connection and its TLS session."""
    body_timeout_s: float = 5.0
    """The whole request body (a workload report, or a body to discard) within this long: 408 after."""
    write_timeout_s: float = 10.0
    """A client must take its answer within this long once the agent has it ready, or it is cut off."""
    max_connections: int = 1024
    """Open connections in all. At the cap the oldest connection with no request in progress is
    closed to make room; only when every one is busy is the newcomer closed instead."""
    max_connections_per_client: int = 64
    """Open connections from one address: past it, new ones from that address are closed on arrival."""
    max_in_flight: int = 64
    """Requests being answered at once (received whole, not yet written): past it, 503 at once."""
    max_header_bytes: int = 16 * 1024
    """Request line and headers together; past it, 431 and close. Bounds what one connection buffers."""
    max_discard_bytes: int = 64 * 1024
    """A body nobody asked for (on a GET, a 405) is read and thrown away up to this; past it, close."""
    max_requests_per_connection: int = 1000
    """Then the answer says ``Connection: close``, as nginx's keepalive_requests: a pipelining client
    that never reads its answers costs a bounded amount of work per connection."""
    workers: int = 4
    """Threads that run handlers (auth, renders); the event loop itself never blocks on one."""

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
