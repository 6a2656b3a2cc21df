"""amdsmi plus the node's AMD Device Metrics Exporter (DME): the profiler counters amdsmi has not got.

amdsmi reads activity, UMC activity, power, clocks, memory and XGMI, but no tensor (MFMA), VALU or
HBM-byte counter; DME's profiler series (``gpu_prof_*``, docs/amd.md) have them. With the amdsmi
backend and ``amd_exporter_url`` set, :class:`AmdExporterJoin` wraps the amdsmi backend (the shared
join, :class:`agent.backends.exporter_join.ExporterJoin`): every sample is amdsmi's, read as always,
then DME's profiler reading for the same device fills what amdsmi left unknown:

* ``tensor_active`` (MFMA busy, or 16-bit ops over the window / the device's BF16 peak where MFMA
  utilisation is not exported: the counter FLOP/s stand-in), ``sm_active`` (VALU busy) and
  ``sm_occupancy``, each as a share of elapsed time (:func:`agent.backends.amd_exporter.mapping.profiler_values`);
* ``dram_active`` from the profiler's HBM bytes over the device's bandwidth, only where amdsmi read no
  UMC activity (a partition other than 0): amdsmi's own readings win wherever it has one.

* each process's ``compute_units`` from DME's ``gpu_process_cu_occupancy`` (1.5.0+) where amdsmi gives none
  (its wrapper has ``cu_occupancy`` from 6.4.2), matched by PID: amdsmi's list stays the list.

The device's peaks are amdsmi's (a partition's share), so DME's counts are divided by the same spec the
verdicts use. Nothing else DME exports is taken.

**Matching.** DME labels each GPU object with ``serial_number``, the board's product serial that amdsmi
gives as ``amdsmi_get_gpu_board_info()["product_serial"]``, and ``gpu_partition_id``; the amdsmi
backend names partitions ``"<gpu>/<partition id>"`` from KFD's partition id, the same number. So a
device matches the DME record with its board serial and, on a partitioned GPU, its partition id. Only
where serials are missing (amdsmi answers "N/A", or the exposition has no ``serial_number``) does the
match fall back: to the PCI address where DME's ``/gpumetrics`` (1.4.0+) gives each ``gpu_id``'s BDF
(:mod:`agent.backends.amd_exporter.gpumetrics`, read at set-up and in the background, never on a cycle),
matched to amdsmi's ``amdsmi_get_gpu_device_bdf`` (each partition has its own); else to ``gpu_id`` = the
device's position in amdsmi's processor list (gpuagent's index), right only while both enumerate alike.
``doctor`` says which rule matched, with every DME device that matched no amdsmi device.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

from agent.backends.amd_exporter.backend import SOURCE, profiler_advice
from agent.backends.amd_exporter.exposition import AmdRecord
from agent.backends.amd_exporter.gpumetrics import REFRESH_S, BdfWatch, normalise_bdf
from agent.backends.amd_exporter.mapping import DEFAULT_WINDOW_US, process_samples, profiled, profiler_values
from agent.backends.exporter_join import ExporterJoin
from agent.backends.exporter_reader import ExporterReader
from agent.model import DeviceInfo, GpuSample, ProcessSample

log = logging.getLogger("roofwatch.amd_exporter")

PROFILER_FIELDS = frozenset({"tensor_active", "sm_active", "sm_occupancy", "dram_active"})
"""The sample fields the join takes from DME: amdsmi has none of them but ``dram_active`` (UMC activity), which
the profiler's HBM bytes replace, so the compute and memory readings the roofline compares come from one
profiler sample, as NVML + dcgm-exporter take the profiling fields as one set."""
OWN_FIELDS = frozenset({*PROFILER_FIELDS, "gr_active", "power_w", "energy_j", "sm_clock_mhz", "mem_used_bytes",
                        "temperature_c", "link_rx_bytes_per_s", "link_tx_bytes_per_s"})
"""The fields whose source ``doctor`` names."""


@dataclass(frozen=True, slots=True)
class DmeKey:
    """What an amdsmi device is matched on: its board serial and partition, else its enumeration index."""

    serial: str | None
    partition: int | None
    """KFD partition id on a partitioned GPU; None for a whole GPU."""
    index: int | None
    """Position in ``amdsmi_get_processor_handles()`` (DME's ``gpu_id``), for the fallback."""
    bdf: str | None = None
    """amdsmi's PCI address of the device (a partition's own function), for the fallback through ``/gpumetrics``."""

    def __str__(self) -> str:
        part = f" partition {self.partition}" if self.partition is not None else ""
        if self.serial:
            return f"serial {self.serial}{part}"
        return f"gpu_id {self.index}" + (f" / bdf {self.bdf}" if self.bdf else "")


def _partition(record: AmdRecord) -> int | None:
    return record.partition if record.partitions > 1 else None


def by_serial(records: Mapping[str, AmdRecord]) -> bool:
    """Whether an exposition can be matched on serials (every record has one)."""
    return bool(records) and all(r.serial for r in records.values())


def fallback(key: DmeKey, bdfs: Mapping[str, str] | None) -> tuple[str | None, str]:
    """The ``gpu_id`` a device without a usable serial matches, and by which rule: ``bdf`` where ``/gpumetrics``
    gives the device's PCI address to one ``gpu_id``, else ``gpu_id`` = its enumeration index, unless
    ``/gpumetrics`` gives that ``gpu_id`` to another address (then none)."""
    if bdfs and key.bdf:
        owner = next((gpu_id for gpu_id, bdf in bdfs.items() if bdf == key.bdf), None)
        if owner is not None:
            return owner, "bdf"
    if key.index is None:
        return None, "gpu_id"
    gpu_id = str(key.index)
    if bdfs and key.bdf and bdfs.get(gpu_id, key.bdf) != key.bdf:
        return None, "gpu_id"
    return gpu_id, "gpu_id"


def select(records: Mapping[str, AmdRecord], key: DmeKey, bdfs: Mapping[str, str] | None = None) -> AmdRecord | None:
    """The DME record for ``key``: by serial and partition, or where serials are missing by PCI address (``bdfs``:
    ``gpu_id`` -> BDF from ``/gpumetrics``) else ``gpu_id`` (:func:`fallback`). Where one serial and partition name
    several records (an MI250X's two GCDs reading one board FRU, or a DME release that repeats a partition id:
    issue #495), ``gpu_id`` picks among them; none matches when it names none of them."""
    if key.serial and by_serial(records):
        same = [r for r in records.values() if r.serial == key.serial and _partition(r) == key.partition]
        if len(same) <= 1:
            return same[0] if same else None
        return next((r for r in same if key.index is not None and r.gpu_id == str(key.index)), None)
    gpu_id, _ = fallback(key, bdfs)
    if gpu_id is None:
        return None
    return next((r for r in records.values() if r.gpu_id == gpu_id), None)


def shared_serials(records: Mapping[str, AmdRecord]) -> list[str]:
    """Serials (with partition) that name more than one DME record, where the join falls back to ``gpu_id``."""
    seen: dict[tuple[str, int | None], int] = {}
    for r in records.values():
        if r.serial:
            seen[(r.serial, _partition(r))] = seen.get((r.serial, _partition(r)), 0) + 1
    return sorted(f"{serial}" + (f" partition {part}" if part is not None else "")
                  for (serial, part), n in seen.items() if n > 1)


def with_exporter_occupancy(processes: tuple[ProcessSample, ...] | None, record: Any
                            ) -> tuple[ProcessSample, ...] | None:
    """amdsmi's processes with DME's ``gpu_process_cu_occupancy`` where amdsmi has none (its wrapper before 6.4.2
    has no ``cu_occupancy``), matched by PID on the matched device; None when nothing changes. amdsmi's list stays
    the list: a PID only DME names is not added, and amdsmi's own occupancy wins."""
    theirs = {p.pid: p.compute_units for p in process_samples(record) or () if p.compute_units is not None}
    if not processes or not theirs or all(p.compute_units is not None for p in processes):
        return None
    filled = tuple(replace(p, compute_units=theirs[p.pid]) if p.compute_units is None and p.pid in theirs else p
                   for p in processes)
    return filled if filled != processes else None


def _handle_id(handle: Any) -> Any:
    return getattr(handle, "value", handle)


class AmdExporterJoin(ExporterJoin):
    """An amdsmi backend whose samples the node's Device Metrics Exporter completes with profiler counters."""

    own = "amdsmi"
    source = SOURCE
    fields = OWN_FIELDS
    no_key = "amdsmi gave neither a board serial nor an enumeration index to match"

    def __init__(self, inner: Any, reader: ExporterReader, *, window_us: float = DEFAULT_WINDOW_US,
                 bdf_refresh_s: float = REFRESH_S) -> None:
        super().__init__(inner, reader)
        self.window_us = window_us
        self.bdf = BdfWatch(reader, refresh_s=bdf_refresh_s)
        """``gpu_id`` -> PCI address from DME's ``/gpumetrics``, read only while some device falls back."""

    def limit_devices(self, max_devices: int) -> None:
        """The ``max_devices`` setting (before :meth:`discover`): it bounds the GPU objects read from ``/gpumetrics``
        too, and reaches the wrapped backend where that takes it."""
        self.bdf.max_entries = max_devices
        inner = getattr(self.inner, "limit_devices", None)
        if inner is not None:
            inner(max_devices)

    def discover(self) -> Sequence[DeviceInfo]:
        infos = super().discover()
        if self.needs_fallback():  # once at set-up, bounded by the reader's timeout; later reads on the watch's thread
            self.bdf.read_once()
        self.bdf.start(self.needs_fallback)
        return infos

    def needs_fallback(self) -> bool:
        """Whether some device is matched without a serial (amdsmi gave none, or the exposition has none)."""
        keys = [k for k in self.join_keys().values() if k is not None]
        return any(not k.serial for k in keys) or not by_serial(self.reader.records())

    def match_keys(self, infos: Sequence[DeviceInfo]) -> dict[str, DmeKey | None]:
        amdsmi = self.inner.amdsmi
        try:
            order = [_handle_id(h) for h in amdsmi.amdsmi_get_processor_handles()]
        except Exception as exc:  # noqa: BLE001 - only the gpu_id fallback needs it
            log.warning("amdsmi processor list for the Device Metrics Exporter join: %s", exc)
            order = []
        keys: dict[str, DmeKey | None] = {}
        devices = self.inner.devices
        for info in infos:
            device = devices.get(info.gpu)
            if device is None:
                keys[info.gpu] = None
                continue
            handle = _handle_id(device.handle)
            keys[info.gpu] = DmeKey(serial=self._serial(device), index=order.index(handle) if handle in order else None,
                                    partition=device.partition if device.partitions > 1 else None,
                                    bdf=normalise_bdf(device.info.pci_bus_id))
        missing = [gpu for gpu, key in keys.items() if key is not None and key.serial is None]
        if missing:
            log.warning("amdsmi gives no board serial for GPU(s) %s: matched to the Device Metrics Exporter by PCI "
                        "address where its /gpumetrics gives one, else by gpu_id (amdsmi's enumeration order)",
                        ", ".join(missing))
        return keys

    def _serial(self, device: Any) -> str | None:
        """The board's product serial (what DME prints as ``serial_number``), or None."""
        try:
            board = self.inner.amdsmi.amdsmi_get_gpu_board_info(device.handle)
        except Exception as exc:  # noqa: BLE001 - absent from the wrapper, or the FRU unreadable
            log.info("GPU %s: no board serial from amdsmi (%s)", device.info.gpu, exc)
            return None
        serial = board.get("product_serial") if isinstance(board, dict) else None
        return serial.strip() if isinstance(serial, str) and serial.strip() not in ("", "N/A") else None

    def lookup(self, key: Any, now: float) -> tuple[Any | None, str | None]:
        bdfs = self.bdf.bdfs()
        return self.reader.find(lambda records: select(records, key, bdfs), str(key), now)

    def updates(self, gpu: str, sample: GpuSample, record: Any, now: float) -> dict[str, Any]:
        """DME's profiler fields, over amdsmi's own spec for the device: those amdsmi left unknown, and the HBM
        bytes in place of UMC activity; and DME's CU occupancy for amdsmi's processes that have none."""
        out: dict[str, Any] = {}
        processes = with_exporter_occupancy(sample.processes, record)
        if processes is not None:
            out["processes"] = processes
        reading = profiled(record.values, self.window_us)
        if reading is None:
            return out
        device = self.inner.devices.get(gpu)
        spec = device.info.spec if device is not None else None
        theirs = profiler_values(reading, spec)
        out.update({name: value for name, value in theirs.items()
                    if name in PROFILER_FIELDS and (getattr(sample, name) is None or name == "dram_active")})
        return out

    def fallback_rules(self) -> dict[str, str]:
        """GPU -> ``bdf`` or ``gpu_id``: the rule each device matched without a serial takes now (doctor)."""
        records, bdfs = self.reader.records(), self.bdf.bdfs()
        serials = by_serial(records)
        return {gpu: fallback(key, bdfs)[1] for gpu, key in self.join_keys().items()
                if key is not None and not (key.serial and serials)}

    def matched_by(self) -> str:
        """How the latest exposition is matched (doctor): ``serial``, ``serial+gpu_id`` (serials shared by several
        records, told apart by ``gpu_id``); where serials are missing ``bdf`` (every such device by its PCI address,
        through ``/gpumetrics``), ``bdf+gpu_id`` (some by address, the rest by enumeration) or ``gpu_id``."""
        keys = [k for k in self.join_keys().values() if k is not None]
        records = self.reader.records()
        if not (keys and all(k.serial for k in keys) and by_serial(records)):
            rules = set(self.fallback_rules().values())
            return "bdf" if rules == {"bdf"} else "bdf+gpu_id" if "bdf" in rules else "gpu_id"
        return "serial+gpu_id" if shared_serials(records) else "serial"

    def unmatched(self) -> list[str]:
        """DME devices that no amdsmi device matches (``gpu_id`` and serial): a join warning in doctor."""
        records, bdfs = self.reader.records(), self.bdf.bdfs()
        matched = {id(r) for k in self.join_keys().values()
                   if k is not None and (r := select(records, k, bdfs)) is not None}
        return [f"gpu_id {r.gpu_id}" + (f" (serial {r.serial})" if r.serial else "")
                for r in records.values() if id(r) not in matched]

    def profiler_state(self) -> str:
        """One line for doctor: whether DME's exposition has the profiler series the join uses."""
        return profiler_advice(self.reader.records(), self.window_us)

    def close(self) -> None:
        self.bdf.close()
        super().close()
