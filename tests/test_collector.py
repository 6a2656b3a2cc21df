"""The collector isolates device failures, bounds threads and history, and never blocks readers."""

from __future__ import annotations

import threading
import time

import pytest

from agent.backends.base import DeviceError, DeviceLostError
from agent.collector import Backoff, Collector, accumulate_counters
from agent.model import DeviceCounters, DeviceInfo, GpuSample


class ScriptedBackend:
    """A Backend whose devices behave as each test scripts: ok, raise, or block until released."""

    name = "scripted"

    def __init__(self, count: int = 4) -> None:
        self.devices = [DeviceInfo(gpu=str(i), uuid=f"GPU-{i}", vendor="nvidia", model="Test GPU") for i in range(count)]
        self.behaviour: dict[str, str] = {}
        self.release = threading.Event()
        self.calls: dict[str, int] = {d.gpu: 0 for d in self.devices}
        self.concurrent: dict[str, int] = {d.gpu: 0 for d in self.devices}
        self.max_concurrent: dict[str, int] = {d.gpu: 0 for d in self.devices}
        self.energy = 0.0
        self.closed = False
        self._lock = threading.Lock()

    def discover(self):
        return self.devices

    def sample(self, gpu: str, now: float) -> GpuSample:
        with self._lock:
            self.calls[gpu] += 1
            self.concurrent[gpu] += 1
            self.max_concurrent[gpu] = max(self.max_concurrent[gpu], self.concurrent[gpu])
        try:
            mode = self.behaviour.get(gpu, "ok")
            if mode == "error":
                raise DeviceError("scripted failure")
            if mode == "lost":
                raise DeviceLostError("fell off the bus")
            if mode == "hang":
                self.release.wait(30)
            return GpuSample(ts=now, gpu=gpu, interval_s=1.0, gr_active=0.5, power_w=100.0, pcie_tx_bytes_per_s=1e6)
        finally:
            with self._lock:
                self.concurrent[gpu] -= 1

    def close(self) -> None:
        self.closed = True
        self.release.set()


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def make(backend: ScriptedBackend, **kw) -> tuple[Collector, FakeClock]:
    mono = FakeClock()
    collector = Collector(
        backend, node="n1", interval_s=1.0, sample_timeout_s=0.2, monotonic=mono, clock=lambda: mono.t + 1e9, **kw
    )
    return collector, mono


def test_all_devices_reported_up():
    backend = ScriptedBackend(4)
    collector, _ = make(backend)
    snap = collector.collect_once()
    assert [d.up for d in snap.devices] == [True] * 4
    assert snap.visible_devices == 4 and snap.expected_devices == 4
    assert snap.health.last_cycle_success
    collector.stop()


def test_failing_device_is_down_while_others_report():
    backend = ScriptedBackend(4)
    backend.behaviour["2"] = "error"
    collector, _ = make(backend)
    snap = collector.collect_once()
    up = {d.info.gpu: d.up for d in snap.devices}
    assert up == {"0": True, "1": True, "2": False, "3": True}
    down = snap.devices[2]
    assert "scripted failure" in down.error and down.sample_errors_total == 1
    assert not snap.health.last_cycle_success
    collector.stop()


def test_hanging_device_times_out_without_second_call_and_recovers():
    backend = ScriptedBackend(3)
    backend.behaviour["1"] = "hang"
    before = set(threading.enumerate())
    collector, mono = make(backend)
    snap = collector.collect_once()
    assert not snap.devices[1].up and "TimeoutError" in snap.devices[1].error
    assert all(d.up for i, d in enumerate(snap.devices) if i != 1)
    for _ in range(5):  # the hung call is still in flight: no pile-up of calls or threads
        mono.t += 10
        snap = collector.collect_once()
        assert snap.devices[0].up and snap.devices[2].up
    assert backend.calls["1"] == 1 and backend.max_concurrent["1"] == 1
    started = set(threading.enumerate()) - before
    assert len(started) <= 3, f"threads piled up: {sorted(t.name for t in started)}"  # the pool: a worker per GPU at most
    backend.behaviour["1"] = "ok"
    assert release_and_recover(collector, backend, mono)
    collector.stop()


def test_backoff_spaces_out_retries_of_a_lost_device():
    backend = ScriptedBackend(2)
    backend.behaviour["0"] = "lost"
    collector, mono = make(backend, backoff=Backoff(initial_s=1.0, max_s=8.0))
    for _ in range(20):  # 20 cycles, 1 s apart
        collector.collect_once()
        mono.t += 1.0
    # retries at 0, 1, 3, 7, 15 s (delays 1, 2, 4, 8): far fewer than one per cycle
    assert backend.calls["0"] == 5
    assert backend.calls["1"] == 20
    assert "lost" in collector.snapshot.devices[0].error
    collector.stop()


def test_backoff_delay_doubles_and_caps():
    b = Backoff(initial_s=0.5, max_s=4.0)
    assert [b.delay(n) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]


def test_history_is_bounded():
    backend = ScriptedBackend(1)
    collector, mono = make(backend, history_len=10)
    for _ in range(25):
        collector.collect_once()
        mono.t += 1
    history = collector.history("0")
    assert len(history) == 10
    assert [s.ts for s in history] == sorted(s.ts for s in history)
    collector.stop()


def test_snapshot_is_replaced_not_mutated():
    backend = ScriptedBackend(2)
    collector, _ = make(backend)
    first = collector.collect_once()
    backend.behaviour["0"] = "error"
    second = collector.collect_once()
    assert first.devices[0].up and not second.devices[0].up
    assert second.sequence > first.sequence
    with pytest.raises(AttributeError):
        first.devices[0].up = False  # type: ignore[misc]
    collector.stop()


def test_expected_devices_configurable():
    collector, _ = make(ScriptedBackend(2), expected_devices=4)
    snap = collector.collect_once()
    assert snap.expected_devices == 4 and snap.visible_devices == 2
    collector.stop()


def test_background_loop_publishes_and_stops():
    backend = ScriptedBackend(2)
    collector = Collector(backend, node="n1", interval_s=0.05)
    collector.start()
    assert collector.wait_for_cycles(3, timeout=10)
    collector.stop()
    assert backend.closed
    assert collector.snapshot.health.cycles_total >= 3


def test_counters_integrate_rates_and_prefer_energy_counter():
    a = GpuSample(ts=1, gpu="0", interval_s=2.0, power_w=100.0, pcie_rx_bytes_per_s=10.0)
    c = accumulate_counters(DeviceCounters(), None, a)
    assert c.energy_j == pytest.approx(200.0) and c.pcie_rx_bytes == pytest.approx(20.0)
    b = GpuSample(ts=2, gpu="0", interval_s=1.0, energy_j=5000.0, power_w=100.0)
    c2 = accumulate_counters(c, GpuSample(ts=1, gpu="0", energy_j=4700.0), b)
    assert c2.energy_j == pytest.approx(500.0)  # 200 + the driver's 300 J delta, not power x dt
    reset = accumulate_counters(c2, GpuSample(ts=2, gpu="0", energy_j=5000.0), GpuSample(ts=3, gpu="0", interval_s=1.0, energy_j=10.0))
    assert reset.energy_j == c2.energy_j  # a counter reset never makes the total go backwards


HUNG_FOREVER_SCRIPT = """
import threading, sys
sys.path.insert(0, {root!r})
from agent.collector import Collector
from agent.model import DeviceInfo, GpuSample

class HungDriver:
    name = "hung"
    def discover(self):
        return [DeviceInfo(gpu=str(i), uuid=f"GPU-{{i}}", vendor="nvidia", model="T") for i in range(2)]
    def sample(self, gpu, now):
        if gpu == "1":
            threading.Event().wait()  # a driver call that never returns, and ignores close()
        return GpuSample(ts=now, gpu=gpu, interval_s=1.0)
    def close(self):
        pass

c = Collector(HungDriver(), node="n", interval_s=0.05, sample_timeout_s=0.05)
c.start()
assert c.wait_for_cycles(3, timeout=20)
snap = c.snapshot
c.stop()
print("up:", [d.up for d in snap.devices], flush=True)
"""


@pytest.mark.slow
def test_process_exits_although_a_driver_call_never_returns(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "hung.py"
    script.write_text(HUNG_FOREVER_SCRIPT.format(root=str(Path(__file__).resolve().parent.parent)))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "up: [True, False]"


def test_cli_reports_discovery_failure_without_traceback():
    from agent.app.assemble import make_collector
    from agent.app.cli_base import CliError
    from agent.app.config import load_settings
    from agent.backends.base import BackendUnavailable

    class NoDevices:
        name = "empty"
        closed = False

        def discover(self):
            raise BackendUnavailable("driver loaded but no GPUs visible")

        def close(self):
            self.closed = True

    backend = NoDevices()
    with pytest.raises(CliError, match="no GPUs visible"):
        make_collector(load_settings(), backend)
    assert backend.closed


# ---------------------------------------------------------------- a bounded pool, bounded logs


def release_and_recover(collector, backend, mono) -> bool:
    """Let the hung calls return, then cycle (fake clock) until every device is up again: True when it
    happens within 30 s of real time. Polls the state the test needs instead of sleeping: between cycles it
    gives the released worker threads a moment to run (a loaded machine once ran 200 fake-clock cycles
    before the workers were scheduled at all)."""
    backend.release.set()
    deadline = time.monotonic() + 30.0
    pause = threading.Event()
    while time.monotonic() < deadline:
        mono.t += 10
        if all(d.up for d in collector.collect_once().devices):
            return True
        pause.wait(0.01)
    return False


def sampling_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("roofwatch-sample"))


def test_sampling_threads_are_bounded_by_the_pool_not_the_device_count():
    backend = ScriptedBackend(64)
    before = sampling_threads()
    collector, mono = make(backend)  # the default pool: 16 workers
    try:
        for _ in range(3):
            snap = collector.collect_once()
            mono.t += 1
            assert all(d.up for d in snap.devices) and len(snap.devices) == 64
        assert sampling_threads() - before <= 16, "one thread per device used to be 64"
        assert all(n == 3 for n in backend.calls.values()) and max(backend.max_concurrent.values()) == 1
    finally:
        collector.stop()


def test_the_pool_starts_its_workers_at_the_first_cycle_and_never_grows_after():
    """A pool that grew in a busy moment and never shrank moved the agent's thread count long after
    start, so the load tests' 'threads back at their baseline' could not tell it from a leak."""
    backend = ScriptedBackend(4)
    collector, mono = make(backend)
    try:
        collector.collect_once()
        started = collector._workers.threads
        backend.behaviour.update({"0": "hang"})
        for _ in range(3):
            mono.t += 10
            collector.collect_once()
        assert started == 4 and collector._workers.threads == 4, "one worker per device up to 16, from the start"
        backend.behaviour.clear()
        backend.release.set()
    finally:
        collector.stop()


def test_devices_past_max_devices_are_refused_with_one_log_line(caplog):
    backend = ScriptedBackend(200)
    with caplog.at_level("INFO", logger="roofwatch"):
        collector, mono = make(backend)  # max_devices: 128 by default
        try:
            for _ in range(3):
                snap = collector.collect_once()
                mono.t += 1
        finally:
            collector.stop()
    assert [d.info.gpu for d in snap.devices] == [str(i) for i in range(128)]
    assert snap.expected_devices == 128 and collector.refused_devices[0] == "128"
    assert backend.calls["128"] == 0 and backend.calls["127"] == 3
    (line,) = [r.getMessage() for r in caplog.records]
    assert "lists 200 devices, more than max_devices (128)" in line and "and 64 more" in line


class ChangingErrors(ScriptedBackend):
    """Each failed read says something new (an age, a count), as the dcgm-exporter reader's do."""

    def sample(self, gpu: str, now: float) -> GpuSample:
        if self.behaviour.get(gpu) == "changing":
            self.calls[gpu] += 1
            raise DeviceError(f"last good read {self.calls[gpu]} s ago")
        return super().sample(gpu, now)


def collector_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "roofwatch.collector"]


def test_a_device_down_is_logged_once_per_change_of_state_not_per_new_error_text(caplog):
    backend = ChangingErrors(2)
    backend.behaviour["1"] = "changing"
    collector, mono = make(backend, backoff=Backoff(initial_s=0.0, max_s=0.0))
    with caplog.at_level("DEBUG", logger="roofwatch"):
        try:
            for _ in range(10):
                snap = collector.collect_once()
                mono.t += 1
            assert "last good read 10 s ago" in snap.devices[1].error, "the state still says the latest reason"
            backend.behaviour["1"] = "ok"
            collector.collect_once()
            backend.behaviour["1"] = "changing"
            collector.collect_once()
        finally:
            collector.stop()
    lines = [(r.levelname, r.getMessage()) for r in caplog.records
             if r.name == "roofwatch.collector" and r.levelname != "DEBUG"]
    assert lines == [("WARNING", "device down"), ("INFO", "device back up"), ("WARNING", "device down")]


def test_many_devices_going_down_or_coming_back_at_once_are_one_line_each_way(caplog):
    backend = ScriptedBackend(40)
    collector, mono = make(backend, backoff=Backoff(initial_s=0.0, max_s=0.0))
    with caplog.at_level("INFO", logger="roofwatch"):
        try:
            collector.collect_once()
            backend.behaviour.update({str(i): "error" for i in range(40)})
            for _ in range(5):
                mono.t += 1
                collector.collect_once()
            backend.behaviour.clear()
            mono.t += 1
            collector.collect_once()
        finally:
            collector.stop()
    records = [r for r in caplog.records if r.name == "roofwatch.collector"]
    assert [r.getMessage() for r in records] == ["devices down", "devices back up"]
    down = records[0]
    assert down.count == 40 and down.gpus == "0, 1, 2, 3, 4, 5, 6, 7 and 32 more"
    assert down.errors == "40 x DeviceError: scripted failure"


@pytest.mark.slow
def test_a_hung_device_holds_one_worker_while_the_others_keep_being_sampled():
    backend = ScriptedBackend(12)
    backend.behaviour["1"] = "hang"
    before = sampling_threads()
    collector, mono = make(backend, max_workers=3)
    try:
        for _ in range(5):
            snap = collector.collect_once()
            mono.t += 10
            assert [d.info.gpu for d in snap.devices if not d.up] == ["1"]
            assert "no answer within 0.20s" in snap.devices[1].error, "its deadline marks it down"
        assert backend.calls["1"] == 1 and backend.max_concurrent["1"] == 1, "not resubmitted while it hangs"
        assert all(backend.calls[str(i)] == 5 for i in range(12) if i != 1)
        assert sampling_threads() - before <= 3
        backend.behaviour["1"] = "ok"
        assert release_and_recover(collector, backend, mono)
    finally:
        collector.stop()


@pytest.mark.slow
def test_with_every_worker_hung_the_rest_are_marked_down_and_wait_without_piling_up():
    backend = ScriptedBackend(6)
    backend.behaviour.update({"0": "hang", "1": "hang"})
    before = sampling_threads()
    collector, mono = make(backend, max_workers=2)
    try:
        for _ in range(3):
            snap = collector.collect_once()
            mono.t += 10
            assert not any(d.up for d in snap.devices)
            for d in snap.devices[2:]:
                assert "not started within 0.20s: all 2 sampling workers busy" in d.error, d.error
        assert [backend.calls[str(i)] for i in range(6)] == [1, 1, 0, 0, 0, 0], "no call started, none added"
        assert collector._workers._jobs.qsize() == 4, "one queued call per waiting device, not one per cycle"
        assert sampling_threads() - before <= 2
        backend.behaviour.clear()
        assert release_and_recover(collector, backend, mono) and max(backend.max_concurrent.values()) == 1
    finally:
        collector.stop()
