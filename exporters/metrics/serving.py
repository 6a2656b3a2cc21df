"""The serving families: per GPU that serves inference, its distance from the decode latency floor.

Only GPUs whose workload report carries serving figures (a scraped vLLM/SGLang/TGI endpoint, or a
client report with ``serving``) have these series, so a training fleet pays nothing for them.
Figures are per model replica, repeated on each of its GPUs (``sum``/``max by (server)`` joins them);
docs/serving.md says what each number means and how the floor is computed.
"""

from __future__ import annotations

from exporters.metrics.definition import MetricDef
from exporters.metrics.labels import GPU_LABELS

_SRV = "inference server metrics + classifier"
_SERVERS = "vLLM, SGLang, TGI metrics or client reports"

SERVING_INFO = MetricDef(
    "roofwatch_serving_info", "info", "",
    "The serving verdict of the replica this GPU serves: server, model, state (at_floor, near_floor, "
    "under_batched, prefill_heavy, kv_saturated, above_floor, unknown) and the advice code for it.",
    GPU_LABELS + ("server", "model", "state", "advice"), nvidia=_SRV, amd=_SRV, virtual=_SRV,
)
DECODE_FLOOR = MetricDef(
    "roofwatch_serving_decode_floor_seconds", "gauge", "seconds",
    "Least time a decode step can take at the current batch: max((weight + KV-cache bytes read) / HBM "
    "bandwidth, batch x FLOPs per token / dense peak), over the replica's GPUs.",
    GPU_LABELS, nvidia=_SRV, amd=_SRV, virtual=_SRV,
)
STEP_BYTES = MetricDef(
    "roofwatch_serving_step_read_bytes", "gauge", "bytes",
    "Bytes one decode step reads from HBM across the replica: kind=weights, kind=kv_cache (at the current batch).",
    GPU_LABELS + ("kind",), nvidia=_SRV, amd=_SRV, virtual=_SRV,
)
TPOT = MetricDef(
    "roofwatch_serving_time_per_output_token_seconds", "gauge", "seconds",
    "Mean time per output token (inter-token latency) over the last scrape interval.",
    GPU_LABELS, nvidia=_SERVERS, amd=_SERVERS, virtual=_SRV,
)
FLOOR_MULTIPLE = MetricDef(
    "roofwatch_serving_tpot_floor_multiple", "gauge", "multiple",
    "Time per output token / the decode floor: 1 is as fast as the hardware allows, 3 leaves two thirds unused.",
    GPU_LABELS, nvidia=_SRV, amd=_SRV, virtual=_SRV,
)
TOKENS_PER_GPU = MetricDef(
    "roofwatch_serving_output_tokens_per_second_per_gpu", "gauge", "tokens per second",
    "Output (decode) tokens per second of the replica, divided by its GPUs.",
    GPU_LABELS, nvidia=_SERVERS, amd=_SERVERS, virtual=_SRV,
)
PREFILL_SHARE = MetricDef(
    "roofwatch_serving_prefill_time_ratio", "gauge", "ratio",
    "Share of the replica's GPU time spent in prefill (prompt processing); the rest is decode.",
    GPU_LABELS, nvidia=_SERVERS, amd=_SERVERS, virtual=_SRV,
)
REQUESTS = MetricDef(
    "roofwatch_serving_requests", "gauge", "requests",
    "Requests of the replica: state=running (the batch), state=waiting (queued for admission).",
    GPU_LABELS + ("state",), nvidia=_SERVERS, amd=_SERVERS, virtual=_SRV,
)
POSSIBLE_BATCH = MetricDef(
    "roofwatch_serving_possible_batch_requests", "gauge", "requests",
    "The batch the KV-cache pool could hold at the current context lengths (running / KV-cache usage).",
    GPU_LABELS, nvidia=_SRV, amd=_SRV, virtual=_SRV,
)
KV_USAGE = MetricDef(
    "roofwatch_serving_kv_cache_usage_ratio", "gauge", "ratio",
    "Share of the replica's KV-cache pool in use.", GPU_LABELS, nvidia=_SERVERS, amd=_SERVERS, virtual=_SRV,
)
PREEMPTIONS = MetricDef(
    "roofwatch_serving_preemptions_per_second", "gauge", "per second",
    "Requests preempted (vLLM) or retracted (SGLang) per second for lack of KV-cache memory.",
    GPU_LABELS, nvidia=_SERVERS, amd=_SERVERS, virtual=_SRV,
)
SERVING_METRICS: tuple[MetricDef, ...] = (
    SERVING_INFO, DECODE_FLOOR, STEP_BYTES, TPOT, FLOOR_MULTIPLE, TOKENS_PER_GPU, PREFILL_SHARE, REQUESTS,
    POSSIBLE_BATCH, KV_USAGE, PREEMPTIONS,
)
