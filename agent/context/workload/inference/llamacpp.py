"""llama.cpp's server (``llama-server --metrics``): the ``llamacpp:`` families, and what the agent derives.

Read from ggml-org/llama.cpp ``tools/server/server-context.cpp`` (the ``/metrics`` handler's metric
definitions; no labels, one server per port; in router mode ``/metrics?model=<name>`` picks the model)
and the server README as PR #22879 (2026-05) corrected it:

* counters ``llamacpp:prompt_tokens_total`` (prompt tokens evaluated: the slot's prefix cache is not
  evaluated again, so these are the prompt tokens that cost FLOPs), ``llamacpp:prompt_seconds_total`` (each
  request's prompt-processing time, summed, in seconds), ``llamacpp:tokens_predicted_total``,
  ``llamacpp:tokens_predicted_seconds_total`` (each request's generation time, summed, in seconds: both added
  when a request finishes), ``llamacpp:n_decode_total`` (``llama_decode()`` calls: the engine's steps),
  ``llamacpp:n_busy_slots_per_decode`` and ``llamacpp:n_tokens_max`` (a mean and a maximum, declared
  counters; not read);
* gauges ``llamacpp:requests_processing`` (busy slots: the running batch), ``llamacpp:requests_deferred``
  (requests waiting for a slot: the queue), ``llamacpp:prompt_tokens_seconds`` and
  ``llamacpp:predicted_tokens_seconds`` (throughput since the last read; not read: the counters give it);
* up to PR #13660 (2025-05), ``llamacpp:kv_cache_usage_ratio`` ("1 means 100 percent usage") and
  ``llamacpp:kv_cache_tokens``; later releases export no KV-cache figure.

Derived (:func:`derive`): the time per output token, Δ generation seconds ÷ Δ tokens predicted (each
request's own time per token, as TGI's per-request mean: no histogram of it exists), and the prefill and
decode seconds the prefill share is taken from. Both times are per request, so a decode step of a batch of
B slots is counted B times; the share divides it by the batch, as vLLM's per-request phase times are.
"""

from __future__ import annotations

from typing import Mapping

from agent.context.workload.inference.derive import derived, put
from agent.context.workload.inference.figures import Series

PROMPT = "llamacpp:prompt_tokens"
PROMPT_SECONDS = "llamacpp:prompt_seconds"
PREDICTED = "llamacpp:tokens_predicted"
PREDICTED_SECONDS = "llamacpp:tokens_predicted_seconds"
DECODES = "llamacpp:n_decode"
RUNNING = "llamacpp:requests_processing"
WAITING = "llamacpp:requests_deferred"
KV_USAGE = "llamacpp:kv_cache_usage_ratio"
"""Releases before PR #13660 only."""

PER_TOKEN = derived(PREDICTED_SECONDS, "per token")
"""Histogram base (``_sum``: generation seconds, ``_count``: tokens predicted): the time per output token."""
PREFILL = derived(PROMPT_SECONDS, "s")
DECODE = derived(PREDICTED_SECONDS, "s")
"""Histogram bases whose ``_sum`` is the per-request prefill and decode seconds."""

SOURCES = frozenset({PROMPT, PROMPT_SECONDS, PREDICTED, PREDICTED_SECONDS, DECODES, RUNNING, WAITING, KV_USAGE})
"""Names the agent keeps from a llama.cpp body."""
FAMILIES = SOURCES | frozenset({
    "llamacpp:prompt_tokens_seconds", "llamacpp:predicted_tokens_seconds", "llamacpp:n_busy_slots_per_decode",
    "llamacpp:n_tokens_max", "llamacpp:kv_cache_tokens",
})
"""Every ``llamacpp:`` family of the releases read (normalised: no ``_total``): any one tells llama.cpp."""


def derive(samples: Mapping[str, Series]) -> dict[str, Series]:
    """The time-per-token histogram and the prefill and decode seconds, from the four counters."""
    out: dict[str, Series] = {}
    if PREDICTED_SECONDS in samples and PREDICTED in samples:
        put(out, PER_TOKEN + "_sum", samples[PREDICTED_SECONDS])
        put(out, PER_TOKEN + "_count", samples[PREDICTED])
    if PROMPT_SECONDS in samples and PREDICTED_SECONDS in samples:
        put(out, PREFILL + "_sum", samples[PROMPT_SECONDS])
        put(out, DECODE + "_sum", samples[PREDICTED_SECONDS])
    return out
