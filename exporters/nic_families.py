"""Node-level InfiniBand/RoCE port series: traffic, congestion, link flaps and errors.

Labels are ``node, device, port`` plus, for the error and RoCE families, a ``counter`` label
drawn from the fixed sets in agent.context.host.infiniband, so a new driver cannot grow the label set.
"""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric

from agent.context.host.infiniband import ERROR_COUNTERS, HW_COUNTERS
from agent.model import NicPort
from exporters import metrics as m

_SEPARATE = ("port_xmit_wait", "link_downed")
"""Error counters with a family of their own (congestion ticks and flaps are read differently)."""


def nic_families(node: str, ports: tuple[NicPort, ...]) -> list[Metric]:
    info = InfoMetricFamily(m.NIC_INFO.family_name, m.NIC_INFO.help, labels=m.NIC_LABELS)
    up = GaugeMetricFamily(m.NIC_UP.name, m.NIC_UP.help, labels=m.NIC_UP.labels)
    rate = GaugeMetricFamily(m.NIC_RATE.name, m.NIC_RATE.help, labels=m.NIC_RATE.labels)
    traffic = _counter(m.NIC_BYTES)
    wait, downed = _counter(m.NIC_XMIT_WAIT), _counter(m.NIC_LINK_DOWNED)
    errors, roce = _counter(m.NIC_ERRORS), _counter(m.NIC_ROCE_EVENTS)
    for port in ports:
        labels = [node, port.device, str(port.port)]
        info.add_metric(labels, {"link_layer": port.link_layer or ""})
        up.add_metric(labels, 1.0 if port.active else 0.0)
        if port.rate_bytes_per_s is not None:
            rate.add_metric(labels, port.rate_bytes_per_s)
        traffic.add_metric(labels + ["tx"], port.tx_bytes)
        traffic.add_metric(labels + ["rx"], port.rx_bytes)
        if "port_xmit_wait" in port.events:
            wait.add_metric(labels, port.events["port_xmit_wait"])
        if "link_downed" in port.events:
            downed.add_metric(labels, port.events["link_downed"])
        for name in ERROR_COUNTERS:
            if name not in _SEPARATE and name in port.events:
                errors.add_metric(labels + [name], port.events[name])
        for name in HW_COUNTERS:
            if name in port.events:
                roce.add_metric(labels + [name], port.events[name])
    return [info, up, rate, traffic, wait, downed, errors, roce]


def _counter(defn: m.MetricDef) -> CounterMetricFamily:
    return CounterMetricFamily(defn.family_name, defn.help, labels=defn.labels)
