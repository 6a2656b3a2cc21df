"""Opt-in series (issue 36): what the default exposition leaves out, and that each group brings it back.

Series per GPU bound what a fleet's Prometheus holds and what every rule reads; the budget is 60
per GPU by default on each virtual layout (the demo node, NVML's H100 node, amdsmi's MI300X node).
"""

from __future__ import annotations

from collections import Counter

import pydantic
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.app.config import Settings
from agent.model import CLOCK_EVENT_REASONS, WORKLOAD_CLASSES
from benchmarks.series_per_gpu import snapshot_of
from exporters import metrics as m
from exporters.encoding import encode_exposition
from exporters.prometheus import SnapshotCollector, families_for
from prometheus_client.exposition import generate_latest

SERIES_PER_GPU_BUDGET = 60


class _Snapshots(dict):
    """Each layout's snapshot, built on first use (each costs about half a second)."""

    def __missing__(self, backend: str):
        self[backend] = snapshot_of(backend)
        return self[backend]


@pytest.fixture(scope="module")
def snapshots():
    return _Snapshots()


def _samples(snapshot, optional=()):
    text = encode_exposition(SnapshotCollector(lambda: snapshot, optional_metrics=optional), generate_latest).decode()
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


@pytest.mark.parametrize("backend", ["virtual", "nvml-virtual", "amd-virtual"])
def test_series_per_gpu_within_budget_by_default(snapshots, backend):
    snapshot = snapshots[backend]
    samples = _samples(snapshot)
    per_gpu = len(samples) / len(snapshot.devices)
    assert per_gpu <= SERIES_PER_GPU_BUDGET, Counter(s.name for s in samples).most_common(10)
    everything = _samples(snapshot, tuple(m.OPTIONAL_GROUPS))
    assert len(everything) > len(samples)  # the groups do add series on this layout


def test_one_hot_class_exports_its_one_and_zeros_on_request(snapshots):
    snapshot = snapshots["virtual"]
    classes = Counter(s.labels["uuid"] for s in _samples(snapshot) if s.name == "roofwatch_gpu_workload_class")
    assert set(classes.values()) == {1} and len(classes) == len(snapshot.devices)
    values = [s.value for s in _samples(snapshot) if s.name == "roofwatch_gpu_workload_class"]
    assert set(values) == {1.0}
    full = [s for s in _samples(snapshot, ("one_hot_zeros",)) if s.name == "roofwatch_gpu_workload_class"]
    assert len(full) == len(WORKLOAD_CLASSES) * len(snapshot.devices)
    per_gpu_sum = Counter()
    for s in full:
        per_gpu_sum[s.labels["uuid"]] += s.value
    assert set(per_gpu_sum.values()) == {1.0}
    # the default's one series per GPU is the class of the full one-hot that reads 1
    assert {(s.labels["uuid"], s.labels["class"]) for s in full if s.value == 1.0} == {
        (s.labels["uuid"], s.labels["class"]) for s in _samples(snapshot) if s.name == "roofwatch_gpu_workload_class"}


def test_clock_event_reasons_active_only_by_default(snapshots):
    snapshot = snapshots["nvml-virtual"]
    known = [d for d in snapshot.devices if d.up and d.sample is not None and d.sample.clock_event_reasons is not None]
    assert known
    default = [s for s in _samples(snapshot) if s.name == "roofwatch_gpu_clock_event_active"]
    assert all(s.value == 1.0 for s in default)
    active = sum(bin(d.sample.clock_event_reasons & sum(CLOCK_EVENT_REASONS.values())).count("1") for d in known)
    assert len(default) == active
    full = [s for s in _samples(snapshot, ("one_hot_zeros",)) if s.name == "roofwatch_gpu_clock_event_active"]
    assert len(full) == len(CLOCK_EVENT_REASONS) * len(known)


def test_peak_flops_for_the_roofline_precision_unless_roofline_detail(snapshots):
    snapshot = snapshots["virtual"]
    dtypes = {v.gpu: v.roofline.dtype for v in snapshot.verdicts}
    gpu_of = {d.info.uuid: d.info.gpu for d in snapshot.devices}
    default = [s for s in _samples(snapshot) if s.name == "roofwatch_gpu_peak_flops"]
    assert default and all(s.labels["dtype"] == dtypes[gpu_of[s.labels["uuid"]]] for s in default)
    full = [s for s in _samples(snapshot, ("roofline_detail",)) if s.name == "roofwatch_gpu_peak_flops"]
    assert len(full) == sum(len(d.info.spec.peak_flops) for d in snapshot.devices if d.info.spec)
    assert len(full) > len(default)


@pytest.mark.parametrize("group", sorted(m.OPTIONAL_GROUPS))
def test_each_group_adds_only_its_own_families(snapshots, group):
    layout = {"fabric_links": "amd-virtual", "pipes": "virtual"}.get(group, "nvml-virtual")
    snapshot = snapshots[layout]
    base = Counter(s.name for s in _samples(snapshot))
    more = Counter(s.name for s in _samples(snapshot, (group,)))
    added = {name for name in more if more[name] > base[name]}
    owned = {d.name.removesuffix("_total") for d in m.METRICS if d.optional == group}
    partial = {"roofline_detail": {"roofwatch_gpu_peak_flops"},
               "one_hot_zeros": {"roofwatch_gpu_workload_class", "roofwatch_gpu_clock_event_active"}}
    assert added, f"{group} adds nothing on this layout"
    assert {n.removesuffix("_total") for n in added} <= owned | partial.get(group, set())


def test_unknown_group_is_refused_naming_the_setting(snapshots):
    snapshot = snapshots["virtual"]
    with pytest.raises(ValueError, match="optional_metrics"):
        families_for(snapshot, optional_metrics=("bogus",))
    with pytest.raises(pydantic.ValidationError, match="optional_metrics"):
        Settings(optional_metrics=["bogus"])
