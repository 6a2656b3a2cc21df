"""``--backend amd-exporter``: the GPUs and partitions as AMD's Device Metrics Exporter on the node
sees them, with no amdsmi access: the shared exporter backend (:mod:`agent.backends.exporter_backend`)
with DME's names, units and partitions (:mod:`agent.backends.amd_exporter.mapping`).

The model comes from the labels: ``card_series`` (an optional label) where enabled, else
``card_model``. gpuagent fills ``card_model`` with amdsmi's board model number (``102-G30211-0C``
on an MI300X: ROCm/device-metrics-exporter PR #329), which the catalogue does not hold, so the board
numbers known from published material are listed in :mod:`agent.backends.amd_exporter.boards`; any
other is resolved by name as the driver name would be, and a ``specs:`` entry keyed by the ``card_model``
value covers a board neither knows (docs/specs.md; ``roofwatch doctor`` prints it). A partition is held
to its share of the peaks (:func:`agent.model.specs.partition_slice_spec`), as amdsmi partitions are; an
MI250X GCD is a device of its own (its own ``gpu_id``) and the catalogue's MI250X entry is already per GCD.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Mapping

from agent.backends.amd_exporter.boards import board_model
from agent.backends.amd_exporter.exposition import MAX_GPUS, AmdRecord, read_records
from agent.backends.amd_exporter.mapping import (
    DEFAULT_WINDOW_US,
    LinkRates,
    capabilities,
    profiled,
    sample_values,
)
from agent.backends.amd_exporter.units import MIB
from agent.backends.exporter_backend import ExporterBackend
from agent.backends.exporter_reader import DEFAULT_MAX_BYTES, Dialect, ExporterReader, Fetch
from agent.model import DeviceInfo, GpuSpec
from agent.model.specs import partition_slice_spec, resolve_spec

log = logging.getLogger("roofwatch.amd_exporter")

SOURCE = "amd-exporter"
UNNAMED_MODEL = "AMD GPU (model not exported)"

DME = Dialect(source=SOURCE, parse=read_records, energy="gpu_energy_consumed", power="gpu_package_power",
              no_gpu="the exposition has Device Metrics Exporter series but none names a GPU (no gpu_id label)",
              stopped="gpuagent stopped updating (hung or restarted)")


def amd_exporter_reader(url: str, *, interval_s: float = 5.0, timeout_s: float = 2.0, stale_s: float = 120.0,
                        max_bytes: int = DEFAULT_MAX_BYTES, fetch: Fetch | None = None,
                        clock: Callable[[], float] = time.time, max_gpus: int = MAX_GPUS) -> ExporterReader:
    """The shared background reader over DME's ``/metrics`` (rules: :mod:`agent.backends.exporter_reader`)."""
    return ExporterReader(url, interval_s=interval_s, timeout_s=timeout_s, stale_s=stale_s, max_bytes=max_bytes,
                          fetch=fetch, clock=clock, max_gpus=max_gpus, dialect=DME)


def device_model(record: AmdRecord) -> str:
    """The market name where a label's board part number is known
    (:data:`agent.backends.amd_exporter.boards.BOARD_MODELS`), else the label as printed."""
    for name in (record.series, record.model):
        known = board_model(name)
        if known:
            return known
    return record.series or record.model or UNNAMED_MODEL


def device_uuid(record: AmdRecord, records: Mapping[str, AmdRecord]) -> str:
    """An id unique on the node without the optional ``gpu_uuid`` label: the board serial, with the partition id
    on a partitioned GPU, and with ``gpu_id`` where unpartitioned devices share a serial (an MI250X's two GCDs
    may read one board FRU); ``amd-exporter-gpu-<gpu_id>`` without a serial."""
    if not record.serial:
        return f"amd-exporter-gpu-{record.gpu_id}"
    if record.partitions > 1:
        return f"{record.serial}/{record.partition}"
    shared = sum(1 for r in records.values() if r.serial == record.serial and r.partitions <= 1) > 1
    return f"{record.serial}/gpu{record.gpu_id}" if shared else record.serial


def device_spec(record: AmdRecord) -> GpuSpec | None:
    """The whole GPU's peaks (a ``specs:`` entry for the printed ``card_model`` first), then the partition's share."""
    total = record.values.get("gpu_total_vram")
    memory = int(total * MIB * record.partitions) if total else None  # finite: the parser skips what is not (units.py)
    spec = None
    for name in (record.model, record.series, device_model(record)):
        if name and spec is None:
            spec = resolve_spec(vendor="amd", name=name, memory_bytes=memory)
            spec = None if spec is not None and spec.estimated else spec
    if spec is None or record.partitions <= 1:
        return spec
    return partition_slice_spec(spec, record.partitions, record.partition_type or f"{record.partitions}x")


class AmdExporterBackend(ExporterBackend):
    """Samples every GPU and partition a Device Metrics Exporter lists, from its latest exposition."""

    name = SOURCE
    vendor = "amd"
    devices_word = "GPUs and partitions"
    most_per_node = "a node has at most 8 GPUs x 8 partitions"

    def __init__(self, reader: ExporterReader, *, window_us: float = DEFAULT_WINDOW_US, **kwargs: Any) -> None:
        """``window_us``: rocpctl's sampling window, which ``/metrics`` does not say (the setting
        ``amd_exporter_profiler_window_us``)."""
        super().__init__(reader, **kwargs)
        self.window_us = window_us
        self._links: dict[str, LinkRates] = {}

    def device(self, record: AmdRecord, records: Mapping[str, AmdRecord]) -> DeviceInfo:
        spec = device_spec(record)
        values = sample_values(record, spec, self.window_us)
        modes = "/".join(m.upper() for m in (record.partition_type, record.memory_partition_type) if m) or None
        uuid = record.uuid or device_uuid(record, records)
        return DeviceInfo(gpu=record.key, uuid=uuid, vendor="amd", model=device_model(record),
                          memory_total_bytes=values.get("mem_total_bytes"), sm_clock_max_mhz=values.get("sm_clock_max_mhz"),
                          spec=spec, partition=modes if record.partitions > 1 else None,
                          capabilities=(SOURCE, *capabilities(values)))

    def values(self, gpu: str, record: AmdRecord, now: float | None) -> dict[str, Any]:
        info = self._infos.get(gpu)
        links = self._links.setdefault(gpu, LinkRates())
        return sample_values(record, info.spec if info is not None else device_spec(record), self.window_us,
                             links, now)

    def profiler_state(self) -> str:
        """One line for doctor: whether the exposition has profiler series, and what to do if not."""
        return profiler_advice(self.reader.records(), self.window_us)


def profiler_advice(records: Mapping[str, AmdRecord], window_us: float) -> str:
    """Whether the latest exposition has the profiler's series, and how to turn them on when not."""
    with_profiler = [k for k, r in records.items() if profiled(r.values, window_us) is not None]
    if with_profiler and len(with_profiler) == len(records):
        short = (f"; amd_exporter_profiler_window_us is {window_us:g}: DME 1.3.x-1.4.0.1 counted each field "
                 "for 10 us, too short for a rate (upgrade to 1.4.1+, window 1000 us)" if window_us < 100 else "")
        return (f"profiler metrics present on all {len(records)} devices: tensor, VALU and HBM counters, "
                f"each over a {window_us:g} us window{short}")
    missing = "absent" if not with_profiler else f"absent on {len(records) - len(with_profiler)} of {len(records)} devices"
    return (f"profiler metrics (gpu_prof_*) {missing}: they are off by default (GPUConfig.ProfilerMetrics, "
            "since 1.3.1), off on SR-IOV, and from 1.4.1 switched off after 3 failed rocpctl runs (or one crash) "
            "until the exporter restarts (log 'rocpclient has failed 3 times, disabling'; 1.5.1 raises a "
            "Kubernetes event ProfilerDisabled). Enable with \"ProfilerMetrics\": {\"all\": true} in the "
            "exporter's config.json/ConfigMap, stop any other profiler (rocprof, omniperf) on the GPU, and "
            "restart the exporter. Until then: activity, UMC activity and power only, as with amdsmi")
