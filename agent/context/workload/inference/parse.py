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
* **vLLM of 2026**, **llama.cpp** and **Triton** with its TensorRT-LLM backend: their families, and the series
  derived from them, are in agent.context.workload.inference.vllm, llamacpp and triton. vLLM's cached prompt
  tokens come from ``vllm:prefix_cache_hits_total`` where a release lacks ``prompt_tokens_cached``;
  llama.cpp's prompt counter already leaves out the tokens its prefix cache served; TensorRT-LLM's token
  counts are the ``_sum`` of its per-request histograms ``nv_llm_input_token_len`` / ``nv_llm_output_token_len``
  and its steps the executor's iteration counter.

A server is recognised by any family it exports (:data:`KIND_FAMILIES`), not only by its token
counters: a queue or a full KV cache needs no token counter, and excerpts, old releases and forks
often lack them. Sample names are normalised by dropping a trailing ``_total``, because exporters
differ on whether a counter sample carries it (the Rust exporter's ``tgi_batch_inference_count``).

The body is read one line at a time (agent.context.workload.inference.lines), as the dcgm-exporter reader
does: a line that is no sample (a ``curl`` or ``$ kubectl`` line pasted or proxied into the body, ``> ``
quoting, a ``...`` elision) is skipped and counted, never fatal, unless no sample line is left at all. A
sample the agent keeps is admitted by the label bounds first (agent.context.workload.inference.admission),
and its figures are held to the serving bounds one replica at a time (agent.context.workload.inference.figures).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from agent.context.workload.inference import llamacpp, triton, vllm
from agent.context.workload.inference.admission import MAX_SERIES, Admission
from agent.context.workload.inference.derive import Derive, is_derived
from agent.context.workload.inference.figures import (
    Rejected,
    Rejections,
    Series,
    SeriesKey,
    counter_rate,
    finite_total,
    fsum,
)
from agent.context.workload.inference.lines import Tally, labels_of
from agent.context.workload.inference.lines import samples as samples_of
from agent.context.workload.inference.serving_parse import (
    SERVING_WANTED,
    ServingRates,
    ServingTotals,
    serving_rates,
    serving_sample_names,
    serving_totals,
)

Kind = Literal["vllm", "sglang", "tgi", "llamacpp", "triton"]
KINDS: tuple[Kind, ...] = ("vllm", "sglang", "tgi", "llamacpp", "triton")
"""In the order :func:`detect` tries them: Triton's vLLM backend exports vLLM's own counters beside Triton's
families, and is read as vLLM."""
KIND_NAMES: dict[Kind, str] = {"vllm": "vLLM", "sglang": "SGLang", "tgi": "TGI", "llamacpp": "llama.cpp",
                               "triton": "Triton"}

_MODEL_LABELS = ("model_name", "name", "model")
"""Labels naming the served model: ``name`` is SGLang's up to 0.3 (sgl-project/sglang PR #1853's capture),
``model`` Triton's (the model repository's name for it)."""


class ExpositionError(ValueError):
    """The body is not a Prometheus text exposition, or holds no figure of the server it should come from."""


@dataclass(frozen=True, slots=True)
class MetricNames:
    """Normalised sample names (trailing ``_total`` dropped) of one server kind."""

    prompt: str
    generated: str
    cached: tuple[str, ...]
    """Counters of prompt tokens the server did not compute (a prefix-cache hit), first present wins."""
    steps: tuple[str, ...]
    """Step counters, first present wins."""
    flops: str | None
    read_bytes: str | None
    write_bytes: str | None
    prefixes: tuple[str, ...]


NAMES: dict[Kind, MetricNames] = {
    "vllm": MetricNames(
        prompt="vllm:prompt_tokens", generated="vllm:generation_tokens", cached=vllm.CACHED,
        steps=("vllm:iteration_tokens_total_count",), flops="vllm:estimated_flops_per_gpu",
        read_bytes="vllm:estimated_read_bytes_per_gpu", write_bytes="vllm:estimated_write_bytes_per_gpu",
        prefixes=("vllm:",)),
    "sglang": MetricNames(
        prompt="sglang:prompt_tokens", generated="sglang:generation_tokens", cached=("sglang:cached_tokens",),
        steps=("sglang:cuda_graph_passes",), flops="sglang:estimated_flops_per_gpu",
        read_bytes="sglang:estimated_read_bytes_per_gpu", write_bytes="sglang:estimated_write_bytes_per_gpu",
        prefixes=("sglang:",)),
    "tgi": MetricNames(
        prompt="tgi_request_input_length_sum", generated="tgi_request_generated_tokens_sum", cached=(),
        steps=("tgi_batch_inference_count", "tgi_batch_forward_duration_count"), flops=None,
        read_bytes=None, write_bytes=None, prefixes=("tgi_",)),
    "llamacpp": MetricNames(
        prompt=llamacpp.PROMPT, generated=llamacpp.PREDICTED, cached=(), steps=(llamacpp.DECODES,), flops=None,
        read_bytes=None, write_bytes=None, prefixes=("llamacpp:",)),
    "triton": MetricNames(
        prompt=triton.PROMPT, generated=triton.GENERATED, cached=(), steps=(triton.STEPS,), flops=None,
        read_bytes=None, write_bytes=None, prefixes=triton.PREFIXES),
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


DERIVE: dict[Kind, Derive] = {"vllm": vllm.derive, "llamacpp": llamacpp.derive, "triton": triton.derive}
"""Each server module's derivation (agent.context.workload.inference.derive): run on the kept samples before
the totals are read."""
SOURCES: dict[Kind, frozenset[str]] = {"vllm": vllm.SOURCES, "llamacpp": llamacpp.SOURCES, "triton": triton.SOURCES}
"""What each derivation reads: kept besides the names the tables here and in serving_parse give."""
OTHER_FAMILIES: dict[Kind, frozenset[str]] = {"vllm": vllm.FAMILIES, "llamacpp": llamacpp.FAMILIES,
                                              "triton": triton.FAMILIES}
"""Families that tell a server (besides those read), from each module's reading of the server's sources."""


def _kind_sample_names(kind: Kind) -> frozenset[str]:
    """The real sample names kept for ``kind`` (a derived series is made from them, never kept from a body)."""
    n = NAMES[kind]
    own = (n.prompt, n.generated, *n.cached, *n.steps, n.flops, n.read_bytes, n.write_bytes)
    return (frozenset(name for name in own if name and not is_derived(name)) | serving_sample_names(kind)
            | SOURCES.get(kind, frozenset()))


def _family(name: str) -> str:
    """The family a normalised sample name belongs to (a histogram's ``_sum`` and ``_count`` to the histogram)."""
    for suffix in _HISTOGRAM_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


KIND_FAMILIES: dict[Kind, frozenset[str]] = {
    kind: frozenset(f for name in _kind_sample_names(kind) for f in (name, _family(name)))
    | (TGI_ROUTER_FAMILIES if kind == "tgi" else OTHER_FAMILIES.get(kind, frozenset()))
    for kind in KINDS
}
"""The families that identify each server kind: every one the agent reads, and the others its module lists."""
_WANTED = frozenset({_START_TIME} | SERVING_WANTED).union(*(_kind_sample_names(kind) for kind in KINDS))
_PREFIXES = tuple(prefix for kind in KINDS for prefix in NAMES[kind].prefixes)


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
    """Normalised family names of the servers' prefixes (``vllm:``, ``sglang:``, ``tgi_``, ``llamacpp:``,
    ``nv_inference_`` ...) seen, whether or not their samples are kept."""
    skipped: int = 0
    """Lines that were neither blank, comments nor readable samples."""
    first_bad: str | None = None
    """The first of those, as ``line N: '...'`` (80 characters at most, non-ASCII escaped)."""
    refused: int = 0
    """Samples of kept series refused by the label bounds (agent.context.workload.inference.admission)."""
    refused_note: str | None = None
    """How many, past which bounds, and the first, printable; None when none was refused."""


def parse(text: str | bytes) -> Exposition:
    """Parse a text exposition (a body as it came, or decoded), keeping only the series used here (a server
    exports hundreds), each admitted by the label bounds (agent.context.workload.inference.admission) before
    it is stored. Lines that are no sample are skipped and counted; :class:`ExpositionError` only when no
    sample line is left."""
    samples: dict[str, Series] = {}
    families: set[str] = set()
    tally = Tally()
    admission = Admission()
    known: dict[str | None, tuple[dict[str, str], SeriesKey]] = {}
    """Label texts of admitted series (families repeat them), so a line's labels are taken apart once."""
    for raw_name, text_labels, value in samples_of(text, tally):
        name = _normalise(raw_name)
        if name not in families and len(families) < MAX_FAMILIES and name.startswith(_PREFIXES):
            families.update((name, _family(name)))
        if name not in _WANTED or not math.isfinite(value):
            continue
        labels, key = known.get(text_labels) or (None, None)
        if labels is None:
            if admission.skimming:
                admission.skip(name)
                continue
            labels = labels_of(text_labels)
            labels.pop("le", None)
            key = frozenset(labels.items())
        series = samples.get(name)
        if admission.admit(name, labels, series is None or key not in series):
            (series if series is not None else samples.setdefault(name, {}))[key] = value
            if len(known) < MAX_SERIES and text_labels not in known:
                known[text_labels] = (labels, key)
    if not tally.samples:
        why = f"; first: {tally.first_bad}" if tally.first_bad else ""
        lines = "line" if tally.skipped == 1 else "lines"
        raise ExpositionError(f"not a Prometheus text exposition: no sample line ({tally.skipped} unreadable "
                              f"{lines}{why})")
    prefixes = frozenset(kind for kind in KINDS if any(f.startswith(NAMES[kind].prefixes) for f in families))
    return Exposition(samples, prefixes, frozenset(families), tally.skipped, tally.first_bad, admission.refused,
                      admission.note())


def detect(expo: Exposition) -> Kind | None:
    """The server kind whose token counters are present (in :data:`KINDS` order); else the kind with the
    most families in the body (a server without token counters still has a queue); else None."""
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
        return configured  # type: ignore[return-value]  # the settings allow only the kinds of KINDS
    kind = detect(expo)
    if kind is None:
        seen = ", ".join(sorted(expo.prefixes)) or "none"
        servers = ", ".join(KIND_NAMES[kind] for kind in KINDS[:-1]) + f" or {KIND_NAMES[KINDS[-1]]}"
        raise ExpositionError(f"no {servers} metrics in the response (server metric families seen: {seen})")
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
    cached_name: str | None = None
    """Which of the kind's cached-token counters ``cached`` was read from (to name a rejected rate)."""
    """Batch, queue, KV-cache and latency figures (agent.context.workload.inference.serving_parse)."""

    @property
    def has_tokens(self) -> bool:
        """Both token counters are there, so tokens/s (and with it the workload MFU) can be had."""
        return self.prompt is not None and self.generated is not None


MODEL_FAMILIES: dict[Kind, frozenset[str]] = {"triton": frozenset(triton.LLM_SOURCES)}
"""Where a server's model names are read first: Triton names every model of its repository (an ensemble's
pre- and post-processing too), and the one that serves tokens is the one with TensorRT-LLM families."""


def _models(expo: Exposition, kind: Kind) -> tuple[str, ...]:
    """The model names on any series of ``kind`` (``model_name``, SGLang 0.3's ``name``, Triton's ``model``),
    sorted: those on :data:`MODEL_FAMILIES` where the kind has some and any is there."""
    def named(families: frozenset[str]) -> set[str]:
        return {value for name, series in expo.samples.items() if name in families
                for key in series for label, value in key if label in _MODEL_LABELS}
    return tuple(sorted(named(MODEL_FAMILIES.get(kind, frozenset())) or named(KIND_FAMILIES[kind])))


def totals(expo: Exposition, kind: Kind) -> Totals:
    """What ``kind`` exports of the figures read here; :class:`ExpositionError` when it exports none of them
    (a queue or KV gauge alone is enough: token counters are not required)."""
    n = NAMES[kind]
    derive = DERIVE.get(kind)
    s = {**expo.samples, **derive(expo.samples)} if derive is not None else expo.samples

    def get(name: str | None) -> Series | None:
        return s.get(name) if name else None

    steps = next((s[name] for name in n.steps if name in s), None)
    cached = next((name for name in n.cached if name in s), None)
    starts = list(s.get(_START_TIME, {}).values())
    serving = serving_totals(s, kind)
    current = Totals(kind=kind, prompt=get(n.prompt), generated=get(n.generated), cached=get(cached), steps=steps,
                     flops=get(n.flops), read_bytes=get(n.read_bytes), write_bytes=get(n.write_bytes),
                     start_time=starts[0] if starts else None, models=_models(expo, kind), serving=serving,
                     cached_name=cached)
    if not (serving.any_figure or any(series is not None for series in (
            current.prompt, current.generated, current.steps, current.flops, current.read_bytes, current.write_bytes))):
        seen = ", ".join(sorted(expo.prefixes)) or "none"
        raise ExpositionError(f"no {kind} token counters ({n.prompt} / {n.generated}) or serving metrics "
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
    rejected: Rejected = Rejected()
    """Rates of replicas outside the serving bounds, left out of their figures (agent.context.workload.inference.figures)."""

    @property
    def computed_tokens_per_s(self) -> float | None:
        """Tokens that cost FLOPs: prompt (prefill) + generated, less prompt tokens the prefix cache served;
        None unless both token counters are exported (one alone would understate the work)."""
        if self.prompt_per_s is None or self.generated_per_s is None:
            return None
        return max(0.0, self.prompt_per_s + self.generated_per_s - (self.cached_per_s or 0.0))


class CounterReset(Exception):
    """A counter went backwards (server restarted, or a series was reset): no rate for this interval."""


def _forward(prev: Series, cur: Series) -> None:
    """Raise :class:`CounterReset` when any series of ``cur`` is below its value in ``prev``. A series new in
    ``cur`` started at zero (a lazily created label set); one gone from ``cur`` contributes nothing."""
    if any(value < prev.get(key, 0.0) for key, value in cur.items()):
        raise CounterReset


def rates(prev: Totals, cur: Totals, dt_s: float) -> Rates:
    """Rates over ``dt_s`` seconds, each replica's within the serving bounds (one outside is left out, counted
    and named in ``rejected``); raises :class:`CounterReset` when they cannot be trusted."""
    if dt_s <= 0 or prev.kind != cur.kind:
        raise CounterReset
    if prev.start_time is not None and cur.start_time is not None and prev.start_time != cur.start_time:
        raise CounterReset  # restarted: counters may have grown past their old values already
    n, checks = NAMES[cur.kind], Rejections()
    # Two counters of cached tokens (vLLM's cached-token counter, or its prefix-cache hits) are no one series.
    cached = (prev.cached, cur.cached) if prev.cached_name == cur.cached_name else (None, None)
    pairs = ((prev.prompt, cur.prompt), (prev.generated, cur.generated), cached,
             (prev.steps, cur.steps), (prev.flops, cur.flops), (prev.read_bytes, cur.read_bytes),
             (prev.write_bytes, cur.write_bytes))
    for a, b in pairs:
        if a is not None and b is not None:
            _forward(a, b)

    def rate(a: Series | None, b: Series | None, what: str, name: str | None) -> float | None:
        return counter_rate(a, b, dt_s, what, name or what, checks)

    def per_gpu(a: Series | None, b: Series | None, what: str, name: str | None) -> float | None:
        """Mean over the series (each GPU's own estimate) of its rate, each finite and within bounds."""
        if a is None or b is None:
            return None
        kept = [(value - a.get(key, 0.0)) / dt_s for key, value in b.items()
                if checks.admits((value - a.get(key, 0.0)) / dt_s, "total", what, name or what, key)]
        return fsum(kept) / len(kept) if kept else None

    flops = per_gpu(prev.flops, cur.flops, "estimated FLOPs per second", n.flops)
    read = per_gpu(prev.read_bytes, cur.read_bytes, "estimated bytes read per second", n.read_bytes)
    write = per_gpu(prev.write_bytes, cur.write_bytes, "estimated bytes written per second", n.write_bytes)
    moved = None if read is None and write is None else (read or 0.0) + (write or 0.0)
    serving = serving_rates(prev.serving, cur.serving, dt_s) if prev.serving and cur.serving else None
    return Rates(
        dt_s=dt_s,
        prompt_per_s=rate(prev.prompt, cur.prompt, "prompt tokens per second", n.prompt),
        generated_per_s=rate(prev.generated, cur.generated, "generated tokens per second", n.generated),
        cached_per_s=rate(*cached, "cached prompt tokens per second", cur.cached_name),
        steps_per_s=rate(prev.steps, cur.steps, "engine steps per second", n.steps[0]),
        steps_total=finite_total(cur.steps, "engine steps", n.steps[0], checks),
        flops_per_gpu_per_s=flops,
        bytes_per_gpu_per_s=moved,
        serving=serving,
        rejected=checks.result() + (serving.rejected if serving is not None else Rejected()),
    )
