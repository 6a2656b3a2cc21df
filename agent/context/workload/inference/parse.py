"""Turn an inference server's Prometheus exposition into counter totals, and two totals into rates.

Kept apart from the scraper (agent.context.workload.inference.scraper) so the arithmetic can be read, and tested, without
HTTP or threads. Which series each server exports was checked against the servers' sources:

* **vLLM** (V0 ``vllm/engine/metrics.py``, V1 ``vllm/v1/metrics/loggers.py`` and ``perf.py``):
  ``vllm:prompt_tokens_total`` and ``vllm:generation_tokens_total`` (counters, labels
  ``model_name`` and, in V1, ``engine`` = data-parallel engine index);
  ``vllm:iteration_tokens_total`` is a *histogram* observed once per engine step, so its
  ``_count`` counts steps; ``vllm:prompt_tokens_cached_total`` (newer releases) counts prompt
  tokens served from the prefix cache; with ``--enable-mfu-metrics`` (PR #30738)
  ``vllm:estimated_{flops,read_bytes,write_bytes}_per_gpu_total`` are per-GPU estimates.
* **SGLang** (``python/sglang/srt/metrics/collector.py``): ``sglang:prompt_tokens_total``,
  ``sglang:generation_tokens_total``, ``sglang:cached_tokens_total`` (tokenizer process, label
  ``model_name``); ``sglang:cuda_graph_passes_total{mode=...}`` is incremented once per *decode*
  forward pass by the scheduler (labels ``tp_rank``, ``pp_rank``, ``moe_ep_rank``, optional
  ``dp_rank``); with ``--enable-mfu-metrics`` (PR #19395) the same three estimated per-GPU counters
  as vLLM under the ``sglang:`` prefix.
* **TGI** (``router/src/server.rs``, ``validation.rs``, ``infer/``): no token counters, but
  histograms with buckets whose ``_sum`` is one: ``tgi_request_input_length`` (recorded when a
  request is validated) and ``tgi_request_generated_tokens`` (recorded when it finishes);
  ``tgi_batch_inference_count{method="prefill"|"decode"}`` counts model forward calls
  (``tgi_batch_forward_duration_count`` as the fallback).

Sample names are normalised by dropping a trailing ``_total``, because the parser renames a
counter sample exposed without it (the Rust exporter's ``tgi_batch_inference_count``) to
``..._total`` and keeps it on the others.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Mapping

from prometheus_client.parser import text_string_to_metric_families

from agent.context.workload.inference.serving_parse import (
    SERVING_WANTED,
    ServingRates,
    ServingTotals,
    serving_rates,
    serving_totals,
)

Kind = Literal["vllm", "sglang", "tgi"]
KINDS: tuple[Kind, ...] = ("vllm", "sglang", "tgi")

SeriesKey = frozenset[tuple[str, str]]
Series = dict[SeriesKey, float]

_RANK_LABELS = frozenset({"tp_rank", "pp_rank", "moe_ep_rank", "attn_tp_rank", "attn_cp_rank"})
"""Labels that tell apart ranks of *one* model replica. Ranks of a replica report the same batches
(SGLang's pass counter is kept by each pipeline stage), so they collapse by max, not by sum."""


class ExpositionError(ValueError):
    """The body is not a Prometheus text exposition, or lacks the counters a server must export."""


@dataclass(frozen=True, slots=True)
class MetricNames:
    """Normalised sample names (trailing ``_total`` dropped) of one server kind."""

    prompt: str
    generated: str
    cached: str | None
    steps: tuple[str, ...]
    """Step counters, first present wins."""
    flops: str | None
    read_bytes: str | None
    write_bytes: str | None
    prefix: str


NAMES: dict[Kind, MetricNames] = {
    "vllm": MetricNames(
        prompt="vllm:prompt_tokens", generated="vllm:generation_tokens", cached="vllm:prompt_tokens_cached",
        steps=("vllm:iteration_tokens_total_count",), flops="vllm:estimated_flops_per_gpu",
        read_bytes="vllm:estimated_read_bytes_per_gpu", write_bytes="vllm:estimated_write_bytes_per_gpu",
        prefix="vllm:"),
    "sglang": MetricNames(
        prompt="sglang:prompt_tokens", generated="sglang:generation_tokens", cached="sglang:cached_tokens",
        steps=("sglang:cuda_graph_passes",), flops="sglang:estimated_flops_per_gpu",
        read_bytes="sglang:estimated_read_bytes_per_gpu", write_bytes="sglang:estimated_write_bytes_per_gpu",
        prefix="sglang:"),
    "tgi": MetricNames(
        prompt="tgi_request_input_length_sum", generated="tgi_request_generated_tokens_sum", cached=None,
        steps=("tgi_batch_inference_count", "tgi_batch_forward_duration_count"), flops=None,
        read_bytes=None, write_bytes=None, prefix="tgi_"),
}
_START_TIME = "process_start_time_seconds"
_WANTED = frozenset({_START_TIME} | SERVING_WANTED | {
    name for n in NAMES.values()
    for name in (n.prompt, n.generated, n.cached, *n.steps, n.flops, n.read_bytes, n.write_bytes) if name
})


def _normalise(name: str) -> str:
    return name[: -len("_total")] if name.endswith("_total") else name


@dataclass(frozen=True, slots=True)
class Exposition:
    """The samples this module cares about, by normalised name, plus which server prefixes appeared."""

    samples: dict[str, Series]
    prefixes: frozenset[str]


def parse(text: str) -> Exposition:
    """Parse a text exposition, keeping only the series used here (a server exports hundreds)."""
    samples: dict[str, Series] = {}
    prefixes: set[str] = set()
    try:
        for family in text_string_to_metric_families(text):
            for kind, names in NAMES.items():
                if family.name.startswith(names.prefix):
                    prefixes.add(kind)
            for s in family.samples:
                name = _normalise(s.name)
                if name in _WANTED and math.isfinite(s.value):
                    key = frozenset((k, v) for k, v in s.labels.items() if k != "le")
                    samples.setdefault(name, {})[key] = float(s.value)
    except (ValueError, TypeError, IndexError) as exc:  # the parser's errors for malformed lines
        raise ExpositionError(f"not a Prometheus text exposition: {exc}") from None
    return Exposition(samples, frozenset(prefixes))


def detect(expo: Exposition) -> Kind | None:
    """The server kind whose token counters are present (vLLM, then SGLang, then TGI), else None."""
    for kind in KINDS:
        n = NAMES[kind]
        if n.prompt in expo.samples and n.generated in expo.samples:
            return kind
    return None


@dataclass(frozen=True, slots=True)
class Totals:
    """Cumulative counters of one scrape, per series (``None`` where the server does not export it)."""

    kind: Kind
    prompt: Series
    generated: Series
    cached: Series | None
    steps: Series | None
    flops: Series | None
    read_bytes: Series | None
    write_bytes: Series | None
    start_time: float | None
    models: tuple[str, ...]
    serving: ServingTotals | None = None
    """Batch, queue, KV-cache and latency figures (agent.context.workload.inference.serving_parse)."""


def totals(expo: Exposition, kind: Kind) -> Totals:
    """The counters of ``kind``; raises :class:`ExpositionError` when its token counters are missing."""
    n = NAMES[kind]
    s = expo.samples
    if n.prompt not in s or n.generated not in s:
        seen = ", ".join(sorted(expo.prefixes)) or "none"
        raise ExpositionError(f"no {kind} token counters ({n.prompt}_total / {n.generated}_total) in the "
                              f"response; server metric families seen: {seen}")
    steps = next((s[name] for name in n.steps if name in s), None)
    starts = list(s.get(_START_TIME, {}).values())
    models = sorted({v for series in (s[n.prompt], s[n.generated]) for key in series for k, v in key
                     if k == "model_name"})
    return Totals(kind=kind, prompt=s[n.prompt], generated=s[n.generated],
                  cached=s.get(n.cached) if n.cached else None, steps=steps,
                  flops=s.get(n.flops) if n.flops else None,
                  read_bytes=s.get(n.read_bytes) if n.read_bytes else None,
                  write_bytes=s.get(n.write_bytes) if n.write_bytes else None,
                  start_time=starts[0] if starts else None, models=tuple(models),
                  serving=serving_totals(s, kind))


@dataclass(frozen=True, slots=True)
class Rates:
    """Per-second rates between two scrapes; ``None`` where the server does not export the counter."""

    dt_s: float
    prompt_per_s: float
    generated_per_s: float
    cached_per_s: float | None
    steps_per_s: float | None
    steps_total: float | None
    flops_per_gpu_per_s: float | None
    """Mean over the series (engines, ranks) of the server's per-GPU FLOP estimate rate."""
    bytes_per_gpu_per_s: float | None
    """The same for estimated bytes read + written."""
    serving: ServingRates | None = None

    @property
    def computed_tokens_per_s(self) -> float:
        """Tokens that cost FLOPs: prompt (prefill) + generated, less prompt tokens the prefix cache served."""
        return max(0.0, self.prompt_per_s + self.generated_per_s - (self.cached_per_s or 0.0))


class CounterReset(Exception):
    """A counter went backwards (server restarted, or a series was reset): no rate for this interval."""


def _deltas(prev: Series, cur: Series) -> dict[SeriesKey, float]:
    """Per-series increase. A series new in ``cur`` started at zero (lazily created label set); one
    gone from ``cur`` contributes nothing; any decrease is a reset."""
    out = {}
    for key, value in cur.items():
        before = prev.get(key, 0.0)
        if value < before:
            raise CounterReset
        out[key] = value - before
    return out


def _replicas(series: Series) -> Series:
    """Collapse the ranks of one replica, which count the same work, by max (the leading rank);
    keep replicas apart (vLLM engines, SGLang dp ranks, label values such as TGI's method)."""
    out: Series = {}
    for key, value in series.items():
        replica = frozenset((k, v) for k, v in key if k not in _RANK_LABELS)
        out[replica] = max(out.get(replica, 0.0), value)
    return out


def _increase(prev: Series, cur: Series) -> float:
    """Total increase over replicas; any series going backwards is a reset."""
    _deltas(prev, cur)
    return math.fsum(_deltas(_replicas(prev), _replicas(cur)).values())


def _mean(deltas: Mapping[SeriesKey, float]) -> float | None:
    return math.fsum(deltas.values()) / len(deltas) if deltas else None


def rates(prev: Totals, cur: Totals, dt_s: float) -> Rates:
    """Rates over ``dt_s`` seconds; raises :class:`CounterReset` when they cannot be trusted."""
    if dt_s <= 0 or prev.kind != cur.kind:
        raise CounterReset
    if prev.start_time is not None and cur.start_time is not None and prev.start_time != cur.start_time:
        raise CounterReset  # restarted: counters may have grown past their old values already

    def rate(a: Series | None, b: Series | None) -> float | None:
        return None if a is None or b is None else _increase(a, b) / dt_s

    def per_gpu(a: Series | None, b: Series | None) -> float | None:
        if a is None or b is None:
            return None
        mean = _mean(_deltas(a, b))
        return None if mean is None else mean / dt_s

    flops = per_gpu(prev.flops, cur.flops)
    read, write = per_gpu(prev.read_bytes, cur.read_bytes), per_gpu(prev.write_bytes, cur.write_bytes)
    moved = None if read is None and write is None else (read or 0.0) + (write or 0.0)
    return Rates(
        dt_s=dt_s,
        prompt_per_s=_increase(prev.prompt, cur.prompt) / dt_s,
        generated_per_s=_increase(prev.generated, cur.generated) / dt_s,
        cached_per_s=rate(prev.cached, cur.cached),
        steps_per_s=rate(prev.steps, cur.steps),
        steps_total=math.fsum(_replicas(cur.steps).values()) if cur.steps is not None else None,
        flops_per_gpu_per_s=flops,
        bytes_per_gpu_per_s=moved,
        serving=serving_rates(prev.serving, cur.serving, dt_s) if prev.serving and cur.serving else None,
    )
