"""The VictoriaMetrics side of the fleet benchmark: Debian's victoria-metrics 1.79.5 and vmalert.

Why VictoriaMetrics: promtool backfills about 150,000 samples/s on the 2-core machine, slower than a
32,000-GPU fleet produces them (2.6 million series every 15 s), while VictoriaMetrics imports the
same history several times faster, so its store can be built at the largest size, with the history
ending at "now" and a real vmalert evaluating the shipped rule file live over it.

The history is :mod:`benchmarks.fleet_data`'s, streamed as JSON-line import records (one line per
series per window, its value and timestamp arrays formatted once per value sequence), posted in
chunks by a sender thread while the next chunk is generated; nothing is held beyond two chunks and
nothing is written to disk but VictoriaMetrics' own store.
"""

from __future__ import annotations

import http.client
import http.server
import json
import queue
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Callable, Iterable, Iterator

from benchmarks import fleet_data
from benchmarks.fleet_prometheus import api_get, timed_get, tool
from benchmarks.own_port import listening_port

CHUNK_BYTES = 16 << 20
"""One import request's body: large enough that per-request costs vanish, small enough that two in
flight (one generating, one sending) stay far below the machine's memory."""


def rss_bytes(pid: int) -> int:
    """VmRSS of a process from /proc (what the kernel charges it now), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


class Child:
    """A child process logging to a file (a pipe could fill and stall it over a long run)."""

    def __init__(self, argv: list[str], log: Path) -> None:
        self.log = log
        self._log = log.open("a")
        self.process = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT)

    def wait_http(self, url: str, what: str, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with urllib.request.urlopen(url, timeout=5) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                pass
            if self.process.poll() is not None:
                raise RuntimeError(f"{what} exited ({self.process.returncode}): {self.log.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} not up in {timeout_s:.0f} s")
            time.sleep(0.3)

    def rss_bytes(self) -> int:
        return rss_bytes(self.process.pid)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()


class VictoriaServer(Child):
    """Single-node VictoriaMetrics over ``workdir/vm-data`` with limits raised to fleet size.

    The defaults refuse a fleet: 300,000 unique series per query (a 32,000-GPU fleet has 2.6 million
    raw series), 30 s per query. ``-search.disableCache``: the history is written into the past,
    which the rollup cache assumes never changes (VictoriaMetrics' own advice for backfills); a
    dashboard's repeated query then costs what its first one does, as in Prometheus."""

    def __init__(self, workdir: Path, *, memory_percent: float = 40.0) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.data = workdir / "vm-data"
        super().__init__([tool("victoria-metrics"), "-httpListenAddr=127.0.0.1:0", f"-storageDataPath={self.data}",
                          "-retentionPeriod=100y", "-search.disableCache", "-loggerLevel=WARN",
                          "-search.maxUniqueTimeseries=50000000", "-search.maxQueryDuration=15m",
                          "-search.maxSamplesPerQuery=10000000000", "-search.maxSeries=50000000",
                          "-search.maxTagValues=10000000", "-search.maxQueueDuration=15m",
                          f"-memory.allowedPercent={memory_percent:g}"], workdir / "victoria-metrics.log")
        self.url = f"http://127.0.0.1:{listening_port(self.process, 'victoria-metrics')}"  # benchmarks/own_port.py
        self.wait_http(self.url + "/health", "victoria-metrics")

    def api(self, path: str, **params: object) -> object:
        return api_get(self.url, path, params, 1800)

    def timed(self, path: str, **params: object) -> tuple[float, object]:
        return timed_get(self.url, path, params, 1800)

    def flush(self) -> None:
        """Make everything imported searchable now (otherwise within about a second)."""
        with urllib.request.urlopen(self.url + "/internal/force_flush", timeout=600) as answer:
            answer.read()

    def own_metric(self, name: str) -> float:
        with urllib.request.urlopen(self.url + "/metrics", timeout=60) as answer:
            text = answer.read().decode()
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith(name + " ") or line.startswith(name + "{"))


def _post(conn: http.client.HTTPConnection, path: str, body: bytes) -> None:
    conn.request("POST", path, body=body, headers={"Content-Type": "application/octet-stream"})
    answer = conn.getresponse()
    text = answer.read()
    if answer.status not in (200, 204):
        raise RuntimeError(f"import {path} answered {answer.status}: {text[:500]!r}")


def post_chunks(url: str, path: str, chunks: Iterable[bytes], senders: int = 1) -> None:
    """POST every chunk to ``url + path`` from ``senders`` threads while the caller's generator
    makes the next ones (the queue holds two per sender: memory stays bounded)."""
    parsed = urllib.parse.urlparse(url)
    work: queue.Queue[bytes | None] = queue.Queue(maxsize=2 * senders)
    errors: list[BaseException] = []

    def send() -> None:
        conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=1800)
        try:
            while (body := work.get()) is not None:
                if not errors:
                    try:
                        _post(conn, path, body)
                    except BaseException as err:  # reported by the caller, after the queue drains
                        errors.append(err)
        finally:
            conn.close()

    threads = [threading.Thread(target=send, daemon=True) for _ in range(senders)]
    for t in threads:
        t.start()
    try:
        for chunk in chunks:
            if errors:
                break
            work.put(chunk)
    finally:
        for _ in threads:
            work.put(None)
        for t in threads:
            t.join()
    if errors:
        raise errors[0]


def _chunked(lines: Iterator[str], size: int) -> Iterator[bytes]:
    buf: list[str] = []
    held = 0
    for line in lines:
        buf.append(line)
        held += len(line)
        if held >= size:
            yield "".join(buf).encode()
            buf, held = [], 0
    if buf:
        yield "".join(buf).encode()


class _TextLines:
    """fleet_data.write_window's Prometheus-text output as a stream of strings (a file-like sink)."""

    def __init__(self) -> None:
        self.parts: list[str] = []

    def write(self, text: str) -> None:
        self.parts.append(text)


def text_window(template: list[fleet_data.Series], shape: fleet_data.FleetShape, ts: list[int],
                start_ts: int) -> Iterator[str]:
    """The window in the Prometheus text format (a line per sample, millisecond timestamps), per
    family: the import format VictoriaMetrics shares with Prometheus, kept to compare speeds."""
    single = fleet_data.single_class(template)
    for s in template:
        sink = _TextLines()
        fleet_data.write_window(sink, [s], shape, ts, start_ts, patterns=fleet_data.MillisecondPatterns, single=single)
        yield "".join(p for p in sink.parts if not p.startswith("# "))


def import_span(vm: VictoriaServer, template: list[fleet_data.Series], shape: fleet_data.FleetShape,
                ts: list[int], start_ts: int, *, fmt: str = "json", window_s: int = 1800, senders: int = 1,
                log: Callable[[str], None] = print) -> tuple[int, float]:
    """Import the fleet over timestamps ``ts`` (values as if the history began at ``start_ts``);
    returns (samples, seconds). Windows of ``window_s``: a series is one JSON line per window."""
    started = time.perf_counter()
    samples = 0
    path = "/api/v1/import" if fmt == "json" else "/api/v1/import/prometheus"
    make = fleet_data.json_window if fmt == "json" else text_window
    for part in fleet_data.windows(shape, window_s, ts):
        post_chunks(vm.url, path, _chunked(make(template, shape, part, start_ts), CHUNK_BYTES), senders)
        samples += len(part) * len(template) * shape.nodes
        rate = samples / (time.perf_counter() - started)
        log(f"  imported {samples:,} samples up to {time.strftime('%H:%M:%S', time.localtime(part[-1]))}"
            f" ({rate:,.0f} samples/s)")
    vm.flush()
    return samples, time.perf_counter() - started


def span(t_from: int, t_to: int, step_s: int) -> list[int]:
    """Timestamps on the step grid in (t_from, t_to]."""
    first = (t_from // step_s + 1) * step_s
    return list(range(first, t_to + 1, step_s))


class _Sink(http.server.BaseHTTPRequestHandler):
    """An Alertmanager that accepts everything: vmalert must notify somewhere, and a fleet's alerts
    are not what is measured."""

    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


class VmAlert(Child):
    """vmalert evaluating ``rules`` live against ``vm`` and writing results back, as deployed.

    The remote-write queue is raised from 100,000: a per-GPU recording group at 32,000 GPUs writes
    more than that per evaluation, and a full queue drops results silently."""

    def __init__(self, workdir: Path, rules: Path, vm: VictoriaServer, eval_s: float) -> None:
        self.sink = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
        threading.Thread(target=self.sink.serve_forever, daemon=True).start()
        super().__init__([tool("vmalert"), f"-rule={rules}", f"-datasource.url={vm.url}", f"-remoteWrite.url={vm.url}",
                          f"-notifier.url=http://127.0.0.1:{self.sink.server_address[1]}",
                          f"-evaluationInterval={int(eval_s)}s", "-httpListenAddr=127.0.0.1:0",
                          "-remoteWrite.maxQueueSize=20000000", "-remoteWrite.maxBatchSize=10000",
                          "-remoteWrite.concurrency=2", "-loggerLevel=WARN"], workdir / "vmalert.log")
        self.url = f"http://127.0.0.1:{listening_port(self.process, 'vmalert')}"  # benchmarks/own_port.py
        self.wait_http(self.url + "/health", "vmalert")

    def iterations(self) -> dict[str, tuple[float, int]]:
        """Per group: (sum of evaluation seconds, evaluations) from vmalert's own summary
        ``vmalert_iteration_duration_seconds``."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=60) as answer:
            text = answer.read().decode()
        out: dict[str, list[float]] = {}
        for line in text.splitlines():
            for suffix, index in (("_sum{", 0), ("_count{", 1)):
                if line.startswith("vmalert_iteration_duration_seconds" + suffix):
                    group = line.split('group="', 1)[1].split('"', 1)[0]
                    out.setdefault(group, [0.0, 0.0])[index] = float(line.rsplit(" ", 1)[1])
        return {g: (v[0], int(v[1])) for g, v in out.items()}

    def group_timings(self, evaluations: int, timeout_s: float, poll_s: float = 0.3) -> dict[str, list[float]]:
        """Each group's evaluation seconds, one per evaluation, from the summary's sum and count
        between polls (a poll that saw two evaluations records their mean twice); the first
        evaluation is dropped (it creates every recorded series). Until every group has
        ``evaluations`` or ``timeout_s`` passes."""
        last: dict[str, tuple[float, int]] = {}
        out: dict[str, list[float]] = {}
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for group, (total, count) in self.iterations().items():
                before = last.get(group)
                if before is None or count == 0:
                    if count:
                        last[group] = (total, count)
                    out.setdefault(group, [])
                    continue
                if count > before[1]:
                    new = count - before[1]
                    out[group] += [(total - before[0]) / new] * new
                    last[group] = (total, count)
            if out and all(len(v) >= evaluations for v in out.values()):
                break
            time.sleep(poll_s)
        return out

    def rule_errors(self) -> list[str]:
        with urllib.request.urlopen(self.url + "/api/v1/rules", timeout=60) as answer:
            groups = json.loads(answer.read())["data"]["groups"]
        return sorted({f"{g['name']}: {r['name']}: {r['lastError']}" for g in groups for r in g["rules"]
                       if r.get("lastError")})

    def stop(self) -> None:
        super().stop()
        self.sink.shutdown()
        self.sink.server_close()


def rfc3339(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def replay_recordings(vm: VictoriaServer, rules: Path, workdir: Path, start: int, end: int, eval_s: int,
                      log: Callable[[str], None] = print) -> float:
    """vmalert's replay of the recording rules over [start, end] every ``eval_s``, a dependency level
    at a time (:func:`fleet_queries.levels`; VictoriaMetrics flushed between levels, so a level reads
    what the one below wrote): the history the hourly group's rules read. Returns the seconds taken."""
    from benchmarks import fleet_queries

    started = time.perf_counter()
    for level, chosen in enumerate(fleet_queries.levels(fleet_queries.rules(rules))):
        path = fleet_queries.rule_file(chosen, workdir / f"replay-level-{level}.yml")
        run = subprocess.run([tool("vmalert"), f"-rule={path}", f"-datasource.url={vm.url}", f"-remoteWrite.url={vm.url}",
                              f"-replay.timeFrom={rfc3339(start)}", f"-replay.timeTo={rfc3339(end)}",
                              f"-evaluationInterval={eval_s}s", f"-datasource.queryStep={eval_s}s",
                              "-replay.maxDatapointsPerQuery=10000", "-replay.rulesDelay=100ms",
                              "-replay.disableProgressBar", "-remoteWrite.maxQueueSize=20000000",
                              "-remoteWrite.maxBatchSize=10000", "-loggerLevel=WARN"],
                             capture_output=True, text=True)
        if run.returncode:
            raise RuntimeError(f"vmalert replay of level {level} failed: {(run.stdout + run.stderr)[-2000:]}")
        vm.flush()
        log(f"  replayed recording rules, level {level}: {len(chosen)} rules")
    return time.perf_counter() - started
