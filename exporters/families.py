"""How a per-GPU metric family is built: its label names (with the configured attribution labels),
its label values for one device, and adding a value only when it is known.

Shared by every module that builds per-GPU families (exporters.prometheus, .process_families), so
the label layout ``node, gpu, uuid, <gpu_labels...>`` is decided in one place.
"""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily

from agent.model import DeviceState, RejectedValues
from exporters import metrics as m


class Families:
    """Creates per-GPU families with the configured attribution labels after ``node, gpu, uuid``."""

    def __init__(self, extra: tuple[str, ...] = ()) -> None:
        self.extra = extra

    def names(self, defn: m.MetricDef) -> tuple[str, ...]:
        head = len(m.GPU_LABELS)
        if not self.extra or defn.labels[:head] != m.GPU_LABELS:
            return defn.labels
        return defn.labels[:head] + self.extra + defn.labels[head:]

    def values(self, node: str, device: DeviceState) -> list[str]:
        """``node, gpu, uuid`` and the extra labels' values for one device."""
        values = [node, device.info.gpu, device.info.uuid]
        if self.extra:
            sample = device.sample
            who = sample.attribution if sample is not None else None
            for name in self.extra:
                value = getattr(who, name, None) if who is not None else None
                values.append(m.clip_label(value))
        return values

    def gauge(self, defn: m.MetricDef) -> GaugeMetricFamily:
        return GaugeMetricFamily(defn.name, defn.help, labels=self.names(defn))

    def counter(self, defn: m.MetricDef) -> CounterMetricFamily:
        return CounterMetricFamily(defn.family_name, defn.help, labels=self.names(defn))

    def info(self, defn: m.MetricDef) -> InfoMetricFamily:
        """Info families carry their own labels in the value dict; only the GPU key gets extras."""
        return InfoMetricFamily(defn.family_name, defn.help, labels=m.GPU_LABELS + self.extra)


def add_known(family: GaugeMetricFamily, labels: list[str], value: float | None) -> None:
    """Unknown stays absent: a series with no sample, never a made-up zero."""
    if value is not None:
        family.add_metric(labels, value)


def rejected_values(node: str, rejected: tuple[RejectedValues, ...]) -> CounterMetricFamily:
    """``roofwatch_source_rejected_values_total``: readings dropped as physically impossible, by source and
    field (a fixed set of field names, so the series stay few); no series until a first refusal."""
    family = CounterMetricFamily(m.SOURCE_REJECTED.family_name, m.SOURCE_REJECTED.help, labels=m.SOURCE_REJECTED.labels)
    for entry in rejected:
        family.add_metric([node, entry.source, entry.field], entry.count)
    return family
