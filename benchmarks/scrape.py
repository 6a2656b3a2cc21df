"""What serving ``/metrics`` costs for a full 8-GPU node with 64 GPU processes.

The agent renders each published snapshot once and then serves the cached bytes, so the figure that
bounds its CPU is the *uncached* render of a fresh snapshot (one per collection cycle); the served
latency through the real HTTP server is what a scraper sees between cycles. The render is compared
with prometheus_client's own ``generate_latest`` over a registry of ordinary Gauge/Counter/Info
objects holding exactly the same series, measured in the same run, so the ratio says how much our
snapshot-to-families path adds on top of the encoder everyone pays for, whatever the machine.

This module holds the timing loops and the figures; the node measured is built in
:mod:`benchmarks.scrape_snapshot` and the baseline registry in :mod:`benchmarks.scrape_baseline`.

Run alone with ``.venv/bin/python -m benchmarks.scrape [--quick]``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import http.client
import statistics
import threading
import time
from typing import Callable, Iterator

from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from agent.model import NodeSnapshot
from benchmarks.figures import Figure
from benchmarks.scrape_baseline import checked_baseline, no_created_series, series
from benchmarks.scrape_snapshot import GPUS, PROCS_PER_GPU, fresh, node_snapshot
from exporters.http import AgentHTTPServer
from exporters.prometheus import ExpositionCache, SnapshotCollector

GROUP = "scrape"
RENDER_P99_BUDGET_MS = 5.0
RATIO_BUDGET = 2.0
BASELINE_NAME = "prometheus_client generate_latest, same series"

TEXT_ACCEPT = ""
"""No Accept header: prometheus_client's default text format 0.0.4, the agent's default path."""
OPENMETRICS_ACCEPT = "application/openmetrics-text; version=1.0.0"
"""What Prometheus 3 asks for first in its default ``scrape_protocols``."""

SERVED_WARMUP = 10
"""The served path only reads cached bytes; a few requests warm the connection and the handler."""
MIN_SAMPLES = 30
"""A loop cut short by its deadline still measures at least this many requests."""

Timings = list[int]
"""Nanoseconds per iteration, in run order."""


# -- timing ---------------------------------------------------------------------------------------

def timed(step: Callable[[int], object], n: int, warmup: int, deadline_s: float | None = None) -> Timings:
    """Run ``step(i)`` ``warmup`` times unmeasured, then ``n`` times measured one by one.

    ``deadline_s`` stops the measured loop early (the caller reports how many ran), so a pathological
    server cannot stretch the whole suite past its time budget.
    """
    for i in range(warmup):
        step(i)
    gc.collect()  # garbage from setup and warm-up must not land in the measured loop
    out: Timings = []
    clock = time.perf_counter_ns
    stop = None if deadline_s is None else clock() + int(deadline_s * 1e9)
    for i in range(warmup, warmup + n):
        started = clock()
        step(i)
        ended = clock()
        out.append(ended - started)
        if stop is not None and ended > stop and len(out) >= MIN_SAMPLES:
            break
    return out


@dataclasses.dataclass(frozen=True)
class Percentiles:
    """The two quantiles the budget speaks of, and how many timings they summarise."""

    p50_ms: float
    p99_ms: float
    n: int

    @classmethod
    def of(cls, ns: Timings) -> "Percentiles":
        cuts = statistics.quantiles(ns, n=100)
        return cls(cuts[49] / 1e6, cuts[98] / 1e6, len(ns))


def interleaved(steps: dict[str, Callable[[int], object]], n: int, warmup: int) -> dict[str, Timings]:
    """Each iteration runs every step once, in turn, each timed on its own.

    Taking turns (rather than one loop after another) means a neighbour's load on a shared machine
    hits our render and the baseline alike, so their ratio stays meaningful. The order rotates
    every iteration: a full garbage collection (tens of ms, every few dozen renders) lands on
    whichever step allocates when it falls due, and no step should always follow the baseline's
    garbage.
    """
    for i in range(warmup):
        for step in steps.values():
            step(i)
    gc.collect()  # garbage from setup and warm-up must not land in the measured loop
    out: dict[str, Timings] = {name: [] for name in steps}
    order = list(steps.items())
    clock = time.perf_counter_ns
    for i in range(warmup, warmup + n):
        turn = i % len(order)
        for name, step in order[turn:] + order[:turn]:
            started = clock()
            step(i)
            out[name].append(clock() - started)
    return out


def uncached_render(snapshot: NodeSnapshot, accept: str, count: int) -> Callable[[int], object]:
    """Step ``i`` is ``ExpositionCache.render`` exactly as the HTTP handler calls it, for a snapshot
    with a sequence number not seen before, so nothing comes from the cache."""
    encoder, content_type = choose_encoder(accept)
    snapshots = [fresh(snapshot, snapshot.sequence + 1 + i) for i in range(count)]  # made outside the clock
    current = {"index": 0}
    cache = ExpositionCache(lambda: snapshots[current["index"]])

    def step(i: int) -> object:
        current["index"] = i
        return cache.render(encoder, content_type)

    return step


def registry_render(registry: Collector) -> Callable[[int], object]:
    """The baseline: prometheus_client's text encoder over its own metric objects."""
    encoder, _ = choose_encoder(TEXT_ACCEPT)
    return lambda _: encoder(registry)


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """The heap as the agent would have it after ``gc.freeze()`` at start-up.

    A full collection walks every tracked object in the process (here ~20 ms), and the render's
    short-lived samples make one fall due every few dozen renders, so the default p99 is mostly
    that walk. Frozen, full collections only see what the render itself left behind; the figure
    tells the render's own tail from the cost of the rest of the heap.
    """
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@contextlib.contextmanager
def serving(snapshot: NodeSnapshot) -> Iterator[AgentHTTPServer]:
    """The real agent server on a free loopback port, in a thread, shut down afterwards."""
    server = AgentHTTPServer(("127.0.0.1", 0), lambda: snapshot, stale_after_s=3600.0)
    thread = threading.Thread(target=server.serve_forever, name="bench-http", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5.0)


def served(server: AgentHTTPServer, headers: dict[str, str], n: int, deadline_s: float) -> tuple[Timings, int]:
    """GET /metrics over one keep-alive connection, as Prometheus does; returns timings and body size."""
    host, port = server.server_address[:2]
    conn = http.client.HTTPConnection(str(host), int(port), timeout=10)
    size = 0

    def step(_: int) -> object:
        nonlocal size
        conn.request("GET", "/metrics", headers=headers)
        response = conn.getresponse()
        body = response.read()
        if response.status != 200:
            raise RuntimeError(f"/metrics answered {response.status}")
        size = len(body)
        return body

    try:
        return timed(step, n, SERVED_WARMUP, deadline_s), size
    finally:
        conn.close()


# -- the run --------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Results:
    """Everything one run measured, before it is turned into figures."""

    series: int
    size: int
    gzip_size: int
    ours: Percentiles
    theirs: Percentiles
    openmetrics: Percentiles
    unfrozen: Percentiles
    plain: Percentiles
    zipped: Percentiles


def run(quick: bool = False) -> list[Figure]:
    """All scrape figures, measured in this process in one go."""
    n, warmup, deadline_s = (300, 30, 2.0) if quick else (2000, 50, 3.0)
    snapshot = node_snapshot()
    text = checked_render(snapshot, TEXT_ACCEPT)
    checked_render(snapshot, OPENMETRICS_ACCEPT)
    registry = checked_baseline(text.decode())

    # As the agent runs: it freezes its start-up heap (agent.app.cli), so both sides are measured so.
    with frozen_heap(), no_created_series():
        renders = interleaved({"ours": uncached_render(snapshot, TEXT_ACCEPT, warmup + n),
                               "theirs": registry_render(registry),
                               "openmetrics": uncached_render(snapshot, OPENMETRICS_ACCEPT, warmup + n)}, n, warmup)
    ours, theirs, openmetrics = (Percentiles.of(renders[k]) for k in ("ours", "theirs", "openmetrics"))
    unfrozen_n = max(n // 4, 150)  # a supplementary figure: fewer turns keep the full run near a minute
    step = uncached_render(snapshot, TEXT_ACCEPT, warmup + unfrozen_n)
    unfrozen = Percentiles.of(interleaved({"ours": step}, unfrozen_n, warmup)["ours"])
    with serving(snapshot) as server:
        plain_ns, plain_size = served(server, {}, n, deadline_s)
        gzip_ns, gzip_size = served(server, {"Accept-Encoding": "gzip"}, n, deadline_s)
    if plain_size != len(text):
        raise RuntimeError(f"served {plain_size} bytes, rendered {len(text)}")
    return figures(Results(len(series(text.decode())), len(text), gzip_size, ours, theirs, openmetrics, unfrozen,
                           Percentiles.of(plain_ns), Percentiles.of(gzip_ns)))


def checked_render(snapshot: NodeSnapshot, accept: str) -> bytes:
    """What the agent serves, refused unless it is byte for byte what prometheus_client's encoder
    writes for the same families (the agent may encode them its own way, never differently)."""
    encoder, content_type = choose_encoder(accept)
    ours = ExpositionCache(lambda: snapshot).render(encoder, content_type)
    if ours != encoder(SnapshotCollector(lambda: snapshot)):
        raise RuntimeError(f"the rendering for Accept {accept!r} differs from prometheus_client's")
    return ours


def figures(r: Results) -> list[Figure]:
    shape = f"{GPUS} GPUs, {GPUS * PROCS_PER_GPU} processes"
    served_note = "AgentHTTPServer, keep-alive, cached snapshot"
    gzip_note = "Accept-Encoding: gzip (compressed once per snapshot)"
    registry_note = "prometheus_client Gauge/Counter/Info"
    return [
        Figure(GROUP, "series exposed", r.series, "series", note=shape),
        Figure(GROUP, "exposition size", r.size, "bytes", note=f"text 0.0.4; gzip level 1: {r.gzip_size:,} bytes"),
        Figure(GROUP, "render p50 (fresh snapshot, text)", r.ours.p50_ms, "ms", baseline=r.theirs.p50_ms,
               baseline_name=BASELINE_NAME, note=f"ExpositionCache.render, new sequence each time; n={r.ours.n}"),
        Figure(GROUP, "render p99 (fresh snapshot, text)", r.ours.p99_ms, "ms", budget=RENDER_P99_BUDGET_MS,
               baseline=r.theirs.p99_ms, baseline_name=BASELINE_NAME,
               note=f"{shape}; n={r.ours.n}; start-up heap frozen, as the agent runs"),
        Figure(GROUP, "render p99 / generate_latest p99", r.ours.p99_ms / r.theirs.p99_ms, "x", budget=RATIO_BUDGET,
               note=f"same run, same series, taking turns; p50s: {r.ours.p50_ms / r.theirs.p50_ms:.2f}x"),
        Figure(GROUP, "generate_latest p50 (registry)", r.theirs.p50_ms, "ms", note=f"{registry_note}; n={r.theirs.n}"),
        Figure(GROUP, "generate_latest p99 (registry)", r.theirs.p99_ms, "ms", note=f"{registry_note}; n={r.theirs.n}"),
        Figure(GROUP, "render p99 (fresh snapshot, text, heap not frozen)", r.unfrozen.p99_ms, "ms",
               note=f"without gc.freeze() every full collection walks the start-up heap; "
                    f"p50 {r.unfrozen.p50_ms:.3g} ms; n={r.unfrozen.n}"),
        Figure(GROUP, "render p50 (fresh snapshot, OpenMetrics)", r.openmetrics.p50_ms, "ms",
               note=f"Prometheus 3's first choice; n={r.openmetrics.n}"),
        Figure(GROUP, "render p99 (fresh snapshot, OpenMetrics)", r.openmetrics.p99_ms, "ms",
               note=f"Prometheus 3's first choice; n={r.openmetrics.n}"),
        Figure(GROUP, "served GET /metrics p50", r.plain.p50_ms, "ms", note=f"{served_note}; n={r.plain.n}"),
        Figure(GROUP, "served GET /metrics p99", r.plain.p99_ms, "ms", note=f"{served_note}; n={r.plain.n}"),
        Figure(GROUP, "served GET /metrics gzip p50", r.zipped.p50_ms, "ms", note=f"{gzip_note}; n={r.zipped.n}"),
        Figure(GROUP, "served GET /metrics gzip p99", r.zipped.p99_ms, "ms", note=f"{gzip_note}; n={r.zipped.n}"),
    ]


def main() -> None:
    from benchmarks.figures import table

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations (about 15 s)")
    print(table(run(quick=parser.parse_args().quick)))


if __name__ == "__main__":
    main()
