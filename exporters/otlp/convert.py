"""The families ``/metrics`` shows for a snapshot, as one OTLP ``ExportMetricsServiceRequest``.

Why walk the Prometheus families instead of reading the snapshot a second way: the OTLP push must
carry exactly what a scrape of the same snapshot shows, whoever adds or drops a family. So the input
is the list :func:`exporters.prometheus.families_for` returns (the one the exposition encodes), and
the output is one OTLP metric per family, one data point per sample, values untouched; only names
(:mod:`exporters.otlp.names`), instrument kinds and units are translated.

Why the protobuf message is built here rather than through the SDK's ``MetricsData`` and its
``encode_metrics``: that path cost 50 ms of CPU per push of 1,300 points (dataclasses, then a
message per attribute, every time), three times a ``/metrics`` render and far past the push's
budget. A series' attributes do not change between pushes, so each series keeps a prepared data
point (attributes and start time) that a push copies in C and stamps with its time and value. The
SDK's exporters still do everything on the wire (:mod:`exporters.otlp.endpoint`).
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import AGGREGATION_TEMPORALITY_CUMULATIVE, NumberDataPoint
from opentelemetry.sdk.resources import OTELResourceDetector, Resource
from prometheus_client.core import Metric as PromFamily

from agent import __version__
from exporters.metrics import MetricDef
from exporters.otlp import names as n

SCOPE_NAME = "roofwatch"


def resource_for(node: str, environ_resource: Resource | None = None) -> Resource:
    """``service.name=roofwatch``, ``service.version``, ``host.name`` and ``service.instance.id`` (the node
    label), then ``OTEL_RESOURCE_ATTRIBUTES`` / ``OTEL_SERVICE_NAME`` on top: what the operator sets wins."""
    ours = Resource({"service.name": "roofwatch", "service.version": __version__, "host.name": node,
                     "service.instance.id": node}, schema_url=n.SCHEMA_URL)
    return ours.merge(environ_resource if environ_resource is not None else OTELResourceDetector().detect())


def catalogue_key(family: PromFamily) -> str:
    """The exposed name of a family as :class:`MetricDef` spells it (``_total``/``_info`` included)."""
    if family.type == "counter":
        return family.name + "_total"
    if family.type == "info":
        return family.name + "_info"
    return family.name


def key_values(attributes: Mapping[str, Any]) -> list[KeyValue]:
    """OTLP attributes: str, bool, int and float values as the matching ``AnyValue`` field."""
    out = []
    for key, value in attributes.items():
        kv = KeyValue(key=key)
        if isinstance(value, bool):
            kv.value.bool_value = value
        elif isinstance(value, int):
            kv.value.int_value = value
        elif isinstance(value, float):
            kv.value.double_value = value
        else:
            kv.value.string_value = str(value)
        out.append(kv)
    return out


class _Head:
    """What a family becomes, decided once per family name."""

    __slots__ = ("name", "unit", "description", "kind", "semconv")

    def __init__(self, key: str, family: PromFamily, defn: MetricDef | None) -> None:
        self.semconv = n.SEMCONV.get(key)
        self.unit = self.semconv.unit if self.semconv else n.ucum(defn.unit if defn else "")
        self.name = self.semconv.name if self.semconv else n.roofwatch_name(key, family.type, self.unit)
        self.kind = self.semconv.kind if self.semconv else (n.KIND_COUNTER if family.type == "counter" else n.KIND_GAUGE)
        self.description = defn.help if defn else family.documentation


class Converter:
    """Turns families into an OTLP request; ``catalogue`` gives each family's unit word and help.

    ``start_time_ns`` is when the agent started: every ``_total`` counts from then, so it is the start of
    every cumulative sum. Gauges carry only the snapshot's time.
    """

    def __init__(self, catalogue: Mapping[str, MetricDef], start_time_ns: int) -> None:
        self.catalogue = dict(catalogue)
        self.start_time_ns = start_time_ns
        self._resources: dict[str, list[KeyValue]] = {}
        self._environ_resource = OTELResourceDetector().detect()
        self._heads: dict[str, _Head] = {}
        self._templates: dict[tuple, NumberDataPoint] = {}
        self._used: dict[tuple, NumberDataPoint] = {}

    def resource(self, node: str) -> list[KeyValue]:
        """The resource attributes for ``node``, built once (the environment is read when the pusher starts)."""
        resource = self._resources.get(node)
        if resource is None:
            attributes = resource_for(node, self._environ_resource).attributes
            resource = self._resources[node] = key_values(dict(attributes))
        return resource

    def request(self, node: str, groups: Iterable[tuple[Iterable[PromFamily], int]]) -> tuple[ExportMetricsServiceRequest, int]:
        """The whole push: each group of families with its own timestamp, under one resource and scope;
        and how many data points it holds."""
        request = ExportMetricsServiceRequest()
        resource_metrics = request.resource_metrics.add(schema_url=n.SCHEMA_URL)
        resource_metrics.resource.attributes.extend(self.resource(node))
        scope = resource_metrics.scope_metrics.add(schema_url=n.SCHEMA_URL)
        scope.scope.name, scope.scope.version = SCOPE_NAME, __version__
        points = 0
        self._used = {}
        for families, time_ns in groups:
            points += self._add(scope.metrics, list(families), time_ns)
        self._templates = self._used  # series gone since the last push are forgotten: memory follows the series
        return request, points

    def _add(self, metrics: Any, families: list[PromFamily], time_ns: int) -> int:
        identity: dict[str, dict[str, str]] | None = None
        points = 0
        usage: dict[tuple, tuple[NumberDataPoint, float]] = {}
        limit: dict[tuple, float] = {}
        templates, used = self._templates, self._used
        for family in families:
            if not family.samples:
                continue
            key = catalogue_key(family)
            head = self._heads.get(key)
            if head is None:
                head = self._heads[key] = _Head(key, family, self.catalogue.get(key))
            metric = metrics.add(name=head.name, unit=head.unit, description=head.description)
            if head.kind == n.KIND_GAUGE:
                data_points = metric.gauge.data_points
            else:
                metric.sum.aggregation_temporality = AGGREGATION_TEMPORALITY_CUMULATIVE
                metric.sum.is_monotonic = head.kind == n.KIND_COUNTER
                data_points = metric.sum.data_points
            integer = head.semconv is not None and head.semconv.integer
            derived = key in n.MEMORY_UTILIZATION_FROM
            samples = family.samples
            prepared = []
            for sample in samples:
                series = (key, *sample.labels.values())  # a family's label names come in one fixed order
                template = templates.get(series) or used.get(series)
                if template is None:
                    if identity is None:
                        identity = _gpu_identity(families)
                    template = self._template(sample.labels, head, identity)
                used[series] = template
                prepared.append(template)
            data_points.extend(prepared)  # one copy in C per point: attributes and start time
            for point, sample in zip(data_points, samples):
                point.time_unix_nano = time_ns
                value = sample.value
                if integer and float(value).is_integer():
                    point.as_int = int(value)
                else:
                    point.as_double = value
            if derived:
                for template, sample in zip(prepared, samples):
                    labels = tuple(sample.labels.items())
                    if key == n.MEMORY_UTILIZATION_FROM[0]:
                        usage[labels] = (template, float(sample.value))
                    else:
                        limit[labels] = float(sample.value)
            points += len(family.samples)
        return points + self._memory_utilization(metrics, usage, limit, time_ns)

    def _template(self, labels: Mapping[str, str], head: _Head, identity: Mapping[str, Mapping[str, str]]) -> NumberDataPoint:
        template = NumberDataPoint(attributes=key_values(point_attributes(labels, head.semconv, identity)))
        if head.kind != n.KIND_GAUGE:
            template.start_time_unix_nano = self.start_time_ns
        return template

    @staticmethod
    def _memory_utilization(metrics: Any, usage: dict[tuple, tuple[NumberDataPoint, float]], limit: dict[tuple, float],
                            time_ns: int) -> int:
        """``hw.gpu.memory.utilization``: usage / limit of the same GPU (same labels) in the same snapshot."""
        ratios = [(template, used / limit[labels]) for labels, (template, used) in usage.items() if limit.get(labels, 0.0) > 0.0]
        if not ratios:
            return 0
        sc = n.MEMORY_UTILIZATION
        metric = metrics.add(name=sc.name, unit=sc.unit,
                             description="Fraction of GPU memory used: hw.gpu.memory.usage / hw.gpu.memory.limit.")
        for template, ratio in ratios:
            point = metric.gauge.data_points.add()
            point.attributes.extend(template.attributes)
            point.time_unix_nano = time_ns
            point.as_double = ratio
        return len(ratios)


def point_attributes(labels: Mapping[str, str], semconv: n.Semconv | None = None,
                     identity: Mapping[str, Mapping[str, str]] | None = None) -> dict[str, object]:
    """The attributes of one data point from its Prometheus labels (rules in :mod:`exporters.otlp.names`).

    ``node`` is the resource's, not the point's. A point of a GPU (one with ``uuid``) also gets
    ``hw.type=gpu`` and the GPU's vendor and model from ``identity``; a point with a pod also gets
    ``k8s.node.name``, the node the pod runs on.
    """
    attributes: dict[str, object] = {}
    uuid = labels.get("uuid")
    if uuid:
        attributes["hw.type"] = "gpu"
        if identity is not None:
            attributes.update(identity.get(uuid, {}))
    for label, value in labels.items():
        if label == n.RESOURCE_LABEL or value == "":
            continue
        renamed = semconv.labels.get(label) if semconv is not None else None
        if renamed is not None:
            attributes[renamed[0]] = renamed[1].get(value, value)
        else:
            attributes[n.attribute_name(label)] = n.attribute_value(label, value)
    if semconv is not None:
        attributes.update(semconv.constant)
    if labels.get("pod") and labels.get(n.RESOURCE_LABEL):
        attributes["k8s.node.name"] = labels[n.RESOURCE_LABEL]
    return attributes


def _gpu_identity(families: list[PromFamily]) -> dict[str, dict[str, str]]:
    """uuid -> ``hw.vendor`` / ``hw.model`` from ``roofwatch_gpu_info`` (empty values left out)."""
    identity: dict[str, dict[str, str]] = {}
    for family in families:
        if family.type == "info" and family.name == "roofwatch_gpu":
            for sample in family.samples:
                uuid = sample.labels.get("uuid")
                if uuid:
                    identity[uuid] = {attr: sample.labels[label] for label, attr in n.GPU_IDENTITY.items()
                                      if sample.labels.get(label)}
            break
    return identity
