"""``roofwatch doctor --backend amd-exporter`` on each Device Metrics Exporter fixture (tests/fixtures/amd-exporter),
served over HTTP as the node's exporter: what it finds, and what it says to do where the profiler is off."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.agent_process import clean_env, roofwatch_cmd
from tests.dcgm_exporter_server import FakeExporter

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).parent / "fixtures" / "amd-exporter"
PROFILED = {"mi300x-spx-profiler.prom": 8, "mi300x-spx-v1.4.1-profiler.prom": 8, "mi300x-cpx-profiler.prom": 16}


def doctor(name: str) -> subprocess.CompletedProcess[str]:
    with FakeExporter((FIXTURES / name).read_text()) as exporter:
        return subprocess.run(roofwatch_cmd("doctor", "--backend", "amd-exporter"), capture_output=True, text=True,
                              env=clean_env(ROOFWATCH_AMD_EXPORTER_URL=exporter.url), timeout=60)


def test_every_fixture_is_a_doctor_case() -> None:
    assert sorted(p.name for p in FIXTURES.glob("*.prom")) == sorted([*PROFILED, "mi300x-spx-no-profiler.prom"])


@pytest.mark.parametrize("name", sorted(PROFILED))
def test_with_the_profiler_the_node_is_fully_usable_on_counters(name: str) -> None:
    done = doctor(name)
    assert done.returncode == 0, done.stdout + done.stderr
    devices = PROFILED[name]
    assert f"ok   amd-exporter backend: {devices} GPU(s)" in done.stdout
    assert f"profiler metrics present on all {devices} devices" in done.stdout
    assert "(basis counters)" in done.stdout and "AMD's profiler" in done.stdout
    assert "node: fully usable" in done.stdout


def test_without_the_profiler_doctor_says_why_it_may_be_off_and_how_to_turn_it_on() -> None:
    done = doctor("mi300x-spx-no-profiler.prom")
    assert done.returncode == 3, done.stdout + done.stderr
    line = next(l for l in done.stdout.splitlines() if "amd-exporter profiler" in l)
    assert line.startswith("WARN") and "off by default" in line and "3 failed rocpctl runs" in line
    assert '"ProfilerMetrics": {"all": true}' in line
    assert "(basis power_and_dram)" in done.stdout and "node: usable, with pieces missing" in done.stdout
