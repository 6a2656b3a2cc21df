"""DCGM 4.6's cumulative counters through the DCGM bindings (issue 46 item 1): an A100-class virtual GPU whose
host engine offers only the counters for SM, tensor and FP-pipe activity gets them as Δactive / Δelapsed over the
span between two reads, named as the counters' source; a reset of the counters drops one window and is never a
negative activity; a host engine older than 4.6 (no such fields) leaves the agent on the sampled ratios; and the
virtual fleet's scenario that plays only the counters gives counter verdicts (agent/virtual/scenarios/
a100-dcgm-counters.yaml)."""

from __future__ import annotations

from importlib import resources

import pytest

from agent.app.config import load_settings
from agent.backends.virtual import VirtualBackend
from agent.diagnostics.doctor import run_doctor
from agent.virtual.fake_dcgm.engine import full_counters_twin
from agent.virtual.scenario import load_scenario
from tests.agent_process import poll
from tests.fake_nvml_rig import START
from tests.neighbour_agent import Agent
from tests.test_dcgm_agent import joined

PIPES = ("sm_active", "tensor_active", "fp32_active", "fp16_active")
SCENARIO = str(resources.files("agent.virtual").joinpath("scenarios", "a100-dcgm-counters.yaml"))


def _reference(virtual, clock):
    return full_counters_twin(VirtualBackend(virtual.engine.scenario, clock=clock, start_time=START))


def test_an_a100_whose_dcgm_offers_only_the_counters_gets_its_activity_from_them():
    backend, clock, virtual = joined(cumulative=True, ratios=False)
    try:
        backend.discover()
        reference = _reference(virtual, clock)
        seen = []
        for _ in range(3):  # the first update is the counters' baseline; each later read is one window
            clock.t += 1.0
            seen.append((clock.t, backend.sample("0", clock.t)))
        sources = backend.counter_sources("0")
    finally:
        backend.close()
    t, last = seen[-1]
    want = reference.sample("0", t)  # one DCGM update (1 s) per window: the window's activity is that update's
    for name in PIPES:
        assert getattr(last, name) == pytest.approx(getattr(want, name), abs=1e-6), name
    assert last.dram_active == pytest.approx(want.dram_active)  # no counter for DRAM: DCGM's sampled ratio
    assert {sources[n] for n in PIPES} == {"dcgm-totals"} and sources["dram_active"] == "dcgm"


def test_counters_that_go_back_drop_one_window_and_never_give_a_negative_activity():
    backend, clock, virtual = joined(cumulative=True, ratios=False)
    try:
        backend.discover()
        for _ in range(3):
            clock.t += 1.0
            backend.sample("0", clock.t)
        engine = backend.source.m.structs.dcgmLib.engine
        engine.totals.clear()  # a GPU reset: its counters start again from 0
        clock.t += 1.0
        after_reset = backend.sample("0", clock.t)
        clock.t += 1.0
        recovered = backend.sample("0", clock.t)
        restarts = backend.source.windows.state(backend.joined["0"]).restarts
    finally:
        backend.close()
    assert after_reset.tensor_active is None and after_reset.sm_active is None, after_reset
    assert restarts == 1
    assert recovered.tensor_active is not None and 0.0 <= recovered.tensor_active <= 1.0


@pytest.mark.parametrize("version", ["4.5.3", "4.0.0"])
def test_a_host_engine_before_4_6_has_no_counters_and_the_sampled_ratios_are_read(version):
    backend, clock, virtual = joined(version=version, cumulative=True)
    try:
        backend.discover()
        reference = _reference(virtual, clock)
        clock.t += 1.0
        sample = backend.sample("0", clock.t)
        sources = backend.counter_sources("0")
    finally:
        backend.close()
    assert sample.tensor_active == pytest.approx(reference.sample("0", clock.t).tensor_active)
    assert sources["tensor_active"] == "dcgm"


def test_the_scenario_that_plays_only_the_counters_is_valid_and_asks_for_them():
    scenario = load_scenario(SCENARIO)
    (node,) = scenario.nodes
    assert node.dcgm.cumulative and not node.dcgm.ratios and node.model.startswith("a100")


@pytest.mark.slow
def test_a_real_agent_on_the_counters_only_scenario_gives_counter_verdicts_and_mfu(tmp_path):
    agent = Agent(tmp_path, "run", "--backend", "nvml-virtual", "--scenario", SCENARIO, ROOFWATCH_DCGM="on",
                  ROOFWATCH_CLASSIFIER__WINDOW_S="2", ROOFWATCH_CLASSIFIER__LONG_WINDOW_S="4",
                  ROOFWATCH_CLASSIFIER__EVALUATE_EVERY_S="0.5")
    training = ("0", "1", "2", "3")
    try:
        def ready() -> dict | None:
            verdicts = {v["gpu"]: v for v in agent.snapshot()["verdicts"]}
            done = all(verdicts.get(g, {}).get("basis") == "counters" for g in training)
            return verdicts if done else None

        verdicts = poll(ready, 60, interval=0.3, what="counter verdicts on the training GPUs")
    finally:
        agent.finish()
    mfu = load_scenario(SCENARIO).nodes[0].workloads[0].phases[0].mfu
    for gpu in training:
        assert verdicts[gpu]["basis_source"] == "dcgm+dcgm-totals", verdicts[gpu]
        assert verdicts[gpu]["class"] == "compute_bound", verdicts[gpu]
        assert verdicts[gpu]["mfu_counters"] == pytest.approx(mfu, abs=0.03), verdicts[gpu]


@pytest.mark.slow  # doctor waits for DCGM's first update (a second of wall time)
def test_doctor_says_which_activity_dcgm_gives():
    report = run_doctor(load_settings(backend="nvml-virtual", scenario=SCENARIO, dcgm="on"))
    activity = {f.gpu: f.detail for f in report.findings if f.check == "activity"}
    assert activity["0"].startswith("cumulative counters: ") and "tensor_active" in activity["0"], activity
    assert "Traceback" not in "".join(f.detail for f in report.findings)
    older = run_doctor(load_settings(backend="nvml-virtual", scenario="demo", dcgm="on"))
    assert not [f for f in older.findings if f.check == "activity"], "H100s read GPM: no DCGM activity line"
