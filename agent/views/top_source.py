"""Where ``roofwatch top`` gets its data: one roofwatch ``/metrics`` exposition, parsed into rows.

``top`` reads the same exposition Prometheus scrapes (not the JSON API) so it works against any
roofwatch agent or anything re-serving its metrics, and shows exactly what the dashboards would.
The exposition's rule carries over: **a series that is absent is unknown**, so every field a row
could not find is ``None``, never 0 (an idle GPU and a GPU without a tensor counter must look
different).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Mapping

from prometheus_client.parser import text_string_to_metric_families

from agent.model.terms import DEFAULT_PORT
from agent.model.text import one_line
from agent.views.http_get import FetchError, agent_endpoint, bounded_get
from agent.views.top_holders import PREFIX as HOLDER_PREFIX
from agent.views.top_holders import HolderRow, HolderSeries
from agent.views.top_serving import PREFIX as SERVING_PREFIX
from agent.views.top_serving import ServingRow, ServingSeries

DEFAULT_TIMEOUT_S = 2.0
"""Longest wait for any one read of a poll."""

DEFAULT_DEADLINE_S = 5.0
"""Longest a whole poll may take: a server trickling its answer cannot keep a poll open for ever."""

MAX_BODY_BYTES = 16 * 2**20
"""A node's exposition is well under a megabyte; a larger answer is not one, and is not read whole."""

GpuKey = tuple[str, str, str]
"""(node, gpu, uuid): the labels every per-GPU series carries (docs/metrics.md)."""


class TopSourceError(Exception):
    """The URL gave no roofwatch exposition; the message is one line and names the URL."""


@dataclass(frozen=True)
class GpuRow:
    """One GPU as the exposition describes it; ``None`` means the series was absent (unknown)."""

    node: str
    gpu: str
    uuid: str
    model: str | None = None
    up: bool | None = None
    cls: str | None = None
    detail: str | None = None
    throttle: str | None = None
    confidence: float | None = None
    throttled: bool | None = None
    mfu: float | None = None
    mfu_source: str | None = None
    mbu: float | None = None
    mbu_source: str | None = None
    engine: float | None = None
    sm: float | None = None
    tensor: float | None = None
    dram: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    sm_clock_mhz: float | None = None
    sm_clock_max_mhz: float | None = None
    mem_used_bytes: float | None = None
    mem_total_bytes: float | None = None
    job: str | None = None
    pod: str | None = None
    basis: str | None = None
    """What the verdict rests on (the reason info's ``basis`` label, EVIDENCE_BASES)."""
    basis_source: str | None = None
    """Where those counters were read (the reason info's ``basis_source`` label: agent.model.counter_source)."""
    waste: str | None = None
    """Whether the GPU is wasted (the reason info's ``waste`` label: agent.model.waste.WASTE_LABELS)."""
    lost: float | None = None
    """Share of its window it lost (``roofwatch_gpu_waste_lost_ratio``): the lost-time measure."""
    comm_wait: float | None = None
    power_fabric_r: float | None = None
    step_cv: float | None = None
    step_time_s: float | None = None

    @property
    def key(self) -> GpuKey:
        return (self.node, self.gpu, self.uuid)


@dataclass(frozen=True)
class NodeView:
    """Everything one fetch learned: the GPU rows and the node-level facts next to them."""

    url: str
    rows: tuple[GpuRow, ...]
    fetched_at: float
    gpus_visible: int | None = None
    gpus_expected: int | None = None
    version: str | None = None
    serving: tuple[ServingRow, ...] = ()
    """One row per inference server (agent.views.top_serving); empty where no GPU serves."""
    holders: tuple[HolderRow, ...] = ()
    """One row per holder of a shared GPU (agent.views.top_holders); empty where no GPU is shared."""

    @property
    def nodes(self) -> tuple[str, ...]:
        """Node names in first-seen order (an exposition re-served by a proxy may hold several)."""
        return tuple(dict.fromkeys(row.node for row in self.rows))


# -- URL ------------------------------------------------------------------------------------


def metrics_url(url: str | None) -> str:
    """The ``/metrics`` URL to read: people type a host, a base URL or the full endpoint."""
    if not url:
        return f"http://127.0.0.1:{DEFAULT_PORT}/metrics"
    try:
        return agent_endpoint(url, "/metrics")
    except ValueError as exc:
        raise TopSourceError(str(exc)) from None


# -- fetch ----------------------------------------------------------------------------------


def fetch_text(url: str, timeout: float = DEFAULT_TIMEOUT_S, deadline: float = DEFAULT_DEADLINE_S) -> str:
    """GET ``url`` within ``timeout`` per read and ``deadline`` in all, at most ``MAX_BODY_BYTES``;
    every failure becomes :class:`TopSourceError` with a one-line reason."""
    try:
        body = bounded_get(url, accept="text/plain", timeout_s=timeout, deadline_s=max(deadline, timeout),
                           max_bytes=MAX_BODY_BYTES)
    except FetchError as exc:
        raise TopSourceError(str(exc)) from None
    return body.decode("utf-8", errors="replace")


def fetch_view(url: str, timeout: float = DEFAULT_TIMEOUT_S, deadline: float = DEFAULT_DEADLINE_S) -> NodeView:
    """Fetch and parse one exposition (``url`` is already a /metrics URL, see :func:`metrics_url`)."""
    return parse_exposition(fetch_text(url, timeout, deadline), url)


# -- parse ----------------------------------------------------------------------------------

_GAUGES: dict[str, str] = {
    "roofwatch_gpu_workload_confidence_ratio": "confidence",
    "roofwatch_gpu_engine_active_ratio": "engine",
    "roofwatch_gpu_sm_active_ratio": "sm",
    "roofwatch_gpu_tensor_active_ratio": "tensor",
    "roofwatch_gpu_dram_active_ratio": "dram",
    "roofwatch_gpu_power_watts": "power_w",
    "roofwatch_gpu_power_limit_watts": "power_limit_w",
    "roofwatch_gpu_memory_used_bytes": "mem_used_bytes",
    "roofwatch_gpu_memory_total_bytes": "mem_total_bytes",
    "roofwatch_gpu_comm_wait_ratio": "comm_wait",
    "roofwatch_gpu_power_fabric_correlation": "power_fabric_r",
    "roofwatch_gpu_step_time_cv": "step_cv",
    "roofwatch_gpu_step_time_seconds": "step_time_s",
    "roofwatch_gpu_waste_lost_ratio": "lost",
}
_MHZ: dict[str, str] = {
    "roofwatch_gpu_sm_clock_hertz": "sm_clock_mhz",
    "roofwatch_gpu_sm_clock_max_hertz": "sm_clock_max_mhz",
}
_BOOLS: dict[str, str] = {"roofwatch_gpu_up": "up", "roofwatch_gpu_throttled": "throttled"}
_BY_SOURCE: dict[str, str] = {"roofwatch_gpu_mfu_ratio": "mfu", "roofwatch_gpu_mbu_ratio": "mbu"}
SOURCES = ("workload", "counters")
"""Preference order, as in ``Roofline.mfu``: the job's own figure wins, the counter estimate stands in."""


def _samples(text: str, url: str) -> list:
    """Every sample of the exposition; matched later by ``sample.name``, since the parser renames
    families (it strips ``_total`` from counters and would strip ``_info`` from info types)."""
    try:
        return [sample for family in text_string_to_metric_families(text) for sample in family.samples]
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        raise TopSourceError(f"{url} did not answer with a Prometheus exposition ({one_line(exc, 80)})") from None


def _key(labels: Mapping[str, str]) -> GpuKey:
    return (labels.get("node", ""), labels["gpu"], labels.get("uuid", ""))


def _value(value: float) -> float | None:
    """NaN is how a text exposition spells 'no value'; it is unknown, not a number."""
    return None if value is None or math.isnan(value) else float(value)


def parse_exposition(text: str, url: str, fetched_at: float | None = None) -> NodeView:
    """Rows (one per GPU, down ones included) and node facts from one exposition's text."""
    fields: dict[GpuKey, dict[str, object]] = {}
    by_source: dict[GpuKey, dict[str, dict[str, float]]] = {}
    node_facts: dict[str, object] = {}
    serving = ServingSeries()
    holders = HolderSeries()
    seen_info = False
    for sample in _samples(text, url):
        name, labels, value = sample.name, sample.labels, _value(sample.value)
        if "gpu" not in labels:
            _node_fact(node_facts, name, labels, value)
            continue
        if name.startswith(SERVING_PREFIX):
            serving.add(name, labels, value)
            continue
        if name.startswith(HOLDER_PREFIX):
            holders.add(name, labels, value)
            continue
        if not name.startswith("roofwatch_gpu_"):
            continue
        row = fields.setdefault(_key(labels), {})
        seen_info |= name == "roofwatch_gpu_info"
        _gpu_fact(row, by_source.setdefault(_key(labels), {}), name, labels, value)
    if not seen_info:
        raise TopSourceError(f"{url} has no roofwatch_gpu_info series: not a roofwatch agent's /metrics")
    rows = tuple(_row(key, row, by_source.get(key, {})) for key, row in fields.items() if "model" in row or "up" in row)
    return NodeView(
        url=url, rows=rows, fetched_at=time.time() if fetched_at is None else fetched_at,
        gpus_visible=node_facts.get("gpus_visible"), gpus_expected=node_facts.get("gpus_expected"),
        version=node_facts.get("version"), serving=serving.rows(), holders=holders.rows(),
    )


def _node_fact(facts: dict[str, object], name: str, labels: Mapping[str, str], value: float | None) -> None:
    """Node-level series; GPU counts add up over nodes when a proxy serves several."""
    if name == "roofwatch_build_info":
        facts.setdefault("version", labels.get("version"))
    elif name in ("roofwatch_gpus_visible", "roofwatch_gpus_expected") and value is not None:
        field = name.removeprefix("roofwatch_")
        facts[field] = int(facts.get(field, 0)) + int(value)


def _gpu_fact(row: dict[str, object], sources: dict[str, dict[str, float]], name: str,
              labels: Mapping[str, str], value: float | None) -> None:
    """File one per-GPU sample under its row field (info labels, gauges, per-source ratios)."""
    if name == "roofwatch_gpu_info":
        row["model"] = labels.get("model")
    elif name in _GAUGES:
        row[_GAUGES[name]] = value
    elif name in _MHZ:
        row[_MHZ[name]] = None if value is None else value / 1e6
    elif name in _BOOLS:
        row[_BOOLS[name]] = None if value is None else value >= 0.5
    elif name in _BY_SOURCE and value is not None:
        sources.setdefault(_BY_SOURCE[name], {})[labels.get("source", "counters")] = value
    elif name == "roofwatch_gpu_workload_class" and value == 1:
        row["cls"] = labels.get("class")
    elif name == "roofwatch_gpu_workload_reason_info":
        row["detail"], row["throttle"] = labels.get("detail"), labels.get("throttle")
        row["basis"] = labels.get("basis") or None
        row["basis_source"] = labels.get("basis_source") or None
        row["waste"] = labels.get("waste") or None
    elif name == "roofwatch_gpu_job_info":
        row["job"] = labels.get("job_id") or None
    elif name == "roofwatch_gpu_pod_info":
        pod = "/".join(p for p in (labels.get("namespace"), labels.get("pod")) if p)
        row["pod"] = pod or None


def preferred(values: Mapping[str, float]) -> tuple[float | None, str | None]:
    """(value, source) with the workload's own figure first, the counter estimate otherwise."""
    for source in SOURCES:
        if source in values:
            return values[source], source
    return None, None


def _row(key: GpuKey, row: dict[str, object], sources: dict[str, dict[str, float]]) -> GpuRow:
    mfu, mfu_source = preferred(sources.get("mfu", {}))
    mbu, mbu_source = preferred(sources.get("mbu", {}))
    node, gpu, uuid = key
    return GpuRow(node=node, gpu=gpu, uuid=uuid, mfu=mfu, mfu_source=mfu_source, mbu=mbu,
                  mbu_source=mbu_source, **row)  # type: ignore[arg-type]

