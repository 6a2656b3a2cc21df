"""A prometheus_client custom collector that turns the latest node snapshot into metric families.

It reads only the immutable snapshot handed to it, so a scrape costs the same whether the
GPUs answer in microseconds or hang. :class:`ExpositionCache` renders each snapshot once per
exposition format: Prometheus and a handful of dashboards scraping the same agent share
the work. It writes the bytes prometheus_client's encoders would, without their per-label
overhead (:mod:`exporters.encoding`), since that render is paid once a collection cycle.

Every label value of every family passes through one rule on its way out, whatever source gave it
(a driver, dcgm-exporter's labels, the kubelet, Slurm, the process table, an inference server, the
settings): :func:`clip_labels`, which applies :func:`exporters.metrics.clip_label` (at most 128
characters, valid UTF-8); the encoder then escapes it.
"""

from __future__ import annotations

import gzip
import platform
from typing import Callable, Collection, Iterable, Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from agent import __version__
from agent.model import CLOCK_EVENT_REASONS, WORKLOAD_CLASSES, DeviceState, NodeSnapshot
from agent.model.counter_source import NO_SOURCE, device_basis_sources, source_label
from agent.model.waste import NOT_WASTED, waste_of
from exporters import metrics as m
from exporters.encoding import encode_exposition
from exporters.families import Families, add_known, rejected_values
from exporters.mig_families import mig_unattributed_family
from exporters.nic_families import nic_families
from exporters.holder_families import HolderFamilies
from exporters.process_families import ProcessFamilies
from exporters.serving_families import serving_families
from exporters.render_cache import PerSnapshotCache


class SnapshotCollector(Collector):
    """Yields every family in :data:`exporters.metrics.METRICS` from ``get_snapshot()``."""

    def __init__(self, get_snapshot: Callable[[], NodeSnapshot], *, max_processes_per_gpu: int = 16,
                 gpu_labels: Sequence[str] = (), optional_metrics: Collection[str] = ()) -> None:
        self._get_snapshot = get_snapshot
        self._max_processes = max_processes_per_gpu
        self._gpu_labels = tuple(gpu_labels)
        self._optional = frozenset(optional_metrics)

    def describe(self) -> Iterable[Metric]:
        return []  # families depend on the snapshot; skip the registry's eager collect()

    def collect(self) -> Iterator[Metric]:
        yield from families_for(self._get_snapshot(), max_processes_per_gpu=self._max_processes,
                                gpu_labels=self._gpu_labels, optional_metrics=self._optional)


def families_for(snapshot: NodeSnapshot, *, max_processes_per_gpu: int = 16, gpu_labels: Sequence[str] = (),
                 optional_metrics: Collection[str] = ()) -> list[Metric]:
    """Build all metric families for one snapshot (pure: the same snapshot gives the same output).

    ``gpu_labels`` (a subset of :data:`exporters.metrics.ATTRIBUTION_LABELS`) are added to every
    per-GPU series, valued from the GPU's current attribution ("" when unknown). Series are built
    from the snapshot on every scrape, so when a job or pod ends its labelled series simply stop
    being exposed: nothing stale is left behind in the agent.

    ``optional_metrics`` names the :data:`exporters.metrics.OPTIONAL_GROUPS` to export beside the
    default set; a family of a group not named is left out whole (no HELP/TYPE either).
    """
    unknown = set(gpu_labels) - set(m.ATTRIBUTION_LABELS)
    if unknown:
        raise ValueError(f"gpu_labels: {sorted(unknown)} not in {list(m.ATTRIBUTION_LABELS)}")
    optional = frozenset(optional_metrics)
    if optional - set(m.OPTIONAL_GROUPS):
        raise ValueError(f"optional_metrics: {sorted(optional - set(m.OPTIONAL_GROUPS))} not in {list(m.OPTIONAL_GROUPS)}")
    fam = Families(tuple(gpu_labels))
    node = snapshot.node
    node_labels = [node]
    backend_labels = [node, snapshot.health.backend]
    out: list[Metric] = []

    build = InfoMetricFamily(m.BUILD_INFO.family_name, m.BUILD_INFO.help)
    build.add_metric([], {"version": __version__, "python_version": platform.python_version()})
    out.append(build)

    def node_gauge(defn: m.MetricDef, labels: list[str], value: float | None) -> None:
        family = GaugeMetricFamily(defn.name, defn.help, labels=defn.labels)
        if value is not None:
            family.add_metric(labels, value)
        out.append(family)

    node_gauge(m.GPUS_EXPECTED, node_labels, snapshot.expected_devices)
    node_gauge(m.GPUS_VISIBLE, node_labels, snapshot.visible_devices)
    cycles = CounterMetricFamily(m.COLLECTOR_CYCLES.family_name, m.COLLECTOR_CYCLES.help, labels=m.COLLECTOR_CYCLES.labels)
    cycles.add_metric(backend_labels, snapshot.health.cycles_total)
    out.append(cycles)
    node_gauge(m.COLLECTOR_DURATION, backend_labels, snapshot.health.last_cycle_duration_s)
    node_gauge(m.COLLECTOR_SUCCESS, backend_labels, 1.0 if snapshot.health.last_cycle_success else 0.0)
    node_gauge(m.COLLECTOR_INTERVAL, backend_labels, snapshot.health.interval_s)
    node_gauge(m.SNAPSHOT_TS, node_labels, snapshot.health.last_cycle_ts)
    sources = GaugeMetricFamily(m.SOURCE_UP.name, m.SOURCE_UP.help, labels=m.SOURCE_UP.labels)
    for source in snapshot.sources:
        sources.add_metric([node, source.name, source.state], 1.0 if source.state == "up" else 0.0)
    out.append(sources)
    out.append(rejected_values(node, snapshot.rejected))

    host = snapshot.host
    node_gauge(m.HOST_IOWAIT, node_labels, host.cpu_iowait_ratio if host else None)
    node_gauge(m.HOST_IO_PRESSURE, node_labels, host.io_pressure_ratio if host else None)
    node_gauge(m.HOST_CPU_PRESSURE, node_labels, host.cpu_pressure_ratio if host else None)
    node_gauge(m.HOST_CPU_UTILIZATION, node_labels, host.cpu_utilization_ratio if host else None)

    roofline_dtype = {v.gpu: v.roofline.dtype for v in snapshot.verdicts}
    out.extend(_device_families(fam, node, snapshot.devices, max_processes_per_gpu, optional, roofline_dtype))
    if snapshot.mig_parents:  # like the holders' families: a node without MIG exposes exactly what it did before
        out.append(mig_unattributed_family(fam, node, snapshot.mig_parents))
    out.extend(_verdict_families(fam, node, snapshot, zeros="one_hot_zeros" in optional))
    out.extend(nic_families(node, snapshot.nics))
    out.extend(serving_families(fam, node, snapshot))
    return clip_labels(_opted_in(out, optional))


_OPTIONAL_FAMILIES = {d.family_name: d.optional for d in m.METRICS if d.optional}


def _opted_in(families: list[Metric], optional: frozenset[str]) -> list[Metric]:
    """``families`` less those of an optional group not asked for."""
    return [f for f in families if _OPTIONAL_FAMILIES.get(f.name, "") in optional or f.name not in _OPTIONAL_FAMILIES]


def clip_labels(families: list[Metric]) -> list[Metric]:
    """Every label value of ``families`` clipped in place by :func:`exporters.metrics.clip_label`.

    One pass at the end rather than at each place a value enters, so no family and no source can
    miss it (a dcgm-exporter ``Hostname`` of 2,200 characters became the ``node`` label of every
    series). Each sample holds its own label dict, built by ``add_metric``; a value that is short and
    ASCII, nearly all of them, costs two checks.
    """
    clip, limit = m.clip_label, m.JOB_ID_MAX_LEN
    for family in families:
        for sample in family.samples:
            labels = sample.labels
            for key, value in labels.items():
                if len(value) > limit or not value.isascii():
                    labels[key] = clip(value)
    return families


def _device_families(fam: Families, node: str, devices: tuple[DeviceState, ...], max_processes: int,
                     optional: frozenset[str], roofline_dtype: dict[str, str]) -> list[Metric]:
    """Identity, readings, counters, health and processes per GPU.

    Peak FLOP/s are constants: by default only the precision the verdict's roofline uses is
    exported (what the node dashboard's roofline reads), every precision with ``roofline_detail``.
    A clock-event reason is exported while active; the inactive ones (value 0) with
    ``one_hot_zeros``.
    """
    every_peak, inactive_reasons = "roofline_detail" in optional, "one_hot_zeros" in optional
    info = fam.info(m.GPU_INFO)
    up, last, errors = fam.gauge(m.GPU_UP), fam.gauge(m.GPU_LAST_SAMPLE), fam.counter(m.GPU_SAMPLE_ERRORS)
    peak_flops, peak_bw = fam.gauge(m.GPU_PEAK_FLOPS), fam.gauge(m.GPU_PEAK_BANDWIDTH)
    gauges = [fam.gauge(g.metric) for g in m.SAMPLE_GAUGES]
    pipes, tensor_pipes = fam.gauge(m.PIPE_ACTIVE), fam.gauge(m.TENSOR_PIPE_ACTIVE)
    clock_events, clock_event_time = fam.gauge(m.CLOCK_EVENT_ACTIVE), fam.counter(m.CLOCK_EVENT_TIME)
    counters = {defn.name: fam.counter(defn) for defn in (m.ENERGY, m.PCIE_BYTES, m.LINK_BYTES, m.NETWORK_BYTES)}
    driver_calls = fam.counter(m.DRIVER_CALLS)
    ecc = fam.counter(m.ECC_ERRORS)
    replays = fam.counter(m.PCIE_REPLAYS)
    link_bytes, link_up = fam.counter(m.FABRIC_LINK_BYTES), fam.gauge(m.FABRIC_LINK_UP)
    remapped, remap_pending, remap_failure = (fam.gauge(m.REMAPPED_ROWS), fam.gauge(m.REMAPPED_ROWS_PENDING),
                                              fam.gauge(m.REMAPPED_ROWS_FAILURE))
    xid_errors, xid_last = fam.counter(m.XID_ERRORS), fam.gauge(m.XID_LAST_SEEN)
    processes = ProcessFamilies(fam, max_processes)
    holders = HolderFamilies(fam)

    for device in devices:
        d = device.info
        labels = fam.values(node, device)
        spec = d.spec
        info.add_metric(
            labels,
            {
                "vendor": d.vendor,
                "model": d.model,
                "pci_bus_id": d.pci_bus_id or "",
                "spec": spec.key if spec else "",
                "spec_source": m.spec_source(device),
            },
        )
        up.add_metric(labels, 1.0 if device.up else 0.0)
        errors.add_metric(labels, device.sample_errors_total)
        if device.last_success_ts is not None:
            last.add_metric(labels, device.last_success_ts)
        if spec is not None:
            for dtype, flops in spec.peak_flops.items():
                if every_peak or roofline_dtype.get(d.gpu) == dtype:
                    peak_flops.add_metric(labels + [dtype], flops)
            if spec.mem_bandwidth_bytes_per_s:
                peak_bw.add_metric(labels, spec.mem_bandwidth_bytes_per_s)

        c = device.counters
        if c.energy_j is not None:  # totals exist once their reading has: absent, never 0, without a source
            counters[m.ENERGY.name].add_metric(labels, c.energy_j)
        for defn, tx, rx in (
            (m.PCIE_BYTES, c.pcie_tx_bytes, c.pcie_rx_bytes),
            (m.LINK_BYTES, c.link_tx_bytes, c.link_rx_bytes),
            (m.NETWORK_BYTES, c.net_tx_bytes, c.net_rx_bytes),
        ):
            if tx is not None:
                counters[defn.name].add_metric(labels + ["tx"], tx)
            if rx is not None:
                counters[defn.name].add_metric(labels + ["rx"], rx)
        if c.driver_calls:
            driver_calls.add_metric(labels, c.driver_calls)
        for xid in device.xid_errors:  # also while down: a GPU that fell off the bus reports XID 79
            xid_errors.add_metric(labels + [str(xid.xid)], xid.count)
            xid_last.add_metric(labels + [str(xid.xid)], xid.last_ts)

        sample = device.sample
        if not device.up or sample is None:
            continue  # a down GPU's last values would read as live; up=0 says why they are gone
        for family, gauge in zip(gauges, m.SAMPLE_GAUGES):
            value = gauge.getter(sample)
            if value is not None:
                family.add_metric(labels, value)
        for pipe, field in m.PIPE_FIELDS:
            value = getattr(sample, field)
            if value is not None:
                pipes.add_metric(labels + [pipe], value)
        for pipe, field in m.TENSOR_PIPE_FIELDS:
            value = getattr(sample, field)
            if value is not None:
                tensor_pipes.add_metric(labels + [pipe], value)
        if sample.clock_event_reasons is not None:
            for reason, bit in CLOCK_EVENT_REASONS.items():
                if sample.clock_event_reasons & bit:
                    clock_events.add_metric(labels + [reason], 1.0)
                elif inactive_reasons:
                    clock_events.add_metric(labels + [reason], 0.0)
        for reason, seconds in (sample.clock_event_time_s or {}).items():
            clock_event_time.add_metric(labels + [reason], seconds)
        for kind, count in (("corrected", sample.ecc_corrected_errors), ("uncorrected", sample.ecc_uncorrected_errors)):
            if count is not None:
                ecc.add_metric(labels + [kind], count)
        if sample.pcie_replays is not None:
            replays.add_metric(labels, sample.pcie_replays)
        for link in sample.links or ():
            name = str(link.link)
            if link.read_bytes is not None:
                link_bytes.add_metric(labels + [name, "rx"], link.read_bytes)
            if link.write_bytes is not None:
                link_bytes.add_metric(labels + [name, "tx"], link.write_bytes)
            if link.up is not None:
                link_up.add_metric(labels + [name], 1.0 if link.up else 0.0)
        rows = sample.remapped_rows
        if rows is not None:
            remapped.add_metric(labels + ["correctable"], rows.correctable)
            remapped.add_metric(labels + ["uncorrectable"], rows.uncorrectable)
            remap_pending.add_metric(labels, 1.0 if rows.pending else 0.0)
            remap_failure.add_metric(labels, 1.0 if rows.failure else 0.0)
        processes.add(labels, sample)
        holders.add(labels, device)

    return [info, up, last, errors, peak_flops, peak_bw, *gauges, pipes, tensor_pipes, clock_events, clock_event_time,
            *counters.values(), replays, link_bytes, link_up, driver_calls, ecc, remapped, remap_pending, remap_failure, xid_errors, xid_last,
            *processes.families(), *holders.families()]


def _verdict_families(fam: Families, node: str, snapshot: NodeSnapshot, *, zeros: bool = False) -> list[Metric]:
    """Class, confidence, scores, reasons, waste, roofline and MFU/MBU per GPU.

    Every GPU has, at all times, its class's one-hot series at 1 (a GPU without a verdict yet, or
    down, reads ``unknown``), its confidence and its reason series, so their count per GPU is
    fixed; the six other classes' 0 series only with ``zeros`` (optional ``one_hot_zeros``). The
    measured values are absent while unknown, as everywhere else in roofwatch. Whether a GPU is
    wasted is the ``waste`` label of its reason series and the share a wasted GPU lost is one gauge
    (none for the others: the series budget of docs/performance.md), both from agent.model.waste
    (the one definition the views, rules and dashboards count by).
    """
    gauge = fam.gauge
    one_hot, confidence, scores = gauge(m.WORKLOAD_CLASS), gauge(m.WORKLOAD_CONFIDENCE), gauge(m.WORKLOAD_SCORE)
    reason, lost = fam.info(m.WORKLOAD_REASON), gauge(m.WASTE_LOST)
    throttled, duty, wait, step_cv, skew = (gauge(d) for d in (m.THROTTLED, m.DUTY_CYCLE, m.COMM_WAIT, m.STEP_TIME_CV, m.RANK_SKEW))
    suspect, correlation, step_time = gauge(m.COUNTERS_SUSPECT), gauge(m.POWER_FABRIC_CORRELATION), gauge(m.STEP_TIME)
    flops, bandwidth, intensity, ridge, headroom, mfu, mbu = (gauge(d) for d in (
        m.ACHIEVED_FLOPS, m.ACHIEVED_BANDWIDTH, m.INTENSITY, m.RIDGE_POINT, m.ROOF_HEADROOM, m.MFU, m.MBU))

    verdicts = {v.gpu: v for v in snapshot.verdicts}
    for device in snapshot.devices:
        labels = fam.values(node, device)
        verdict = verdicts.get(device.info.gpu) if device.up else None
        cls = verdict.cls if verdict else "unknown"
        for name in WORKLOAD_CLASSES:
            if name == cls or zeros:
                one_hot.add_metric(labels + [name], 1.0 if name == cls else 0.0)
        confidence.add_metric(labels, verdict.confidence if verdict else 0.0)
        if verdict is None:
            reason.add_metric(labels, {"class": "unknown", "detail": "warming_up" if device.up else "gpu_down", "throttle": "none",
                                       "basis": "none", "basis_source": NO_SOURCE, "waste": NOT_WASTED})
            continue
        waste = waste_of(verdict)
        reason.add_metric(labels, {"class": cls, "detail": verdict.detail, "throttle": verdict.throttle,
                                   "basis": verdict.basis,
                                   "basis_source": source_label(device_basis_sources(verdict.basis, device)),
                                   "waste": waste.label})
        if waste.wasted:  # a GPU not wasted lost nothing: its reason info says so, no series per GPU for a 0
            add_known(lost, labels + [waste.label], waste.lost_fraction)
        for name, value in verdict.scores.items():
            scores.add_metric(labels + [name], value)
        if verdict.features.throttle_known:  # no clock-event reasons: unknown is absent, never 0
            throttled.add_metric(labels, 1.0 if verdict.throttled else 0.0)
        f, r = verdict.features, verdict.roofline
        if f.duty_check is not None:
            suspect.add_metric(labels, 1.0 if verdict.counters_suspect else 0.0)
        add_known(duty, labels, f.duty)
        add_known(wait, labels, f.comm_wait_fraction if f.comm_wait_fraction is not None else f.fabric_wait_fraction)
        add_known(correlation, labels, None if f.power_fabric_r is None else round(f.power_fabric_r, 3))
        add_known(step_cv, labels, f.step_cv if f.steps >= 2 else None)
        add_known(step_time, labels, f.step_time_mean)
        add_known(skew, labels, verdict.rank_skew)
        add_known(flops, labels + [r.dtype], r.achieved_flops)
        add_known(bandwidth, labels, r.achieved_bytes_per_s)
        add_known(intensity, labels + [r.dtype], r.intensity)
        add_known(ridge, labels + [r.dtype], r.ridge_point)
        add_known(headroom, labels + ["compute"], r.compute_headroom)
        add_known(headroom, labels + ["memory"], r.memory_headroom)
        add_known(mfu, labels + ["counters", r.dtype], r.mfu_counters)
        add_known(mfu, labels + ["workload", r.dtype], r.mfu_workload)
        add_known(mbu, labels + ["counters"], r.mbu_counters)
        add_known(mbu, labels + ["workload"], r.mbu_workload)
    return [one_hot, confidence, scores, reason, lost, throttled, suspect, duty, wait, correlation, step_cv, step_time, skew,
            flops, bandwidth, intensity, ridge, headroom, mfu, mbu]


class ExpositionCache:
    """Renders the exposition once per (snapshot, format) and serves the bytes to every scraper.

    The encoders only iterate ``collect()``, so each rendering gets a collector bound to exactly
    the snapshot it was keyed by: concurrent scrapes can never mix two snapshots.
    """

    def __init__(self, get_snapshot: Callable[[], NodeSnapshot], *, max_processes_per_gpu: int = 16,
                 gpu_labels: Sequence[str] = (), optional_metrics: Collection[str] = ()) -> None:
        self._get_snapshot = get_snapshot
        self._max_processes = max_processes_per_gpu
        self._gpu_labels = tuple(gpu_labels)
        self._optional = frozenset(optional_metrics)
        self._cache = PerSnapshotCache()
        self.extra_families: Callable[[NodeSnapshot], list[Metric]] | None = None
        """Families served after the snapshot's, from the same snapshot (the OTLP push's own counters)."""

    def cached(self, content_type: str, *, gzipped: bool = False) -> bytes | None:
        """The current snapshot's exposition if already rendered, else None: the listener's event loop
        serves it at once and leaves the render (milliseconds) to a worker thread."""
        snapshot = self._get_snapshot()
        return self._cache.peek(snapshot, (content_type, "gzip") if gzipped else content_type)

    def render(self, encoder: Callable[[Collector], bytes], content_type: str, *, gzipped: bool = False) -> bytes:
        """The exposition of the current snapshot; ``gzipped`` compresses it, also once per snapshot
        (Prometheus asks for gzip on every scrape)."""
        def encode(snapshot: NodeSnapshot) -> bytes:
            collector = SnapshotCollector(lambda: snapshot, max_processes_per_gpu=self._max_processes,
                                          gpu_labels=self._gpu_labels, optional_metrics=self._optional)
            extra = self.extra_families
            if extra is not None:
                collector = _Joined(collector, lambda: extra(snapshot))
            return encode_exposition(collector, encoder)

        snapshot = self._get_snapshot()
        plain = self._cache.get(snapshot, content_type, encode)
        if not gzipped:
            return plain
        return self._cache.get(snapshot, (content_type, "gzip"), lambda _: gzip.compress(plain, compresslevel=1))


class _Joined(Collector):
    """A collector's families followed by ``extra()``'s, as one collector for the encoders."""

    def __init__(self, first: Collector, extra: Callable[[], list[Metric]]) -> None:
        self._first, self._extra = first, extra

    def collect(self) -> Iterator[Metric]:
        yield from self._first.collect()
        yield from clip_labels(self._extra())
