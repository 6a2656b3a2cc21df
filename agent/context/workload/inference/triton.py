"""NVIDIA Triton Inference Server and its TensorRT-LLM backend: the families, and what the agent derives.

Read from triton-inference-server/server ``docs/user_guide/metrics.md`` (release 2.73 / 26.09; labels
``model`` and ``version``) and from the TensorRT-LLM backend's sources (NVIDIA/TensorRT-LLM
``triton_backend/inflight_batcher_llm/src/custom_metrics_reporter/custom_metrics_reporter.cc`` and
``model_instance_state.cc``, formerly triton-inference-server/tensorrtllm_backend, whose README prints
the families):

* Triton, per model: counters ``nv_inference_request_success``, ``_request_failure``, ``nv_inference_count``,
  ``nv_inference_exec_count``; cumulative microseconds ``nv_inference_request_duration_us`` (end to end),
  ``nv_inference_queue_duration_us``, ``nv_inference_compute_input_duration_us``,
  ``nv_inference_compute_infer_duration_us`` and ``nv_inference_compute_output_duration_us``; the gauge
  ``nv_inference_pending_request_count`` (requests Triton holds that no backend executes yet); with
  ``--metrics-config histogram_latencies=true`` the histogram ``nv_inference_first_response_histogram_ms``
  (request to first response, milliseconds); with ``summary_latencies=true`` the ``*_summary_us`` summaries.
* TensorRT-LLM, per model, from the executor's iteration statistics: ``nv_trt_llm_request_metrics`` with
  ``request_type`` ``active`` (requests the executor holds), ``max`` (``maxNumActiveRequests``: the cap on the
  batch), ``scheduled`` (this iteration's batch), ``context`` (of them in prefill) and ``waiting``
  (``active - scheduled``); ``nv_trt_llm_kv_cache_block_metrics`` with ``kv_cache_block_type`` ``max``,
  ``free``, ``used``, ``tokens_per``, ``reused`` and ``fraction`` (used ÷ max); ``nv_trt_llm_general_metrics``
  with ``general_type`` ``iteration_counter`` (the executor's iteration: its steps) and ``timestamp``; the
  histograms ``nv_llm_input_token_len`` and ``nv_llm_output_token_len`` (``response_metric_type``
  ``total_input_tokens`` / ``total_output_tokens``), observed once per finished request, so their ``_sum``
  counts the prompt and generated tokens; and the runtime-memory, in-flight-batcher, V1 and
  disaggregated-serving groups, which identify the backend but give the serving view nothing.

Derived (:func:`derive`): the batch, the queue (Triton's pending requests of every model plus the
executor's waiting ones: a request is in one of them at a time), the batch cap, KV usage and the pool in
tokens (max blocks x tokens per block), the steps, the time to first token in seconds, and the time per
output token: with the first-response histogram, (Δ request time - Δ first-response time) ÷ (Δ output
tokens - Δ first responses), each request's time after its first token per token after it; without it,
Δ compute time ÷ Δ output tokens (the backend holds a request from enqueue to its last token, so this
counts prefill and waits in the batch too, as TGI's per-request mean does). Timing figures are taken from
the models that export TensorRT-LLM families where any does (an ensemble's other models time the same
requests again), else from every model.
"""

from __future__ import annotations

from typing import Mapping

from agent.context.workload.inference.derive import derived, joined, project, put, scaled, select
from agent.context.workload.inference.figures import Series, SeriesKey

REQUESTS = "nv_trt_llm_request_metrics"
KV_BLOCKS = "nv_trt_llm_kv_cache_block_metrics"
GENERAL = "nv_trt_llm_general_metrics"
PROMPT = "nv_llm_input_token_len_sum"
GENERATED = "nv_llm_output_token_len_sum"
PENDING = "nv_inference_pending_request_count"
REQUEST_US = "nv_inference_request_duration_us"
COMPUTE_US = "nv_inference_compute_infer_duration_us"
FIRST_MS = "nv_inference_first_response_histogram_ms"

RUNNING = derived(REQUESTS, "scheduled")
WAITING = derived(PENDING, "+waiting")
"""Triton's pending requests of every model, and the TensorRT-LLM executor's waiting ones."""
MAX_RUNNING = derived(REQUESTS, "max")
KV_USAGE = derived(KV_BLOCKS, "fraction")
POOL_TOKENS = derived(KV_BLOCKS, "max x tokens_per")
STEPS = derived(GENERAL, "iteration_counter")
FIRST = derived(FIRST_MS, "s")
"""Histogram base: time to first response, in seconds."""
PER_TOKEN = derived(REQUEST_US, "per token")
"""Histogram base: seconds per output token (see the module's docstring)."""

MODEL = frozenset({"model", "version"})
"""The labels that tell one Triton model (a replica of the serving view) from another."""
LLM_SOURCES = (REQUESTS, KV_BLOCKS, GENERAL, PROMPT, GENERATED)
SOURCES = frozenset({*LLM_SOURCES, PENDING, REQUEST_US, COMPUTE_US, FIRST_MS + "_sum", FIRST_MS + "_count"})
"""Names the agent keeps from a Triton body."""
FAMILIES = frozenset({
    REQUESTS, KV_BLOCKS, GENERAL, "nv_llm_input_token_len", "nv_llm_output_token_len",
    "nv_trt_llm_runtime_memory_metrics", "nv_trt_llm_inflight_batcher_metrics", "nv_trt_llm_v1_metrics",
    "nv_trt_llm_disaggregated_serving_metrics", PENDING, REQUEST_US, COMPUTE_US, FIRST_MS,
    "nv_inference_request_success", "nv_inference_request_failure", "nv_inference_count", "nv_inference_exec_count",
    "nv_inference_queue_duration_us", "nv_inference_compute_input_duration_us",
    "nv_inference_compute_output_duration_us", "nv_inference_request_summary_us", "nv_inference_queue_summary_us",
    "nv_inference_compute_input_summary_us", "nv_inference_compute_infer_summary_us",
    "nv_inference_compute_output_summary_us",
})
"""Every Triton and TensorRT-LLM family of the releases read: any one tells Triton."""
PREFIXES = ("nv_inference_", "nv_trt_llm_", "nv_llm_")


def _llm(samples: Mapping[str, Series]) -> set[SeriesKey]:
    """The (model, version) keys of the models that export TensorRT-LLM families."""
    return {project(key, MODEL) for name in LLM_SOURCES for key in samples.get(name, {})}


def _of(series: Series | None, models: set[SeriesKey]) -> Series:
    """The series of ``models`` (every series where no model exports TensorRT-LLM families)."""
    return {k: v for k, v in (series or {}).items() if not models or project(k, MODEL) in models}


def _pool(samples: Mapping[str, Series]) -> Series:
    """Max KV blocks x tokens per block, per model (a model lacking either has no pool)."""
    blocks = joined(select(samples.get(KV_BLOCKS), "kv_cache_block_type", "max"), MODEL)
    per = joined(select(samples.get(KV_BLOCKS), "kv_cache_block_type", "tokens_per"), MODEL)
    return {key: blocks[key] * per[key] for key in blocks if key in per}


def _per_token(samples: Mapping[str, Series], models: set[SeriesKey]) -> tuple[Series, Series]:
    """(seconds, output tokens) per model: each request's time after its first response over the tokens after
    it where the first-response histogram is exported, else the backend's compute time over the tokens.
    Clamped at 0: the first response of a request still running is counted before its end is."""
    tokens = joined(samples.get(GENERATED), MODEL)
    request, compute = joined(_of(samples.get(REQUEST_US), models), MODEL), joined(samples.get(COMPUTE_US), MODEL)
    first_s = joined(scaled(samples.get(FIRST_MS + "_sum"), 1e-3), MODEL)
    first_n = joined(samples.get(FIRST_MS + "_count"), MODEL)
    seconds: Series = {}
    count: Series = {}
    for key, out in tokens.items():
        if key in request and key in first_s and key in first_n:
            seconds[key] = max(0.0, request[key] * 1e-6 - first_s[key])
            count[key] = max(0.0, out - first_n[key])
        elif key in compute:
            seconds[key], count[key] = compute[key] * 1e-6, out
    return seconds, count


def derive(samples: Mapping[str, Series]) -> dict[str, Series]:
    """The serving figures of a Triton body, in the shapes the serving arithmetic reads."""
    requests, models = samples.get(REQUESTS), _llm(samples)
    out: dict[str, Series] = {}
    put(out, RUNNING, select(requests, "request_type", "scheduled"))
    put(out, WAITING, {**(samples.get(PENDING) or {}), **select(requests, "request_type", "waiting")})
    put(out, MAX_RUNNING, select(requests, "request_type", "max"))
    put(out, KV_USAGE, select(samples.get(KV_BLOCKS), "kv_cache_block_type", "fraction"))
    put(out, POOL_TOKENS, _pool(samples))
    put(out, STEPS, select(samples.get(GENERAL), "general_type", "iteration_counter"))
    if FIRST_MS + "_sum" in samples and FIRST_MS + "_count" in samples:
        put(out, FIRST + "_sum", scaled(_of(samples[FIRST_MS + "_sum"], models), 1e-3))
        put(out, FIRST + "_count", _of(samples[FIRST_MS + "_count"], models))
    seconds, count = _per_token(samples, models)
    put(out, PER_TOKEN + "_sum", seconds)
    put(out, PER_TOKEN + "_count", count)
    return out
