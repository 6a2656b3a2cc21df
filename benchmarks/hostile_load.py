"""The hostile-client load: hundreds of attacking connections and a few honest scrapers against a real agent.

Shared by the suite (tests/test_load_hostile.py asserts its promises) and ``./dev.sh bench``
(benchmarks/hostile.py reports its figures with budgets). The agent is a real ``roofwatch demo``
process with TLS and basic auth on (certificates made with openssl); the attackers run on an asyncio
loop in this process, spread over loopback source addresses 127.0.1.x, and reconnect whenever the agent
closes them, so the number of hostile connections stays at its target the whole time:

- ``idle``: TCP connected, nothing sent (not even a TLS hello);
- ``idle-tls``: handshake done, no request;
- ``slowloris``: a request line, then a header line a second, never the blank line;
- ``slow-body``: a whole head announcing a body, then a body byte a second;
- ``pipeline``: requests sent back to back as fast as the socket takes them, answers never read.

The honest scrapers (threads, keep-alive, the right password, as Prometheus) scrape ``/metrics`` once a
second each and record every latency. Only loopback addresses are ever contacted.
"""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import multiprocessing
import os
import queue
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import bcrypt
import psutil

KINDS = ("idle", "idle-tls", "slowloris", "slow-body", "pipeline")
PASSWORD = "honest scraper"
ATTACKER_ADDRESSES = 20
"""127.0.1.1 .. 127.0.1.20: 25 connections each for 500, under the per-address cap."""
REPO = Path(__file__).resolve().parents[1]


def make_pki(directory: Path) -> None:
    """A self-signed certificate for 127.0.0.1 and a web config with TLS and one basic-auth user."""
    run = lambda *args: subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)  # noqa: E731
    run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", "tls.key",
        "-out", "tls.crt", "-subj", "/CN=roofwatch", "-days", "2", "-addext", "subjectAltName=IP:127.0.0.1")
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=10)).decode()
    (directory / "web.yml").write_text(json.dumps({
        "tls_server_config": {"cert_file": "tls.crt", "key_file": "tls.key"},
        "basic_auth_users": {"prometheus": hashed}}))


@dataclass
class Samples:
    """What the run saw of the agent and of the honest scrapers."""

    latencies: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    rss_mib: list[float] = field(default_factory=list)
    hostile_open: list[int] = field(default_factory=list)
    cpu_s: float = 0.0
    attacks: dict[str, int] = field(default_factory=dict)
    """Connections each kind opened over the run (the agent closing them makes them reconnect)."""


class Agent:
    """The agent under attack: ``roofwatch demo`` with TLS and basic auth, or another command (the
    benchmark's comparison with the old listener runs the same load against an older checkout)."""

    def __init__(self, workdir: Path, command: list[str] | None = None, cwd: Path | None = None) -> None:
        make_pki(workdir)
        env = {k: v for k, v in os.environ.items() if not k.startswith("ROOFWATCH_")}
        args = ["demo", "--listen", "127.0.0.1:0", "--web-config-file", str(workdir / "web.yml")]
        self.stderr = open(workdir / "agent.stderr", "w")
        self.proc = subprocess.Popen((command or [sys.executable, "-m", "agent.app.cli"]) + args, cwd=cwd or REPO,
                                     stdout=subprocess.PIPE, stderr=self.stderr, text=True, env=env)
        line = self.proc.stdout.readline()
        if "https://" not in line:
            self.stop()
            raise RuntimeError(f"agent printed no URL: {line!r}")
        self.port = int(line.split("https://127.0.0.1:", 1)[1].split("/", 1)[0])
        self.ps = psutil.Process(self.proc.pid)
        self.client_tls = ssl.create_default_context(cafile=str(workdir / "tls.crt"))

    def scrape(self, conn: http.client.HTTPSConnection | None = None) -> tuple[int, http.client.HTTPSConnection]:
        conn = conn or http.client.HTTPSConnection("127.0.0.1", self.port, timeout=10, context=self.client_tls)
        token = base64.b64encode(f"prometheus:{PASSWORD}".encode()).decode()
        conn.request("GET", "/metrics", headers={"Authorization": f"Basic {token}", "Accept-Encoding": "gzip"})
        response = conn.getresponse()
        response.read()
        return response.status, conn

    def threads(self) -> int:
        return self.ps.num_threads()

    def fds(self) -> int:
        return self.ps.num_fds()

    def rss_mib(self) -> float:
        return self.ps.memory_info().rss / 2**20

    def cpu_s(self) -> float:
        times = self.ps.cpu_times()
        return times.user + times.system

    def hostile_connections(self) -> int:
        return sum(1 for c in self.ps.net_connections("tcp") if c.raddr and c.raddr.ip.startswith("127.0.1."))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.stderr.close()


class Attackers:
    """``per_kind`` connections of each kind, kept open (reconnecting) until :meth:`stop`.

    They run in a child process with its own event loop: in this process they would hold the GIL
    the honest scrapers' threads need, and the scrapers' latency would measure the rig, not the agent.
    The child is spawned, not forked: a fork copies this process's threads' locks in whatever state they
    are (the scrapers', the sampler's, pytest's), and a second attack in one process once hung that way.
    """

    def __init__(self, port: int, per_kind: int) -> None:
        self.port = port
        self.per_kind = per_kind
        self.opened = {kind: 0 for kind in KINDS}
        context = multiprocessing.get_context("spawn")
        self._stopping = context.Event()
        self._results = context.Queue()
        self._process = context.Process(target=_attack_in_child, name="attackers", daemon=True,
                                        args=(port, per_kind, self._stopping, self._results))

    def start(self) -> None:
        self._process.start()

    def stop(self) -> None:
        self._stopping.set()
        try:
            self.opened = self._results.get(timeout=30)
        except queue.Empty:
            pass
        self._process.join(10)
        if self._process.is_alive():
            self._process.kill()


def _attack_in_child(port: int, per_kind: int, stopping, results) -> None:
    """The attackers' process: the attack until ``stopping`` is set, then how many connections each kind opened."""
    results.put(_AttackLoop(port, per_kind, stopping).run())


class _AttackLoop:
    """The hostile connections, on one event loop in the attackers' process."""

    def __init__(self, port: int, per_kind: int, stopping) -> None:
        self.port = port
        self.per_kind = per_kind
        self.opened = {kind: 0 for kind in KINDS}
        self._stopping = stopping
        self._tls = ssl.create_default_context()
        self._tls.check_hostname = False
        self._tls.verify_mode = ssl.CERT_NONE
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None

    def run(self) -> dict[str, int]:
        """The attack until stopped; the loop is left open (the process ends next), so connections abandoned
        mid-cancellation close quietly instead of each logging that their loop is closed."""
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._main())
        return self.opened

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        tasks = [asyncio.ensure_future(self._keep(kind, i)) for kind in KINDS for i in range(self.per_kind)]
        while not self._stopping.is_set():
            await asyncio.sleep(0.2)
        self._stop.set()
        for task in tasks:
            task.cancel()
        # asyncio.wait_for (Python <= 3.11) may swallow a cancellation that lands as its inner call ends;
        # the loops below also check the stop flag, and whatever still runs after a moment is abandoned.
        await asyncio.wait(tasks, timeout=2.0)

    async def _keep(self, kind: str, i: int) -> None:
        """One hostile connection of ``kind``, opened again each time the agent closes it."""
        source = f"127.0.1.{1 + (i + KINDS.index(kind) * self.per_kind) % ATTACKER_ADDRESSES}"
        await asyncio.sleep(i * 0.01)  # a ramp, not a SYN flood: the point is what the connections do
        while not self._stop.is_set():
            self.opened[kind] += 1
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection(
                    "127.0.0.1", self.port, local_addr=(source, 0),
                    ssl=None if kind == "idle" else self._tls, server_hostname=None if kind == "idle" else "x"), 15)
                try:
                    await getattr(self, "_" + kind.replace("-", "_"))(reader, writer)
                finally:
                    writer.transport.abort()
            except (OSError, asyncio.TimeoutError, ssl.SSLError, EOFError):
                await asyncio.sleep(0.2)  # refused or cut: back in a moment

    async def _idle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1)  # until the agent closes it

    _idle_tls = _idle

    async def _slowloris(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        await self._drip(reader, writer, b"X-Slow: 1\r\n")

    async def _slow_body(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"POST /api/v1/report HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 4000\r\n\r\n")
        await self._drip(reader, writer, b" ")

    async def _drip(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, piece: bytes) -> None:
        """A piece a second until the agent answers or closes."""
        while not self._stop.is_set():
            try:
                if await asyncio.wait_for(reader.read(1), 1.0) == b"":
                    return
                return  # answered (408 or a refusal): done, reconnect
            except asyncio.TimeoutError:
                writer.write(piece)

    async def _pipeline(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        burst = (b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" + b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n") * 10
        while not reader.at_eof() and not self._stop.is_set():
            writer.write(burst)
            try:
                await asyncio.wait_for(writer.drain(), 5.0)  # blocks once the agent stops reading
            except asyncio.TimeoutError:
                pass
            await asyncio.sleep(0.05)


def honest_scrapers(agent: Agent, count: int, seconds: float, samples: Samples) -> None:
    """``count`` scrapers, one scrape a second each, keep-alive like Prometheus; blocks for ``seconds``."""
    deadline = time.monotonic() + seconds
    lock = threading.Lock()

    def scraper(offset: float) -> None:
        conn: http.client.HTTPSConnection | None = None
        next_at = time.monotonic() + offset
        while next_at < deadline:
            time.sleep(max(0.0, next_at - time.monotonic()))
            started = time.perf_counter()
            try:
                status, conn = agent.scrape(conn)
                failure = None if status == 200 else f"status {status}"
            except (OSError, http.client.HTTPException) as exc:
                failure, conn = f"{type(exc).__name__}: {exc}", None
            elapsed = time.perf_counter() - started
            with lock:
                samples.latencies.append(elapsed)
                if failure:
                    samples.failures.append(failure)
            next_at += 1.0

    threads = [threading.Thread(target=scraper, args=(i / count,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(seconds + 30)


def run(agent: Agent, *, attackers: int, scrapers: int, seconds: float,
        on_tick: Callable[[Samples], None] | None = None) -> Samples:
    """The attack for ``seconds`` with ``scrapers`` honest scrapers; the agent is sampled twice a second."""
    samples = Samples()
    attack = Attackers(agent.port, attackers // len(KINDS))
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.5):
            try:
                samples.rss_mib.append(agent.rss_mib())
                samples.hostile_open.append(agent.hostile_connections())
            except psutil.Error:
                return
            if on_tick:
                on_tick(samples)

    cpu_before = agent.cpu_s()
    attack.start()
    poll_until = time.monotonic() + 20
    while agent.hostile_connections() < 0.8 * attackers and time.monotonic() < poll_until:
        time.sleep(0.2)  # the attack is at strength before the honest scrapes start counting
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        honest_scrapers(agent, scrapers, seconds, samples)
    finally:
        stop.set()
        attack.stop()
        sampler.join(10)
    samples.cpu_s = agent.cpu_s() - cpu_before
    samples.attacks = dict(attack.opened)
    return samples


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def workdir() -> Path:
    return Path(tempfile.mkdtemp(prefix="rw-hostile-"))
