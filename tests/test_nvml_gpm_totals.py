"""NVML GPM's cumulative metrics (ids 248-260) through the real backend over the fake driver, per nvidia-ml-py release.

What is held (docs/nvidia.md, "Exact-window activity"): where the binding defines the ids (13.615.71 of the tested
releases) and the driver has them (R590 and later in the fake, an assumption), activity is Δactive / Δelapsed of
the totals over the two GPM samples the ratios use, named ``gpm-totals``; older releases read the ratios exactly as
before; a driver that refuses the ids costs no ratio and, after the first refusal, no call; a counter that goes back
gives no negative activity; a driver whose values are not running totals is caught by the self-check against GPM's
own ratios, switched off, and doctor says why.
"""

from __future__ import annotations

import html
import json
import logging
import os
import subprocess
from typing import Any

import pytest

from agent.diagnostics.nvidia import nvml_findings
from agent.model.counter_source import basis_sources, from_sources
from tests.agent_process import clean_env, poll, roofwatch_cmd
from tests.neighbour_agent import Agent
from tests.nvml_harness import NVIDIA_ML_PY, Rig, release_pynvml, scenario
from tests.wheels import unpacked

NEWEST = "13.615.71"
"""The one tested release that defines NVML_GPM_METRIC_SM_CYCLES_ELAPSED ... FP16_CYCLES_ACTIVE."""
WITH_IDS = "590.48.01"
"""A driver branch the fake gives the cumulative metrics (R590 and later)."""
WITHOUT_IDS = "580.95.05"
"""The newest branch before them (its binding, 13.580.126, stops at metric 210)."""
ELAPSED, SM_ACTIVE, MMA_ACTIVE = 248, 249, 250
"""nvml.h (NVIDIA/DCGM 4.6.0 sdk/nvidia/nvml/dcgm_nvml.h): SM cycles elapsed, SM active, any tensor pipe active."""
PIPES = ("sm_active", "tensor_active", "tensor_hmma_active", "fp16_active", "fp32_active", "fp64_active")
DISAGREE = ("GPM totals disagree with GPM's ratios over the same samples: not used (what nvmlGpmMetricsGet returns "
            "for ids 248-260 is undocumented)")
"""What doctor must say when the self-check switched the totals off (the issue's words)."""


def rig(release: str = NEWEST, driver: str = WITH_IDS, **nvml: Any) -> Rig:
    workloads = nvml.pop("workloads", None)
    node: dict[str, Any] = {"nvml": {"driver_version": driver, **nvml}}
    if workloads is not None:
        node["workloads"] = workloads
    return Rig(scenario("h100-sxm", **node), pynvml=release_pynvml(release))


def sources(backend: Any, gpu: str = "0") -> dict[str, str]:
    """The backend's counter sources of a GPU ({} for a backend that names none)."""
    return dict(getattr(backend, "counter_sources", lambda _: {})(gpu))


def metrics_calls(r: Rig) -> int:
    """nvmlGpmMetricsGet calls the fake driver has answered (it files them under no GPU: they take no handle)."""
    return r.library.calls[(None, "nvmlGpmMetricsGet")]


class DriverTotals:
    """The fake driver's cumulative counters of one GPU, read by the test itself through the C API (its own sample
    pair and metrics request), not through the backend."""

    def __init__(self, r: Rig, index: int = 0) -> None:
        self.nvml = r.nvml
        self.handle = self.nvml.nvmlDeviceGetHandleByIndex(index)
        self.samples = [self.nvml.nvmlGpmSampleAlloc(), self.nvml.nvmlGpmSampleAlloc()]
        self.nvml.nvmlGpmSampleGet(self.handle, self.samples[0])

    def now(self) -> dict[int, float]:
        """The counters at the fake's latest advance (the backend's read at the same virtual time)."""
        nvml = self.nvml
        nvml.nvmlGpmSampleGet(self.handle, self.samples[1])
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        ids = (ELAPSED, SM_ACTIVE, MMA_ACTIVE)
        request.numMetrics = len(ids)
        for i, metric_id in enumerate(ids):
            request.metrics[i].metricId = metric_id
        request.sample1, request.sample2 = self.samples
        nvml.nvmlGpmMetricsGet(request)
        self.samples.reverse()
        assert all(request.metrics[i].nvmlReturn == 0 for i in range(len(ids)))
        return {request.metrics[i].metricId: request.metrics[i].value for i in range(len(ids))}


def metrics_once(r: Rig, ids: tuple[int, ...], step: float = 1.0) -> dict[int, tuple[int, float]]:
    """One pair of GPM samples of GPU 0, ``step`` seconds apart, and ``ids`` over it: id -> (its return, value)."""
    nvml = r.nvml
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    first, second = nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()
    nvml.nvmlGpmSampleGet(handle, first)
    r.step(step)
    nvml.nvmlGpmSampleGet(handle, second)
    request = nvml.c_nvmlGpmMetricsGet_t()
    request.version, request.numMetrics = nvml.NVML_GPM_METRICS_GET_VERSION, len(ids)
    for i, metric_id in enumerate(ids):
        request.metrics[i].metricId = metric_id
    request.sample1, request.sample2 = first, second
    nvml.nvmlGpmMetricsGet(request)
    return {request.metrics[i].metricId: (request.metrics[i].nvmlReturn, request.metrics[i].value)
            for i in range(len(ids))}


def test_the_fake_driver_plays_the_ids_per_branch_at_the_c_level():
    """R580 does not know them (each fails alone, the ratio beside them is answered); R590 counts running totals:
    elapsed SM cycles grow by SMs x clock x time, active cycles by that times the activity; the differences mode
    answers the change over the pair; call_fails fails the call."""
    older = rig(driver=WITHOUT_IDS)
    try:
        older.nvml.nvmlInit()
        got = metrics_once(older, (ELAPSED, MMA_ACTIVE, 5))
        assert got[ELAPSED][0] == got[MMA_ACTIVE][0] == older.nvml.NVML_ERROR_INVALID_ARGUMENT and got[5][0] == 0
    finally:
        older.close()
    newer = rig()
    try:
        newer.nvml.nvmlInit()
        info = newer.library.backend.discover()[0]
        first = metrics_once(newer, (ELAPSED, MMA_ACTIVE, 5))
        second = metrics_once(newer, (ELAPSED, MMA_ACTIVE, 5), step=2.0)
        assert all(code == 0 for code, _ in (*first.values(), *second.values()))
        assert second[ELAPSED][1] > first[ELAPSED][1] > 0 and second[MMA_ACTIVE][1] > first[MMA_ACTIVE][1]
        cycles_per_s = info.sm_count * info.sm_clock_max_mhz * 1e6
        assert second[ELAPSED][1] == pytest.approx(first[ELAPSED][1] + 2.0 * cycles_per_s, rel=1e-9)
        tensor = second[5][1] / 100.0  # GPM's own ratio over the second pair
        span = second[ELAPSED][1] - first[ELAPSED][1]
        assert (second[MMA_ACTIVE][1] - first[MMA_ACTIVE][1]) / span == pytest.approx(tensor, abs=1e-9)
    finally:
        newer.close()
    differences = rig(gpm_cumulative="differences")
    try:
        differences.nvml.nvmlInit()
        info = differences.library.backend.discover()[0]
        got = metrics_once(differences, (ELAPSED,), step=1.5)
        assert got[ELAPSED] == (0, pytest.approx(1.5 * info.sm_count * info.sm_clock_max_mhz * 1e6, rel=1e-9))
    finally:
        differences.close()
    failing = rig(gpm_cumulative="call_fails")
    try:
        failing.nvml.nvmlInit()
        with pytest.raises(failing.nvml.NVMLError_InvalidArgument):
            metrics_once(failing, (5, ELAPSED))
        assert metrics_once(failing, (5,))[5][0] == 0  # a call without them is answered
    finally:
        failing.close()


def test_newest_release_on_a_driver_with_the_ids_reads_activity_as_delta_of_the_totals():
    r = rig()
    try:
        backend = r.backend()
        backend.discover()
        driver = DriverTotals(r)
        before = driver.now()
        for step in (1.0, 1.3, 0.7, 2.0):
            calls = metrics_calls(r)
            now = r.step(step)
            sample = backend.sample("0", now)
            assert metrics_calls(r) - calls == 2  # the ratios' call and the totals' one, over the same samples
            after = driver.now()
            backend.sample("1", now)
            span = after[ELAPSED] - before[ELAPSED]
            assert span > 0
            assert sample.tensor_active == pytest.approx((after[MMA_ACTIVE] - before[MMA_ACTIVE]) / span, abs=1e-9)
            assert sample.sm_active == pytest.approx((after[SM_ACTIVE] - before[SM_ACTIVE]) / span, abs=1e-9)
            assert 0.3 < sample.tensor_active < 0.8  # the training job's tensor activity, not a count of cycles
            named = sources(backend)
            assert {named.get(f) for f in PIPES} == {"gpm-totals"}, named
            assert "dram_active" not in named and "gr_active" not in named  # no totals for those: GPM's ratios
            before = after
        assert sources(backend, "1").get("tensor_active") == "gpm-totals"  # every GPU, not only the first
        early = backend.sample("0", r.step(0.05))  # too soon for GPM (100 ms): no new window, no ratio either
        assert early.tensor_active is None
        assert sources(backend).get("tensor_active") == "gpm-totals"  # the source does not flap to "gpm"
        device = backend.devices["0"]
        caps = device.info.capabilities
        used = basis_sources("counters", "nvidia", caps, named, lambda name: getattr(sample, name) is not None)
        assert used == ("gpm", "gpm-totals")  # tensor activity from the totals, DRAM from GPM's ratio
        assert "GPM's cumulative counters (Δactive / Δelapsed over the window)" in from_sources(used)
        findings, _ = nvml_findings(backend)
        activity = [f for f in findings if f.check == "activity" and f.gpu == "0"]
        assert len(activity) == 1 and activity[0].status == "info", activity
        assert activity[0].detail.startswith("cumulative counters: ") and "tensor_active" in activity[0].detail
        assert "preferred to the sampled ratios" in activity[0].detail
    finally:
        r.close()


@pytest.mark.parametrize("release", NVIDIA_ML_PY[:-1])
def test_older_releases_read_the_ratios_as_before_on_the_same_driver(release):
    """No release before 13.615 defines the ids: nothing is asked for, one metrics call per interval, no line."""
    r = rig(release)
    try:
        backend = r.backend()
        backend.discover()
        for _ in range(3):
            calls = metrics_calls(r)
            sample = backend.sample("0", r.step())
            assert metrics_calls(r) - calls == 1
            assert sample.tensor_active is not None and sample.sm_active is not None
            assert sources(backend) == {}
        assert not backend.devices["0"].failed
        findings, _ = nvml_findings(backend)
        assert not [f for f in findings if f.check in ("activity", "GPM totals")]
    finally:
        r.close()


@pytest.mark.parametrize(("driver", "mode", "why"), [
    (WITHOUT_IDS, "since_reboot", "SM_CYCLES_ELAPSED invalid argument"),  # each id fails alone: unknown to R580
    (WITH_IDS, "call_fails", "invalid argument"),  # the whole call fails
])
def test_a_driver_that_refuses_the_ids_costs_no_ratio_and_no_call_after(driver, mode, why, caplog):
    caplog.set_level(logging.DEBUG, logger="roofwatch.nvml")
    r = rig(driver=driver, gpm_cumulative=mode)
    try:
        backend = r.backend()
        backend.discover()
        probe_calls = metrics_calls(r)
        for _ in range(4):
            calls = metrics_calls(r)
            sample = backend.sample("0", r.step())
            assert metrics_calls(r) - calls == 1  # switched off at the probe: no further failed call
            truth = r.library.latest_sample("0")
            assert sample.tensor_active == pytest.approx(truth.tensor_active, abs=1e-6)  # GPM's ratio still read
            assert sample.sm_active == pytest.approx(truth.sm_active, abs=1e-6)
            assert sources(backend) == {}
        assert probe_calls == 2 * 1 + 2  # the probe's one ratios call per GPU, and the one refused totals call each
        device = backend.devices["0"]
        assert not device.failed and "gpm" in device.info.capabilities
        findings, _ = nvml_findings(backend)
        assert not [f for f in findings if f.check == "activity"]  # no activity line: the ratios, as before
        totals = [f for f in findings if f.check == "GPM totals" and f.gpu == "0"]
        assert len(totals) == 1 and totals[0].status == "info"
        assert why in totals[0].detail and "sampled ratios from GPM" in totals[0].detail
        refusals = [rec for rec in caplog.records if "GPM totals" in rec.getMessage() and "GPU 0" in rec.getMessage()]
        assert len(refusals) == 1 and "Traceback" not in caplog.text
    finally:
        r.close()


def test_a_counter_that_goes_back_gives_no_negative_activity_and_the_totals_resume():
    r = rig()
    try:
        backend = r.backend()
        backend.discover()
        for _ in range(2):
            backend.sample("0", r.step())
        assert sources(backend).get("tensor_active") == "gpm-totals"
        r.library.reset_gpm_counters("0")  # a GPU reset: the counters start again from about 0
        sample = backend.sample("0", r.step())
        truth = r.library.latest_sample("0")
        for name in PIPES:
            value = getattr(sample, name)
            assert value is not None and 0.0 <= value <= 1.0, (name, value)
        assert sample.tensor_active == pytest.approx(truth.tensor_active, abs=1e-6)  # the ratio over that window
        assert sources(backend) == {}  # the window across the reset is dropped
        state = backend.devices["0"].gpm_totals.state()
        assert state.restarts == 1 and state.off is None
        sample = backend.sample("0", r.step())
        assert sources(backend).get("tensor_active") == "gpm-totals"  # the new baseline gives the next window
        assert 0.0 <= sample.tensor_active <= 1.0
    finally:
        r.close()


SWINGING = [{"job": "swing", "gpus": [0], "phases": [
    {"kind": "compute", "mfu": 0.6, "duration_s": 2}, {"kind": "memory", "mbu": 0.7, "duration_s": 2},
    {"kind": "idle", "duration_s": 2}, {"kind": "compute", "mfu": 0.3, "duration_s": 3600}]}]
"""A load that changes every two seconds: a driver returning the change between its samples instead of a running
total happens to give the right Δ/Δ under steady load only."""


def test_a_driver_returning_differences_is_switched_off_after_disagreeing_and_doctor_says_why(caplog):
    caplog.set_level(logging.WARNING, logger="roofwatch.nvml")
    r = rig(gpm_cumulative="differences", workloads=SWINGING)
    try:
        backend = r.backend()
        backend.discover()
        device = backend.devices["0"]
        reads = 0
        while device.gpm_totals.off is None:
            reads += 1
            assert reads <= 10, device.gpm_totals.state()
            sample = backend.sample("0", r.step(0.7 + 0.3 * (reads % 3)))
            truth = r.library.latest_sample("0")
            if sources(backend).get("sm_active") != "gpm-totals":  # a window that disagreed: GPM's ratios stand
                assert sample.sm_active == pytest.approx(truth.sm_active, abs=1e-6)
            else:  # a window whose totals agreed is within the tolerance of the ratios on every field
                assert sample.sm_active == pytest.approx(truth.sm_active, abs=0.05)
        assert device.gpm_totals.off == DISAGREE
        for _ in range(3):
            calls = metrics_calls(r)
            sample = backend.sample("0", r.step())
            assert metrics_calls(r) - calls == 1 and sources(backend) == {}
            assert sample.tensor_active == pytest.approx(r.library.latest_sample("0").tensor_active, abs=1e-6)
        findings, _ = nvml_findings(backend)
        activity = [f for f in findings if f.check == "activity" and f.gpu == "0"]
        assert len(activity) == 1 and activity[0].status == "warn" and DISAGREE in activity[0].detail, activity
        warned = [rec for rec in caplog.records if DISAGREE in rec.getMessage()]
        assert len(warned) == 1 and warned[0].levelno == logging.WARNING and "\n" not in warned[0].getMessage()
    finally:
        r.close()


def test_honest_totals_over_a_swinging_load_are_never_switched_off():
    """The self-check's other side: running totals agree with GPM's ratios over the same samples whatever the load."""
    r = rig(workloads=SWINGING)
    try:
        backend = r.backend()
        backend.discover()
        for k in range(12):
            backend.sample("0", r.step(0.7 + 0.3 * (k % 3)))
            assert sources(backend).get("sm_active") == "gpm-totals"
        state = backend.devices["0"].gpm_totals.state()
        assert state.off is None and state.strikes == 0
    finally:
        r.close()


SCENARIO = """
name: gpm-totals
seed: 46
nodes:
  - name: h100-totals
    model: h100-sxm
    gpus: 2
    nvml: {driver_version: "%s"}
    workloads:
      - {job: train, gpus: [0], phases: [{kind: compute, mfu: 0.5, duration_s: 3600}]}
      - {job: decode, gpus: [1], phases: [{kind: memory, mbu: 0.6, duration_s: 3600}]}
""" % WITH_IDS


@pytest.mark.slow
def test_a_real_agent_with_the_newest_release_names_the_totals_in_its_verdicts_and_status_page(tmp_path):
    """``roofwatch run --backend nvml-virtual`` with nvidia-ml-py 13.615.71 first on the path, on a driver that has
    the ids: the training GPU's verdict rests on GPM's ratios (DRAM) and its totals (tensor activity), in the
    snapshot and on the status page, and doctor (its two-read probe) says the totals are read."""
    scenario_file = tmp_path / "gpm-totals.yaml"
    scenario_file.write_text(SCENARIO)
    path = os.pathsep.join(p for p in (str(unpacked("nvidia-ml-py", NEWEST)), os.environ.get("PYTHONPATH")) if p)
    doctor = subprocess.run(roofwatch_cmd("doctor", "--backend", "nvml-virtual", "--scenario", str(scenario_file),
                                          "--json"), capture_output=True, text=True, timeout=60,
                            env=clean_env(PYTHONPATH=path))
    report = json.loads(doctor.stdout)
    assert f"nvidia-ml-py {NEWEST}" in report["findings"][0]["detail"], doctor.stdout  # the release ran
    totals = [f for f in report["findings"] if f["check"] == "GPM totals" and f["gpu"] == "0"]
    assert len(totals) == 1 and "ids 248-260" in totals[0]["detail"] and totals[0]["status"] == "info"
    assert "are read" in totals[0]["detail"], totals  # the driver answers them: one baseline in doctor's probe
    agent = Agent(tmp_path, "run", "--backend", "nvml-virtual", "--scenario", str(scenario_file), PYTHONPATH=path,
                  ROOFWATCH_CLASSIFIER__WINDOW_S="2", ROOFWATCH_CLASSIFIER__LONG_WINDOW_S="4",
                  ROOFWATCH_CLASSIFIER__EVALUATE_EVERY_S="0.5")
    try:
        def ready() -> dict | None:  # the first verdicts (before the totals' second window) rest on GPM's ratios
            verdicts = {v["gpu"]: v for v in agent.snapshot()["verdicts"]}
            return verdicts if verdicts.get("0", {}).get("basis_source") == "gpm+gpm-totals" else None

        verdicts = poll(ready, 30, interval=0.3, what="a verdict on GPM's totals on the training GPU")
        assert verdicts["0"]["basis"] == "counters" and verdicts["0"]["class"] == "compute_bound", verdicts["0"]
        seen: dict[float, str] = {}

        def later_windows() -> bool:  # and it stays there: no window falls back to "gpm" (the source does not flap)
            latest = {v["gpu"]: v for v in agent.snapshot()["verdicts"]}["0"]
            seen[latest["window_end"]] = latest["basis_source"]
            return len(seen) >= 4

        poll(later_windows, 30, interval=0.2, what="four more verdict windows")
        assert set(seen.values()) == {"gpm+gpm-totals"}, seen
        status, page = agent.get("")
        assert status == 200
        assert "GPM's cumulative counters (Δactive / Δelapsed over the window)" in html.unescape(page)
    finally:
        agent.finish()
