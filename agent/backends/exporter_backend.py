"""A backend made of one exporter's ``/metrics`` alone, with no driver access: what the dcgm-exporter
backend (``--backend dcgm-exporter``) and the AMD Device Metrics Exporter backend
(``--backend amd-exporter``) share.

Discovery is the first read: every device in the exposition becomes a device named as the trace
format names it. Each sample is the latest exposition's values for that device, mapped by the
vendor's subclass (:meth:`ExporterBackend.device` and :meth:`ExporterBackend.values`), answered from
the reader's memory (:mod:`agent.backends.exporter_reader`). When the reader refuses a device's
values (exporter down, stale, frozen, device gone), :meth:`sample` raises :class:`DeviceError` with
that reason and the collector marks the device down until the values are good again.

A device that appears only after start (an exporter restarted with more GPUs) is logged and listed
by ``doctor``; the collector's device set is fixed at start, so restart the agent to read it.

The node's side comes from the same host source as on the driver backends (``host``: workload
reports, inference servers, the node's CPU and I/O pressure, its NICs, the kubelet). What such a
backend cannot have is a process list (no driver access): which pod holds a GPU comes from the
exposition's ``pod``/``namespace``/``container`` labels, or the kubelet; which server or job runs
on a GPU from what names the GPU (an endpoint's ``gpus``, a report's ``gpu``), never from a PID.

An exposition may list any number of devices (a federating proxy, a misdirected URL, a hostile
body), and each costs the agent memory, series and sampling work. So at most ``max_devices`` (the
setting of that name) become devices: the first in index order. The rest are refused with one
warning at discovery and a ``doctor`` finding, not once per cycle.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any, Mapping, Sequence

from agent.backends.base import BackendUnavailable, DeviceError
from agent.backends.exporter_reader import ExporterReader, listed
from agent.context.sources import HostFacts, HostSource
from agent.model import Attribution, DeviceInfo, GpuSample, NicPort, SourceState, XidCount
from agent.model.redact import hide, safe_url
from agent.model.terms import Vendor

log = logging.getLogger("roofwatch.exporter")

MAX_DEVICES = 128
"""Default bound on devices (``max_devices``): a node has at most 16 GPUs x 7 MIG instances (112)."""


class ExporterNotAnswering(BackendUnavailable):
    """The exporter did not give a usable exposition (refused, timed out, an HTTP error, not its format yet):
    a neighbour that may only be late, which ``run`` waits for (agent.app.source_wait) instead of exiting."""

    def __init__(self, source: str, url: str, why: str) -> None:
        self.source, self.url, self.why = source, safe_url(url), hide(why)
        super().__init__(hide(f"{source} at {url}: {why}"))

    @property
    def what(self) -> str:
        """The neighbour as ``/healthz`` shows it: its name and URL, without credentials."""
        return f"{self.source} at {self.url}"


class ExporterBackend:
    """Samples every device an exporter lists, from its latest exposition. Subclasses say how a record
    becomes a device (:meth:`device`) and a sample's fields (:meth:`values`)."""

    name = "exporter"
    vendor: Vendor = "nvidia"
    devices_word = "GPUs"
    most_per_node = "a node has at most 16 GPUs"
    reads_from_memory = True
    """A sample is a lookup in the reader's memory, never a call that can hang or cost: the collector retries a
    device that is down at every interval (agent.app.assemble), so a GPU is back one interval after its
    exporter is, not after a back-off grown while the exporter restarted."""

    def __init__(self, reader: ExporterReader, *, node: str | None = None, max_devices: int = MAX_DEVICES,
                 host: HostSource | None = None) -> None:
        """``node``: the node label; None takes the exposition's host name label. ``max_devices``:
        devices read at most; the exporter's others are refused (:attr:`refused`). ``host``: the
        node's side (reports, inference servers, pressure, NICs); None reads none."""
        self.reader = reader
        self.host = host
        self.node = node
        self.max_devices = max_devices
        self.refused: tuple[str, ...] = ()
        """Keys the exporter listed at discovery past ``max_devices`` (and past the reader's own bound)."""
        self._infos: dict[str, DeviceInfo] = {}
        self._last_now: dict[str, float] = {}
        self._closed = False

    # ------------------------------------------------------------------ what a vendor says

    def device(self, record: Any, records: Mapping[str, Any]) -> DeviceInfo:
        raise NotImplementedError

    def values(self, gpu: str, record: Any, now: float) -> dict[str, Any]:
        raise NotImplementedError

    # ------------------------------------------------------------------ the Backend protocol

    def first_read(self) -> None:
        """Read the exporter now; ExporterNotAnswering naming the cause when it does not answer (a late exporter,
        waited for), BackendUnavailable when it refuses the agent's credentials (401, 403: waiting cures
        nothing). Also names the node after the exposition's host name label unless a node was given."""
        error = self.reader.read_once()
        if error is not None and self.reader.refused_status is not None:  # it answered: our credentials are wrong
            raise BackendUnavailable(hide(f"{self.reader.source} at {self.reader.url}: {error}: the exporter refuses "
                                          "the agent's credentials (the URL's token, or its web config)"))
        if error is not None:
            raise ExporterNotAnswering(self.reader.source, self.reader.url, error)
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
            log.warning("%s %s lists %d %s, more than max_devices (%d): reading %s, refusing %d (%s); %s: is "
                        "the URL this node's exporter? (raise max_devices if the node has more)", self.reader.source,
                        self.reader.url, len(keys) + len(self.reader.status().refused), self.devices_word,
                        self.max_devices, listed(kept, 4), len(self.refused), listed(self.refused, 4),
                        self.most_per_node)
        records = self.reader.records()
        self._infos = {key: self.device(records[key], records) for key in kept}
        self.reader.start()
        return list(self._infos.values())

    def unknown_gpus(self) -> tuple[str, ...]:
        """Devices the exporter lists now that were not there at start (read after a restart of the
        agent); those refused at discovery are :attr:`refused`, not unknown."""
        refused = set(self.refused)
        return tuple(k for k in self.reader.records() if k not in self._infos and k not in refused)

    def sample(self, gpu: str, now: float) -> GpuSample:
        info = self._infos.get(gpu)
        source = self.reader.source
        if info is None:
            raise DeviceError(f"{source}: no GPU {gpu!r}")
        if self._closed:
            raise DeviceError(f"{source} backend is closed")
        record, problem = self.reader.lookup(gpu, now)
        if record is None:
            raise DeviceError(problem or f"{source}: GPU {gpu} unavailable")
        last = self._last_now.get(gpu)
        self._last_now[gpu] = now
        interval = now - last if last is not None and now > last else None
        host = self._host_facts(info, now, sorted(getattr(record, "processes", None) or ()))
        return GpuSample(ts=now, gpu=gpu, node=self.node or "local", uuid=info.uuid, vendor=self.vendor,
                         model=info.model, interval_s=interval, attribution=joined(record.attribution, host.attribution),
                         host=host.host, net_tx_bytes_per_s=host.net_tx_bytes_per_s,
                         net_rx_bytes_per_s=host.net_rx_bytes_per_s, net_congestion_per_s=host.net_congestion_per_s,
                         net_retransmits_per_s=host.net_retransmits_per_s, net_link_downs=host.net_link_downs,
                         workload=host.workload, dtype=host.dtype, **self.values(gpu, record, now))

    def _host_facts(self, info: DeviceInfo, now: float, pids: list[int]) -> HostFacts:
        """The node's facts for this GPU and the PIDs the exporter lists on it (AMD's Device Metrics Exporter's
        ``gpu_process_cu_occupancy``, at most its per-GPU bound; dcgm-exporter lists none), so each process joins
        its pod or Slurm job as on the vendor-library backends; nothing on failure."""
        if self.host is None:
            return HostFacts(processes={})
        try:
            return self.host.facts(info.gpu, pids, now, bus_id=info.pci_bus_id, uuid=info.uuid)
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
        return {f: self.reader.source for f in self.values(gpu, record, None)} if record is not None else {}

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
    """Who holds the GPU: the exposition's pod labels (the exporter asked the kubelet), completed by
    what the node side knows (the kubelet again, a job from a report or Slurm)."""
    if exported is None or host is None:
        return exported or host
    return replace(host, **{f: getattr(exported, f) for f in ("namespace", "pod", "container")
                            if getattr(exported, f) is not None})
