"""Traces with serving samples: ``workload.serving`` survives the trace round trip, ``classify`` prints the
serving view, and ``roofwatch report`` gets a serving section per server.

The samples are written here from published figures, not from the virtual fleet: Llama-3.1-8B in
bf16 reads 16.06 GB of weights per decode step, an H100 SXM's HBM3 moves 3.35 TB/s (the spec
catalogue's datasheet figure), so its batch-1 floor is 16.06e9 / 3.35e12 = 4.79 ms per token.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from agent.classifier.engine import classify_samples
from agent.model import GpuSample, ServingReport, WorkloadReport
from agent.model.specs import spec_by_key
from agent.trace import TraceWriter, read_trace
from agent.views.report import build_report
from tests.agent_process import clean_env, roofwatch_cmd
from tests.test_status_page import elements

START = 1_800_000_000.0
H100 = spec_by_key("h100-sxm")
WEIGHTS = 16.06e9
FLOOR = WEIGHTS / H100.mem_bandwidth_bytes_per_s


def samples(gpu: str, server: str, serving: ServingReport, seconds: int = 60) -> list[GpuSample]:
    step_bytes_per_s = WEIGHTS / (serving.tpot_s or 1.0)
    return [GpuSample(
        ts=START + i, gpu=gpu, node="infer-1", model="NVIDIA H100 80GB HBM3", vendor="nvidia", interval_s=1.0,
        gr_active=0.95, sm_active=0.4, tensor_active=0.04, dram_active=min(0.85, step_bytes_per_s / H100.mem_bandwidth_bytes_per_s),
        power_w=380.0, power_limit_w=700.0, sm_clock_mhz=1980.0, sm_clock_max_mhz=1980.0, mem_used_bytes=72 * 10**9,
        mem_total_bytes=80 * 2**30, dtype="bf16",
        workload=WorkloadReport(job=server, world_size=1, tokens_per_s=(serving.running or 1) / (serving.tpot_s or 1),
                                model_bytes=WEIGHTS, flops_per_token=16e9, dtype="bf16", source="vllm",
                                serving=serving)) for i in range(seconds)]


CHAT = ServingReport(server="chat", model="meta-llama/Llama-3.1-8B-Instruct", weight_bytes=WEIGHTS, running=1, waiting=0,
                     kv_usage=0.01, kv_cache_bytes=45e9, tpot_s=1.2 * FLOOR, prefill_share=0.05, gpus=1)
QUEUED = ServingReport(server="batch-api", model="meta-llama/Llama-3.1-8B-Instruct", weight_bytes=WEIGHTS, running=60,
                       waiting=40, kv_usage=0.96, kv_cache_bytes=45e9, tpot_s=0.03, prefill_share=0.2,
                       preemptions_per_s=1.5, gpus=1)


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("serving") / "serving.jsonl"
    with TraceWriter(path, node="infer-1") as writer:
        writer.write_many(sorted(samples("0", "chat", CHAT) + samples("1", "batch-api", QUEUED), key=lambda s: s.ts))
    return path


def test_serving_figures_survive_the_trace_round_trip(trace_file):
    lines = [json.loads(line) for line in trace_file.read_text().splitlines()[1:]]
    assert lines[0]["workload"]["serving"]["tpot_s"] == pytest.approx(1.2 * FLOOR)
    read = [s for s in read_trace(trace_file) if s.gpu == "1"]
    assert read[0].workload.serving == QUEUED


@pytest.mark.slow
def test_classify_prints_the_serving_view_beside_the_class(trace_file):
    result = subprocess.run(roofwatch_cmd("classify", str(trace_file)), capture_output=True, text=True, timeout=120,
                            env=clean_env())
    assert result.returncode == 0, result.stderr
    last = {}
    for line in result.stdout.splitlines():
        verdict = json.loads(line)
        last[verdict["gpu"]] = verdict
    chat, queued = last["0"]["serving"], last["1"]["serving"]
    assert chat["state"] == "at_floor" and chat["advice_code"] == "faster_memory_or_fewer_bytes"
    # KV read at 1% of the 45 GB pool adds to the weights: the floor is (16.06 + 0.45) GB / 3.35 TB/s.
    assert chat["floor_s"] == pytest.approx((WEIGHTS + 0.01 * 45e9) / H100.mem_bandwidth_bytes_per_s, rel=1e-3)
    assert queued["state"] == "kv_saturated" and queued["advice_code"] == "scale_out"
    assert last["0"]["class"] in ("memory_bound", "latency_bound", "compute_bound", "unknown")  # the GPU class stays


def test_the_report_has_a_serving_row_per_server(trace_file):
    trace = list(read_trace(trace_file))
    html = build_report(trace, list(classify_samples(trace)))
    rows = {row["data-server"] for row in elements(html, "tr") if "data-server" in row}
    assert rows == {"chat", "batch-api"}
    chat_row = html.split('data-server="chat"')[1].split("</tr>")[0]
    assert "at the floor" in chat_row and "1.2x" in chat_row
    queued_row = html.split('data-server="batch-api"')[1].split("</tr>")[0]
    assert "KV cache saturated" in queued_row and "scale out" in queued_row


def test_a_trace_without_serving_samples_has_no_serving_section(trace_file):
    trace = [s for s in read_trace(trace_file)]
    plain = [s.__class__(**{**{f: getattr(s, f) for f in s.__dataclass_fields__}, "workload": None}) for s in trace]
    html = build_report(plain, list(classify_samples(plain)))
    assert 'id="serving"' not in html
