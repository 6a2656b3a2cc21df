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
from typing import Mapping, Sequence

from dataclasses import replace

from agent.backends.base import BackendUnavailable, DeviceError
from agent.backends.dcgm_exporter.exposition import GpuRecord
from agent.backends.dcgm_exporter.mapping import capabilities, sample_values
from agent.backends.dcgm_exporter.reader import ExporterReader, listed
from agent.context.sources import HostFacts, HostSource
from agent.model import Attribution, DeviceInfo, GpuSample, GpuSpec, NicPort, SourceState, XidCount
from agent.model.specs.lookup import resolve_spec
from agent.model.specs.mig_identity import spec_from_mig_profiles
from agent.model.specs.slices import mig_name_spec

log = logging.getLogger("roofwatch.dcgm_exporter")

SOURCE = "dcgm-exporter"
MAX_DEVICES = 128
"""Default bound on devices (``max_devices``): a node has at most 16 GPUs x 7 MIG instances (112)."""


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
                      capabilities=(SOURCE, *capabilities(values)))


def unnamed_spec(record: GpuRecord, siblings: Mapping[str, GpuRecord]) -> GpuSpec | None:
    """The whole GPU's peaks for a record no label names, from the MIG profiles of every instance of the
    same GPU (a parent GPU's record carries none itself), checked against the GPU's own framebuffer
    where exported; None when they identify nothing (:mod:`agent.model.specs.mig_identity`)."""
    same_gpu = [r for r in siblings.values() if r.index == record.index and r.uuid == record.uuid] + [record]
    whole = next((r for r in same_gpu if r.instance is None), None)
    memory = sample_values(whole).get("mem_total_bytes") if whole is not None else None
    return spec_from_mig_profiles((r.profile for r in same_gpu if r.profile), memory)


class DcgmExporterBackend:
    """Samples every GPU a dcgm-exporter lists, from its latest exposition."""

    name = SOURCE

    def __init__(self, reader: ExporterReader, *, node: str | None = None, max_devices: int = MAX_DEVICES,
                 host: HostSource | None = None) -> None:
        """``node``: the node label; None takes the exposition's ``Hostname`` label. ``max_devices``:
        GPUs and MIG instances read at most; the exporter's others are refused (:attr:`refused`).
        ``host``: the node's side (reports, inference servers, pressure, NICs); None reads none."""
        self.reader = reader
        self.host = host
        self.node = node
        self.max_devices = max_devices
        self.refused: tuple[str, ...] = ()
        """Keys the exporter listed at discovery past ``max_devices`` (and past the reader's own bound)."""
        self._infos: dict[str, DeviceInfo] = {}
        self._last_now: dict[str, float] = {}
        self._closed = False

    def first_read(self) -> None:
        """Read the exporter now; BackendUnavailable naming the cause when it does not answer. Also
        names the node after the exposition's ``Hostname`` label unless a node was given."""
        error = self.reader.read_once()
        if error is not None:
            raise BackendUnavailable(f"dcgm-exporter at {self.reader.url}: {error}")
        if self.node is None:
            self.node = next((r.hostname for r in self.reader.records().values() if r.hostname), None)

    def limit_devices(self, max_devices: int) -> None:
        """Apply the ``max_devices`` setting (before :meth:`discover`)."""
        self.max_devices = max_devices

    def discover(self) -> Sequence[DeviceInfo]:
        if not self.reader.status().up:
            self.first_read()
        keys = list(self.reader.records())
        kept = keys[:self.max_devices]
        self.refused = tuple(keys[self.max_devices:]) + self.reader.status().refused
        if self.refused:
            log.warning("dcgm-exporter %s lists %d GPUs and MIG instances, more than max_devices (%d): reading %s, "
                        "refusing %d (%s); a node has at most 16 GPUs x 7 MIG instances: is the URL this node's "
                        "exporter? (raise max_devices if the node has more)", self.reader.url,
                        len(keys) + len(self.reader.status().refused), self.max_devices, listed(kept, 4),
                        len(self.refused), listed(self.refused, 4))
        records = self.reader.records()
        self._infos = {key: device_info(records[key], records) for key in kept}
        self.reader.start()
        return list(self._infos.values())

    def unknown_gpus(self) -> tuple[str, ...]:
        """GPUs the exporter lists now that were not there at start (read after a restart of the agent);
        those refused at discovery are :attr:`refused`, not unknown."""
        refused = set(self.refused)
        return tuple(k for k in self.reader.records() if k not in self._infos and k not in refused)

    def sample(self, gpu: str, now: float) -> GpuSample:
        info = self._infos.get(gpu)
        if info is None:
            raise DeviceError(f"dcgm-exporter: no GPU {gpu!r}")
        if self._closed:
            raise DeviceError("dcgm-exporter backend is closed")
        record, problem = self.reader.lookup(gpu, now)
        if record is None:
            raise DeviceError(problem or f"dcgm-exporter: GPU {gpu} unavailable")
        last = self._last_now.get(gpu)
        self._last_now[gpu] = now
        interval = now - last if last is not None and now > last else None
        host = self._host_facts(info, now)
        return GpuSample(ts=now, gpu=gpu, node=self.node or "local", uuid=info.uuid, vendor="nvidia",
                         model=info.model, interval_s=interval, attribution=joined(record.attribution, host.attribution),
                         host=host.host, net_tx_bytes_per_s=host.net_tx_bytes_per_s,
                         net_rx_bytes_per_s=host.net_rx_bytes_per_s, net_congestion_per_s=host.net_congestion_per_s,
                         net_retransmits_per_s=host.net_retransmits_per_s, net_link_downs=host.net_link_downs,
                         workload=host.workload, dtype=host.dtype, **sample_values(record))

    def _host_facts(self, info: DeviceInfo, now: float) -> HostFacts:
        """The node's facts for this GPU, with no PIDs (the exporter lists none); nothing on failure."""
        if self.host is None:
            return HostFacts(processes={})
        try:
            return self.host.facts(info.gpu, [], now, bus_id=info.pci_bus_id, uuid=info.uuid)
        except Exception as exc:  # noqa: BLE001 - host facts are extras; never fail a GPU over them
            log.debug("host facts for GPU %s failed: %s", info.gpu, exc)
            return HostFacts(processes={})

    def source_states(self, now: float) -> tuple[SourceState, ...]:
        """The exporter's state, then those of the node's side (inference servers)."""
        host_states = getattr(self.host, "source_states", None)
        return (self.reader.source_state(now), *(host_states(now) if host_states is not None else ()))

    def nic_ports(self) -> tuple[NicPort, ...]:
        """The node's InfiniBand/RoCE ports as the host side last read them (none without such a host)."""
        ports = getattr(self.host, "nic_ports", None)
        return ports() if ports is not None else ()

    def device_events(self, gpu: str) -> tuple[XidCount, ...]:
        return self.reader.xids(gpu)

    def counter_sources(self, gpu: str) -> dict[str, str]:
        """Every field of this backend's samples comes from the exporter."""
        record = self.reader.records().get(gpu)
        return {f: SOURCE for f in sample_values(record)} if record is not None else {}

    def device_info(self, gpu: str) -> DeviceInfo:
        return self._infos[gpu]

    @property
    def devices(self) -> dict[str, DeviceInfo]:
        return dict(self._infos)

    def close(self) -> None:
        self._closed = True
        self.reader.close()
        close_host = getattr(self.host, "close", None)
        if close_host is not None:
            close_host()


def joined(exported: Attribution | None, host: Attribution | None) -> Attribution | None:
    """Who holds the GPU: the exposition's pod labels (dcgm-exporter asked the kubelet), completed by
    what the node side knows (the kubelet again, a job from a report or Slurm)."""
    if exported is None or host is None:
        return exported or host
    return replace(host, **{f: getattr(exported, f) for f in ("namespace", "pod", "container")
                            if getattr(exported, f) is not None})

