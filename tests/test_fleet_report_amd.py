"""``roofwatch fleet-report --source amd`` as a real child process against a real Prometheus holding AMD
Device Metrics Exporter series, backfilled as tests/fleet_stores.py backfills the dcgm-exporter GPUs
(``promtool tsdb create-blocks-from openmetrics``). The series are the fixture expositions' own lines
(tests/fixtures/amd-exporter/, written by tests/amd_exporter_fixtures.py) repeated every minute for the
period, one host per exposition: the GEMM and decode MI300X with the profiler on, the same two with it
off, and one CPX MI300X's eight partitions. Every expected answer is computed here from the fixture's
numbers."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests import amd_exporter_fixtures as amd
from tests import fleet_fixture as fx
from tests.fleet_stores import backfilled_prometheus, fleet_end, run_report

pytestmark = pytest.mark.slow

HOSTS = {"mi300x-spx-profiler.prom": ("mi300x-prof", {"0", "4"}),
         "mi300x-spx-no-profiler.prom": ("mi300x-noprof", {"0", "4"}),
         "mi300x-cpx-profiler.prom": ("mi300x-cpx", {str(p) for p in range(8)})}
"""Fixture file -> (the host it becomes, the gpu_id values kept): GPU 0 runs the GEMM, GPU 4 decodes;
in CPX, gpu_id 0-7 are the partitions of physical GPU 0."""
UNREAD = ("gpu_xgmi_link_", "gpu_energy_consumed", "gpu_ecc_", "gpu_nodes_total")
LINE = re.compile(r'^(\w+)\{(.*)\} (\S+)$')
SERIES_STEP = 60


def dme_lines() -> list[tuple[str, str]]:
    """(series with the cluster label added and its host renamed, value) of every kept fixture line."""
    out = []
    for name, (host, gpus) in HOSTS.items():
        for line in (amd.FIXTURES / name).read_text().splitlines():
            m = LINE.match(line)
            if not m or m.group(1).startswith(UNREAD):
                continue
            gpu = re.search(r'gpu_id="(\d+)"', m.group(2))
            if gpu is None or gpu.group(1) not in gpus:
                continue
            labels = m.group(2).replace(f'hostname="{amd.HOST}"', f'hostname="{host}"')
            out.append((f'{m.group(1)}{{cluster="amd-lab",{labels}}}', m.group(3)))
    return out


def dme_openmetrics(end: int) -> str:
    lines = dme_lines()
    body = [f"{series} {value} {t}\n" for t in range(end - fx.PERIOD - fx.LEAD_IN, end + 1, SERIES_STEP)
            for series, value in lines]
    return "".join(body) + "# EOF\n"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    end = fleet_end()
    work: Path = tmp_path_factory.mktemp("amd-prometheus")
    server = backfilled_prometheus(work, {"dme": dme_openmetrics(end)})
    yield server.base, end, work
    server.stop()


@pytest.fixture(scope="module")
def report(store):
    base, end, work = store
    done, data = run_report(base, work, "--source", "amd", end=end)
    assert done.returncode == 0, done.stderr
    return data


def _gpus(data: dict) -> dict[tuple[str, str], dict]:
    return {(g["node"], g["gpu"]): g for g in data["amd"]["gpus"]}


def test_gemm_is_compute_bound_and_decode_memory_bound_with_the_counter_mfu(report) -> None:
    gpus = _gpus(report)
    gemm, decode = gpus[("mi300x-prof", "0")], gpus[("mi300x-prof", "4")]
    assert (gemm["class"], decode["class"]) == ("compute_bound", "memory_bound")
    assert gemm["model"] == "AMD Instinct MI300X" and gemm["uuid"] == "692407004230" and gemm["profiler"]
    for g in (gemm, decode):  # all but the classifier's first window
        assert g["hours"][g["class"]] == pytest.approx(2.0, abs=3 * 60 / 3600)
    # By hand: tensor activity = MFMA 62 % x GUI-active 96 % = 0.5952 of elapsed time; the fixture's 16-bit
    # ops per 1000 us window over the 1307.4 TFLOP/s BF16 peak say the same.
    assert amd.expected_mfu(amd.GEMM) == pytest.approx(0.62 * 0.96, rel=1e-5)
    assert gemm["mfu"] == pytest.approx(0.62 * 0.96, abs=0.03)
    assert decode["mfu"] == pytest.approx(0.05 * 0.97, abs=0.03)  # MFMA 5 % x GUI 97 %; HBM 4.3 / 5.3 TB/s = 81 %
    assert report["amd"]["profiler_window_us"] == 1000.0
    assert report["amd"]["absent_fields"] == ["gpu_max_clock"]  # 1.4.2+, not in the fixtures
    assert report["problems"] == [] and report["source"] == "amd"
    assert {c["cluster"] for c in report["clusters"]} == {"amd-lab"}


def test_without_the_profiler_verdicts_rest_on_activity_and_have_no_counter_mfu(report) -> None:
    gpus = _gpus(report)
    for gpu in ("0", "4"):
        g = gpus[("mi300x-noprof", gpu)]
        assert not g["profiler"] and g["mfu"] is None
        assert g["class"] not in (None, "idle")  # gfx activity 97 % / 96 %
    # UMC activity is the only memory evidence: 79 % on the decode GPU, 34 % on the GEMM one.
    assert gpus[("mi300x-noprof", "4")]["class"] == "memory_bound"


def test_cpx_partitions_read_their_own_busy_and_partition_zero_alone_holds_power(report) -> None:
    gpus = _gpus(report)
    parts = {p: gpus[("mi300x-cpx", str(p))] for p in range(8)}
    assert all(g["partition"] == p and g["partition_type"] == "cpx" for p, g in parts.items())
    # Partition 0 is nearly idle (its XCC 9 % busy) although gpu_gfx_activity (71 %) and 688 W are printed on it.
    assert parts[0]["class"] == parts[7]["class"] == "input_starved"  # 9 % and 12 % busy alike
    for p in (1, 2, 3, 4):  # 94-97 % busy, GEMM at 1/8 of the GPU's counts on 1/8 of its peak
        assert parts[p]["class"] == "compute_bound"
        assert parts[p]["mfu"] == pytest.approx(0.62 * 0.96, abs=0.03)
    assert parts[5]["class"] == parts[6]["class"] == "idle"  # 0 % busy


def test_window_flag_scales_the_counter_rates_and_max_gpus_caps(store, report) -> None:
    base, end, work = store
    assert _gpus(report)[("mi300x-prof", "4")]["detail"] == "at_roof"  # 4.3 TB/s: 81 % of 5.3
    done, data = run_report(base, work, "--source", "amd", "--amd-profiler-window-us", "2000", end=end)
    assert done.returncode == 0, done.stderr
    decode = _gpus(data)[("mi300x-prof", "4")]  # the same bytes over twice the window: 2.15 TB/s, 41 %
    assert (decode["class"], decode["detail"]) == ("memory_bound", "leaning")
    assert _gpus(data)[("mi300x-prof", "0")]["mfu"] == pytest.approx(0.62 * 0.96, abs=0.03)  # MFMA % is a share
    done, data = run_report(base, work, "--source", "amd", "--max-gpus", "2", end=end)
    assert done.returncode == 0, done.stderr
    assert (data["amd"]["gpus_found"], data["amd"]["gpus_read"]) == (12, 2)
    assert "were read (--max-gpus 2)" in (work / "fleet.html").read_text()
    done, _ = run_report(base, work, "--source", "amd", "--amd-profiler-window-us", "0", end=end)
    assert done.returncode == 2 and "--amd-profiler-window-us" in done.stderr
