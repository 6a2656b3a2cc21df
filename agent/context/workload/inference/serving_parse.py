"""An inference server's batch, queue, KV cache, latency and prefill figures, from two scrapes.

Kept apart from agent.context.workload.inference.parse (token and FLOP counters) because these are
gauges and histograms, with their own names per server and release. Names were checked against
the servers' sources (the newest name first; an older one stands in where a release lacks it):

* **vLLM** (V1 ``vllm/v1/metrics/loggers.py``; V0 ``vllm/engine/metrics.py``; labels ``model_name``
  and, V1, ``engine``): gauges ``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
  ``vllm:kv_cache_usage_perc`` (0..1 despite the name; from 0.9, replacing ``vllm:gpu_cache_usage_perc``,
  removed in 0.12); counter ``vllm:num_preemptions_total``; histograms
  ``vllm:inter_token_latency_seconds`` (one observation per decode step; from 0.10, replacing
  ``vllm:time_per_output_token_seconds``, gone in 0.15), ``vllm:time_to_first_token_seconds``,
  ``vllm:request_prefill_time_seconds`` and ``vllm:request_decode_time_seconds`` (per request,
  observed when it finishes); ``vllm:cache_config_info`` (value 1, the cache config as labels,
  among them ``kv_cache_memory_bytes`` when set, per GPU, and ``num_gpu_blocks`` x ``block_size``,
  the pool in tokens).
* **SGLang** (``sglang/srt/observability/metrics_collector.py``, formerly ``srt/metrics/collector.py``;
  labels ``model_name``, ``engine_type``, ranks): gauges ``sglang:num_running_reqs``,
  ``sglang:num_queue_reqs``, ``sglang:token_usage`` (0..1); up to 0.3 (``docs/references/production_metrics.md``
  of that release, label ``name``) and in the pre-release of PR #1461 the gauges were
  ``sglang:num_requests_running`` and ``sglang:num_requests_waiting`` (``sglang:queue_req`` beside them); counter
  ``sglang:num_retracted_requests_total``; histograms ``sglang:inter_token_latency_seconds``
  (``sglang:time_per_output_token_seconds`` before 0.4.5), ``sglang:time_to_first_token_seconds``,
  ``sglang:per_stage_req_latency_seconds{stage="prefill_forward"|"chunked_prefill"}``, the pool size
  ``sglang:max_total_num_tokens`` (from 0.5.12; up to 0.3 too); with
  ``SGLANG_ENABLE_METRICS_DEVICE_TIMER=1`` the counter ``sglang:forward_execution_seconds_total{category}``.
  Up to 0.3 (``srt/metrics/metrics_collector.py``, ``log_config_stats``) the gauge
  ``sglang:max_running_requests`` is the scheduler's cap on the running batch (``--max-running-requests``,
  or what the request pool allows), the cap vLLM calls ``max_num_seqs`` and exports nowhere; later releases
  dropped it (``sglang:max_running_requests_under_SLO`` is another figure, an estimate, and is not read).
* **TGI** (``router/src/server.rs``, ``backends/v3``; no model or rank labels): gauges
  ``tgi_batch_current_size``, ``tgi_queue_size``, ``tgi_batch_current_max_tokens`` and
  ``tgi_batch_max_total_tokens`` (their ratio is the share of the KV-token budget the batch holds);
  histograms ``tgi_request_mean_time_per_token_duration`` (per request, prefill included) and
  ``tgi_batch_forward_duration{method="prefill"|"decode"}`` (per forward call: GPU time by phase).
* **TGIS** (vLLM behind IBM's TGIS front end: IBM/vllm PR #18 ``vllm/tgis_utils/metrics.py``, then
  opendatahub-io/vllm-tgis-adapter ``tgis_utils/metrics.py``; read as TGI): the histogram
  ``tgi_batch_inference_duration`` ("Time taken for each forward-pass iteration (in seconds)") is fed
  vLLM's own per-request stats, not forward passes: ``method="next_token"`` observes each
  ``time_per_output_tokens`` value (what ``vllm:time_per_output_token_seconds`` observes, seconds) and
  ``method="prefill"`` each ``time_to_first_tokens`` value. PR #18 passed a dict to ``labels()``, so its
  label value reads ``{'method': 'next_token'}``. HF TGI's own ``tgi_batch_inference_duration`` has
  ``method="prefill"|"decode"`` (whole batch calls): ``next_token`` marks TGIS, and a plain ``prefill`` is
  read as time to first token only beside it.

* **vLLM of 2026** (agent.context.workload.inference.vllm): the waiting figure is the ``capacity`` series of
  ``vllm:num_requests_waiting_by_reason`` where exported (requests deferred for a KV transfer or a LoRA slot
  do not wait for room in the batch); ``vllm:request_time_per_output_token_seconds`` (per request) stands in
  for the inter-token latency where a body lacks it.
* **llama.cpp** (agent.context.workload.inference.llamacpp) and **Triton** with TensorRT-LLM
  (agent.context.workload.inference.triton): their figures are series derived from their families
  (agent.context.workload.inference.derive), named ``family[what]``; the modules say what each is.

Sample names are normalised as in parse (a trailing ``_total`` dropped).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping

from agent.context.workload.inference import llamacpp, triton, vllm
from agent.context.workload.inference.derive import is_derived
from agent.context.workload.inference.figures import (
    Hist,
    Rejected,
    Rejections,
    Series,
    SeriesKey,
    bounded_sum,
    counter_rate,
    finite_total,
    histogram,
    mean_between,
)


@dataclass(frozen=True, slots=True)
class ServingNames:
    """Sample names (normalised) of one server kind; tuples list the newest name first."""

    running: tuple[str, ...]
    waiting: tuple[str, ...]
    kv_usage: tuple[str, ...]
    kv_tokens_used: str | None
    kv_tokens_total: str | None
    preemptions: tuple[str, ...]
    itl: tuple[str, ...]
    """Histogram base names of the inter-token latency (``_sum``/``_count`` appended)."""
    ttft: tuple[str, ...]
    prefill_time: str | None
    """Histogram base of per-request prefill time (vLLM, SGLang per-stage)."""
    decode_time: str | None
    phase_time: str | None
    """Histogram base whose ``method`` label splits GPU time by phase (TGI forward calls)."""
    device_time: str | None
    """Counter of GPU time by forward mode (SGLang device timer)."""
    cache_config: str | None
    pool_tokens: str | None = None
    """Gauge of the KV-cache pool's size in tokens (SGLang, TGI); vLLM's comes from ``cache_config_info``."""
    max_running: tuple[str, ...] = ()
    """Gauge of the cap on the running batch (SGLang <= 0.3)."""
    tgis_latency: str | None = None
    """Histogram base whose ``method`` label holds TGIS's per-token and first-token latencies."""


SERVING_NAMES: dict[str, ServingNames] = {
    "vllm": ServingNames(
        running=("vllm:num_requests_running",), waiting=(vllm.WAITING_CAPACITY, "vllm:num_requests_waiting"),
        kv_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"), kv_tokens_used=None, kv_tokens_total=None,
        preemptions=("vllm:num_preemptions",),
        itl=("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds",
             "vllm:request_time_per_output_token_seconds"),
        ttft=("vllm:time_to_first_token_seconds",), prefill_time="vllm:request_prefill_time_seconds",
        decode_time="vllm:request_decode_time_seconds", phase_time=None, device_time=None,
        cache_config="vllm:cache_config_info"),
    "sglang": ServingNames(
        running=("sglang:num_running_reqs", "sglang:num_requests_running"),
        waiting=("sglang:num_queue_reqs", "sglang:num_requests_waiting", "sglang:queue_req"),
        kv_usage=("sglang:token_usage",),
        kv_tokens_used=None, kv_tokens_total=None, preemptions=("sglang:num_retracted_requests",),
        itl=("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"),
        ttft=("sglang:time_to_first_token_seconds",), prefill_time="sglang:per_stage_req_latency_seconds",
        decode_time=None, phase_time=None, device_time="sglang:forward_execution_seconds", cache_config=None,
        pool_tokens="sglang:max_total_num_tokens", max_running=("sglang:max_running_requests",)),
    "tgi": ServingNames(
        running=("tgi_batch_current_size",), waiting=("tgi_queue_size",), kv_usage=(),
        kv_tokens_used="tgi_batch_current_max_tokens", kv_tokens_total="tgi_batch_max_total_tokens", preemptions=(),
        itl=("tgi_request_mean_time_per_token_duration",), ttft=(), prefill_time=None, decode_time=None,
        phase_time="tgi_batch_forward_duration", device_time=None, cache_config=None,
        pool_tokens="tgi_batch_max_total_tokens", tgis_latency="tgi_batch_inference_duration"),
    "llamacpp": ServingNames(
        running=(llamacpp.RUNNING,), waiting=(llamacpp.WAITING,), kv_usage=(llamacpp.KV_USAGE,), kv_tokens_used=None,
        kv_tokens_total=None, preemptions=(), itl=(llamacpp.PER_TOKEN,), ttft=(), prefill_time=llamacpp.PREFILL,
        decode_time=llamacpp.DECODE, phase_time=None, device_time=None, cache_config=None),
    "triton": ServingNames(
        running=(triton.RUNNING,), waiting=(triton.WAITING,), kv_usage=(triton.KV_USAGE,), kv_tokens_used=None,
        kv_tokens_total=None, preemptions=(), itl=(triton.PER_TOKEN,), ttft=(triton.FIRST,), prefill_time=None,
        decode_time=None, phase_time=None, device_time=None, cache_config=None, pool_tokens=triton.POOL_TOKENS,
        max_running=(triton.MAX_RUNNING,)),
}

_SGLANG_PREFILL_STAGES = frozenset({"prefill_forward", "chunked_prefill"})
_TGIS_NEXT_TOKEN = frozenset({"next_token", "{'method': 'next_token'}"})
_TGIS_FIRST_TOKEN = "{'method': 'prefill'}"


def _histogram_names(base: str | None) -> tuple[str, ...]:
    return (base + "_sum", base + "_count") if base else ()


def serving_sample_names(kind: str) -> frozenset[str]:
    """The sample names this module reads for ``kind``: parse keeps them, and recognises a server by them
    even when it exports no token counter (a queue or a full KV cache needs none). Series derived from
    others (``family[what]``) are left out: the server's module names what they are derived from."""
    n = SERVING_NAMES[kind]
    return frozenset(
        name for name in (*n.running, *n.waiting, *n.kv_usage, n.kv_tokens_used, n.kv_tokens_total, *n.preemptions,
                          *(h for base in (*n.itl, *n.ttft, n.prefill_time, n.decode_time, n.phase_time,
                                           n.tgis_latency)
                            for h in _histogram_names(base)),
                          n.device_time, n.cache_config, n.pool_tokens, *n.max_running)
        if name and not is_derived(name))


SERVING_WANTED: frozenset[str] = frozenset().union(*(serving_sample_names(kind) for kind in SERVING_NAMES))
"""Every sample name this module reads; parse keeps these besides its own."""


def _first(samples: Mapping[str, Series], names: tuple[str, ...]) -> Series | None:
    return next((samples[n] for n in names if n in samples), None)


def _where(series: Series | None, label: str, values: frozenset[str] | None = None, *,
           contains: str | None = None) -> Series | None:
    """The series whose ``label`` is one of ``values`` (or contains ``contains``)."""
    if series is None:
        return None
    return {k: v for k, v in series.items() for name, value in k
            if name == label and ((values is not None and value in values) or (contains is not None and contains in value))}


@dataclass(frozen=True, slots=True)
class ServingTotals:
    """One scrape's serving gauges, and the cumulative sums and counts the rates are taken from."""

    running: float | None
    waiting: float | None
    kv_usage: float | None
    preemptions: Series | None
    """The preemption (SGLang: retraction) counter per replica."""
    itl: Hist | None
    """(sum of seconds, count) of the inter-token-latency histogram per replica, each within the bounds."""
    ttft: Hist | None
    prefill_s: float | None
    """Cumulative seconds attributed to prefill (per request, or per forward call)."""
    decode_s: float | None
    decode_per_request: bool
    """True when ``decode_s`` sums each request's decode time, so a batch counts it once per request."""
    kv_cache_bytes_per_gpu: float | None
    kv_pool_tokens: float | None = None
    """Tokens the KV-cache pool holds (all replicas): vLLM blocks x block size, SGLang, TGI gauges."""
    max_running: float | None = None
    """The server's cap on the running batch (all replicas), where it exports one (SGLang <= 0.3)."""
    rejected: Rejected = Rejected()
    """Values outside the serving bounds (agent.context.workload.inference.figures), left out of the figures."""
    sources: Mapping[str, str] = field(default_factory=dict)
    """Figure (``itl``, ``ttft``, ``preemptions``) -> the series it was read from, to name a rejected rate."""

    @property
    def any_figure(self) -> bool:
        """Whether the scrape gave any figure at all: a server known only by name gives the serving view nothing."""
        return any(getattr(self, name) is not None for name in (
            "running", "waiting", "kv_usage", "preemptions", "itl", "ttft", "prefill_s", "decode_s",
            "kv_cache_bytes_per_gpu", "kv_pool_tokens", "max_running"))


def _base(samples: Mapping[str, Series], bases: tuple[str, ...]) -> str | None:
    """The first histogram of ``bases`` whose ``_sum`` and ``_count`` are both in the body."""
    return next((base for base in bases if base + "_sum" in samples and base + "_count" in samples), None)


def _hist(samples: Mapping[str, Series], base: str | None, what: str, rejections: Rejections) -> Hist | None:
    return histogram(samples[base + "_sum"], samples[base + "_count"], what, base, rejections) if base else None


def _tgis(samples: Mapping[str, Series], base: str | None, rejections: Rejections) -> tuple[Hist | None, Hist | None]:
    """TGIS's (time per output token, time to first token) histograms, as (sum, count) per replica; a plain
    ``prefill`` counts as first-token time only beside a ``next_token`` series (HF TGI has none)."""
    if base is None:
        return None, None

    def hist(values: frozenset[str], what: str) -> Hist | None:
        return histogram(_where(samples.get(base + "_sum"), "method", values) or None,
                         _where(samples.get(base + "_count"), "method", values) or None, what, base, rejections)

    itl = hist(_TGIS_NEXT_TOKEN, "time per output token")
    return itl, hist(frozenset({_TGIS_FIRST_TOKEN, "prefill"}) if itl else frozenset({_TGIS_FIRST_TOKEN}),
                     "time to first token")


def _label_number(labels: SeriesKey, name: str) -> float | None:
    for key, value in labels:
        if key == name:
            try:
                number = float(value)
            except ValueError:
                return None
            return number if math.isfinite(number) and number > 0 else None
    return None


def _vllm_pool_tokens(series: Series | None, checks: Rejections) -> float | None:
    """``num_gpu_blocks`` x ``block_size`` of each engine's ``cache_config_info``, engines summed (an engine's
    pool in tokens is held to the bytes bound: a token takes a byte of KV cache at the very least)."""
    total = 0.0
    for key in series or {}:
        blocks, size = _label_number(key, "num_gpu_blocks"), _label_number(key, "block_size")
        if blocks is None or size is None:
            return None
        if not checks.admits(blocks * size, "bytes", "KV-cache pool in tokens (num_gpu_blocks x block_size)",
                             "vllm:cache_config_info", key):
            return None
        total += blocks * size
    return total or None


def _kv_cache_bytes(series: Series | None, checks: Rejections) -> float | None:
    """vLLM's ``kv_cache_memory_bytes`` label of ``cache_config_info``, when the user set it ("None" otherwise)."""
    for key in series or {}:
        for name, value in key:
            if name == "kv_cache_memory_bytes":
                try:
                    number = float(value)
                except ValueError:
                    continue
                if number > 0 and checks.admits(number, "bytes", "KV-cache memory", "vllm:cache_config_info", key):
                    return number
    return None


def serving_totals(samples: Mapping[str, Series], kind: str) -> ServingTotals:
    """The serving figures of ``kind`` in one parsed exposition (``None`` where the server lacks them), each
    replica's value within the serving bounds (agent.context.workload.inference.figures): one that is not
    is left out of its figure, counted and named in ``rejected``, and the other replicas' figures stand."""
    n = SERVING_NAMES[kind]
    checks = Rejections()

    def gauge(names: tuple[str, ...], bound: str, what: str, *, mean: bool = False) -> float | None:
        name = next((name for name in names if name in samples), None)
        return bounded_sum(samples[name], bound, what, name, checks, mean=mean) if name else None

    def seconds(series: Series | None, name: str, what: str) -> float | None:
        return finite_total(series, what, name, checks)

    kv_usage = gauge(n.kv_usage, "ratio", "KV-cache usage", mean=True)
    if kv_usage is None and n.kv_tokens_used and n.kv_tokens_total:
        used = seconds(samples.get(n.kv_tokens_used), n.kv_tokens_used, "KV tokens in use")
        budget = seconds(samples.get(n.kv_tokens_total), n.kv_tokens_total, "KV-token budget")
        kv_usage = used / budget if used is not None and budget else None
    prefill_s = decode_s = None
    per_request = False
    if n.device_time and n.device_time in samples:  # SGLang's device timer: GPU seconds by forward mode
        device, name = samples[n.device_time], n.device_time
        prefill_s = (seconds(_where(device, "category", contains="extend"), name, "extend seconds") or 0.0) + (
            seconds(_where(device, "category", contains="prefill"), name, "prefill seconds") or 0.0)
        decode_s = seconds(_where(device, "category", contains="decode"), name, "decode seconds")
    elif n.phase_time:  # TGI: each forward call's time, by phase
        phases, name = samples.get(n.phase_time + "_sum"), n.phase_time + "_sum"
        prefill_s = seconds(_where(phases, "method", frozenset({"prefill"})), name, "prefill seconds")
        decode_s = seconds(_where(phases, "method", frozenset({"decode"})), name, "decode seconds")
    elif n.prefill_time and n.prefill_time + "_sum" in samples:
        prefill, name = samples[n.prefill_time + "_sum"], n.prefill_time + "_sum"
        if kind == "sglang":
            prefill = _where(prefill, "stage", _SGLANG_PREFILL_STAGES) or {}
        prefill_s = seconds(prefill, name, "prefill seconds") if prefill else None
        if n.decode_time:
            decode_s = seconds(samples.get(n.decode_time + "_sum"), n.decode_time + "_sum", "decode seconds")
        per_request = True
    sources = {"itl": _base(samples, n.itl), "ttft": _base(samples, n.ttft),
               "preemptions": next((name for name in n.preemptions if name in samples), None)}
    itl = _hist(samples, sources["itl"], "time per output token", checks)
    ttft = _hist(samples, sources["ttft"], "time to first token", checks)
    if itl is None and ttft is None:
        itl, ttft = _tgis(samples, n.tgis_latency, checks)
        sources.update(itl=n.tgis_latency, ttft=n.tgis_latency)
    return ServingTotals(
        running=gauge(n.running, "count", "running requests"), waiting=gauge(n.waiting, "count", "waiting requests"),
        kv_usage=None if kv_usage is None else min(1.0, kv_usage),
        preemptions=_first(samples, n.preemptions) if n.preemptions else None,
        itl=itl, ttft=ttft, prefill_s=prefill_s, decode_s=decode_s,
        decode_per_request=per_request,
        kv_cache_bytes_per_gpu=_kv_cache_bytes(samples.get(n.cache_config), checks) if n.cache_config else None,
        kv_pool_tokens=(_vllm_pool_tokens(samples.get(n.cache_config), checks) if n.cache_config
                        else gauge((n.pool_tokens,), "bytes", "KV-cache pool in tokens (a byte each at least)")
                        if n.pool_tokens else None),
        max_running=gauge(n.max_running, "count", "running-batch cap") or None if n.max_running else None,
        rejected=checks.result(), sources={figure: name for figure, name in sources.items() if name},
    )


@dataclass(frozen=True, slots=True)
class ServingRates:
    """What happened between two scrapes (``None`` where a counter is missing, or went backwards)."""

    running: float | None
    waiting: float | None
    kv_usage: float | None
    preemptions_per_s: float | None
    tpot_s: float | None
    ttft_s: float | None
    prefill_share: float | None
    kv_cache_bytes_per_gpu: float | None
    kv_pool_tokens: float | None = None
    max_running: float | None = None
    rejected: Rejected = Rejected()
    """Interval figures of replicas outside the serving bounds, left out (the scrape's own are on its totals)."""


def _increase(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b < a else b - a


def _prefill_share(prev: ServingTotals, cur: ServingTotals, dt_s: float) -> float | None:
    prefill, decode = _increase(prev.prefill_s, cur.prefill_s), _increase(prev.decode_s, cur.decode_s)
    if prefill is None:
        return None
    if decode is None:
        # SGLang without its device timer times prefill forwards only: their share of the wall time.
        return min(1.0, prefill / dt_s) if dt_s > 0 else None
    if cur.decode_per_request:
        # Every running request accrues each decode step's time: one step of a batch of B counts B times.
        batch = max(1.0, ((prev.running or 0.0) + (cur.running or 0.0)) / 2.0)
        decode /= batch
    busy = prefill + decode
    return min(1.0, prefill / busy) if busy > 0 else None


def serving_rates(prev: ServingTotals, cur: ServingTotals, dt_s: float) -> ServingRates:
    """Rates and interval means over ``dt_s`` seconds, each replica's within the serving bounds (one outside
    is left out and counted in ``rejected``); gauges are the latest scrape's."""
    checks = Rejections()
    name = cur.sources.get
    return ServingRates(
        running=cur.running, waiting=cur.waiting, kv_usage=cur.kv_usage,
        preemptions_per_s=counter_rate(prev.preemptions, cur.preemptions, dt_s, "preemptions per second",
                                       name("preemptions", "preemptions"), checks),
        tpot_s=mean_between(prev.itl, cur.itl, "time per output token", name("itl", "itl"), checks),
        ttft_s=mean_between(prev.ttft, cur.ttft, "time to first token", name("ttft", "ttft"), checks),
        prefill_share=_prefill_share(prev, cur, dt_s), kv_cache_bytes_per_gpu=cur.kv_cache_bytes_per_gpu,
        kv_pool_tokens=cur.kv_pool_tokens, max_running=cur.max_running, rejected=checks.result(),
    )
