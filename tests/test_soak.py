"""A compressed long run: two hours of the demo node in virtual time, with a GPU falling off
the bus and another failing its reads, through the collector, the live classifier and the
exporter. The verdict timeline follows the scenario, faults stay on their GPU, and nothing
leaks (threads, file descriptors, memory)."""

from __future__ import annotations

import gc
import threading
from collections import Counter

import psutil
import pytest
from prometheus_client.exposition import generate_latest

from agent.backends.virtual import VirtualBackend
from agent.classifier.live import LiveClassifier
from agent.collector import Backoff, Collector
from agent.virtual.clock import ManualClock
from exporters.prometheus import ExpositionCache

pytestmark = pytest.mark.slow

T0 = 1_800_000_000.0
HOURS = 2
LOST = ("2", 1800.0, 120.0)    # GPU 2 falls off the bus for two minutes, half an hour in
ERROR = ("5", 3600.0, 60.0)    # GPU 5's reads fail for a minute, an hour in


@pytest.fixture(scope="module")
def run():
    clock = ManualClock(T0)
    virtual = VirtualBackend("demo", clock=clock, start_time=T0 - 100)
    for gpu, start, duration in (LOST, ERROR):
        virtual.inject_fault(gpu, "lost" if gpu == LOST[0] else "error", duration, start_s=100 + start)
    collector = Collector(virtual, node="soak", clock=clock, monotonic=clock, sample_timeout_s=60.0,
                          backoff=Backoff(initial_s=1.0, max_s=8.0), analyzer=LiveClassifier())
    cache = ExpositionCache(lambda: collector.snapshot)
    process = psutil.Process()
    timeline: list[tuple[float, dict[str, bool], dict[str, tuple[str, str | None]]]] = []
    base = None
    try:
        for i in range(HOURS * 3600):
            clock.advance(1.0)
            snapshot = collector.collect_once()
            up = {d.info.gpu: d.up for d in snapshot.devices}
            vt = clock() - virtual.start_time  # the scenario's own time: what each GPU truly does now
            verdicts = {v.gpu: (v.cls, virtual.engine.true_class(virtual.node, v.gpu, vt)) for v in snapshot.verdicts}
            timeline.append((clock() - T0, up, verdicts))
            if i % 15 == 0:
                cache.render(generate_latest, "text/plain")
            if i == 600:  # history (600 samples) and the classifier's windows are full
                gc.collect()
                base = (set(threading.enumerate()), process.num_fds(), process.memory_info().rss)
        gc.collect()
        end = (set(threading.enumerate()), process.num_fds(), process.memory_info().rss)
    finally:
        collector.stop()
        virtual.close()
    return timeline, base, end


def _during(t: float, fault: tuple[str, float, float]) -> bool:
    _, start, duration = fault
    return start <= t < start + duration


def test_faults_stay_on_their_gpu_and_heal(run):
    timeline, _, _ = run
    for t, up, _ in timeline:
        for gpu, is_up in up.items():
            if gpu == LOST[0] and _during(t, LOST):
                assert not is_up, f"GPU {gpu} up while lost at {t:.0f}s"
            elif gpu == ERROR[0] and _during(t, ERROR):
                assert not is_up, f"GPU {gpu} up while its reads fail at {t:.0f}s"
            elif t > 30 and not any(_during(t - s, f) for f in (LOST, ERROR) for s in range(0, 20) if f[0] == gpu):
                assert is_up, f"GPU {gpu} down at {t:.0f}s with no fault on it"
    assert all(all(up.values()) for _, up, _ in timeline[-60:]), "everything is back up at the end"


def test_verdicts_follow_the_scenario(run):
    timeline, _, _ = run
    agree: Counter[str] = Counter()
    scored: Counter[str] = Counter()
    for t, up, verdicts in timeline[900:]:  # after the first windows settle
        for gpu, (cls, truth) in verdicts.items():
            if truth is None or not up[gpu] or any(_during(t - s, f) for f in (LOST, ERROR) for s in (0, 60, 120)
                                                   if f[0] == gpu):
                continue
            scored[gpu] += 1
            agree[gpu] += cls == truth
    assert set(scored) == {str(i) for i in range(8)}
    for gpu in scored:
        share = agree[gpu] / scored[gpu]
        floor = 0.75 if gpu == "7" else 0.9  # GPU 7 switches phase every minute; each switch costs a window
        assert share >= floor, f"GPU {gpu}: the verdict matched the scenario {share:.0%} of the time"


def test_nothing_leaks_over_the_run(run):
    """Counted in the test worker's process, where threads and sockets of earlier tests may still be winding
    down during the run: so the threads are compared as objects (any thread alive at the end that was not at the
    base is this run's), and file descriptors may fall but never rise."""
    _, base, end = run
    started = sorted(t.name for t in end[0] - base[0])
    assert started == [], f"threads started during the run and still alive: {started}"
    assert end[1] <= base[1], f"file descriptors: {base[1]} -> {end[1]}"
    assert end[2] - base[2] < 20 * 2**20, f"RSS grew {(end[2] - base[2]) / 2**20:.1f} MiB"
