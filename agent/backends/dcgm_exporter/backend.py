"""``--backend dcgm-exporter``: the GPUs as a dcgm-exporter on the node sees them, with no driver access.

For an agent that runs beside the GPU Operator's exporter (a sidecar, a locked-down pod) and for
pre-Hopper fleets where only DCGM has the profiling counters. Discovery is the first read: every
GPU and MIG instance in the exposition becomes a device named as the trace format names it
(``"3"``, ``"3/7"`` for GPU instance 7). Each sample is the latest exposition's values for that
device, mapped by :mod:`agent.backends.dcgm_exporter.mapping`, answered from the reader's memory.
When the reader refuses a device's values (exporter down, stale, frozen, device gone: see
:mod:`agent.backends.dcgm_exporter.reader`), :meth:`sample` raises :class:`DeviceError` with that
reason and the collector marks the device down until the values are good again.

A GPU that appears only after start (an exporter restarted with more GPUs) is logged and listed
by ``doctor``; the collector's device set is fixed at start, so restart the agent to read it.

The node's side comes from the same host source as on the NVML backend (``host``: workload
reports, inference servers, the node's CPU and I/O pressure, its NICs, the kubelet): a sidecar beside
NVIDIA's exporter is a whole agent, not a counter relay. What it cannot have is a process list (no
driver access): which pod holds a GPU comes from the exposition's ``pod``/``namespace``/``container``
labels, or the kubelet; which server or job runs on a GPU from what names the GPU (an endpoint's
``gpus``, a report's ``gpu`` or visible devices), never from a PID.

An exposition may list any number of GPUs (a federating proxy, a misdirected URL, a hostile body),
and each device costs the agent memory, series and sampling work. So at most ``max_devices``
(the setting of that name, default :data:`MAX_DEVICES`) become devices: the first in index order.
The rest are refused with one warning at discovery and a ``doctor`` finding, not once per cycle.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping

from agent.backends.cumulative import CounterWindows, WindowState, prefer
from agent.backends.dcgm_exporter.exposition import GpuRecord
from agent.backends.dcgm_exporter.mapping import capabilities, counter_fields, sample_values, totals
from agent.backends.exporter_backend import MAX_DEVICES, ExporterBackend, joined
from agent.model import DeviceInfo, GpuSpec
from agent.model.specs.lookup import resolve_spec
from agent.model.specs.mig_identity import spec_from_mig_profiles
from agent.model.specs.slices import mig_name_spec

log = logging.getLogger("roofwatch.dcgm_exporter")

SOURCE = "dcgm-exporter"
TOTALS = "dcgm-exporter-totals"
"""The source of a field the exporter gave as cumulative counters over the window (agent.model.counter_source)."""
__all__ = ["MAX_DEVICES", "SOURCE", "TOTALS", "UNNAMED_MODEL", "DcgmExporterBackend", "device_info", "joined",
           "named_totals"]


def named_totals(sources: dict[str, str], window: WindowState | None) -> dict[str, str]:
    """``sources`` with each field the exporter's cumulative counters gave over the latest window named as such,
    so the verdict's ``basis_source`` and doctor say the activity is the counters', not DCGM's sampled ratio."""
    used = window.used if window is not None else ()
    return {f: TOTALS if f in used and source == SOURCE else source for f, source in sources.items()}


UNNAMED_MODEL = "NVIDIA GPU (model not exported)"
"""The model of a GPU the exposition names nowhere (dcgm-exporter 2.x prints no ``modelName``); also the
name a ``specs:`` entry for such GPUs is keyed by (docs/specs.md)."""


def device_model(record: GpuRecord) -> str:
    """The model as NVML would name the device: a MIG instance is ``<parent> MIG <profile>``.
    dcgm-exporter's ``--replace-blanks-in-model-name`` dashes are turned back into spaces when the
    name starts ``NVIDIA-``, so both spellings find the same catalogue entry."""
    model = record.model or UNNAMED_MODEL
    if model.startswith("NVIDIA-") and " " not in model:
        model = "NVIDIA " + model[len("NVIDIA-"):]
    return f"{model} MIG {record.profile}" if record.profile else model


def device_info(record: GpuRecord, siblings: Mapping[str, GpuRecord] | None = None) -> DeviceInfo:
    """Identity and peaks of one record. A MIG instance has no UUID of its own in the exposition,
    so it is named ``<GPU UUID>/<instance>``; its peaks are its profile's slice of the GPU's.

    ``siblings`` (the exposition's other records) matter only when no label names the model: then the
    MIG profiles of the GPU's instances may still identify it (:func:`unnamed_spec`); a ``specs:``
    entry for :data:`UNNAMED_MODEL` wins over that, as it wins over the catalogue."""
    values = sample_values(record)
    model = device_model(record)
    total = values.get("mem_total_bytes")
    parent_name = model.split(" MIG ")[0]
    spec = resolve_spec(vendor="nvidia", name=parent_name, memory_bytes=None if record.profile else total)
    if spec is None and record.model is None:
        spec = unnamed_spec(record, siblings or {})
    if spec is not None and record.profile:
        spec = mig_name_spec(spec, model)
    uuid = record.uuid or f"dcgm-exporter-gpu-{record.index}"
    return DeviceInfo(gpu=record.key, uuid=f"{uuid}/{record.instance}" if record.instance else uuid, vendor="nvidia",
                      model=model, memory_total_bytes=total, pci_bus_id=record.pci_bus_id,
                      sm_clock_max_mhz=values.get("sm_clock_max_mhz"), spec=spec,
                      capabilities=(SOURCE, *capabilities({**values, **dict.fromkeys(counter_fields(record), 0.0)})))


def unnamed_spec(record: GpuRecord, siblings: Mapping[str, GpuRecord]) -> GpuSpec | None:
    """The whole GPU's peaks for a record no label names, from the MIG profiles of every instance of the
    same GPU (a parent GPU's record carries none itself), checked against the GPU's own framebuffer
    where exported; None when they identify nothing (:mod:`agent.model.specs.mig_identity`)."""
    same_gpu = [r for r in siblings.values() if r.index == record.index and r.uuid == record.uuid] + [record]
    whole = next((r for r in same_gpu if r.instance is None), None)
    memory = sample_values(whole).get("mem_total_bytes") if whole is not None else None
    return spec_from_mig_profiles((r.profile for r in same_gpu if r.profile), memory)


class DcgmExporterBackend(ExporterBackend):
    """Samples every GPU a dcgm-exporter lists, from its latest exposition (:mod:`agent.backends.exporter_backend`)."""

    name = SOURCE
    vendor = "nvidia"
    devices_word = "GPUs and MIG instances"
    most_per_node = "a node has at most 16 GPUs x 7 MIG instances"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.windows = CounterWindows()
        """Each GPU's cumulative counters at the latest read (agent.backends.cumulative)."""

    def device(self, record: GpuRecord, records: Mapping[str, GpuRecord]) -> DeviceInfo:
        return device_info(record, records)

    def values(self, gpu: str, record: GpuRecord, now: float | None) -> dict[str, Any]:
        """The record's fields, the activity of its cumulative counters over the window since the previous read
        winning over the sampled ratios. Asked again for the same record (``counter_sources``), the window is
        the same: an unchanged reading gives the previous window's activity."""
        return prefer(sample_values(record), self.windows.activity(gpu, totals(record)))

    def counter_window(self, gpu: str) -> WindowState | None:
        """How GPU ``gpu``'s cumulative counters went at the latest read; None when it has none (doctor)."""
        return self.windows.state(gpu)

    def counter_sources(self, gpu: str) -> dict[str, str]:
        return named_totals(super().counter_sources(gpu), self.windows.state(gpu))
