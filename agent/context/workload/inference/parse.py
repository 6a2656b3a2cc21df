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
  ``model_name``; up to 0.3 the label was ``name``); ``sglang:cuda_graph_passes_total{mode=...}`` is
  incremented once per *decode* forward pass by the scheduler (labels ``tp_rank``, ``pp_rank``,
  ``moe_ep_rank``, optional ``dp_rank``); with ``--enable-mfu-metrics`` (PR #19395) the same three
  estimated per-GPU counters as vLLM under the ``sglang:`` prefix. Re-exporters that allow no colon in
  a name (the smg gateway, smg-project/smg PR #813) write ``sglang_``: read as ``sglang:``.
* **TGI** (``router/src/server.rs``, ``validation.rs``, ``infer/``): no token counters, but
  histograms with buckets whose ``_sum`` is one: ``tgi_request_input_length`` (recorded when a
  request is validated) and ``tgi_request_generated_tokens`` (recorded when it finishes);
  ``tgi_batch_inference_count{method="prefill"|"decode"}`` counts model forward calls
  (``tgi_batch_forward_duration_count`` as the fallback). vLLM forks that speak TGIS (IBM's
  text-generation-inference fork; opendatahub-io/vllm-tgis-adapter ``tgis_metrics.py``) export
  ``tgi_queue_size``, ``tgi_batch_current_size`` and ``tgi_batch_inference_duration`` under the same
  names, so they read as TGI.

A server is recognised by any family it exports (:data:`KIND_FAMILIES`), not only by its token
counters: a queue or a full KV cache needs no token counter, and excerpts, old releases and forks
often lack them. Sample names are normalised by dropping a trailing ``_total``, because exporters
differ on whether a counter sample carries it (the Rust exporter's ``tgi_batch_inference_count``).

The body is read one line at a time, as the dcgm-exporter reader does: a line that is no sample (a
``curl`` or ``$ kubectl`` line pasted or proxied into the body, ``> `` quoting, a ``...`` elision)
is skipped and counted, never fatal, unless no sample line is left at all.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Iterator, Literal, Mapping

from agent.context.workload.inference.serving_parse import (
    SERVING_WANTED,
    ServingRates,
    ServingTotals,
    serving_rates,
    serving_sample_names,
    serving_totals,
)

Kind = Literal["vllm", "sglang", "tgi"]
KINDS: tuple[Kind, ...] = ("vllm", "sglang", "tgi")

SeriesKey = frozenset[tuple[str, str]]
Series = dict[SeriesKey, float]

_RANK_LABELS = frozenset({"tp_rank", "pp_rank", "moe_ep_rank", "attn_tp_rank", "attn_cp_rank"})
"""Labels that tell apart ranks of *one* model replica. Ranks of a replica report the same batches
(SGLang's pass counter is kept by each pipeline stage), so they collapse by max, not by sum."""
_MODEL_LABELS = ("model_name", "name")
"""Labels naming the served model: ``name`` is SGLang's up to 0.3 (sgl-project/sglang PR #1853's capture)."""


class ExpositionError(ValueError):
    """The body is not a Prometheus text exposition, or holds no figure of the server it should come from."""


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

TGI_ROUTER_FAMILIES = frozenset({
    "tgi_request_count", "tgi_request_success", "tgi_request_failure", "tgi_request_duration",
    "tgi_request_validation_duration", "tgi_request_queue_duration", "tgi_request_inference_duration",
    "tgi_request_max_new_tokens", "tgi_request_skipped_tokens", "tgi_batch_inference_success",
    "tgi_batch_inference_failure", "tgi_batch_inference_duration", "tgi_batch_decode_duration",
    "tgi_batch_filter_duration", "tgi_batch_concat", "tgi_batch_concat_duration", "tgi_batch_next_size",
})
"""TGI router families the agent reads no figure from but knows TGI by: the ``metrics::describe_*`` list of
huggingface/text-generation-inference ``router/src/server.rs`` and the ``counter!``/``histogram!`` calls
under ``backends/v3`` at release v3.3.7 (``docs/source/reference/metrics.md`` lists the same)."""

_START_TIME = "process_start_time_seconds"
_HISTOGRAM_SUFFIXES = ("_sum", "_count", "_bucket")
MAX_FAMILIES = 4096
"""Distinct server family names remembered from one body (vLLM V1 exports about 60): bounds a hostile body."""


def _kind_sample_names(kind: Kind) -> frozenset[str]:
    n = NAMES[kind]
    own = (n.prompt, n.generated, n.cached, *n.steps, n.flops, n.read_bytes, n.write_bytes)
    return frozenset(name for name in own if name) | serving_sample_names(kind)


def _family(name: str) -> str:
    """The family a normalised sample name belongs to (a histogram's ``_sum`` and ``_count`` to the histogram)."""
    for suffix in _HISTOGRAM_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


KIND_FAMILIES: dict[Kind, frozenset[str]] = {
    kind: frozenset(f for name in _kind_sample_names(kind) for f in (name, _family(name)))
    | (TGI_ROUTER_FAMILIES if kind == "tgi" else frozenset())
    for kind in KINDS
}
"""The families that identify each server kind: every one the agent reads, and for TGI the router's others."""
_WANTED = frozenset({_START_TIME} | SERVING_WANTED).union(*(_kind_sample_names(kind) for kind in KINDS))
_PREFIXES = tuple(NAMES[kind].prefix for kind in KINDS)


def _normalise(name: str) -> str:
    """One spelling per series: ``sglang_`` read as ``sglang:``, a trailing ``_total`` dropped."""
    if name.startswith("sglang_"):
        name = "sglang:" + name[len("sglang_"):]
    return name[: -len("_total")] if name.endswith("_total") else name


@dataclass(frozen=True, slots=True)
class Exposition:
    """The samples this module cares about, by normalised name, plus which server prefixes appeared."""

    samples: dict[str, Series]
    prefixes: frozenset[str]
    families: frozenset[str] = frozenset()
    """Normalised family names (``vllm:``, ``sglang:``, ``tgi_``) seen, whether or not their samples are kept."""
    skipped: int = 0
    """Lines that were neither blank, comments nor readable samples."""
    first_bad: str | None = None
    """The first of those, as ``line N: '...'`` (80 characters at most, non-ASCII escaped)."""


_NAME = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_LABEL = re.compile(r'[ \t]*([A-Za-z_][A-Za-z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\]|\\.)*)"[ \t]*(?:,|(?=[ \t]*\}))')
_CLOSE = re.compile(r"[ \t]*\}")
_ESCAPE = re.compile(r"\\(.)")


def _unescape(value: str) -> str:
    return _ESCAPE.sub(lambda m: "\n" if m.group(1) == "n" else m.group(1), value) if "\\" in value else value


def _sample(line: str) -> tuple[str, dict[str, str], float] | None:
    """(name, labels, value) of one text-format sample line, or None when the line is no sample."""
    match = _NAME.match(line)
    if match is None:
        return None
    name, pos, labels = match.group(0), match.end(), {}
    brace = len(line) - len(line[pos:].lstrip(" \t"))  # blanks may stand before the labels
    if line.startswith("{", brace):
        pos = brace + 1
        while (label := _LABEL.match(line, pos)) is not None:
            labels[label.group(1)] = _unescape(label.group(2))
            pos = label.end()
        close = _CLOSE.match(line, pos)
        if close is None:
            return None
        pos = close.end()
    if pos >= len(line) or line[pos] not in " \t":
        return None
    parts = line[pos:].split()
    if not 1 <= len(parts) <= 2:
        return None
    try:
        value = float(parts[0])
        if len(parts) == 2:
            float(parts[1])  # a timestamp: must be a number, is not used
    except ValueError:
        return None
    return name, labels, value


@dataclass(slots=True)
class _Tally:
    """Bad lines and readable samples of one body, for the error message and doctor."""

    samples: int = 0
    skipped: int = 0
    first_bad: str | None = None

    def bad(self, number: int, line: str) -> None:
        self.skipped += 1
        if self.first_bad is None:
            shown = line[:80].encode("ascii", "backslashreplace").decode()
            self.first_bad = f"line {number}: {shown!r}"


def _samples(text: str, tally: _Tally) -> Iterator[tuple[str, dict[str, str], float]]:
    """The readable sample lines of ``text``, normalised names; other lines counted in ``tally``."""
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        sample = _sample(line)
        if sample is None:
            tally.bad(number, line)
            continue
        tally.samples += 1
        yield _normalise(sample[0]), sample[1], sample[2]


def parse(text: str) -> Exposition:
    """Parse a text exposition, keeping only the series used here (a server exports hundreds). Lines that
    are no sample are skipped and counted; :class:`ExpositionError` only when no sample line is left."""
    samples: dict[str, Series] = {}
    families: set[str] = set()
    tally = _Tally()
    for name, labels, value in _samples(text, tally):
        if len(families) < MAX_FAMILIES and name.startswith(_PREFIXES):
            families.update((name, _family(name)))
        if name in _WANTED and math.isfinite(value):
            samples.setdefault(name, {})[frozenset((k, v) for k, v in labels.items() if k != "le")] = value
    if not tally.samples:
        why = f"; first: {tally.first_bad}" if tally.first_bad else ""
        lines = "line" if tally.skipped == 1 else "lines"
        raise ExpositionError(f"not a Prometheus text exposition: no sample line ({tally.skipped} unreadable "
                              f"{lines}{why})")
    prefixes = frozenset(kind for kind in KINDS if any(f.startswith(NAMES[kind].prefix) for f in families))
    return Exposition(samples, prefixes, frozenset(families), tally.skipped, tally.first_bad)


def detect(expo: Exposition) -> Kind | None:
    """The server kind whose token counters are present (vLLM, then SGLang, then TGI); else the kind with
    the most families in the body (a server without token counters still has a queue); else None."""
    for kind in KINDS:
        n = NAMES[kind]
        if n.prompt in expo.samples and n.generated in expo.samples:
            return kind
    counts = {kind: len(expo.families & KIND_FAMILIES[kind]) for kind in KINDS}
    best = max(KINDS, key=lambda kind: counts[kind])  # the first of equals, in KINDS order
    return best if counts[best] else None


def recognise(expo: Exposition, configured: str) -> Kind:
    """The configured kind, or the detected one for ``auto``; :class:`ExpositionError` when none is found."""
    if configured != "auto":
        return configured  # type: ignore[return-value]  # the settings allow only the three kinds
    kind = detect(expo)
    if kind is None:
        seen = ", ".join(sorted(expo.prefixes)) or "none"
        raise ExpositionError(f"no vLLM, SGLang or TGI metrics in the response (server metric families seen: {seen})")
    return kind


@dataclass(frozen=True, slots=True)
class Totals:
    """Cumulative counters of one scrape, per series (``None`` where the server does not export it)."""

    kind: Kind
    prompt: Series | None
    generated: Series | None
    cached: Series | None
    steps: Series | None
    flops: Series | None
    read_bytes: Series | None
    write_bytes: Series | None
    start_time: float | None
    models: tuple[str, ...]
    serving: ServingTotals | None = None
    """Batch, queue, KV-cache and latency figures (agent.context.workload.inference.serving_parse)."""

    @property
    def has_tokens(self) -> bool:
        """Both token counters are there, so tokens/s (and with it the workload MFU) can be had."""
        return self.prompt is not None and self.generated is not None


def _models(expo: Exposition, kind: Kind) -> tuple[str, ...]:
    """The model names on any series of ``kind`` (``model_name``, or SGLang 0.3's ``name``), sorted."""
    found = {value for name, series in expo.samples.items() if name in KIND_FAMILIES[kind]
             for key in series for label, value in key if label in _MODEL_LABELS}
    return tuple(sorted(found))


def totals(expo: Exposition, kind: Kind) -> Totals:
    """What ``kind`` exports of the figures read here; :class:`ExpositionError` when it exports none of them
    (a queue or KV gauge alone is enough: token counters are not required)."""
    n = NAMES[kind]
    s = expo.samples

    def get(name: str | None) -> Series | None:
        return s.get(name) if name else None

    steps = next((s[name] for name in n.steps if name in s), None)
    starts = list(s.get(_START_TIME, {}).values())
    serving = serving_totals(s, kind)
    current = Totals(kind=kind, prompt=get(n.prompt), generated=get(n.generated), cached=get(n.cached), steps=steps,
                     flops=get(n.flops), read_bytes=get(n.read_bytes), write_bytes=get(n.write_bytes),
                     start_time=starts[0] if starts else None, models=_models(expo, kind), serving=serving)
    if not (serving.any_figure or any(series is not None for series in (
            current.prompt, current.generated, current.steps, current.flops, current.read_bytes, current.write_bytes))):
        seen = ", ".join(sorted(expo.prefixes)) or "none"
        raise ExpositionError(f"no {kind} token counters ({n.prompt}_total / {n.generated}_total) or serving metrics "
                              f"in the response; server metric families seen: {seen}")
    return current


@dataclass(frozen=True, slots=True)
class Rates:
    """Per-second rates between two scrapes; ``None`` where the server does not export the counter."""

    dt_s: float
    prompt_per_s: float | None
    generated_per_s: float | None
    cached_per_s: float | None
    steps_per_s: float | None
    steps_total: float | None
    flops_per_gpu_per_s: float | None
    """Mean over the series (engines, ranks) of the server's per-GPU FLOP estimate rate."""
    bytes_per_gpu_per_s: float | None
    """The same for estimated bytes read + written."""
    serving: ServingRates | None = None

    @property
    def computed_tokens_per_s(self) -> float | None:
        """Tokens that cost FLOPs: prompt (prefill) + generated, less prompt tokens the prefix cache served;
        None unless both token counters are exported (one alone would understate the work)."""
        if self.prompt_per_s is None or self.generated_per_s is None:
            return None
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
        prompt_per_s=rate(prev.prompt, cur.prompt),
        generated_per_s=rate(prev.generated, cur.generated),
        cached_per_s=rate(prev.cached, cur.cached),
        steps_per_s=rate(prev.steps, cur.steps),
        steps_total=math.fsum(_replicas(cur.steps).values()) if cur.steps is not None else None,
        flops_per_gpu_per_s=flops,
        bytes_per_gpu_per_s=moved,
        serving=serving_rates(prev.serving, cur.serving, dt_s) if prev.serving and cur.serving else None,
    )
