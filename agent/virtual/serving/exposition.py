"""What a vLLM (V1) or SGLang server's ``/metrics`` says about one serving job at one virtual time.

Both servers are Python and export through prometheus_client, so these pages are rendered by it
too (``generate_latest`` over a collector): the same ``# HELP``/``# TYPE`` lines, ``_total`` and
``_created`` samples and number formats as the real server running this prometheus_client.
Names, help texts, label sets and bucket boundaries follow the servers' sources, as listed in
agent.context.workload.inference.serving_parse (vLLM ``vllm/v1/metrics/loggers.py``; SGLang
``srt/observability/metrics_collector.py``); TGI's Rust exporter is in agent.virtual.serving.tgi.
"""

from __future__ import annotations

import math
from typing import Iterable, Iterator, Sequence

from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from agent.virtual.serving.job import Observed, ServingJob

VLLM_ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                    40.0, 80.0)
VLLM_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                     20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
VLLM_REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                        240.0, 480.0, 960.0, 1920.0, 7680.0)
"""vLLM's request phase times: end to end, queue, inference (running), prefill and decode."""
VLLM_ITERATION_BUCKETS = (1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0)
VLLM_BLOCK_SIZE = 16
SGLANG_ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06, 0.08, 0.1, 0.2,
                      0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0)
SGLANG_TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0,
                       400.0)
SGLANG_STAGE_BUCKETS = tuple(0.001 * 1.62**i for i in range(30))
"""SGLang's ``exponential_buckets(start=0.001, width=1.62, length=30)``: 1 ms to ~1191 s, unrounded."""


def histogram(name: str, doc: str, labels: dict[str, str], observed: Observed, bounds: Sequence[float],
              created: float) -> Metric:
    """A prometheus_client histogram family: buckets, ``_count``, ``_sum`` and ``_created``, as its Histogram writes them."""
    metric = Metric(name, doc, "histogram")
    add_histogram(metric, labels, observed, bounds, created)
    return metric


def add_histogram(metric: Metric, labels: dict[str, str], observed: Observed, bounds: Sequence[float],
                  created: float) -> None:
    for bound, count in zip([*map(floatToGoString, bounds), "+Inf"], observed.cumulative(bounds)):
        metric.add_sample(metric.name + "_bucket", {**labels, "le": bound}, count)
    metric.add_sample(metric.name + "_count", labels, observed.count)
    metric.add_sample(metric.name + "_sum", labels, observed.sum)
    metric.add_sample(metric.name + "_created", labels, created)


def gauge(name: str, doc: str, series: Iterable[tuple[dict[str, str], float]]) -> GaugeMetricFamily:
    metric = GaugeMetricFamily(name, doc)
    for labels, value in series:
        metric.add_sample(name, labels, value)
    return metric


def counter(name: str, doc: str, series: Iterable[tuple[dict[str, str], float]], created: float) -> CounterMetricFamily:
    metric = CounterMetricFamily(name, doc)
    for labels, value in series:
        metric.add_sample(metric.name + "_total", labels, value)
        metric.add_sample(metric.name + "_created", labels, created)
    return metric


def start_time(start: float) -> GaugeMetricFamily:
    """What prometheus_client's process collector says; here the fake server's start (virtual time 0)."""
    return gauge("process_start_time_seconds", "Start time of the process since unix epoch in seconds.", [({}, start)])


class _Page:
    """A collector yielding fixed families, for :func:`generate_latest`."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)


def vllm_metrics(job: ServingJob, t: float, start: float) -> bytes:
    """vLLM V1's page (one engine, labels ``model_name`` and ``engine``) at virtual time ``t``."""
    lab = {"model_name": job.model, "engine": "0"}
    f = job.figures_at(t)
    totals = job.totals(t)
    c, o = totals.counters, totals.observed
    steps = Observed(o["step_decode_tokens"].points + o["step_prefill_tokens"].points)
    blocks = math.floor(job.kv_pool_bytes / (VLLM_BLOCK_SIZE * job.kv_bytes_per_token))
    cache = {"block_size": str(VLLM_BLOCK_SIZE), "cache_dtype": "auto", "calculate_kv_scales": "False",
             "cpu_offload_gb": "0", "enable_prefix_caching": "True", "engine": "0", "gpu_memory_utilization": "0.9",
             "is_attention_free": "False", "kv_cache_memory_bytes": "None", "num_cpu_blocks": "None",
             "num_gpu_blocks": str(blocks), "num_gpu_blocks_override": "None", "prefix_caching_hash_algo": "sha256",
             "sliding_window": "None", "swap_space": "4"}
    request = "Histogram of time spent in {} phase for request."
    families: list[Metric] = [
        start_time(start),
        gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
              [(lab, f.running if f else 0.0)]),
        gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
              [(lab, f.waiting if f else 0.0)]),
        gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", [(lab, f.kv_usage if f else 0.0)]),
        counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.",
                [(lab, c["preemptions"])], start),
        counter("vllm:prompt_tokens", "Number of prefill tokens processed.", [(lab, c["prompt_tokens"])], start),
        counter("vllm:generation_tokens", "Number of generation tokens processed.",
                [(lab, c["generated_tokens"])], start),
        counter("vllm:request_success", "Count of successfully processed requests.",
                [({**lab, "finished_reason": "stop"}, c["requests"])], start),
        histogram("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", lab, steps,
                  VLLM_ITERATION_BUCKETS, start),
        histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", lab, o["ttft"],
                  VLLM_TTFT_BUCKETS, start),
        histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", lab, o["itl"],
                  VLLM_ITL_BUCKETS, start),
        histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", lab, o["e2e"],
                  VLLM_REQUEST_BUCKETS, start),
        histogram("vllm:request_queue_time_seconds", request.format("WAITING"), lab, o["queue"],
                  VLLM_REQUEST_BUCKETS, start),
        histogram("vllm:request_inference_time_seconds", request.format("RUNNING"), lab, o["inference"],
                  VLLM_REQUEST_BUCKETS, start),
        histogram("vllm:request_prefill_time_seconds", request.format("PREFILL"), lab, o["prefill"],
                  VLLM_REQUEST_BUCKETS, start),
        histogram("vllm:request_decode_time_seconds", request.format("DECODE"), lab, o["decode"],
                  VLLM_REQUEST_BUCKETS, start),
        gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", [(cache, 1.0)]),
    ]
    return generate_latest(_Page(families))  # type: ignore[arg-type]


def sglang_metrics(job: ServingJob, t: float, start: float) -> bytes:
    """SGLang's page: the tokenizer's request figures once, the scheduler's per tensor-parallel rank."""
    tok = {"model_name": job.model, "engine_type": "unified"}
    ranks = [{**tok, "tp_rank": str(r), "pp_rank": "0", "moe_ep_rank": "0"} for r in range(len(job.gpus))]
    f = job.figures_at(t)
    totals = job.totals(t)
    c, o = totals.counters, totals.observed
    stages = Metric("sglang:per_stage_req_latency_seconds", "The latency of each stage of requests.", "histogram")
    for rank in ranks:
        for stage, name in (("prefill_forward", "prefill_forward"), ("request_process", "request_process")):
            add_histogram(stages, {**rank, "stage": stage}, o[name], SGLANG_STAGE_BUCKETS, start)
    families: list[Metric] = [
        start_time(start),
        gauge("sglang:num_running_reqs", "The number of running requests.",
              [(r, f.running if f else 0.0) for r in ranks]),
        gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.",
              [(r, f.waiting if f else 0.0) for r in ranks]),
        gauge("sglang:token_usage", "The token usage.", [(r, f.kv_usage if f else 0.0) for r in ranks]),
        gauge("sglang:max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.",
              [(r, float(math.floor(job.kv_pool_bytes / job.kv_bytes_per_token))) for r in ranks]),
        gauge("sglang:gen_throughput", "The generation throughput (token/s).",
              [(r, f.generated_tokens_per_s if f else 0.0) for r in ranks]),
        counter("sglang:num_retracted_requests", "Total number of retracted requests due to kvcache full.",
                [(r, c["preemptions"]) for r in ranks], start),
        counter("sglang:cuda_graph_passes", "Total number of forward passes using cuda graph.",
                [({**r, "mode": "decode"}, c["decode_steps"]) for r in ranks], start),
        stages,
        *([counter("sglang:forward_execution_seconds", "Total time that GPU is busy executing model forward passes. "
                   "Refer to ForwardMode for category labels.",
                   [({**r, "category": cat}, c[key]) for r in ranks
                    for cat, key in (("extend", "prefill_busy_s"), ("decode", "decode_busy_s"))], start)]
          if job.device_timer else []),
        counter("sglang:prompt_tokens", "Number of prefill tokens processed.", [(tok, c["prompt_tokens"])], start),
        counter("sglang:generation_tokens", "Number of generation tokens processed.",
                [(tok, c["generated_tokens"])], start),
        counter("sglang:num_requests", "The number of processed requests.", [(tok, c["requests"])], start),
        histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                  {**tok, "is_streaming": "true"}, o["ttft"], SGLANG_TTFT_BUCKETS, start),
        histogram("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", tok, o["itl"],
                  SGLANG_ITL_BUCKETS, start),
    ]
    return generate_latest(_Page(families))  # type: ignore[arg-type]
