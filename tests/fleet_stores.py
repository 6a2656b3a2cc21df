"""Real stores holding the synthetic fleet of tests/fleet_fixture.py, and the fleet-report CLI run
against them as a child process.

Prometheus gets the series as TSDB blocks written by ``promtool tsdb create-blocks-from
openmetrics`` (the backfill path its docs give); VictoriaMetrics gets them through its
``/api/v1/import/prometheus``. Both hold the roofwatch fleet and the dcgm-exporter GPUs.

``python -m tests.fleet_stores docs/fleet-report.png`` renders the screenshot in the docs.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests import fleet_fixture
from tests.agent_process import http_get, poll
from tests.prometheus_server import PrometheusServer

REPO = Path(__file__).resolve().parent.parent


def fleet_end() -> int:
    """The end of the report period: a whole hour, an hour ago (inside both stores' retention, and
    past VictoriaMetrics' 30 s search latency offset)."""
    return (int(time.time()) // 3600) * 3600 - 3600


def backfilled_prometheus(workdir: Path, sources: dict[str, str]) -> PrometheusServer:
    """A real Prometheus over the TSDB blocks ``promtool tsdb create-blocks-from openmetrics`` writes
    from each OpenMetrics text of ``sources`` (name -> text, timestamps in seconds, ``# EOF`` last)."""
    promtool = shutil.which("promtool")
    assert promtool, "promtool is required (Debian package 'prometheus')"
    for name, text in sources.items():
        source = workdir / f"{name}.om"
        source.write_text(text)
        done = subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(source), str(workdir / "data")],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
    return PrometheusServer(workdir, targets=[])


def prometheus_store(workdir: Path, end: int) -> PrometheusServer:
    return backfilled_prometheus(workdir, {"fleet": fleet_fixture.openmetrics(end),
                                           "dcgm": fleet_fixture.dcgm_openmetrics(end)})


def victoria_store(workdir: Path, end: int):  # -> tests.victoriametrics.VictoriaMetrics
    from tests.victoriametrics import VictoriaMetrics

    vm = VictoriaMetrics(workdir)
    try:
        for text in (fleet_fixture.prometheus_text(end), fleet_fixture.dcgm_prometheus_text(end)):
            vm.import_prometheus(text.splitlines())
        http_get(vm.base + "/internal/force_flush")
        expected = len({s for s, _, _ in fleet_fixture.samples(end) if s.startswith("roofwatch_gpu_workload_class")})
        poll(lambda: vm.query("count(roofwatch_gpu_workload_class)", end) and
             float(vm.query("count(roofwatch_gpu_workload_class)", end)[0]["value"][1]) == expected,
             timeout=30, what="imported series searchable")
    except BaseException:
        print(vm.stop())
        raise
    return vm


def run_report(base: str, out_dir: Path, *extra: str, end: int, range_: str = "2h") -> tuple[subprocess.CompletedProcess[str], dict]:
    """``roofwatch fleet-report`` as a child process; returns the process and its --json data."""
    html, data = out_dir / "fleet.html", out_dir / "fleet.json"
    done = subprocess.run([sys.executable, "-m", "agent.app.cli", "fleet-report", "--prometheus", base, "--range", range_,
                           "--end", str(end), "--out", str(html), "--json", str(data), *extra],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    return done, (json.loads(data.read_text()) if done.returncode == 0 else {})


PRICES = ("--cost-per-gpu-hour", "h100-sxm=3", "--cost-per-gpu-hour", "NVIDIA A100-SXM4-80GB=1.5")


def main(target: str) -> None:
    from tests import chromium

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        end = fleet_end()
        server = prometheus_store(work, end)
        try:
            done, _ = run_report(server.base, work, *PRICES, end=end)
            assert done.returncode == 0, done.stderr
        finally:
            server.stop()
        chromium.screenshot((work / "fleet.html").as_uri(), Path(target), work / "profile", size=(1300, 2500))
    print(f"wrote {target}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "docs/fleet-report.png")
