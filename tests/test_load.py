"""Load, end to end: the reliability matrix's "50 concurrent scrapers for 60 s plus report traffic" row.

The real agent process (the ``roofwatch demo`` fleet of 8 simulated GPUs with HTTP reports on,
tests/reporting_demo.py) is hammered over its real HTTP port by client threads in this process, each
with its own keep-alive connection, while report traffic flows into ``POST /api/v1/report``. Every
status and latency is recorded; the assertions are about correctness and bounds (statuses, exceptions,
parsable bodies, threads, memory), never about speed: latency and throughput are printed (``pytest -s``)
for a person to read. What happens past the in-flight request cap is in test_load_concurrency_cap.py.
"""

from __future__ import annotations

import gzip
import http.client
import json
import os
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import psutil
import pytest

from tests.agent_process import poll
from tests.reporting_demo import (
    CLIENT_TIMEOUT_S,
    GPUS,
    JSON,
    MAX_CONCURRENT,
    ReportingDemo,
    agent,  # noqa: F401 (a fixture)
    gpu_up,
    report,
)

pytestmark = pytest.mark.slow

LOAD_S = float(os.environ.get("ROOFWATCH_LOAD_S", "20"))
"""Seconds of load. 20 s in the test suite so CI stays fast; the issue's 60 s is
``ROOFWATCH_LOAD_S=60 pytest -s tests/test_load.py`` (the agent never sees it: clean_env drops ROOFWATCH_*)."""
SCRAPERS = 50
REPORTERS = 2


THREAD_SLACK = 4
"""Threads the agent may run beyond baseline + MAX_CONCURRENT during the load. The server spawns one
thread per *connection* (not per request), and this load holds SCRAPERS + REPORTERS = 52 connections,
well under MAX_CONCURRENT. The slack covers connections that overlap briefly: a reporter whose oversized
report is answered ``413 Connection: close`` reconnects while the old handler thread may still be
lingering (``agent.context.workload.report_http.linger``, up to 0.5 s), and the sampler's reading can land mid-handover."""
RSS_GROWTH_BOUND_MIB = 30
"""After the load (its connections closed) the agent's RSS may exceed the healthy baseline by this much.
What the load legitimately leaves behind: the per-snapshot render caches (a few 100 kB exposition,
gzip, OpenMetrics, JSON and status-page renderings), up to two reporters' entries in the report store,
freed-but-kept memory of the allocator (pymalloc arenas and glibc per-thread arenas the handler threads
touched), and the collector's sample history filling up as it does on an idle agent (about 0.7 MiB a
minute here, capped at history_len samples). Measured: +7 MiB after 20 s, +9 MiB after 60 s, for 4-15 x
10^4 requests; a leak of even 100 bytes per request or a few kB per connection would show."""


OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"


@dataclass(frozen=True)
class Kind:
    name: str
    path: str
    headers: tuple[tuple[str, str], ...] = ()


KINDS = {  # scraper i plays MIX[i % 10]: 20 plain, 10 gzip, 5 OpenMetrics /metrics; 5 each of /, snapshot, healthz
    "metrics": Kind("metrics", "/metrics"),
    "metrics-gzip": Kind("metrics-gzip", "/metrics", (("Accept-Encoding", "gzip"),)),
    "metrics-openmetrics": Kind("metrics-openmetrics", "/metrics", (("Accept", OPENMETRICS),)),
    "status-page": Kind("status-page", "/"),
    "snapshot": Kind("snapshot", "/api/v1/snapshot"),
    "healthz": Kind("healthz", "/healthz"),
}
MIX = ["metrics"] * 4 + ["metrics-gzip"] * 2 + ["metrics-openmetrics", "status-page", "snapshot", "healthz"]


INVALID_REPORTS = [  # (what, body, content type, the status it must get); sent once each, then every 10th report
    ("not JSON", b"{step: 1", JSON, 400),
    ("a string for a number", b'{"step": "five"}', JSON, 422),
    ("rank past world_size", b'{"step": 1, "rank": 4, "world_size": 2}', JSON, 422),
    ("wrong content type", b'{"step": 1}', "text/plain", 415),
    ("over 16 KiB", b'{"job": "' + b"x" * 17_000 + b'"}', JSON, 413),  # answered Connection: close
]


@dataclass
class Tally:
    """What one client thread saw; merged after the load."""

    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    statuses: Counter = field(default_factory=Counter)
    """(kind, status) -> answers."""
    unexpected: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    connections: int = 0


class Load:
    """SCRAPERS + REPORTERS client threads for LOAD_S seconds, a sampler of the agent's threads and RSS."""

    def __init__(self, agent: ReportingDemo) -> None:
        self.agent = agent
        self.deadline = 0.0
        self.bodies: dict[tuple[str, str, str, bytes], None] = {}
        """Every distinct (kind, content type, encoding, body) answered: the agent renders once per snapshot,
        so checking each distinct body after the load checks every body it sent."""
        self.tallies: list[Tally] = []
        self.stop_sampling = threading.Event()
        self.go = threading.Event()
        self.samples: list[tuple[int, float]] = []

    def run(self) -> float:
        """The clients connect one at a time, each after the previous one's first answer, then all run
        together for LOAD_S seconds; the seconds of that together-phase are returned.

        Why one at a time: the agent's listen backlog is socketserver's default of 5. Past it, Linux drops
        the handshake's last ACK (or the SYN) and a client whose connect() already returned can wait
        seconds to tens of seconds for the agent to accept it (TCP retransmit back-off). That is a separate
        defect, reported with the matrix; here each client is known to be accepted before the next connects."""
        clients = [(self._scrape, KINDS[MIX[i % len(MIX)]]) for i in range(SCRAPERS)]
        clients += [(self._report, r) for r in range(REPORTERS)]
        sampler = threading.Thread(target=self._sample, name="sampler")
        sampler.start()
        threads = []
        try:
            for target, arg in clients:
                ready = threading.Event()
                threads.append(threading.Thread(target=target, args=(arg, ready), daemon=True))
                threads[-1].start()
                ready.wait(2 * CLIENT_TIMEOUT_S)  # set after its first answer or error: never left waiting
            started = time.monotonic()
            self.deadline = started + LOAD_S
        finally:
            self.go.set()  # also on the way out of a failure: the deadline is then still 0, so all stop
        for thread in threads:
            thread.join(LOAD_S + 2 * CLIENT_TIMEOUT_S)
        elapsed = time.monotonic() - started
        self.stop_sampling.set()
        sampler.join(10)
        assert not any(t.is_alive() for t in threads), "a client thread never finished: a request hung past its timeout"
        return elapsed

    def _sample(self) -> None:
        while not self.stop_sampling.is_set():
            try:
                self.samples.append((self.agent.threads(), self.agent.rss_mib()))
            except psutil.Error:
                return  # the agent died: the clients' errors say so
            self.stop_sampling.wait(0.1)

    def _connection(self, tally: Tally) -> http.client.HTTPConnection:
        tally.connections += 1
        return http.client.HTTPConnection(*self.agent.address, timeout=CLIENT_TIMEOUT_S)

    def _exchange(self, conn: http.client.HTTPConnection, tally: Tally, what: str, method: str, path: str,
                  body: bytes | None, headers: dict[str, str]) -> http.client.HTTPResponse | None:
        """One request on ``conn``; the response (body read into ``.data``), or None after an error."""
        # A request that opens its connection is timed apart: its latency includes the TCP handshake, which
        # a burst of connections can stretch by SYN retransmits (1 s, 3 s) when the listen backlog overflows.
        timed_as = what if conn.sock is not None else "(opening a connection)"
        started = time.perf_counter()
        try:
            conn.request(method, path, body=body, headers=headers)
            response = conn.getresponse()
            response.data = response.read()  # type: ignore[attr-defined]
        except (OSError, http.client.HTTPException) as exc:
            tally.errors.append(f"{what}: {type(exc).__name__}: {exc}")
            conn.close()
            return None
        tally.latencies[timed_as].append(time.perf_counter() - started)
        tally.statuses[(what, response.status)] += 1
        return response

    def _running(self, ready: threading.Event) -> bool:
        """True while the load goes on; a client's first request always runs, then waits for the others."""
        if not ready.is_set():
            return True
        return time.monotonic() < self.deadline

    def _connected(self, ready: threading.Event) -> None:
        """After a client's first answer: let the next client connect, and wait for all of them."""
        if not ready.is_set():
            ready.set()
            self.go.wait()

    def _scrape(self, kind: Kind, ready: threading.Event) -> None:
        tally = Tally()
        self.tallies.append(tally)
        conn = self._connection(tally)
        sock = None
        try:
            while self._running(ready):
                response = self._exchange(conn, tally, kind.name, "GET", kind.path, None, dict(kind.headers))
                self._connected(ready)
                if response is None:
                    conn = self._connection(tally)
                    continue
                if conn.sock is not sock:  # http.client drops its socket after an answer that closes
                    # After max_requests_per_connection answers the agent says Connection: close, as
                    # nginx does; a close without it would be the agent dropping a scraper.
                    announced = response.getheader("Connection", "").lower() == "close"
                    if sock is not None and conn.sock is None and not announced:
                        tally.unexpected.append(f"{kind.name}: the agent closed a keep-alive connection")
                    sock = conn.sock
                if response.status != 200:
                    tally.unexpected.append(f"{kind.name}: {response.status} {response.data[:200]!r}")
                    continue
                key = (kind.name, response.getheader("Content-Type", ""), response.getheader("Content-Encoding", ""),
                       response.data)
                self.bodies[key] = None  # one dict store: atomic under the GIL
        finally:
            ready.set()  # a client that died early must not hold up the others
            conn.close()

    def _report(self, reporter: int, ready: threading.Event) -> None:
        tally = Tally()
        self.tallies.append(tally)
        conn = self._connection(tally)
        n = 0
        try:
            while self._running(ready):
                n += 1
                # Each invalid kind once right after the first report (so every kind is sent however busy
                # the machine keeps the reporters), then every 10th report one of them in turn.
                invalid = n - 2 if 2 <= n < 2 + len(INVALID_REPORTS) else (n // 10 if n % 10 == 0 else None)
                if invalid is not None:
                    what, body, content_type, expected = INVALID_REPORTS[invalid % len(INVALID_REPORTS)]
                    what = f"report ({what})"
                else:
                    what, body, content_type, expected = "report", report(n, reporter), JSON, 204
                response = self._exchange(conn, tally, what, "POST", "/api/v1/report", body,
                                          {"Content-Type": content_type})
                self._connected(ready)
                if response is None:
                    conn = self._connection(tally)
                    continue
                if response.status != expected and response.status != 429:  # over the per-client rate: fine
                    tally.unexpected.append(f"{what}: {response.status} (expected {expected}) {response.data[:200]!r}")
                if response.getheader("Connection", "").lower() == "close":
                    if expected != 413:
                        tally.unexpected.append(f"{what}: the agent closed the connection")
                    conn.close()
                    conn = self._connection(tally)
        finally:
            ready.set()  # a client that died early must not hold up the others
            conn.close()

    def merged(self) -> Tally:
        total = Tally()
        for tally in self.tallies:
            for what, values in tally.latencies.items():
                total.latencies[what].extend(values)
            total.statuses.update(tally.statuses)
            total.unexpected += tally.unexpected
            total.errors += tally.errors
            total.connections += tally.connections
        return total


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def print_latencies(title: str, latencies: dict[str, list[float]], elapsed: float) -> None:
    print(f"\n{title}")
    print(f"  {'kind':32} {'requests':>9} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    everything = [v for values in latencies.values() for v in values]
    for what, values in sorted(latencies.items()) + [("all", everything)]:
        if values:
            print(f"  {what:32} {len(values):9d} {len(values) / elapsed:8.0f} {percentile(values, 0.5) * 1e3:8.1f}"
                  f" {percentile(values, 0.99) * 1e3:8.1f} {max(values) * 1e3:8.1f}")


def check_body(kind: str, content_type: str, encoding: str, body: bytes) -> dict[str, float] | None:
    """Assert one distinct answer is what its kind promises; the ``roofwatch_gpu_up`` values of an exposition."""
    if kind.startswith("metrics"):
        openmetrics = kind == "metrics-openmetrics"
        assert content_type.startswith("application/openmetrics-text" if openmetrics else "text/plain; version=0.0.4")
        assert encoding == ("gzip" if kind == "metrics-gzip" else "")
        text = (gzip.decompress(body) if encoding == "gzip" else body).decode()
        up = gpu_up(text, openmetrics)
        assert sorted(up) == [str(i) for i in range(GPUS)], f"{kind}: roofwatch_gpu_up series for GPUs {sorted(up)}"
        return up
    if kind == "snapshot":
        assert content_type == JSON and len(json.loads(body)["devices"]) == GPUS
    elif kind == "status-page":
        assert content_type.startswith("text/html") and b"<html" in body[:500].lower()
    elif kind == "healthz":
        assert body.startswith(b"ok: "), body
    return None


def test_fifty_scrapers_and_report_traffic_no_errors_bounded_threads_and_memory(agent: ReportingDemo) -> None:
    baseline_threads, baseline_rss = agent.settled_threads(), agent.rss_mib()
    load = Load(agent)
    elapsed = load.run()
    total = load.merged()

    # Every request was answered, by the status it should get, on the connection it was sent on.
    assert not total.errors, f"{len(total.errors)} client errors, first: {total.errors[:5]}\n{agent.stderr_tail()}"
    refused = {what: n for (what, status), n in total.statuses.items() if status == 503}
    assert not refused, f"503 with {SCRAPERS + REPORTERS} clients, under the cap of {MAX_CONCURRENT}: {refused}"
    assert not total.unexpected, f"{len(total.unexpected)} unexpected answers, first: {total.unexpected[:10]}"
    answered = sum(total.statuses.values())
    assert total.connections == SCRAPERS + REPORTERS + total.statuses[("report (over 16 KiB)", 413)], \
        "only a 413 (Connection: close) may cost a reporter its connection"
    for kind in set(MIX):
        assert total.statuses[(kind, 200)] > 0, f"no {kind} answered"
    assert total.statuses[("report", 204)] > 0
    for what, _, _, expected in INVALID_REPORTS:
        assert total.statuses[(f"report ({what})", expected)] > 0, f"no '{what}' report was sent"

    # Every distinct body the agent sent is valid; every exposition has all 8 GPUs.
    down = Counter()
    for kind, content_type, encoding, body in load.bodies:
        up = check_body(kind, content_type, encoding, body)
        down.update(gpu for gpu, value in (up or {}).items() if value != 1.0)

    # Threads stayed bounded during the load, and come back down once the clients are gone.
    peak_threads = max(t for t, _ in load.samples)
    peak_rss = max(r for _, r in load.samples)
    assert peak_threads <= baseline_threads + MAX_CONCURRENT + THREAD_SLACK, \
        f"{peak_threads} threads during the load (baseline {baseline_threads})"
    poll(lambda: agent.threads() <= baseline_threads, 30, what=f"the agent back to {baseline_threads} threads")

    # Healthy afterwards, and no memory kept per request.
    agent.wait_healthy(10)
    assert sorted(gpu_up(agent.metrics(), openmetrics=False)) == [str(i) for i in range(GPUS)]
    rss_after = agent.rss_mib()
    print_latencies(f"load: {SCRAPERS} scrapers + {REPORTERS} reporters for {elapsed:.1f} s, {answered} answers "
                    f"({answered / elapsed:.0f}/s), {len(load.bodies)} distinct bodies checked",
                    total.latencies, elapsed)
    print(f"  agent threads: baseline {baseline_threads}, peak {peak_threads} during the load, "
          f"{agent.threads()} after; RSS MiB: baseline {baseline_rss:.1f}, peak {peak_rss:.1f}, after {rss_after:.1f} "
          f"(+{rss_after - baseline_rss:.1f})")
    if down:
        print(f"  expositions with a GPU down (collector starved of CPU by the load): {dict(down)}")
    assert rss_after - baseline_rss < RSS_GROWTH_BOUND_MIB, \
        f"RSS grew {rss_after - baseline_rss:.1f} MiB over the load (baseline {baseline_rss:.1f} MiB)"
