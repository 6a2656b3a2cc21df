"""The GPU driver missing at start and appearing later, against the real agent process.

The agent runs ``roofwatch run --backend nvml`` with the real pynvml; only the dynamic loading
of libnvidia-ml.so.1 is replaced (tests/late_driver/sitecustomize.py): it fails as the loader
does until a marker file exists, then yields the fake driver playing the demo node.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from agent.app.driver_wait import DriverWait
from agent.backends.base import BackendUnavailable
from prometheus_client.parser import text_string_to_metric_families

from tests.agent_process import clean_env, gauge_values, http_get, poll, roofwatch_cmd
from tests.prometheus_server import free_port

pytestmark = pytest.mark.slow

LATE_DRIVER = Path(__file__).parent / "late_driver"


def _start(marker: Path, *flags: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = clean_env(ROOFWATCH_TEST_DRIVER_MARKER=str(marker),
                    PYTHONPATH=os.pathsep.join([str(LATE_DRIVER), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    proc = subprocess.Popen(roofwatch_cmd("run", "--backend", "nvml", "--listen", f"127.0.0.1:{port}", *flags),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    return proc, f"http://127.0.0.1:{port}/"


def _finish(proc: subprocess.Popen, timeout: float = 15) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"agent still running after {timeout}s; stderr: {err}") from None
    return proc.returncode, err


def test_without_a_wait_a_missing_driver_is_one_line_and_exit_1(tmp_path):
    proc, _url = _start(tmp_path / "driver")
    code, err = _finish(proc, timeout=60)
    assert code == 1
    assert "NVML" in err and "Traceback" not in err


def test_the_agent_waits_for_a_late_driver_then_collects(tmp_path):
    marker = tmp_path / "driver"
    proc, url = _start(marker, "--driver-wait", "120")
    try:
        status, body = poll(lambda: (r := http_get(url + "healthz")) and r[0] == 200 and r, 30,
                            what="/healthz while waiting")
        assert b"waiting for the GPU driver" in body and b"NVML" in body
        waiting = poll(lambda: http_get(url + "metrics"), 10, what="/metrics while waiting")[1].decode()
        assert _node_values(waiting, "roofwatch_gpus_visible") == [0.0]
        assert _node_values(waiting, "roofwatch_collector_last_cycle_success") == [0.0]
        assert "roofwatch_gpu_up" not in _sample_names(waiting)
        status, page = http_get(url)
        assert status == 200 and b'id="waiting">Waiting for the GPU driver: NVML' in page
        status, snapshot = http_get(url + "api/v1/snapshot")
        assert status == 200 and json.loads(snapshot)["health"]["waiting_for"].startswith("the GPU driver")

        marker.touch()  # the driver is installed
        text = poll(lambda: (t := http_get(url + "metrics")[1].decode())
                    and _node_values(t, "roofwatch_gpus_visible") == [8.0] and t, 60,
                    what="8 GPUs after the driver appeared")
        assert _node_values(text, "roofwatch_collector_last_cycle_success") == [1.0]
        assert sorted(gauge_values(text, "roofwatch_gpu_up").values()) == [1.0] * 8
        status, body = http_get(url + "healthz")
        assert status == 200 and b"8/8 GPUs up" in body
        proc.send_signal(signal.SIGTERM)
        code, err = _finish(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert code == 0, err
    assert "waiting for the GPU driver" in err and "GPU driver found" in err
    assert err.count("waiting for the GPU driver") == 1, "one warning per reason, not one per retry"


def test_a_driver_that_never_comes_ends_the_wait_with_the_reason(tmp_path):
    proc, url = _start(tmp_path / "driver", "--driver-wait", "3")
    code, err = _finish(proc, timeout=30)
    assert code == 1
    last = err.strip().splitlines()[-1]
    assert "NVML" in last and "still no GPU driver after waiting driver_wait_s=3 s" in last


def test_sigterm_while_waiting_stops_at_once(tmp_path):
    proc, url = _start(tmp_path / "driver", "--driver-wait", "600")
    try:
        poll(lambda: http_get(url + "healthz")[0] == 200, 30, what="/healthz while waiting")
        proc.send_signal(signal.SIGTERM)
        code, err = _finish(proc, timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert code == 0, err


def test_virtual_backends_never_wait(tmp_path):
    result = subprocess.run(roofwatch_cmd("run", "--backend", "virtual", "--scenario", str(tmp_path / "missing.yaml"),
                                          "--driver-wait", "600", "--listen", "127.0.0.1:0"),
                            capture_output=True, text=True, timeout=60, env=clean_env())
    assert result.returncode == 1 and "waiting" not in result.stderr


# -- the wait itself, on a hand-driven clock --------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_back_off_doubles_to_its_cap_and_never_passes_the_end_of_the_wait():
    clock = _Clock()
    wait = DriverWait(attempt=lambda: None, node="n", backend="nvml", wait_s=100.0, interval_s=1.0,
                      clock=clock, monotonic=clock)
    delays = []
    for _ in range(8):
        wait.failed(BackendUnavailable("NVML: driver not loaded"))
        delays.append(wait.next_delay_s())
        clock.now += delays[-1]
    assert delays[:6] == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0]
    assert sum(delays) == pytest.approx(100.0) and wait.expired
    assert wait.next_delay_s() == 0.0


def test_the_waiting_snapshot_says_why_and_changes_with_every_attempt():
    clock = _Clock()
    outcomes = [BackendUnavailable("NVML: driver not loaded"), BackendUnavailable("NVML: no GPU found"), "collector"]

    def attempt():
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    wait = DriverWait(attempt=attempt, node="n", backend="auto", wait_s=60.0, interval_s=1.0, expected_devices=4,
                      clock=clock, monotonic=clock)
    first = wait.snapshot
    assert wait.try_once() is None
    second = wait.snapshot
    assert second.health.waiting_for == "the GPU driver: NVML: driver not loaded"
    assert (second.sequence, second.expected_devices, second.devices) == (1, 4, ())
    assert not second.health.last_cycle_success and second.sequence != first.sequence
    assert wait.try_once() is None and "no GPU found" in wait.snapshot.health.waiting_for
    assert wait.try_once() == "collector"


def _node_values(text: str, name: str) -> list[float]:
    """The values of a node-level family (no gpu label)."""
    for family in text_string_to_metric_families(text):
        if family.name == name:
            return [s.value for s in family.samples if s.name == name]
    return []


def _sample_names(text: str) -> set[str]:
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}
