"""A demo-node snapshot in which some GPUs serve inference, for the serving views' tests.

The virtual fleet serves nothing, so the servers are put on its snapshot by hand: each GPU's
verdict gets the ServingView that agent.classifier.serving computes from a WorkloadReport (the
classifier's own numbers, not figures typed into the test), and its latest sample carries the report.
Shared by tests/test_serving_views.py and tests/test_serving_browser.py.
"""

from __future__ import annotations

import dataclasses

from prometheus_client.exposition import generate_latest

from agent.app.assemble import make_collector, open_backend_or_fail
from agent.app.config import Settings
from agent.classifier.serving import serving_view
from agent.classifier.thresholds import Thresholds
from agent.model import NodeSnapshot, ServingReport, ServingView, WorkloadReport
from exporters.prometheus import ExpositionCache
from tests.agent_process import SLOW_MACHINE_SAMPLE_TIMEOUT_S

HOSTILE = '<script>alert("x")</script> vllm'

LLAMA_70B = WorkloadReport(
    job="chat", world_size=2, flops_per_token=1.4e11, model_bytes=140e9, dtype="bf16", source="vllm",
    serving=ServingReport(server="vllm 10.0.0.7:8000", model="llama-70b", kv_cache_bytes=100e9, kv_usage=0.2,
                          running=24, waiting=40, max_running=256, preemptions_per_s=0.0, tpot_s=0.031,
                          ttft_s=0.4, prefill_share=0.1, generated_tokens_per_s=774.0, gpus=2),
)
"""A tensor-parallel pair: 160 GB read per step over 2 x 3.35 TB/s = a 23.9 ms floor; TPOT 31 ms = 1.3x;
24 running of ~120 the KV cache holds, 40 waiting: under-batched."""

HOSTILE_SERVER = WorkloadReport(
    job="embed", model_bytes=16e9, dtype="bf16", source="sglang",
    serving=ServingReport(server=HOSTILE, model="<b>qwen</b>", kv_cache_bytes=40e9, kv_usage=0.97, running=64,
                          waiting=12, preemptions_per_s=0.5, tpot_s=0.04, prefill_share=0.2,
                          generated_tokens_per_s=1600.0, gpus=1),
)
"""No FLOPs per token: the decode step has no intensity, so it is listed under the chart, not placed."""

NAMELESS = WorkloadReport(serving=ServingReport(running=4, tpot_s=0.01))
"""A server with no name and no weight bytes: its card is named after its GPU and its floor is unknown."""

SERVERS = {"1": LLAMA_70B, "2": LLAMA_70B, "6": HOSTILE_SERVER, "7": NAMELESS}


def view_for(workload: WorkloadReport, spec) -> ServingView:
    view = serving_view(workload, spec, [], Thresholds())
    assert view is not None
    return view


def serving_snapshot(snapshot: NodeSnapshot, servers: dict[str, WorkloadReport] = SERVERS) -> NodeSnapshot:
    """``snapshot`` with ``servers`` (GPU id -> report) on its verdicts and latest samples."""
    devices = {d.info.gpu: d for d in snapshot.devices}
    verdicts = tuple(dataclasses.replace(v, serving=view_for(servers[v.gpu], devices[v.gpu].info.spec))
                     if v.gpu in servers else v for v in snapshot.verdicts)
    states = tuple(dataclasses.replace(d, sample=dataclasses.replace(d.sample, workload=servers[d.info.gpu]))
                   if d.info.gpu in servers and d.sample is not None else d for d in snapshot.devices)
    return dataclasses.replace(snapshot, verdicts=verdicts, devices=states)


def demo_snapshot() -> NodeSnapshot:
    """One collection of the virtual demo node, as the agent would publish it."""
    settings = Settings(backend="virtual", sample_timeout_s=SLOW_MACHINE_SAMPLE_TIMEOUT_S)
    collector = make_collector(settings, open_backend_or_fail(settings))
    try:
        collector.collect_once()
        return collector.snapshot
    finally:
        collector.stop()


def exposition(snapshot: NodeSnapshot) -> str:
    """The ``/metrics`` text of ``snapshot``, as the agent serves it."""
    return ExpositionCache(lambda: snapshot).render(generate_latest, "text/plain").decode()
