"""The ``serving`` workload kind of the virtual fleet: its numbers come from published figures, the GPU
counters agree with them, its counters only grow, and what the GPUs cannot run is refused by field.

Expected values come from tests/serving_scenario_expectations.py (published figures, plain YAML),
never from agent.virtual.serving. The fake servers' pages and HTTP are in
tests/test_virtual_serving_servers.py; the agent as a process in tests/test_serving_scenario_e2e.py.
"""

from __future__ import annotations

import copy
import statistics
from pathlib import Path
from typing import Any

import pytest

from agent.classifier.serving import serving_view
from agent.classifier.thresholds import DEFAULT_THRESHOLDS
from agent.model.specs import spec_by_key
from agent.trace import TraceWriter
from agent.trace.reader import read_trace
from agent.virtual.engine import VirtualEngine
from agent.virtual.scenario import ScenarioError, builtin_scenario, parse_scenario
from tests.serving_scenario_expectations import (
    H100_SXM_BANDWIDTH,
    H100_SXM_BF16_DENSE,
    MODELS,
    expected_servers,
    scenario_yaml,
)
from tests.test_virtual_engine import check_invariants

NODE = "serving-node"
EXPECTED = expected_servers()
H100 = spec_by_key("h100-sxm")


@pytest.fixture(scope="module")
def engine() -> VirtualEngine:
    return VirtualEngine(builtin_scenario("serving"))


def test_the_scenario_is_written_in_published_figures() -> None:
    assert (H100.mem_bandwidth_bytes_per_s, H100.peak_flops["bf16"]) == (H100_SXM_BANDWIDTH, H100_SXM_BF16_DENSE)
    for e in EXPECTED.values():
        phase = e.phase
        assert float(phase["weight_bytes"]) == pytest.approx(e.weight_bytes, rel=1e-3), e.job  # params x 2 bytes
        assert float(phase["params"]) == MODELS[e.model][0]
        assert float(phase.get("kv_bytes_per_token", 131072)) == e.kv_bytes_per_token, e.job
    assert {e.server for e in EXPECTED.values()} == {"vllm", "sglang", "tgi"}
    assert sorted(g for e in EXPECTED.values() for g in e.gpus) == [str(i) for i in range(8)]


@pytest.mark.parametrize("job", sorted(EXPECTED))
def test_the_direct_report_puts_each_server_in_its_state(engine: VirtualEngine, job: str) -> None:
    """What ``record --simulate`` carries: the report without HTTP, classified as the agent would."""
    e = EXPECTED[job]
    window = [engine.sample(NODE, e.gpus[0], 100.0 + k, 101.0 + k) for k in range(10)]
    report = window[-1].workload
    assert report is not None and report.serving is not None and report.source == e.server
    view = serving_view(report, H100, window, DEFAULT_THRESHOLDS)
    assert (view.state, view.advice_code) == (e.state, e.advice)
    assert view.floor_s == pytest.approx(e.floor_s, rel=1e-5)  # TGI's KV usage: whole tokens of a token budget
    assert view.floor_ratio == pytest.approx(e.ratio, rel=1e-5)
    assert view.prefill_share == pytest.approx(e.prefill_share)
    assert view.kv_usage == pytest.approx(e.kv_usage, rel=1e-4)  # TGI rounds its token counts
    assert view.weight_bytes == pytest.approx(e.weight_bytes, rel=1e-3) and view.gpus == len(e.gpus)
    assert not view.kv_bytes_estimated


@pytest.mark.parametrize("job", sorted(EXPECTED))
def test_gpu_counters_agree_with_the_serving_numbers(engine: VirtualEngine, job: str) -> None:
    e = EXPECTED[job]
    p = e.phase
    gpus, share, batch = len(e.gpus), p["prefill_share"], p["running"]
    flops_per_token = 2.0 * MODELS[e.model][0]
    kv = e.kv_usage * e.kv_pool_bytes
    decode_dram = (e.weight_bytes + kv) / (gpus * H100_SXM_BANDWIDTH) / e.step_s
    decode_tensor = batch * flops_per_token / (gpus * H100_SXM_BF16_DENSE) / e.step_s
    # Little's law on the running batch: each request spends its prefill and (output - 1) token gaps in it.
    gap = e.step_s / (1.0 - share)
    decode_time = (p["output_tokens"] - 1) * gap
    rate = batch / (decode_time * (1.0 + share / ((1.0 - share) * batch)))
    prefill_mfu = rate * p["prompt_tokens"] * flops_per_token / (share * gpus * H100_SXM_BF16_DENSE)
    assert 0.1 < prefill_mfu < 0.85
    assert decode_tensor < 0.05 or job == "chat-70b"  # decode barely touches the tensor pipes, but at batch 164
    for gpu in e.gpus:
        samples = [engine.sample(NODE, gpu, 200.0 + k, 201.0 + k) for k in range(30)]
        for k, s in enumerate(samples):
            check_invariants(s, engine, 200.0 + k, 201.0 + k, None)
        dram = statistics.fmean(s.dram_active for s in samples)
        tensor = statistics.fmean(s.tensor_active for s in samples)
        # prefill runs as a large GEMM: DRAM 0.12-0.30 of peak
        assert (1 - share) * decode_dram + share * 0.12 - 0.02 <= dram <= (1 - share) * decode_dram + share * 0.30 + 0.02
        assert tensor == pytest.approx((1 - share) * decode_tensor + share * prefill_mfu, abs=0.015)
        held = (e.weight_bytes + e.kv_pool_bytes) / gpus + 2**30 + 512 * 2**20  # + workspace + driver reserve
        assert samples[-1].mem_used_bytes == pytest.approx(held, rel=1e-3)
        assert samples[-1].processes[0].name == {"vllm": "vllm", "sglang": "sglang",
                                                 "tgi": "text-generation-launcher"}[e.server]
        assert samples[-1].dtype == "bf16" and max(s.power_w for s in samples) < H100.tdp_w
    assert engine.true_class(NODE, e.gpus[0], 200.0) == ("latency_bound" if job == "tiny-1b" else "memory_bound")


def test_record_simulate_writes_the_serving_figures_into_the_trace(engine: VirtualEngine, tmp_path: Path) -> None:
    path = tmp_path / "serving.jsonl"
    with TraceWriter(path, agent_version="test") as writer:
        for sample in engine.iter_trace(3.0, 1.0, start_ts=1_800_000_000.0):
            writer.write(sample)
    read = [s for s in read_trace(path) if s.gpu == "2"]
    assert len(read) == 3 and all(s.label == "memory_bound" for s in read)
    serving = read[-1].workload.serving
    assert serving.prefill_share == 0.55 and serving.server == "rag-7b" and serving.model == "mistralai/Mistral-7B-Instruct-v0.3"  # as its endpoint names it
    assert serving.tpot_s == pytest.approx(EXPECTED["rag-7b"].ratio * EXPECTED["rag-7b"].floor_s)


def _two_phase_job(**second: Any) -> VirtualEngine:
    first = {"kind": "serving", "duration_s": 30, "server": "vllm", "model": "m", "weight_bytes": 16.06e9,
             "kv_cache_bytes": 60e9, "running": 8, "prompt_tokens": 512, "output_tokens": 128, "prefill_share": 0.1}
    phases = [first, {"kind": "idle_held", "duration_s": 10}, {**first, "running": 32, "waiting": 5, "prefill_share": 0.4, **second}]
    doc = {"name": "t", "nodes": [{"name": "n", "model": "h100-sxm", "gpus": 1,
                                   "workloads": [{"job": "s", "gpus": [0], "phases": phases}]}]}
    return VirtualEngine(parse_scenario(doc))


def test_counters_only_grow_through_phases_and_idle_and_move_at_each_phase_rate() -> None:
    job = _two_phase_job().serving_jobs("n")[0]
    previous = None
    for k in range(0, 3000):
        t = k * 0.05
        totals = job.totals(t)
        values = [*totals.counters.values(), *(o.count for o in totals.observed.values()),
                  *(o.sum for o in totals.observed.values())]
        if previous is not None:
            assert all(b >= a for a, b in zip(previous, values)), t
        previous = values
    a, b = job.totals(31.0), job.totals(39.0)  # the server idles: nothing moves, gauges read zero
    assert a.counters == b.counters and job.figures_at(35.0) is None and job.report(35.0) is None
    for t0, t1 in ((5.0, 25.0), (45.0, 65.0), (75.0, 95.0)):  # first phase, second phase, first again (repeat)
        f = job.figures_at(t1)
        rate = (job.totals(t1).counters["generated_tokens"] - job.totals(t0).counters["generated_tokens"]) / (t1 - t0)
        assert rate == pytest.approx(f.generated_tokens_per_s)
    assert job.figures_at(50.0).running == 32 and job.figures_at(90.0).running == 8


BASE = scenario_yaml()


def _error(change) -> str:
    doc = copy.deepcopy(BASE)
    change(doc["nodes"][0]["workloads"])
    with pytest.raises(ScenarioError) as info:
        parse_scenario(doc, "serving.yaml")
    return str(info.value)


def _set(job: int, **values: Any):
    return lambda workloads: workloads[job]["phases"][0].update(values)


@pytest.mark.parametrize(("change", "path", "message"), [
    (_set(0, running=400, max_running=512), "phases.0.running", "GB of KV cache; the pool holds 60 GB"),
    (_set(2, prefill_share=0.2), "phases.0.prefill_share", "x the dense peak while prefilling"),
    (_set(1, running=32), "phases.0.running", "32 exceeds max_running (16)"),
    (_set(0, device_timer=True), "phases.0.device_timer", "only SGLang has a device timer"),
    (_set(0, floor_multiple=1.05), "phases.0.floor_multiple", "greater than or equal to 1.12"),
    (_set(4, weight_bytes=141.1e9), "phases.0.weight_bytes", "leave no KV cache"),
    (_set(3, kv_cache_bytes=400e9), "phases.0.kv_cache_bytes", "GiB per GPU; the GPU has"),
    (lambda w: w[0]["phases"].append({"kind": "compute", "duration_s": 5, "mfu": 0.5}), "phases.1.kind",
     "a serving workload only serves or idles"),
    (lambda w: w[0]["phases"].append({**w[0]["phases"][0], "model": "other"}), "phases.1",
     "must be the same in every serving phase"),
])
def test_what_the_gpus_cannot_run_is_refused_by_field(change, path: str, message: str) -> None:
    text = _error(change)
    assert f"serving.yaml: nodes.0.workloads." in text and f".{path}: " in text and message in text, text


def test_a_serving_replica_stays_on_whole_gpus_of_one_node() -> None:
    phase = {"kind": "serving", "duration_s": 5, "model": "m", "weight_bytes": 2e9, "running": 1}
    mig = {"name": "n", "model": "h100-sxm", "gpus": 1, "mig": {0: ["3g.40gb"]},
           "workloads": [{"job": "s", "gpus": ["0/1"], "phases": [phase]}]}
    with pytest.raises(ScenarioError, match="runs on whole GPUs"):
        parse_scenario({"name": "t", "nodes": [mig]})
    two = [{"name": n, "model": "h100-sxm", "gpus": 1, "workloads": [{"job": "s", "gpus": [0], "phases": [phase]}]}
           for n in ("a", "b")]
    with pytest.raises(ScenarioError, match="runs on more than one node"):
        parse_scenario({"name": "t", "nodes": two})
