"""vLLM of 2026 (the 0.2x V1 releases): the families its metrics module defines, and what the agent derives.

Read from vllm-project/vllm ``vllm/v1/metrics/loggers.py`` (``PrometheusStatLogger.__init__``, labels
``model_name`` and ``engine``, the newest release reachable) and ``vllm/v1/metrics/stats.py``:

* ``vllm:num_requests_waiting_by_reason{reason="capacity"|"deferred"}`` (gauge): the waiting requests
  split by why they wait; "Sum of all reasons equals vllm:num_requests_waiting". ``capacity`` waits for
  room in the batch (scheduling capacity: KV blocks, ``max_num_seqs``); ``deferred`` waits on a transient
  constraint (a LoRA budget, a KV transfer from a prefill instance, a blocked request). Only the first is a
  queue that a bigger batch or another replica would drain, so where the family is exported the agent's
  waiting figure is its ``capacity`` series (:data:`WAITING_CAPACITY`); older releases give only the total.
* ``vllm:prompt_tokens_cached_total`` (cached prompt tokens, local + external) and, from 0.9,
  ``vllm:prefix_cache_queries_total`` / ``vllm:prefix_cache_hits_total`` (in tokens; the ``gpu_``-prefixed
  names before 0.9 counted blocks in early V1, and are not read). A prefix-cache hit costs no prefill
  FLOPs, so the tokens that did cost FLOPs are prompt + generated - cached: the cached-token counter where
  the release has it, else the prefix-cache hits (agent.context.workload.inference.parse).
  ``vllm:prompt_tokens_by_source_total{source="local_compute"|"local_cache_hit"|"external_kv_transfer"}``
  adds nothing to that: by ``PromptTokenStats``' invariants its ``local_compute`` is exactly prompt - cached.
* Everything else the module defines identifies vLLM (:data:`FAMILIES`) without giving a figure the
  serving view reads: the sleep state, multimodal and external-cache counters, per-request histograms of
  token counts, queue, inference and end-to-end time, the KV-block residency histograms, LoRA info and
  the speculative-decoding counters.
"""

from __future__ import annotations

from typing import Mapping

from agent.context.workload.inference.derive import derived, put, select
from agent.context.workload.inference.figures import Series

WAITING_BY_REASON = "vllm:num_requests_waiting_by_reason"
WAITING_CAPACITY = derived(WAITING_BY_REASON, "capacity")
"""The waiting requests that wait for room in the batch (``reason="capacity"``)."""
CACHED = ("vllm:prompt_tokens_cached", "vllm:prefix_cache_hits")
"""Prompt tokens the server did not compute, the first exported wins (trailing ``_total`` dropped)."""
SOURCES = frozenset({WAITING_BY_REASON, *CACHED})
"""Names of the 2026 releases the agent keeps, besides those the older ones already had."""

FAMILIES = frozenset({
    "vllm:num_requests_running", "vllm:num_requests_waiting", WAITING_BY_REASON, "vllm:engine_sleep_state",
    "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "vllm:corrupted_requests",
    "vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_queries",
    "vllm:gpu_prefix_cache_hits", "vllm:external_prefix_cache_queries", "vllm:external_prefix_cache_hits",
    "vllm:mm_cache_queries", "vllm:mm_cache_hits", "vllm:num_preemptions", "vllm:prompt_tokens",
    "vllm:prompt_tokens_by_source", "vllm:prompt_tokens_cached", "vllm:generation_tokens", "vllm:request_success",
    "vllm:request_prompt_tokens", "vllm:request_generation_tokens", "vllm:iteration_tokens_total",
    "vllm:request_max_num_generation_tokens", "vllm:request_params_n", "vllm:request_params_max_tokens",
    "vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds",
    "vllm:request_time_per_output_token_seconds", "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds", "vllm:request_inference_time_seconds", "vllm:request_prefill_time_seconds",
    "vllm:request_decode_time_seconds", "vllm:request_prefill_kv_computed_tokens", "vllm:kv_block_lifetime_seconds",
    "vllm:kv_block_idle_before_evict_seconds", "vllm:kv_block_reuse_gap_seconds", "vllm:lora_requests_info",
    "vllm:cache_config_info", "vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens", "vllm:spec_decode_num_accepted_tokens_per_pos",
})
"""Every family ``PrometheusStatLogger`` defines (normalised: no ``_total``; a histogram by its base name):
any one of them tells a vLLM body, whether or not the agent reads a figure from it."""


def derive(samples: Mapping[str, Series]) -> dict[str, Series]:
    """The ``capacity`` waiting series, where the release splits the queue by reason."""
    out: dict[str, Series] = {}
    put(out, WAITING_CAPACITY, select(samples.get(WAITING_BY_REASON), "reason", "capacity"))
    return out
