"""What each Prometheus family and label is called over OTLP: the hardware semantic conventions where
they define the figure, one mechanical rule into ``roofwatch.*`` for everything else.

Why a rule and not a hand-written list: the families on ``/metrics`` change (new figures, series per
GPU turned on or off), and every one of them must reach OTLP under a predictable name without anyone
remembering to add it here. The rule is chosen so that the standard OTLP-to-Prometheus translation
(unit suffixes on, as Mimir, Prometheus 3 and VictoriaMetrics apply it) gives back the ``/metrics``
name for the base units: ``roofwatch.gpu.power`` in ``W`` becomes ``roofwatch_gpu_power_watts``,
``roofwatch.gpu.energy`` ... (mapped to ``hw.energy`` here) and a ratio in ``1`` gains ``_ratio``.

The GPU conventions are in development; :data:`SEMCONV_RELEASE` is the release they were read from
(model/hardware/gpu-metrics.yaml and common-metrics.yaml of open-telemetry/semantic-conventions).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping

SEMCONV_RELEASE = "1.44.0"
SCHEMA_URL = f"https://opentelemetry.io/schemas/{SEMCONV_RELEASE}"

KIND_GAUGE, KIND_COUNTER, KIND_UPDOWN = "gauge", "counter", "updowncounter"

UCUM: Mapping[str, str] = {
    "ratio": "1", "boolean": "1", "": "1", "multiple": "1", "correlation (-1..1)": "1",
    "seconds": "s", "bytes": "By", "bytes per second": "By/s", "watts": "W", "joules": "J", "hertz": "Hz",
    "celsius": "Cel", "flops": "{flop}/s", "FLOP per byte": "{flop}/By", "per second": "1/s",
    "tokens per second": "{token}/s", "compute units": "{compute_unit}", "cores": "{cpu}",
}
"""The catalogue's unit words (``MetricDef.unit``) as UCUM. A word not listed becomes a UCUM annotation
of its singular (``gpus`` -> ``{gpu}``, ``errors`` -> ``{error}``), which reads as dimensionless."""

UNIT_SUFFIX: Mapping[str, str] = {
    "s": "_seconds", "By": "_bytes", "By/s": "_bytes_per_second", "W": "_watts", "J": "_joules", "Hz": "_hertz",
    "Cel": "_celsius",
}
"""The suffix a Prometheus name carries for a UCUM unit (the OTLP translator's own table, in part); the
rule strips it, since the OTLP metric carries the unit in its own field. ``_ratio`` goes for ``1`` gauges."""


def ucum(unit: str) -> str:
    """The UCUM form of a catalogue unit word (see :data:`UCUM`)."""
    if unit in UCUM:
        return UCUM[unit]
    word = unit.strip().replace(" ", "_") or "1"
    if word.endswith(("ches", "shes", "sses", "xes")):
        word = word[:-2]
    elif word.endswith("s") and not word.endswith("ss"):
        word = word[:-1]
    return "{" + word + "}"


@dataclasses.dataclass(frozen=True)
class Semconv:
    """A family that the hardware semantic conventions name: its OTLP name, instrument and attributes.

    ``labels`` renames a label and maps its values (the conventions' enumerations); ``constant`` adds
    attributes the convention requires that the Prometheus series has implicitly (``hw.type=gpu``).
    """

    name: str
    kind: str
    unit: str
    constant: Mapping[str, str] = dataclasses.field(default_factory=dict)
    labels: Mapping[str, tuple[str, Mapping[str, str]]] = dataclasses.field(default_factory=dict)
    integer: bool = False
    """The convention's value type is int: integral values go out as ``as_int``."""


_GPU = {"hw.type": "gpu"}
SEMCONV: Mapping[str, Semconv] = {
    "roofwatch_gpu_engine_active_ratio": Semconv("hw.gpu.utilization", KIND_GAUGE, "1", {"hw.gpu.task": "general"}),
    "roofwatch_gpu_memory_used_bytes": Semconv("hw.gpu.memory.usage", KIND_UPDOWN, "By", integer=True),
    "roofwatch_gpu_memory_total_bytes": Semconv("hw.gpu.memory.limit", KIND_UPDOWN, "By", integer=True),
    "roofwatch_gpu_pcie_bytes_total": Semconv(
        "hw.gpu.io", KIND_COUNTER, "By", integer=True,
        labels={"direction": ("network.io.direction", {"tx": "transmit", "rx": "receive"})}),
    "roofwatch_gpu_power_watts": Semconv("hw.power", KIND_GAUGE, "W", _GPU),
    "roofwatch_gpu_energy_joules_total": Semconv("hw.energy", KIND_COUNTER, "J", _GPU),
    "roofwatch_gpu_ecc_errors_total": Semconv("hw.errors", KIND_COUNTER, "{error}", _GPU, integer=True,
                                              labels={"type": ("error.type", {})}),
}
"""Prometheus name -> its semantic-conventions metric (release :data:`SEMCONV_RELEASE`). Everything else
goes through :func:`roofwatch_name`."""

MEMORY_UTILIZATION = Semconv("hw.gpu.memory.utilization", KIND_GAUGE, "1")
"""Derived, not a family of ``/metrics``: ``hw.gpu.memory.usage / hw.gpu.memory.limit`` of the same GPU in
the same snapshot (the convention's "fraction of GPU memory used"; not memory bandwidth or busy time)."""
MEMORY_UTILIZATION_FROM = ("roofwatch_gpu_memory_used_bytes", "roofwatch_gpu_memory_total_bytes")


def roofwatch_name(prometheus_name: str, kind: str, unit: str) -> str:
    """The documented rule for a family the conventions do not name.

    ``roofwatch_<group>_<rest>[_<unit suffix>][_total]`` becomes ``roofwatch.<group>.<rest>``: the
    ``_total`` of a counter and the suffix of the UCUM unit (:data:`UNIT_SUFFIX`, ``_ratio`` for a ratio in
    ``1``) are dropped, because OTLP carries both in fields of their own; the first word after the
    namespace (``gpu``, ``collector``, ``nic``, ``serving``, ``otlp``...) becomes the next level; the rest
    keeps its underscores (OpenTelemetry's snake_case inside a component, as in ``hw.fan.speed_ratio``).
    A byte counter ends in ``io`` as the conventions' byte counters do (``hw.gpu.io``, ``system.network.io``):
    ``roofwatch_nic_bytes_total`` -> ``roofwatch.nic.io``, ``roofwatch_gpu_link_bytes_total`` ->
    ``roofwatch.gpu.link_io``. An ``_info`` family keeps ``info``: ``roofwatch_gpu_info`` -> ``roofwatch.gpu.info``.
    """
    name = prometheus_name.removeprefix("roofwatch_")
    if kind == "counter":
        name = name.removesuffix("_total")
    suffix = UNIT_SUFFIX.get(unit) or ("_ratio" if unit == "1" else "")
    io = kind == "counter" and unit == "By"
    if suffix and name.endswith(suffix) and len(name) > len(suffix):
        name = name[: -len(suffix)] + ("_io" if io else "")
    group, _, rest = name.partition("_")
    return f"roofwatch.{group}.{rest}" if rest else f"roofwatch.{group}"


def otlp_name(prometheus_name: str, kind: str, unit_word: str) -> tuple[str, str]:
    """(OTLP name, UCUM unit) of a catalogue family: its semantic-conventions entry, else the rule."""
    semconv = SEMCONV.get(prometheus_name)
    if semconv is not None:
        return semconv.name, semconv.unit
    unit = ucum(unit_word)
    return roofwatch_name(prometheus_name, kind, unit), unit


# -- labels -> attributes ------------------------------------------------------------------------------

RESOURCE_LABEL = "node"
"""Becomes the resource's ``host.name`` (and ``service.instance.id``), not an attribute of each point."""


def _gpu_name(value: str) -> str:
    return f"gpu{value}"


def _pid(value: str) -> object:
    """``process.pid`` is an int in the conventions; a label that is not a number stays as it is."""
    return int(value) if value.isascii() and value.isdigit() and len(value) < 19 else value


LABELS: Mapping[str, tuple[str, Callable[[str], object] | None]] = {
    "uuid": ("hw.id", None),
    "gpu": ("hw.name", _gpu_name),
    "vendor": ("hw.vendor", None),
    "model": ("hw.model", None),
    "namespace": ("k8s.namespace.name", None),
    "pod": ("k8s.pod.name", None),
    "container": ("k8s.container.name", None),
    "pid": ("process.pid", _pid),
    "process": ("process.executable.name", None),
}
"""Labels with a semantic-conventions attribute: name, and how the value is written (``gpu="3"`` is
``hw.name="gpu3"``, a MIG instance ``gpu="0/1"`` is ``hw.name="gpu0/1"``). Any other label ``x``
becomes ``roofwatch.x`` with its value unchanged. An empty label value is absent (as Prometheus reads it)."""

GPU_IDENTITY = {"vendor": "hw.vendor", "model": "hw.model"}
"""``roofwatch_gpu_info`` labels copied onto every point of that GPU (the join PromQL does with
``group_left``), beside ``hw.type=gpu``: what the GPU conventions list for every GPU metric."""


def attribute_name(label: str) -> str:
    """The attribute a Prometheus label becomes (see :data:`LABELS`)."""
    known = LABELS.get(label)
    return known[0] if known is not None else f"roofwatch.{label}"


def attribute_value(label: str, value: str) -> object:
    """The attribute value of a label value: unchanged, except where :data:`LABELS` says how."""
    known = LABELS.get(label)
    return known[1](value) if known is not None and known[1] is not None else value
