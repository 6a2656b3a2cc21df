"""What serving ``/metrics`` costs for a full 8-GPU node with 64 GPU processes.

The agent renders each published snapshot once and then serves the cached bytes, so the figure that
bounds its CPU is the *uncached* render of a fresh snapshot (one per collection cycle); the served
latency through the real HTTP server is what a scraper sees between cycles. The render is compared
with prometheus_client's own ``generate_latest`` over a registry of ordinary Gauge/Counter/Info
objects holding exactly the same series, measured in the same run, so the ratio says how much our
snapshot-to-families path adds on top of the encoder everyone pays for, whatever the machine.

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

import prometheus_client
import prometheus_client.metrics
from prometheus_client import CollectorRegistry, Counter, Gauge, Info
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from agent.context.host.infiniband import ERROR_COUNTERS
from agent.model import (
    CLOCK_EVENT_REASONS,
    Attribution,
    DeviceState,
    NicPort,
    NodeSnapshot,
    ProcessSample,
    RemappedRows,
    XidCount,
)
from benchmarks.figures import Figure
from exporters import metrics as m
from exporters.http import AgentHTTPServer
from exporters.prometheus import ExpositionCache, SnapshotCollector

GROUP = "scrape"
GPUS = 8
PROCS_PER_GPU = 8
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


# -- the snapshot ---------------------------------------------------------------------------------

def node_snapshot() -> NodeSnapshot:
    """The virtual fleet's 8-GPU node with classification on, filled out to 64 processes.

    A real collector is used (not a hand-built snapshot) so the verdict families are as the agent
    publishes them; every GPU then gets 8 processes with every field known, and the NVIDIA fields
    the virtual backend leaves out (ECC, remapped rows, throttle time, XIDs) plus 8 InfiniBand
    ports are filled in, so every family a real H100 node exports has series.
    """
    from agent.app.cli import _make_collector, _open
    from agent.app.config import Settings

    settings = Settings(backend="virtual")
    collector = _make_collector(settings, _open(settings))
    try:
        collector.collect_once()
        snapshot = collector.collect_once()  # the second cycle has rates and two-sample (GPM) values
    finally:
        collector.stop()
    if len(snapshot.devices) != GPUS or len(snapshot.verdicts) != GPUS:
        raise RuntimeError(f"expected {GPUS} GPUs with verdicts, got {len(snapshot.devices)} / {len(snapshot.verdicts)}")
    devices = tuple(_full_device(index, device) for index, device in enumerate(snapshot.devices))
    nics = tuple(_nic_port(index) for index in range(GPUS))
    return dataclasses.replace(snapshot, devices=devices, nics=nics)


def _full_device(index: int, device: DeviceState) -> DeviceState:
    """One GPU with 8 processes and the fields a real NVML read has that the simulation lacks."""
    sample = device.sample
    if sample is None:
        raise RuntimeError(f"virtual GPU {device.info.gpu} has no sample")
    who = sample.attribution
    sample = dataclasses.replace(
        sample,
        processes=tuple(_process(index, rank) for rank in range(PROCS_PER_GPU)),
        attribution=Attribution(job_id=who.job_id if who else f"job-{index}", user="alice", partition="gpu",
                                namespace="ml-training", pod=f"trainer-{index}", container="main"),
        memory_temperature_c=70.0 + index * 1.37,
        clock_event_time_s={reason: 12.5 * bit + index / 7 for reason, bit in CLOCK_EVENT_REASONS.items()},
        ecc_corrected_errors=3 + index,
        ecc_uncorrected_errors=0,
        remapped_rows=RemappedRows(correctable=index % 2, uncorrectable=0, pending=False, failure=False),
        driver_calls=41,
    )
    xids = (XidCount(xid=31, count=2, last_ts=sample.ts - 600.0),) if index == 3 else ()
    return dataclasses.replace(device, sample=sample, xid_errors=xids)


def _process(gpu: int, rank: int) -> ProcessSample:
    """Distinct pid and name, every field known, values with the digits real readings have."""
    scale = 1.0 + gpu / 97 + rank / 31
    return ProcessSample(
        pid=100_000 + gpu * 1_000 + rank, name=f"{('python', 'torchrun', 'vllm', 'pt_worker')[rank % 4]}-{gpu}-{rank}",
        used_memory_bytes=(rank + 1) * 1_234_567_891, cpu_cores=1.5 * scale, sm_util=0.1 * scale,
        command="python train.py --config big.yaml", user="alice", cpu_main_cores=0.97 * scale,
        cpu_workers_cores=0.53 * scale, workers=rank, cpu_limit_cores=8.0, rss_bytes=3_221_225_472 + rank * 4096,
        io_read_bytes_per_s=1.25e6 * scale, io_write_bytes_per_s=3.3e4 * scale, compute_units=38 + rank,
    )


def _nic_port(index: int) -> NicPort:
    """One HCA port per GPU, as on an 8-rail node, with every error counter present."""
    return NicPort(device=f"mlx5_{index}", port=1, link_layer="InfiniBand", active=True, rate_bytes_per_s=5e10,
                   tx_bytes=1.234e12 * (index + 1), rx_bytes=2.345e12 * (index + 1),
                   events={name: float(position * 17 + index) for position, name in enumerate(ERROR_COUNTERS)})


def fresh(snapshot: NodeSnapshot, sequence: int) -> NodeSnapshot:
    """The same contents under a new sequence number: the render cache treats it as a new cycle's."""
    return dataclasses.replace(snapshot, sequence=sequence)


# -- the baseline registry ------------------------------------------------------------------------

_INFO_KEY_LABELS = frozenset(m.GPU_LABELS + m.NIC_LABELS + ("pid", "process"))
"""Labels that identify an info series (its ``labelnames``); the rest are the info values. The text
format does not say which is which, so the split follows how our families are built."""


@contextlib.contextmanager
def no_created_series() -> Iterator[None]:
    """Counters export ``_created`` by default; ours do not, so the baseline must not either.

    prometheus_client keeps this as a module-wide switch, so it is restored for whatever runs next.
    """
    was = prometheus_client.metrics._use_created  # no public getter
    prometheus_client.disable_created_metrics()
    try:
        yield
    finally:
        if was:
            prometheus_client.enable_created_metrics()


def baseline_registry(exposition: str) -> CollectorRegistry:
    """A registry of standard metric objects holding exactly the series of ``exposition``."""
    registry = CollectorRegistry()
    kinds = {d.name: d.kind for d in m.METRICS}
    defined_labels = {d.name: d.labels for d in m.METRICS}
    for family in text_string_to_metric_families(exposition):
        if kinds.get(family.name) == "info":
            _add_info(registry, family)
        elif family.type == "counter":
            _add_counter(registry, family, defined_labels[family.name + "_total"])
        else:
            _add_gauge(registry, family, defined_labels[family.name])
    return registry


def _label_names(family: Metric, defined: tuple[str, ...]) -> list[str]:
    """From the series when there are any; an empty family still needs labels, or it would export 0."""
    return list(family.samples[0].labels) if family.samples else list(defined)


def _add_gauge(registry: CollectorRegistry, family: Metric, defined: tuple[str, ...]) -> None:
    names = _label_names(family, defined)
    gauge = Gauge(family.name, family.documentation, names, registry=registry)
    for s in family.samples:
        gauge.labels(*(s.labels[n] for n in names)).set(s.value)


def _add_counter(registry: CollectorRegistry, family: Metric, defined: tuple[str, ...]) -> None:
    names = _label_names(family, defined)
    counter = Counter(family.name, family.documentation, names, registry=registry)
    for s in family.samples:
        counter.labels(*(s.labels[n] for n in names)).inc(s.value)


def _add_info(registry: CollectorRegistry, family: Metric) -> None:
    names = [n for n in family.samples[0].labels if n in _INFO_KEY_LABELS] if family.samples else []
    info = Info(family.name.removesuffix("_info"), family.documentation, names, registry=registry)
    for s in family.samples:
        values = {k: v for k, v in s.labels.items() if k not in _INFO_KEY_LABELS}
        (info.labels(*(s.labels[n] for n in names)) if names else info).info(values)


def series(exposition: str) -> set[tuple[str, tuple[tuple[str, str], ...], float]]:
    """Every series with its value, to prove the baseline holds the same ones."""
    return {(s.name, tuple(sorted(s.labels.items())), s.value)
            for family in text_string_to_metric_families(exposition) for s in family.samples}


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


def checked_baseline(text: str) -> CollectorRegistry:
    """The baseline registry, refused unless it exposes exactly our series."""
    registry = baseline_registry(text)
    with no_created_series():
        theirs = prometheus_client.generate_latest(registry).decode()
    if series(theirs) != series(text):
        raise RuntimeError("the baseline registry does not hold the same series as our exposition")
    return registry


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
