"""The baseline the render is compared with: a prometheus_client registry of ordinary metric objects.

It is rebuilt from our own exposition and refused unless it holds exactly the same series, so the
ratio in the scrape figures compares two encoders over the same data, not two different payloads.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import prometheus_client
import prometheus_client.metrics
from prometheus_client import CollectorRegistry, Counter, Gauge, Info
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from exporters import metrics as m

_INFO_KEY_LABELS = frozenset(m.GPU_LABELS + m.NIC_LABELS + ("pid", "process"))
"""Labels that identify an info series (its ``labelnames``); the rest are the info values. The text
format does not say which is which, so the split follows how our families are built."""


@contextlib.contextmanager
def no_created_series() -> Iterator[None]:
    """Counters export ``_created`` by default; ours do not, so the baseline must not either.

    prometheus_client keeps this as a module-wide switch, so it is restored for whatever runs next.
    """
    was = prometheus_client.metrics._use_created  # no public getter
    prometheus_client.disable_created_metrics()
    try:
        yield
    finally:
        if was:
            prometheus_client.enable_created_metrics()


def baseline_registry(exposition: str) -> CollectorRegistry:
    """A registry of standard metric objects holding exactly the series of ``exposition``."""
    registry = CollectorRegistry()
    kinds = {d.name: d.kind for d in m.METRICS}
    defined_labels = {d.name: d.labels for d in m.METRICS}
    for family in text_string_to_metric_families(exposition):
        if kinds.get(family.name) == "info":
            _add_info(registry, family, defined_labels[family.name])
        elif family.type == "counter":
            _add_counter(registry, family, defined_labels[family.name + "_total"])
        else:
            _add_gauge(registry, family, defined_labels[family.name])
    return registry


def _label_names(family: Metric, defined: tuple[str, ...]) -> list[str]:
    """From the series when there are any; an empty family still needs labels, or it would export 0."""
    return list(family.samples[0].labels) if family.samples else list(defined)


def _add_gauge(registry: CollectorRegistry, family: Metric, defined: tuple[str, ...]) -> None:
    names = _label_names(family, defined)
    gauge = Gauge(family.name, family.documentation, names, registry=registry)
    for s in family.samples:
        gauge.labels(*(s.labels[n] for n in names)).set(s.value)


def _add_counter(registry: CollectorRegistry, family: Metric, defined: tuple[str, ...]) -> None:
    names = _label_names(family, defined)
    counter = Counter(family.name, family.documentation, names, registry=registry)
    for s in family.samples:
        counter.labels(*(s.labels[n] for n in names)).inc(s.value)


def _add_info(registry: CollectorRegistry, family: Metric, defined: tuple[str, ...]) -> None:
    # An empty family still needs its key labels: an unlabelled Info exports one series of its own.
    keys = list(family.samples[0].labels) if family.samples else list(defined)
    names = [n for n in keys if n in _INFO_KEY_LABELS]
    info = Info(family.name.removesuffix("_info"), family.documentation, names, registry=registry)
    for s in family.samples:
        values = {k: v for k, v in s.labels.items() if k not in _INFO_KEY_LABELS}
        (info.labels(*(s.labels[n] for n in names)) if names else info).info(values)


def series(exposition: str) -> set[tuple[str, tuple[tuple[str, str], ...], float]]:
    """Every series with its value, to prove the baseline holds the same ones."""
    return {(s.name, tuple(sorted(s.labels.items())), s.value)
            for family in text_string_to_metric_families(exposition) for s in family.samples}


def checked_baseline(text: str) -> CollectorRegistry:
    """The baseline registry, refused unless it exposes exactly our series."""
    registry = baseline_registry(text)
    with no_created_series():
        theirs = prometheus_client.generate_latest(registry).decode()
    if series(theirs) != series(text):
        raise RuntimeError("the baseline registry does not hold the same series as our exposition")
    return registry

