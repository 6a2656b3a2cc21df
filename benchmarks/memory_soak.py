"""Memory over a long run with process churn: the agent must not grow while jobs come and go.

The whole agent pipeline (real NVML backend over the fake driver, collector, classifier, and a
scrape every 15 intervals) runs in this process on a hand-driven clock, so 200 000 intervals take
minutes, not days. Every ``churn_every`` intervals each GPU's processes are replaced by new PIDs
(and their number changes), which is what grows per-process caches, label sets and rate state
in an agent that forgets to drop them.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import time
from typing import Any

import psutil
from prometheus_client.exposition import generate_latest

from agent.backends.nvml import NvmlBackend
from agent.backends.nvml_virtual import SimulatedHost
from agent.backends.virtual import VirtualBackend
from agent.classifier.live import LiveClassifier
from agent.collector import Collector
from agent.virtual.clock import ManualClock
from agent.model import GpuSample
from agent.virtual.fake_nvml import FakeNvmlLibrary, load_pynvml
from benchmarks.figures import Figure
from exporters.prometheus import ExpositionCache

MIB = 2**20
T0 = 1_800_000_000.0
SCRAPE_EVERY = 15


class ChurningBackend(VirtualBackend):
    """The virtual node, with every process replaced by a new one each ``churn_every`` seconds."""

    def __init__(self, *args: Any, churn_every_s: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.churn_every_s = churn_every_s

    def sample(self, gpu: str, now: float) -> GpuSample:
        s = super().sample(gpu, now)
        if not s.processes:
            return s
        generation = int((now - T0) // self.churn_every_s)
        keep = 1 + generation % len(s.processes) if len(s.processes) > 1 else 1
        procs = tuple(dataclasses.replace(p, pid=p.pid + 7919 * generation % 4_000_000, name=f"{p.name}-{generation % 97}")
                      for p in s.processes[:keep])
        return dataclasses.replace(s, processes=procs)


def _rss() -> int:
    gc.collect()
    return psutil.Process().memory_info().rss


def run(quick: bool = False, intervals: int | None = None, step_s: float = 1.0, churn_every_s: float = 10.0,
        progress: bool = False) -> list[Figure]:
    total = intervals or (20_000 if quick else 200_000)
    warmup = min(5_000, total // 10)
    clock = ManualClock(T0)
    virtual = ChurningBackend("demo", clock=clock, start_time=T0 - 100, churn_every_s=churn_every_s)
    library = FakeNvmlLibrary(virtual)
    backend = NvmlBackend(load_pynvml(library), host=SimulatedHost(library), events=False,
                          clock=clock, wall=clock, sleep=clock.advance)
    collector = Collector(backend, node="soak", interval_s=step_s, clock=clock, monotonic=clock,
                          sample_timeout_s=60.0, analyzer=LiveClassifier())
    cache = ExpositionCache(lambda: collector.snapshot)
    proc = psutil.Process()
    started = time.monotonic()
    base_rss = base_threads = base_fds = 0
    peak_rss = 0
    checkpoints: list[tuple[int, int]] = []
    try:
        for i in range(1, total + 1):
            clock.advance(step_s)
            collector.collect_once()
            if i % SCRAPE_EVERY == 0:
                cache.render(generate_latest, "text/plain")
            if i == warmup:
                base_rss, base_threads, base_fds = _rss(), proc.num_threads(), proc.num_fds()
            if i > warmup and (i - warmup) % max(1, (total - warmup) // 10) == 0:
                rss = _rss()
                peak_rss = max(peak_rss, rss)
                checkpoints.append((i, rss))
                if progress:
                    print(f"  {i:>7} intervals: RSS {rss / MIB:.1f} MiB, {time.monotonic() - started:.0f} s", flush=True)
        end_rss, end_threads, end_fds = _rss(), proc.num_threads(), proc.num_fds()
    finally:
        collector.stop()
        backend.close()
        library.close()
        virtual.close()
    elapsed = time.monotonic() - started
    g = f"soak {total:,} intervals"
    note = f"{step_s:g} s steps, new PIDs every {churn_every_s:g} s, a scrape every {SCRAPE_EVERY}; {elapsed:.0f} s wall"
    return [
        Figure(g, "RSS growth after warm-up", (end_rss - base_rss) / MIB, "MiB", 5.0, base_rss / MIB,
               f"RSS at interval {warmup:,}", note),
        Figure(g, "peak RSS", max(peak_rss, end_rss) / MIB, "MiB", 60.0),
        Figure(g, "thread growth", end_threads - base_threads, "threads", 0.0),
        Figure(g, "file descriptor growth", end_fds - base_fds, "fds", 0.0),
    ]


if __name__ == "__main__":
    import sys

    from benchmarks.figures import table

    count = next((int(a.split("=", 1)[1]) for a in sys.argv if a.startswith("--intervals=")), None)
    print(table(run(quick="--quick" in sys.argv, intervals=count, progress=True)))
    os._exit(0)  # the fake driver's daemon threads need not be joined
