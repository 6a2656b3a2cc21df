"""llama.cpp, Triton with TensorRT-LLM and vLLM of 2026 read by a real agent process (issue 46 item 4).

One ``roofwatch run --backend dcgm-exporter`` over the A100 node's stand-in exporter reads three inference
endpoints with ``kind: auto``, served by a real HTTP server in another process (tests/inference_server.py):
each carries its fixture pair on (recipe ``advance-<stem>`` of tests/inference_bodies.py), so its counters
move at the fixtures' rates for as long as the agent reads it. What the agent exports for GPUs 0, 1 and 2
is checked against the fixture text (tests/fixtures/inference/README.md), worked out here. Before, all
three endpoints were "no vLLM, SGLang or TGI metrics" (llama.cpp, Triton) or told to raise its batch for
requests that wait for a KV transfer (vLLM's ``deferred``).
"""

from __future__ import annotations

import pytest

from tests.agent_process import poll
from tests.inference_server import server  # noqa: F401 (a fixture)
from tests.test_inference_hostile_e2e import agents, samples, source_details
from tests.test_inference_servers import step, total

pytestmark = pytest.mark.slow

STEMS = {"0": "llamacpp-serving", "1": "triton-serving", "2": "vllm-2026-serving"}
"""GPU -> the fixture pair its endpoint serves."""
KINDS = {"0": "llamacpp", "1": "triton", "2": "vllm"}


def _of(text: str, name: str, gpu: str, **match: str) -> list[float]:
    return [s["value"] for s in samples(text, name) if s["gpu"] == gpu and all(s.get(k) == v for k, v in match.items())]


def _ready(text: str) -> bool:
    """Every GPU has its server's time per output token: two scrapes made rates."""
    return all(_of(text, "roofwatch_serving_time_per_output_token_seconds", gpu) for gpu in STEMS)


def test_each_new_server_is_recognised_and_read_by_a_running_agent(server, tmp_path):
    urls = {gpu: server.gen(f"advance-{stem}") for gpu, stem in STEMS.items()}
    with agents(tmp_path, agent=[(url, gpu) for gpu, url in urls.items()]) as running:
        agent = running["agent"]
        text = poll(lambda: agent.watch() or ((t := agent.get("metrics")) and _ready(t) and t), 90,
                    what="the serving figures of the llama.cpp, Triton and vLLM endpoints")
        details = source_details(agent)

    info = {s["gpu"]: s for s in samples(text, "roofwatch_serving_info")}
    for gpu, kind in KINDS.items():
        assert info[gpu]["server"].split()[0] == kind, info[gpu]
        assert details[f"inference {urls[gpu]}"] in (None, ""), details  # nothing skipped, refused or rejected
    assert (info["0"]["model"], info["1"]["model"], info["2"]["model"]) == ("", "tensorrt_llm", "Qwen/Qwen3-32B")

    llama, triton, vllm = (f"{STEMS[gpu]}-2.prom" for gpu in ("0", "1", "2"))
    requests = {gpu: {state: _of(text, "roofwatch_serving_requests", gpu, state=state) for state in ("running", "waiting")}
                for gpu in STEMS}
    assert requests["0"] == {"running": [total(llama, "llamacpp:requests_processing")],
                             "waiting": [total(llama, "llamacpp:requests_deferred")]}
    assert requests["1"] == {"running": [total(triton, "nv_trt_llm_request_metrics", request_type="scheduled")],
                             "waiting": [total(triton, "nv_trt_llm_request_metrics", request_type="waiting")
                                         + total(triton, "nv_inference_pending_request_count")]}
    assert requests["2"] == {"running": [total(vllm, "vllm:num_requests_running")],
                             "waiting": [total(vllm, "vllm:num_requests_waiting_by_reason", reason="capacity")]}

    tpot = {gpu: _of(text, "roofwatch_serving_time_per_output_token_seconds", gpu)[0] for gpu in STEMS}
    stem = STEMS["0"]
    assert tpot["0"] == pytest.approx(step(stem, "llamacpp:tokens_predicted_seconds_total")
                                      / step(stem, "llamacpp:tokens_predicted_total"))
    stem, llm = STEMS["1"], {"model": "tensorrt_llm"}
    first_n = step(stem, "nv_inference_first_response_histogram_ms_count", **llm)
    after_first = (step(stem, "nv_inference_request_duration_us", **llm) / 1e6
                   - step(stem, "nv_inference_first_response_histogram_ms_sum", **llm) / 1e3)
    assert tpot["1"] == pytest.approx(after_first / (step(stem, "nv_llm_output_token_len_sum") - first_n))
    stem = STEMS["2"]
    assert tpot["2"] == pytest.approx(step(stem, "vllm:inter_token_latency_seconds_sum")
                                      / step(stem, "vllm:inter_token_latency_seconds_count"))

    kv = {gpu: _of(text, "roofwatch_serving_kv_cache_usage_ratio", gpu) for gpu in STEMS}
    assert kv == {"0": [], "1": [pytest.approx(total(triton, "nv_trt_llm_kv_cache_block_metrics",
                                                     kv_cache_block_type="fraction"))],
                  "2": [total(vllm, "vllm:kv_cache_usage_perc")]}, "llama.cpp exports no KV cache since PR #13660"
    assert all(_of(text, "roofwatch_serving_output_tokens_per_second_per_gpu", gpu)[0] > 0 for gpu in STEMS)
    assert info["1"]["state"] == "kv_saturated", "96 % of the KV cache in use and 32 requests waiting"
    assert info["2"]["state"] != "under_batched", "no request waits for capacity: the small batch is the traffic's"
