"""``roofwatch fleet-report`` as a real child process against a real Prometheus (blocks from
``promtool tsdb create-blocks-from openmetrics``) and a real VictoriaMetrics (its import API),
both holding the synthetic fleet of tests/fleet_fixture.py, whose answers are known: every number
the report computes in PromQL is recomputed here in Python from the fleet's plan."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

import pytest

from agent.model import WORKLOAD_CLASSES
from tests import chromium, fleet_fixture as fx
from tests.fleet_stores import PRICES, fleet_end, prometheus_store, run_report, victoria_store

pytestmark = pytest.mark.slow

RANGE = fx.PERIOD
PRICE = {"h100-sxm": 3.0, "a100-sxm-80gb": 1.5}
WASTED = ("idle", "input_starved", "communication_jittered")


@pytest.fixture(scope="module", params=["prometheus", "victoria-metrics"])
def store(request, tmp_path_factory):
    end = fleet_end()
    work = tmp_path_factory.mktemp(request.param)
    server = prometheus_store(work, end) if request.param == "prometheus" else victoria_store(work, end)
    yield server.base, end, work
    server.stop()


@pytest.fixture(scope="module")
def report(store):
    base, end, work = store
    done, data = run_report(base, work, *PRICES, end=end)
    assert done.returncode == 0, done.stderr
    return data


def planned(end: int, start: int) -> dict[tuple[str, str, str], dict[str, float]]:
    """GPU-hours per class for each (cluster, job, user) over (start, end], from the plan."""
    out: dict[tuple[str, str, str], dict[str, float]] = defaultdict(lambda: dict.fromkeys(WORKLOAD_CLASSES, 0.0))
    for g in fx.fleet():
        for t in fx.times(end):
            if start < t <= end:
                out[(g.cluster, g.job or "", g.user or "")][fx.state(g, t, end)[0]] += fx.STEP / 3600
    return out


def test_gpu_hours_by_class_of_the_whole_fleet(report) -> None:
    end = int(report["window"]["end"])
    by_class = dict.fromkeys(WORKLOAD_CLASSES, 0.0)
    for hours in planned(end, end - RANGE).values():
        for cls, h in hours.items():
            by_class[cls] += h
    assert report["totals"]["gpu_hours_by_class"] == pytest.approx(by_class)
    assert report["totals"]["gpu_hours"] == pytest.approx(24 * 2.0)  # 24 GPUs for 2 hours
    assert report["window"]["step_s"] == 60 and report["window"]["range_s"] == RANGE
    assert report["problems"] == []


def test_wasted_hours_and_cost_by_job_user_namespace_and_cluster(report) -> None:
    jobs = {j["job_id"]: j for j in report["jobs"]}
    # By hand (fleet_fixture's docstring): notebook-b idle 4 GPUs x 2 h, loader-c starved 4 x 1 h, ddp-d jittered 4 x 0.5 h.
    assert jobs["notebook-b"]["idle_allocated_hours"] == pytest.approx(8.0)
    assert jobs["loader-c"]["hours"]["input_starved"] == pytest.approx(4.0)
    assert jobs["ddp-d"]["hours"]["communication_jittered"] == pytest.approx(2.0)
    assert "train-a" not in jobs, "a job that wasted nothing is not among the worst"
    assert [j["job_id"] for j in report["jobs"]] == ["notebook-b", "loader-c", "ddp-d"], "most wasted cost first"
    end = int(report["window"]["end"])
    plan = planned(end, end - RANGE)
    spec = {"east": "h100-sxm", "west": "a100-sxm-80gb"}
    for (cluster, job, user), hours in plan.items():
        if job in jobs:
            assert jobs[job]["wasted_hours"] == pytest.approx(sum(hours[c] for c in WASTED))
            assert jobs[job]["wasted_cost_usd"] == pytest.approx(sum(hours[c] for c in WASTED) * PRICE[spec[cluster]])
            assert jobs[job]["assumed_price"] is False
    users = {(u["cluster"], u["user"]): u for u in report["users"]}
    assert users[("east", "bob")]["wasted_cost_usd"] == pytest.approx(8 * 3.0)
    assert users[("west", "alice")]["wasted_cost_usd"] == pytest.approx(2 * 1.5)
    assert users[("east", "alice")]["wasted_hours"] == pytest.approx(0.0)
    namespaces = {(n["cluster"], n["namespace"]): n["wasted_hours"] for n in report["namespaces"]}
    assert namespaces == pytest.approx({("east", "research"): 8.0, ("east", "ml"): 4.0, ("west", "ml"): 2.0})
    held = {c["cluster"]: c for c in report["held_by_cluster"]}
    assert held["east"]["wasted_cost_usd"] == pytest.approx(12 * 3.0)
    assert held["west"]["total_hours"] == pytest.approx(4 * 2.0), "the 4 unheld west GPUs are capacity, not held"
    assert report["totals"]["wasted_gpu_hours"] == pytest.approx(14.0)
    assert report["totals"]["wasted_cost_usd"] == pytest.approx(39.0)


def test_mfu_distribution_against_the_target(report) -> None:
    end = int(report["window"]["end"])
    weights: dict[int, float] = defaultdict(float)
    for g in fx.fleet():
        for t in fx.times(end):
            cls, mfu = fx.state(g, t, end)
            if end - RANGE < t <= end and mfu is not None and cls != "idle":
                weights[round(mfu * 100)] += fx.STEP / 3600
    mfu = report["mfu"]
    assert {int(k): v for k, v in mfu["histogram"].items()} == pytest.approx(dict(weights))
    total = sum(weights.values())
    assert mfu["busy_gpu_hours"] == pytest.approx(total)
    assert mfu["mean"] == pytest.approx(sum(b / 100 * w for b, w in weights.items()) / total)
    assert mfu["mean"] == pytest.approx(0.38125)  # (16x0.45 + 4x0.10 + 4x0.30 + 2x0.20 + 6x0.50) / 32
    assert mfu["below_target_share"] == pytest.approx(sum(w for b, w in weights.items() if b < 40) / total)
    assert 0.45 <= mfu["p50"] < 0.46 and 0.10 <= mfu["p10"] < 0.11
    assert mfu["by_cluster"] == pytest.approx({"east": (16 * 0.45 + 4 * 0.10 + 4 * 0.30) / 24, "west": (2 * 0.2 + 6 * 0.5) / 8})


def test_worst_jobs_carry_their_verdict_reasons(report) -> None:
    jobs = {j["job_id"]: j for j in report["jobs"]}
    top = jobs["notebook-b"]["reasons"][0]
    assert (top["class"], top["detail"], top["gpu_hours"]) == ("idle", "idle_held", pytest.approx(8.0))
    starved = next(r for r in jobs["loader-c"]["reasons"] if r["class"] == "input_starved")
    assert starved["detail"] == "dataloader"
    # A backfilled series ends without a staleness marker: up to 5 min of lookback per GPU (4 GPUs).
    assert 4.0 <= starved["gpu_hours"] <= 4.0 + 4 * 5 / 60 + 1e-9
    assert jobs["loader-c"]["mfu"] == pytest.approx(0.20)  # half at 0.10, half at 0.30
    assert jobs["notebook-b"]["mfu"] is None, "an idle job has no busy MFU"


def test_straggler_jitter_and_alert_incidents(report) -> None:
    assert report["stragglers"] == [{"cluster": "west", "job_id": "ddp-d", "node": "w1", "gpu": "2",
                                     "hours": pytest.approx(40 / 60, abs=1e-6), "peak_lead": pytest.approx(0.30)}]
    assert report["jitter"] == [{"cluster": "west", "job_id": "ddp-d", "hours": pytest.approx(0.5)}]
    assert report["alerts"] == [{"alertname": "GpuJobStraggler", "cluster": "west", "job_id": "ddp-d",
                                 "hours": pytest.approx(0.5)}]


def test_energy_per_useful_gpu_hour_and_the_previous_period(report) -> None:
    end = int(report["window"]["end"])
    kwh = fx.energy_kwh(end, end - RANGE, end)
    assert report["totals"]["energy_kwh"] == pytest.approx(kwh, rel=1e-6)
    assert report["totals"]["kwh_per_useful_gpu_hour"] == pytest.approx(kwh / 26.0, rel=1e-5)
    before = report["previous"]
    assert before["end"] == report["window"]["start"] and before["start"] == end - 2 * RANGE
    assert before["energy_kwh"] == pytest.approx(fx.energy_kwh(end, end - 2 * RANGE, end - RANGE), rel=1e-6)
    assert before["wasted_gpu_hours"] == pytest.approx(0.0)
    assert before["gpu_hours_by_class"]["memory_bound"] == pytest.approx(8.0)  # notebook-b worked then
    assert before["mfu_mean"] == pytest.approx((16 * 0.45 + 8 * 0.05 + 8 * 0.30 + 8 * 0.50) / 40)  # GPU-hours x MFU


def test_cluster_filter_and_unknown_cluster(store) -> None:
    base, end, work = store
    done, west = run_report(base, work, *PRICES, "--cluster", "west", end=end)
    assert done.returncode == 0, done.stderr
    assert {c["cluster"] for c in west["clusters"]} == {"west"}
    assert west["totals"]["wasted_gpu_hours"] == pytest.approx(2.0)
    done, nowhere = run_report(base, work, "--cluster", "nowhere", end=end)
    assert done.returncode == 0, done.stderr
    assert "sections incomplete" in done.stdout
    sections = {p["section"] for p in nowhere["problems"]}
    assert {"GPU-hours by class", "Waste by user", "MFU distribution"} <= sections
    assert all("no data" in p["error"] and p["query"] for p in nowhere["problems"])


def test_dcgm_source_classifies_with_roofwatchs_engine(store) -> None:
    base, end, work = store
    done, data = run_report(base, work, "--source", "dcgm", end=end)
    assert done.returncode == 0, done.stderr
    gpus = {g["uuid"]: g for g in data["dcgm"]["gpus"]}
    assert set(gpus) == {"GPU-dcgm-0000", "GPU-dcgm-0001"}
    assert (gpus["GPU-dcgm-0000"]["class"], gpus["GPU-dcgm-0001"]["class"]) == ("compute_bound", "memory_bound")
    for g in gpus.values():  # all but the classifier's first window
        assert g["hours"][g["class"]] == pytest.approx(2.0, abs=3 * 60 / 3600)
    assert 0.8 < gpus["GPU-dcgm-0000"]["mfu"] < 0.9 and gpus["GPU-dcgm-0001"]["mfu"] < 0.1
    assert gpus["GPU-dcgm-0001"]["namespace"] == "inference"
    assert data["dcgm"]["absent_fields"] == [] and data["problems"] == []
    done, capped = run_report(base, work, "--source", "dcgm", "--max-gpus", "1", end=end)
    assert done.returncode == 0 and [g["gpu"] for g in capped["dcgm"]["gpus"]] == ["0"]
    assert (capped["dcgm"]["gpus_found"], capped["dcgm"]["gpus_read"]) == (2, 1)
    assert "were read (--max-gpus 1)" in (work / "fleet.html").read_text()


def test_page_renders_in_chromium_and_embeds_its_numbers(store, report, tmp_path: Path) -> None:
    base, end, work = store
    done, data = run_report(base, tmp_path, *PRICES, end=end)
    assert done.returncode == 0, done.stderr
    page = tmp_path / "fleet.html"
    result = chromium._run(["--enable-logging=stderr", "--v=0", "--virtual-time-budget=1000", "--dump-dom", page.as_uri()],
                           tmp_path / "profile")
    assert "Uncaught" not in result.stderr and "Refused" not in result.stderr
    dom = result.stdout
    embedded = re.search(r'<script type="application/json" id="fleet-data">(.*?)</script>', dom, re.S)
    assert embedded and json.loads(embedded.group(1))["totals"] == data["totals"]
    for table in ("waste-cluster", "waste-namespace", "waste-user", "jobs", "stragglers", "jitter", "alerts", "mfu-histogram"):
        assert f'id="{table}"' in dom, table
    assert 'data-job="notebook-b"' in dom and "Nothing: every query answered." in dom
    shot = chromium.screenshot(page.as_uri(), tmp_path / "shot.png", tmp_path / "profile", size=(1300, 2500))
    assert chromium.pixels_near(shot, "#c4162a", tolerance=20) > 50, "the MFU target line and worse-than-before deltas"
    assert chromium.pixels_near(shot, "#8e8e8e") > 200, "idle GPU-hours in the class bars"


def test_progress_on_a_terminal_and_quiet_otherwise(store, tmp_path: Path) -> None:
    import os
    import pty
    import subprocess
    import sys

    from tests.fleet_stores import REPO

    base, end, _ = store
    args = [sys.executable, "-m", "agent.app.cli", "fleet-report", "--prometheus", base, "--range", "2h", "--end", str(end),
            "--out", str(tmp_path / "f.html")]
    piped = subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert piped.returncode == 0 and piped.stderr == "", "no progress when stderr is not a terminal"
    master, slave = pty.openpty()
    with subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=slave, cwd=REPO) as proc:
        os.close(slave)
        seen = b""
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the terminal's other end closed with the process
                break
            if not chunk:
                break
            seen += chunk
    os.close(master)
    assert proc.returncode == 0
    assert b"fleet-report: query 1: GPU-hours by class" in seen and b"Energy" in seen
    assert seen.endswith(b"\r\x1b[K"), "the status line is cleared at the end"
