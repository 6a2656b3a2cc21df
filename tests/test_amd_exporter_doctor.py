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
PROFILED = {"mi300x-spx-profiler.prom": 8, "mi300x-spx-v1.4.1-profiler.prom": 8, "mi300x-cpx-profiler.prom": 16,
            "mi250x-profiler.prom": 8, "mi355x-spx-profiler.prom": 8, "mi355x-dpx-profiler.prom": 16}
PARTITION_0_ONLY = "mi355x-dpx-partition0-only.prom"


def doctor(name: str, body: str | None = None, *args: str) -> subprocess.CompletedProcess[str]:
    with FakeExporter(body if body is not None else (FIXTURES / name).read_text()) as exporter:
        return subprocess.run(roofwatch_cmd("doctor", "--backend", "amd-exporter", *args), capture_output=True,
                              text=True, env=clean_env(ROOFWATCH_AMD_EXPORTER_URL=exporter.url), timeout=60)


def test_every_fixture_is_a_doctor_case() -> None:
    assert sorted(p.name for p in FIXTURES.glob("*.prom")) == sorted(
        [*PROFILED, "mi300x-spx-no-profiler.prom", PARTITION_0_ONLY])


@pytest.mark.parametrize("name", sorted(PROFILED))
def test_with_the_profiler_the_node_is_fully_usable_on_counters(name: str) -> None:
    done = doctor(name)
    assert done.returncode == 0, done.stdout + done.stderr
    devices = PROFILED[name]
    assert f"ok   amd-exporter backend: {devices} GPU(s)" in done.stdout
    assert f"profiler metrics present on all {devices} devices" in done.stdout
    assert "counters from DME (AMD's Device Metrics Exporter) (basis counters)" in done.stdout
    assert "node: fully usable" in done.stdout


def test_without_the_profiler_doctor_says_why_it_may_be_off_and_how_to_turn_it_on() -> None:
    done = doctor("mi300x-spx-no-profiler.prom")
    assert done.returncode == 3, done.stdout + done.stderr
    line = next(l for l in done.stdout.splitlines() if "amd-exporter profiler" in l)
    assert line.startswith("WARN") and "off by default" in line and "3 failed rocpctl runs" in line
    assert '"ProfilerMetrics": {"all": true}' in line
    assert "(basis power_and_dram)" in done.stdout and "node: usable, with pieces missing" in done.stdout


def test_partition_rows_missing_as_in_dme_issue_495_are_named_with_what_the_agent_does() -> None:
    done = doctor(PARTITION_0_ONLY)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "ok   amd-exporter backend: 8 GPU(s)" in done.stdout
    line = next(l for l in done.stdout.splitlines() if "amd-exporter partitions" in l)
    assert line.startswith("WARN") and "8 partitioned GPU(s) list fewer partitions" in line, line
    assert "serial 712506003310 (DPX) lists partition(s) 0 of 0-1" in line and "issue #495" in line
    assert "the partitions not listed are not watched" in line
    assert "amd-exporter partitions" not in doctor("mi355x-dpx-profiler.prom").stdout, "all 16 listed: no warning"


def test_an_unknown_board_is_named_with_the_specs_entry_to_paste_and_the_entry_fixes_it(tmp_path: Path) -> None:
    body = (FIXTURES / "mi355x-spx-profiler.prom").read_text().replace("102-G36218-0C", "102-G39999-0A")
    done = doctor("", body)
    assert done.returncode == 3, done.stdout + done.stderr
    line = next(l for l in done.stdout.splitlines() if "peak specs" in l)
    assert line.startswith("WARN") and "card_model '102-G39999-0A' on GPU(s) 0, 1, 2, 3, 4, 5, 6, 7" in line, line
    snippet = next(part for part in done.stdout.split("specs: ")[1:] if part.startswith('{"102-G39999-0A"'))
    entry = snippet.splitlines()[0].replace("<dense TFLOP/s>", "2500").replace("<TFLOP/s>", "157.3").replace(
        "<TB/s>", "8")
    config = tmp_path / "roofwatch.yaml"
    config.write_text("specs: " + entry + "\n")
    fixed = doctor("", body, "--config", str(config))
    assert "peak specs" not in fixed.stdout and fixed.returncode == 0, fixed.stdout + fixed.stderr
