"""Load, end to end: the reliability matrix's "50 concurrent scrapers for 60 s plus report traffic" row.

The real agent process (the ``roofwatch demo`` fleet of 8 simulated GPUs) is hammered over its real
HTTP port by client threads in this process, each with its own keep-alive connection, while report
traffic flows into ``POST /api/v1/report``. Every status and latency is recorded; the assertions are
about correctness and bounds (statuses, exceptions, parsable bodies, threads, memory), never about
speed: latency and throughput are printed (``pytest -s``) for a person to read.

The demo turns HTTP reports off (``agent.app.cli._report_store``: the simulated fleet reports for its own
jobs), so the agent here is the demo started by a three-line launcher that gives it the report store
a real backend gets. Everything else (settings, collector, HTTP server, exposition) is the real CLI path.
"""

from __future__ import annotations

import gzip
import http.client
import json
import os
import select
import socket
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import psutil
import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

from tests.agent_process import URL_PATTERN, AgentProcess, clean_env, poll

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]

LOAD_S = float(os.environ.get("ROOFWATCH_LOAD_S", "20"))
"""Seconds of load. 20 s in the test suite so CI stays fast; the issue's 60 s is
``ROOFWATCH_LOAD_S=60 pytest -s tests/test_load.py`` (the agent never sees it: clean_env drops ROOFWATCH_*)."""
SCRAPERS = 50
REPORTERS = 2
MAX_CONCURRENT = 64
"""``AgentHTTPServer``'s default in-flight request cap; the CLI does not change it."""
GPUS = 8
CLIENT_TIMEOUT_S = 30.0
"""Socket timeout of every client: a hung agent shows up as a recorded error, never as a hung test."""
THREAD_SLACK = 4
"""Threads the agent may run beyond baseline + MAX_CONCURRENT during the load. The server spawns one
thread per *connection* (not per request), and this load holds SCRAPERS + REPORTERS = 52 connections,
well under MAX_CONCURRENT. The slack covers connections that overlap briefly: a reporter whose oversized
report is answered ``413 Connection: close`` reconnects while the old handler thread may still be
lingering (``agent.context.workload.reports.linger``, up to 0.5 s), and the sampler's reading can land mid-handover."""
RSS_GROWTH_BOUND_MIB = 30
"""After the load (its connections closed) the agent's RSS may exceed the healthy baseline by this much.
What the load legitimately leaves behind: the per-snapshot render caches (a few 100 kB exposition,
gzip, OpenMetrics, JSON and status-page renderings), up to two reporters' entries in the report store,
freed-but-kept memory of the allocator (pymalloc arenas and glibc per-thread arenas the handler threads
touched), and the collector's sample history filling up as it does on an idle agent (about 0.7 MiB a
minute here, capped at history_len samples). Measured: +7 MiB after 20 s, +9 MiB after 60 s, for 4-15 x
10^4 requests; a leak of even 100 bytes per request or a few kB per connection would show."""
DRIBBLE_S = 0.25
"""The slow clients of the 503 test send one byte of their body this often: the server's body read
times out after 5 s without a byte (``BODY_READ_TIMEOUT_S``), so this keeps a request in flight as
long as the test wants it, however slow the machine."""

JSON = "application/json"
OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"

LAUNCHER = """\
import sys
from agent.app import cli
from agent.context.workload.reports import ReportStore
cli._report_store = lambda settings: ReportStore(ttl_s=settings.report_ttl_s)
sys.exit(cli.main(["demo", "--listen", "127.0.0.1:0"]))
"""


class ReportingDemo(AgentProcess):
    """The demo agent with HTTP workload reports on (loopback clients, no token: the real default)."""

    def __init__(self, stderr_path: Path) -> None:
        self.stderr_path = stderr_path
        with open(stderr_path, "w") as stderr:  # a file, not a pipe: a chatty agent can never block on it
            self.proc = subprocess.Popen([sys.executable, "-c", LAUNCHER], stdout=subprocess.PIPE, stderr=stderr,
                                         text=True, env=clean_env(), cwd=REPO)
        line = self.proc.stdout.readline()
        match = URL_PATTERN.search(line)
        if not match:
            self.kill()
            raise AssertionError(f"agent printed no URL: {line!r}; stderr: {self.stderr_tail()}")
        self.url = match.group(1)
        host, port = self.url.removeprefix("http://").rstrip("/").rsplit(":", 1)
        self.address = (host, int(port))
        self.ps = psutil.Process(self.proc.pid)

    def threads(self) -> int:
        return self.ps.num_threads()

    def settled_threads(self) -> int:
        """The thread count once no client connection is open (a handler thread per connection is gone)."""
        poll(lambda: all(c.status == psutil.CONN_LISTEN for c in self.ps.net_connections("tcp")), 30,
             what="the agent to have no open client connection")
        return self.threads()

    def rss_mib(self) -> float:
        return self.ps.memory_info().rss / 2**20

    def client_ports(self) -> set[int]:
        """The peer ports of the connections the agent has accepted."""
        return {c.raddr.port for c in self.ps.net_connections("tcp") if c.raddr}

    def stderr_tail(self) -> str:
        return self.stderr_path.read_text(errors="replace")[-4000:]


@pytest.fixture
def agent(tmp_path) -> Iterator[ReportingDemo]:
    agent = ReportingDemo(tmp_path / "agent.stderr")
    try:
        agent.wait_healthy()
        # The collector's per-GPU workers start with it; wait for them so the baseline is the steady state.
        poll(lambda: agent.threads() >= GPUS + 3, 10, what="main, HTTP, collector and one worker per GPU")
        yield agent
    finally:
        agent.kill()


# -- the load ----------------------------------------------------------------------------------------


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


def report(n: int, reporter: int) -> bytes:
    return json.dumps({"step": n, "step_time_s": 0.5, "tokens": 4096.0, "flops_per_token": 1.4e10, "dtype": "bf16",
                       "job": f"load-{reporter}", "rank": 0, "world_size": 1, "pid": 4000 + reporter}).encode()


INVALID_REPORTS = [  # (what, body, content type, the status it must get); every 10th report is one of these
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
                if conn.sock is not sock:  # http.client reconnects by itself when the server closed
                    if sock is not None:
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
                if n % 10 == 0:
                    what, body, content_type, expected = INVALID_REPORTS[(n // 10) % len(INVALID_REPORTS)]
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


def gpu_up(text: str, openmetrics: bool) -> dict[str, float]:
    families = (openmetrics_families if openmetrics else text_string_to_metric_families)(text)
    up = [s for f in families for s in f.samples if s.name == "roofwatch_gpu_up"]
    values = {s.labels["gpu"]: s.value for s in up}
    assert len(values) == len(up), "duplicate roofwatch_gpu_up series"
    return values


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


# -- past the cap ------------------------------------------------------------------------------------

HOLDERS = 80
PAD = 4000
"""Leading spaces before the JSON of a slow report (valid JSON whitespace): at one per DRIBBLE_S they
last over 15 minutes, far longer than any hold in this test."""


@dataclass
class SlowAnswer:
    status: int | None = None
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    completed_body: bool = False
    error: str | None = None
    port: int = 0
    """The client's own port: how the agent's list of accepted connections names it."""
    connected: threading.Event = field(default_factory=threading.Event)


def slow_report(address: tuple[str, int], release: threading.Event, answer: SlowAnswer, answered: list[int]) -> None:
    """One slow client: report headers at once, then the body a byte per DRIBBLE_S until ``release``.
    The 503 is timed from the moment the client started connecting."""
    body = b" " * PAD + report(1, 0)
    head = (f"POST /api/v1/report HTTP/1.1\r\nHost: {address[0]}\r\nContent-Type: {JSON}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    started = time.perf_counter()
    try:
        with socket.create_connection(address, timeout=CLIENT_TIMEOUT_S) as sock:
            answer.port = sock.getsockname()[1]
            sock.sendall(head)
            answer.connected.set()
            sent = 0
            while not select.select([sock], [], [], DRIBBLE_S)[0]:  # nothing to read: still in flight
                if release.is_set():
                    sock.sendall(body[sent:])
                    answer.completed_body = True
                    break
                if sent < PAD:
                    sock.sendall(body[sent:sent + 1])
                    sent += 1
            response = http.client.HTTPResponse(sock)
            response.begin()
            answer.body = response.read()
            answer.status, answer.headers = response.status, dict(response.headers)
    except (OSError, http.client.HTTPException) as exc:
        answer.error = f"{type(exc).__name__}: {exc}"
    answer.seconds = time.perf_counter() - started
    answer.connected.set()
    answered.append(1)


def test_requests_past_max_concurrent_get_503_at_once_and_the_agent_recovers(agent: ReportingDemo) -> None:
    """The cap is on requests in flight (``exporters.http``: a slot per request, taken after the request
    line and headers are read), not on connections: 80 idle keep-alive connections are all served, and
    of 80 reports held open mid-body exactly 64 hold slots while the other 16, and any scrape meanwhile,
    get 503 at once. Released, the 64 are stored (204) and the agent serves again."""
    baseline_threads = agent.settled_threads()

    # More connections than MAX_CONCURRENT are fine while their requests do not overlap.
    idle = [http.client.HTTPConnection(*agent.address, timeout=CLIENT_TIMEOUT_S) for _ in range(HOLDERS)]
    try:
        for conn in idle:
            conn.request("GET", "/healthz")
            response = conn.getresponse()
            assert (response.status, response.read()[:4]) == (200, b"ok: ")
        threads_with_idle = agent.threads()  # printed: the server runs a thread per connection, idle or not
    finally:
        for conn in idle:
            conn.close()
    poll(lambda: agent.threads() <= baseline_threads, 30, what=f"the agent back to {baseline_threads} threads")

    # 80 reports in flight at once: headers sent, body trickling.
    release = threading.Event()
    answers = [SlowAnswer() for _ in range(HOLDERS)]
    answered: list[int] = []
    clients = [threading.Thread(target=slow_report, args=(agent.address, release, a, answered), daemon=True)
               for a in answers]
    try:
        # One connection at a time, each once the agent has accepted the previous one: its listen backlog
        # is socketserver's default of 5, and a burst past it leaves clients whose connect() returned
        # waiting seconds to tens of seconds to be accepted (a separate defect, see Load.run).
        for client, answer in zip(clients, answers):
            client.start()
            answer.connected.wait(2 * CLIENT_TIMEOUT_S)
            poll(lambda: answer.status is not None or answer.error or answer.port in agent.client_ports(), 30,
                 what=f"the agent to accept connection {answer.port}")
        excess = HOLDERS - MAX_CONCURRENT
        poll(lambda: len(answered) >= excess, CLIENT_TIMEOUT_S, what=f"{excess} requests past the cap to be answered")
        early = [a for a in answers if a.status is not None or a.error]
        assert len(early) == excess and all(a.status == 503 for a in early), [(a.status, a.error) for a in early]
        assert all(a.headers.get("Connection") == "close" and a.body == b"too many concurrent requests\n"
                   for a in early)
        # A 503 means all 64 slots were taken, by slow reports that keep them until released: a scrape now
        # is refused too, at once, and keeps its connection.
        threads_at_cap = agent.threads()
        probe = http.client.HTTPConnection(*agent.address, timeout=CLIENT_TIMEOUT_S)
        for path in ("/metrics", "/healthz"):
            started = time.perf_counter()
            probe.request("GET", path)
            response = probe.getresponse()
            assert (path, response.status, response.read()) == (path, 503, b"too many concurrent requests\n")
            print(f"\n  GET {path} with every slot taken: 503 in {(time.perf_counter() - started) * 1e3:.1f} ms")
        probe_sock = probe.sock
        assert probe_sock is not None
    finally:
        release.set()
        for client in clients:
            client.join(2 * CLIENT_TIMEOUT_S)
    assert not any(c.is_alive() for c in clients), "a slow client never got an answer"

    assert not [a.error for a in answers if a.error], [a.error for a in answers if a.error]
    statuses = Counter(a.status for a in answers)
    assert statuses == {204: MAX_CONCURRENT, 503: HOLDERS - MAX_CONCURRENT}, statuses
    assert all(a.completed_body for a in answers if a.status == 204)
    refused = sorted(a.seconds for a in answers if a.status == 503)

    # Recovered: the probe's own connection is served again, then threads go back to the baseline.
    def metrics_served() -> str | None:
        probe.request("GET", "/metrics")
        response = probe.getresponse()
        body = response.read()
        return body.decode() if response.status == 200 else None

    text = poll(metrics_served, 10, what="/metrics served again")
    assert probe.sock is probe_sock, "the 503s closed the scraper's keep-alive connection"
    probe.close()
    assert gpu_up(text, openmetrics=False) == {str(i): 1.0 for i in range(GPUS)}
    agent.wait_healthy(10)
    poll(lambda: agent.threads() <= baseline_threads, 30, what=f"the agent back to {baseline_threads} threads")
    print(f"  {HOLDERS - MAX_CONCURRENT} reports past the cap: 503 within {refused[0] * 1e3:.1f}-"
          f"{refused[-1] * 1e3:.1f} ms of connecting; agent threads: baseline {baseline_threads}, "
          f"{threads_with_idle} with {HOLDERS} idle keep-alive connections, {threads_at_cap} with "
          f"{MAX_CONCURRENT} reports in flight, {agent.threads()} after")
