"""exporters.encoding writes exactly the bytes prometheus_client's own encoders write.

The fast path is hand-written for speed (docs/performance.md), so it is held to the library's
output byte for byte: on generated families with hostile label values and help texts, and on
the agent's real exposition in every format ``choose_encoder`` hands out.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings, strategies as st
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, InfoMetricFamily
from prometheus_client.exposition import choose_encoder, generate_latest
from prometheus_client.openmetrics import exposition as openmetrics

from agent.app.assemble import make_collector, open_backend_or_fail
from agent.app.config import Settings
from exporters.encoding import encode_exposition
from exporters.prometheus import SnapshotCollector
from tests.agent_process import SLOW_MACHINE_SAMPLE_TIMEOUT_S

ACCEPTS = (
    "",
    "text/plain; version=0.0.4",
    "application/openmetrics-text; version=1.0.0; charset=utf-8",
    "application/openmetrics-text; version=1.0.0; escaping=allow-utf-8",
    "application/openmetrics-text; version=1.0.0; escaping=underscores",
    "application/openmetrics-text; version=1.0.0; escaping=dots",
    "application/openmetrics-text; version=1.0.0; escaping=values",
    "application/openmetrics-text; version=0.0.1,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",  # Prometheus 2.x
    "application/openmetrics-text;escaping=allow-utf-8;version=1.0.0",
    "text/plain;version=1.0.0;escaping=allow-utf-8",
)


class Families:
    """A collector over fixed families (what SnapshotCollector yields, in general form)."""

    def __init__(self, families):
        self.families = families

    def collect(self):
        return iter(self.families)


names = st.from_regex(r"[a-z][a-z0-9_]{0,12}", fullmatch=True).filter(lambda n: not n.endswith(("_total", "_info", "_created")))
label_names = st.sampled_from(["gpu", "node", "uuid", "pid", "process", "class", "job_id", "le_x"])
label_values = st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=40) | st.sampled_from(
    ['"quoted"', "back\\slash", "new\nline", "tab\there", "ünïcødé ✓", "", "{a=\"b\"}", "\\n"])
numbers = st.floats(allow_nan=True, allow_infinity=True) | st.integers(-2**63, 2**64).map(float)


@st.composite
def families(draw):
    out = []
    for name in draw(st.lists(names, min_size=1, max_size=4, unique=True)):
        kind = draw(st.sampled_from(["gauge", "counter", "info"]))
        doc = draw(st.text(max_size=30) | st.just("multi\nline \\ help"))
        keys = draw(st.lists(label_names, max_size=3, unique=True))
        family = {"gauge": GaugeMetricFamily, "counter": CounterMetricFamily}.get(kind)
        if kind == "info":
            fam = InfoMetricFamily(name, doc, labels=keys)
            for _ in range(draw(st.integers(0, 3))):
                fam.add_metric([draw(label_values) for _ in keys], {"extra": draw(label_values)})
        else:
            fam = family(name, doc, labels=keys)
            for _ in range(draw(st.integers(0, 3))):
                value = draw(numbers)
                if kind == "counter" and (math.isnan(value) or value < 0):
                    value = abs(value) if not math.isnan(value) else 0.0
                fam.add_metric([draw(label_values) for _ in keys], value)
        out.append(fam)
    return out


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(families(), st.sampled_from(ACCEPTS))
def test_generated_families_encode_identically(fams, accept):
    encoder, _ = choose_encoder(accept)
    assert encode_exposition(Families(fams), encoder) == encoder(Families(fams))


def test_unusual_families_fall_back_to_the_library():
    histogram = HistogramMetricFamily("latency_seconds", "h", buckets=[("1", 1), ("+Inf", 2)], sum_value=3)
    reserved = GaugeMetricFamily("g", "reserved label", labels=["__name_like"])
    reserved.add_metric(["x"], 1.0)
    for fams in ([histogram], [reserved]):
        for accept in ACCEPTS:
            encoder, _ = choose_encoder(accept)
            assert encode_exposition(Families(fams), encoder) == encoder(Families(fams))
    assert encode_exposition(Families([histogram]), generate_latest) == generate_latest(Families([histogram]))


@pytest.fixture(scope="module")
def agent_collector():
    settings_ = Settings(backend="virtual", sample_timeout_s=SLOW_MACHINE_SAMPLE_TIMEOUT_S)
    collector = make_collector(settings_, open_backend_or_fail(settings_))
    snapshot = collector.collect_once()
    collector.stop()
    return SnapshotCollector(lambda: snapshot)


@pytest.mark.parametrize("accept", ACCEPTS)
def test_the_agents_exposition_encodes_identically(agent_collector, accept):
    encoder, _ = choose_encoder(accept)
    ours = encode_exposition(agent_collector, encoder)
    assert ours == encoder(agent_collector) and len(ours) > 50_000


def test_openmetrics_2_and_other_encoders_are_passed_through(agent_collector):
    calls = []

    def custom(collector):
        calls.append(collector)
        return b"custom"

    assert encode_exposition(agent_collector, custom) == b"custom" and calls == [agent_collector]
    later = lambda c: openmetrics.generate_latest(c, version="2.0.0")  # noqa: E731 - an unknown encoder
    assert encode_exposition(agent_collector, later) == later(agent_collector)
