"""Exact-window activity from DCGM 4.6's cumulative counters, read through dcgm-exporter (issue 46 item 1).

A real ``roofwatch run --backend dcgm-exporter`` process reads a stand-in exporter serving the A100 node with
only the cumulative counters (``tests/fixtures/dcgm_exporter/a100-8x-pods.cumulative.prom``: no
``PIPE_TENSOR_ACTIVE``, no ``SM_ACTIVE`` gauge), whose counters move on by one second of the same work at every
read (tests/cumulative_exporter.py). Each busy GPU must get a verdict on ``counters`` and a counter MFU within
3 points of Δtensor / Δelapsed x clock factor (the A100's 1410 MHz against the datasheet's 1410 MHz boost
clock: 1) x peak / peak, computed here from the two fixture files alone. Before, the counters were not read:
no tensor activity, no counter MFU, a verdict on power. A reset of the counters (they go back) drops that
window and never shows a negative activity; and ``doctor`` says which activity was used.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.agent_process import clean_env, poll, roofwatch_cmd
from tests.cumulative_exporter import AdvancingExporter, window_activity
from tests.neighbour_agent import Agent

pytestmark = pytest.mark.slow

BUSY = ("0", "1", "2", "3", "4", "5", "6")
CLOCK_FACTOR = 1410.0 / 1410.0
"""The fixture's SM clock (DCGM_FI_DEV_SM_CLOCK 1410 MHz on GPUs 0-6) over the A100 SXM4's boost clock."""


def _agent(tmp_path, url: str) -> Agent:
    return Agent(tmp_path, "run", "--backend", "dcgm-exporter", "--dcgm-exporter-url", url,
                 ROOFWATCH_DCGM_EXPORTER_INTERVAL_S="0.5", ROOFWATCH_CLASSIFIER__WINDOW_S="2",
                 ROOFWATCH_CLASSIFIER__LONG_WINDOW_S="4", ROOFWATCH_CLASSIFIER__EVALUATE_EVERY_S="0.5")


def test_cumulative_counters_alone_give_a_counter_verdict_and_mfu(tmp_path):
    tensor = window_activity("DCGM_FI_PROF_MMA_CYCLES_ACTIVE_TOTAL")
    sm = window_activity("DCGM_FI_PROF_SM_CYCLES_ACTIVE_TOTAL")
    with AdvancingExporter() as exporter:
        agent = _agent(tmp_path, exporter.url)
        try:
            def ready() -> dict | None:
                verdicts = {v["gpu"]: v for v in agent.snapshot()["verdicts"]}
                done = all(verdicts.get(g, {}).get("mfu_counters") is not None for g in BUSY)
                return verdicts if done else None

            verdicts = poll(ready, 60, interval=0.3, what="a counter MFU on every busy GPU")
            devices = agent.samples()
            reads_before = exporter.requests
            exporter.restart()  # the counters go back to an earlier reading: a reset
            poll(lambda: exporter.requests >= reads_before + 4, 30, what="reads after the reset")
            after = agent.samples()
        finally:
            agent.finish()
    for gpu in BUSY:
        expected = tensor[gpu] * CLOCK_FACTOR
        assert verdicts[gpu]["basis"] == "counters", verdicts[gpu]
        assert verdicts[gpu]["basis_source"] == "dcgm-exporter+dcgm-exporter-totals", verdicts[gpu]  # DRAM: a gauge
        assert verdicts[gpu]["mfu_counters"] == pytest.approx(expected, abs=0.03), (gpu, verdicts[gpu], expected)
        sample = devices[gpu]["sample"]
        assert sample["tensor_active"] == pytest.approx(tensor[gpu], abs=1e-6), (gpu, sample)
        assert sample["sm_active"] == pytest.approx(sm[gpu], abs=1e-6), (gpu, sample)
    assert tensor["0"] > 0.4 and sm["0"] > 0.9, "the window is the fixture's own busy second, not its since-load mean"
    for gpu, device in after.items():
        value = (device.get("sample") or {}).get("tensor_active")
        assert value is None or 0.0 <= value <= 1.0, (gpu, value)


def test_doctor_says_the_cumulative_counters_are_used(tmp_path):
    with AdvancingExporter() as exporter:
        result = subprocess.run(roofwatch_cmd("doctor", "--backend", "dcgm-exporter", "--json"), capture_output=True,
                                text=True, timeout=60, env=clean_env(ROOFWATCH_DCGM_EXPORTER_URL=exporter.url))
    assert "Traceback" not in result.stderr, result.stderr
    findings = json.loads(result.stdout)["findings"]
    activity = {f["gpu"]: f["detail"] for f in findings if f["check"] == "activity"}
    assert set(activity) >= set(BUSY), findings
    assert activity["0"].startswith("cumulative counters: ") and "tensor_active" in activity["0"], activity
    assert "DCGM_FI_PROF_SM_CYCLES_ELAPSED_TOTAL" in activity["0"], activity
    missing = [f for f in findings if f["check"] == "profiling counters" and f.get("gpu") == "0"]
    assert not any("tensor_active" in f["detail"] for f in missing), missing
