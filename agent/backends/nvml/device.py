"""Reading one NVIDIA device (a whole GPU or one MIG instance) per interval, cheaply and safely.

Every optional reading goes through :meth:`NvmlDevice._opt`, which turns NVML's error codes
into the agent's policy (:mod:`agent.backends.nvml.errors`):

* unsupported / missing function / no permission: the capability is switched off for good and
  remembered with its reason (``doctor`` and ``DeviceInfo.capabilities`` show it); it is never
  asked for again, so an old driver costs nothing per interval;
* no new data: the value is unknown this interval;
* GPU lost / reset required: :class:`DeviceLostError`, the collector marks the device down and
  the backend re-acquires the handle on a back-off;
* anything else: unknown this interval, unless the reading is the device's core signal (its
  utilisation or memory), in which case the whole sample fails with :class:`DeviceError`.

The first two reads at start are the probe: they run exactly this code, so what is probed is
what runs. Fallbacks are ordered best first (GPM before utilization rates, instant power before
the 1 s average, GPM's PCIe rate before the wrapping byte counters, clocks-event reasons before
throttle reasons). Optional pynvml names are looked up by name (:meth:`NvmlDevice._opt`), so a
release that lacks one loses that reading, never the device (agent.backends.nvml.bindings).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from agent.backends.nvml import gpm
from agent.backends.nvml.bindings import Bindings
from agent.backends.nvml.counters import WrappingRate
from agent.backends.nvml.gpm_totals import totals_for
from agent.backends.nvml.errors import INVALID_ARGUMENT, Meaning, describe, describe_code, meaning, meaning_of_code
from agent.backends.nvml.fields import CLOCK_EVENT_FIELDS, FIELDS, Field, FieldBatch
from agent.backends.nvml.parent_energy import ParentEnergy
from agent.backends.nvml.process_reads import ComputeProcesses, ProcessUtilization
from agent.backends.readings import CounterRate, ReadingPolicy
from agent.context.attribution.holders import with_mps_clients
from agent.context.sources import HostFacts, HostSource
from agent.model import DeviceInfo, GpuSample, ProcessSample, RemappedRows, XidCount

log = logging.getLogger("roofwatch.nvml")

POWER_LIMIT_REFRESH_S = 60.0
"""The enforced power limit changes only when an operator changes it; re-read it this often."""


@dataclass(slots=True)
class Handles:
    handle: Any
    """The device's own handle (a MIG device handle for an instance)."""
    parent: Any | None = None
    """The parent GPU's handle, for a MIG instance: GPM reads go through it."""
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    """The compute instance a MIG device handle stands for (several may share a GPU instance)."""


@dataclass(slots=True)
class _State:
    """What survives between intervals; reset when the handle is re-acquired."""

    last_now: float | None = None
    pcie_tx: WrappingRate = field(default_factory=WrappingRate)
    pcie_rx: WrappingRate = field(default_factory=WrappingRate)
    link_tx: CounterRate = field(default_factory=CounterRate)
    link_rx: CounterRate = field(default_factory=CounterRate)
    process_util_ts: int = 0
    power_limit_w: float | None = None
    power_limit_t: float = -1e18


class NvmlDevice:
    """One device's handles, capabilities and reading state."""

    def __init__(self, nvml: Any, info: DeviceInfo, handles: Handles, host: HostSource,
                 xids: Callable[[str], tuple[XidCount, ...]] | None = None,
                 clock: Callable[[], float] = time.monotonic, node: str = "local", *,
                 bindings: Bindings | None = None, fields: tuple[Field, ...] = FIELDS,
                 skipped_fields: dict[str, str] | None = None, parent_energy: ParentEnergy | None = None) -> None:
        """``bindings``: what this pynvml has (detected once per backend); ``fields``/``skipped_fields``:
        the field batch for this driver and the fields left out with why (agent.backends.nvml.fields);
        ``parent_energy``: a MIG instance's parent board counter, shared with its siblings."""
        self.nvml = nvml
        self.node = node
        self.info = info
        self.handles = handles
        self._host = host
        self._xids = xids
        self._clock = clock
        self.bindings = bindings if bindings is not None else Bindings.detect(getattr(nvml, "module", nvml))
        self._policy = ReadingPolicy("NVML", lambda: self.info.gpu, lambda: self.info.uuid, meaning, describe)
        self._fields = FieldBatch(nvml, fields)
        self.absent.update({f"field:{key}": why for key, why in (skipped_fields or {}).items()})
        count = getattr(nvml, "wrap", lambda fn: fn)  # CountingNvml counts the raw driver calls too
        struct = self.bindings.process_struct
        self._compute_processes = ComputeProcesses(nvml, count, struct=struct)
        self._compute_processes_v2 = ComputeProcesses(nvml, count, version=2, struct=struct)
        self._mps_processes = ComputeProcesses(nvml, count, struct=struct, mps=True)
        self._mps_processes_v2 = ComputeProcesses(nvml, count, version=2, struct=struct, mps=True)
        self._process_utilization = ProcessUtilization(nvml, count)
        self._gpm: gpm.GpmReader | None = None
        self._gpm_checked = False
        self.gpm_totals = totals_for(nvml, lambda: self.info.gpu)
        """GPM's cumulative metrics (ids 248-260) where this pynvml defines them (agent.backends.nvml.gpm_totals)."""
        self._parent_energy = parent_energy
        self._state = _State()
        self._ever_read = False

    # ------------------------------------------------------------------ policy

    @property
    def gpu(self) -> str:
        return self.info.gpu

    @property
    def is_mig(self) -> bool:
        return self.handles.gpu_instance_id is not None

    def _error(self, what: str, exc: BaseException, *, core: bool = False) -> None:
        self._policy.error(what, exc, core=core)

    def _opt(self, what: str, fn: Callable[..., Any] | str, *args: Any, core: bool = False) -> Any:
        """``fn``: a callable, or the name of a pynvml function, looked up only while ``what`` is
        not absent (a name this nvidia-ml-py lacks makes ``what`` absent, never an exception)."""
        if what in self.absent:
            return None
        if isinstance(fn, str):
            found = getattr(self.nvml, fn, None)
            if found is None:
                self.absent[what] = f"{fn} is not in nvidia-ml-py {self.bindings.version or '(this copy)'}"
                return None
            fn = found
        try:
            return fn(*args)
        except self.nvml.NVMLError as exc:
            self._error(what, exc, core=core)
            return None
        except self.bindings.mismatch_error:
            # pynvml's unversioned wrappers turn a missing symbol into this (not an NVMLError):
            # the driver predates the version pynvml calls; the caller may try an older one.
            self.absent[what] = "function not found in this driver"
            return None

    def has(self, what: str) -> bool:
        return self._policy.has(what)

    @property
    def absent(self) -> dict[str, str]:
        """Capability -> why it is unavailable ("not supported", "no permission", ...)."""
        return self._policy.absent

    @property
    def failed(self) -> dict[str, str]:
        """Readings that failed transiently in the last interval (for logs and doctor)."""
        return self._policy.failed

    # ------------------------------------------------------------------ GPM

    def _gpm_reader(self) -> gpm.GpmReader | None:
        if self._gpm is not None or "gpm" in self.absent:
            return self._gpm
        if not self._gpm_checked:
            self._gpm_checked = True
            probe = self.handles.parent if self.is_mig else self.handles.handle
            support = self._opt("gpm", "nvmlGpmQueryDeviceSupport", probe)
            if support is None:
                self.absent.setdefault("gpm", "support query failed")
                return None
            if not support.isSupportedDevice:
                self.absent["gpm"] = "device not supported (GPM needs Hopper or newer)"
                return None
        try:
            self._gpm = gpm.GpmReader(self.nvml, self.handles.parent if self.is_mig else self.handles.handle,
                                      self.handles.gpu_instance_id, clock=self._clock)
        except self.nvml.NVMLError as exc:
            self._error("gpm", exc)
        return self._gpm

    def _read_gpm(self) -> dict[str, float]:
        reader = self._gpm_reader()
        if reader is None:
            return {}
        try:
            result = reader.read()
        except self.nvml.NVMLError as exc:
            reader.restart()
            self._error("gpm", exc)
            if "gpm" in self.absent:
                self._drop_gpm()
            return {}
        if result is None:
            return {}
        values, failed = result
        gone = tuple(m for m, code in failed.items() if meaning_of_code(code) is Meaning.ABSENT)
        if gone:
            reader.keep_only(tuple(m for m in reader.metric_ids if m not in gone))
            for m in gone:
                self.absent[f"gpm:{gpm.WANTED[m]}"] = describe_code(failed[m])
        ratios = {gpm.WANTED[m]: gpm.to_sample_value(m, v) for m, v in values.items() if m in gpm.WANTED}
        if self.gpm_totals is not None:
            ratios = self.gpm_totals.apply(reader.last_pair, ratios, self._error)
        return ratios

    def _drop_gpm(self) -> None:
        if self._gpm is not None:
            self._gpm.close()
            self._gpm = None

    # ------------------------------------------------------------------ one interval

    def read(self, now: float) -> GpuSample:
        """One sample over the span since the previous read. Raises DeviceError / DeviceLostError."""
        nvml, h = self.nvml, self.handles.handle
        self._policy.failed.clear()
        values: dict[str, Any] = self._read_gpm()
        if "gr_active" not in values or "dram_active" not in values:
            util = self._opt("utilization", "nvmlDeviceGetUtilizationRates", h, core=not values)
            if util is not None:
                values.setdefault("gr_active", min(1.0, util.gpu / 100.0))
                # utilization.memory is the share of time memory was read or written, not of
                # peak bandwidth: its own field, never dram_active (trace format, mem_busy).
                values["mem_busy"] = min(1.0, util.memory / 100.0)
        fields, _ = self._read_fields(h)
        self._apply_fields(values, fields, now)
        self._apply_power(values, fields)
        if self._parent_energy is not None:  # NVML has no energy per MIG instance: the board's, split by the collector
            values["parent_energy_j"] = self._parent_energy.joules(self._opt("parent_energy", self._parent_energy.read, now))
        self._apply_memory(values)
        temp = None
        if self.bindings.temperature_v:  # nvidia-ml-py 12.570+; the driver needs R565+
            temp = self._opt("temperature", "nvmlDeviceGetTemperatureV", h, nvml.NVML_TEMPERATURE_GPU)
        if temp is None and ("temperature" in self.absent or not self.bindings.temperature_v):
            temp = self._opt("temperature_legacy", "nvmlDeviceGetTemperature", h, nvml.NVML_TEMPERATURE_GPU)
        clock = self._opt("sm_clock", "nvmlDeviceGetClockInfo", h, nvml.NVML_CLOCK_SM)
        reasons = self._clock_reasons(h)
        pids_memory, sm_utils, mps = self._processes(h)
        host = self._host_facts(pids_memory, now)
        attribution = with_mps_clients(host.attribution, pids_memory or {}, mps) if mps else host.attribution
        interval = now - self._state.last_now if self._state.last_now is not None and now > self._state.last_now else None
        self._state.last_now = now
        self._ever_read = True
        return GpuSample(
            ts=now, gpu=self.gpu, node=self.node, uuid=self.info.uuid, vendor="nvidia", model=self.info.model, interval_s=interval,
            temperature_c=float(temp) if temp is not None else None,
            sm_clock_mhz=float(clock) if clock is not None else None,
            sm_clock_max_mhz=self.info.sm_clock_max_mhz,
            clock_event_reasons=reasons,
            processes=_processes(pids_memory, sm_utils, host),
            host=host.host, net_tx_bytes_per_s=host.net_tx_bytes_per_s, net_rx_bytes_per_s=host.net_rx_bytes_per_s,
            net_congestion_per_s=host.net_congestion_per_s, net_retransmits_per_s=host.net_retransmits_per_s,
            net_link_downs=host.net_link_downs, workload=host.workload, dtype=host.dtype, attribution=attribution,
            xid_errors=(self._xids(self.gpu) or None) if self._xids else None,
            **values,
        )

    def _read_fields(self, h: Any) -> tuple[dict[str, float | int], dict[str, int]]:
        if "fields" in self.absent or not self._fields.fields:
            return {}, {}
        try:
            values, failed = self._fields.read(h)
        except self.nvml.NVMLError as exc:
            self._error("fields", exc)
            return {}, {}
        ids = {f.key: f.field_id for f in self._fields.fields}
        for key in self._fields.drop_absent(failed):
            self.absent[f"field:{key}"] = _field_reason(ids[key], failed[key])
        for key, code in failed.items():
            if f"field:{key}" not in self.absent:
                self.failed[f"field:{key}"] = describe_code(code)
        return values, failed

    def _apply_fields(self, values: dict[str, Any], f: dict[str, float | int], now: float) -> None:
        s = self._state
        if self._fields.has("pcie_tx_bytes") or self._fields.has("pcie_rx_bytes"):
            # GPM's rate wins: these 32-bit counters cannot show two wraps between reads. They are
            # still read every interval, so their rate is ready when GPM has none.
            for key, counter, field_name in (("pcie_tx_bytes", s.pcie_tx, "pcie_tx_bytes_per_s"),
                                             ("pcie_rx_bytes", s.pcie_rx, "pcie_rx_bytes_per_s")):
                if key in f:
                    rate = counter.rate(int(f[key]), now)
                    if values.get(field_name) is None:
                        values[field_name] = rate
        if self._fields.has("nvlink_tx_kib") or self._fields.has("nvlink_rx_kib"):
            for key, counter, field_name in (("nvlink_tx_kib", s.link_tx, "link_tx_bytes_per_s"),
                                             ("nvlink_rx_kib", s.link_rx, "link_rx_bytes_per_s")):
                if key in f:
                    rate = counter.rate(float(f[key]), now, 1024.0)
                    if rate is not None or field_name not in values:
                        values[field_name] = rate
        if "memory_temp_c" in f:
            values["memory_temperature_c"] = float(f["memory_temp_c"])
        if "ecc_sbe_volatile" in f:
            values["ecc_corrected_errors"] = int(f["ecc_sbe_volatile"])
        if "ecc_dbe_volatile" in f:
            values["ecc_uncorrected_errors"] = int(f["ecc_dbe_volatile"])
        if all(k in f for k in ("remapped_cor", "remapped_unc", "remapped_pending", "remapped_failure")):
            values["remapped_rows"] = RemappedRows(
                correctable=int(f["remapped_cor"]), uncorrectable=int(f["remapped_unc"]),
                pending=bool(f["remapped_pending"]), failure=bool(f["remapped_failure"]))
        times = {reason: float(f[key]) / 1e9 for key, reason in CLOCK_EVENT_FIELDS.items() if key in f}
        if times:
            values["clock_event_time_s"] = times

    def _apply_power(self, values: dict[str, Any], f: dict[str, float | int]) -> None:
        h = self.handles.handle
        if "power_instant_mw" in f:
            values["power_w"] = f["power_instant_mw"] / 1000.0
        elif not self._fields.has("power_instant_mw") and not self.is_mig:
            mw = self._opt("power_usage", "nvmlDeviceGetPowerUsage", h)  # 1 s average on Ampere+
            values["power_w"] = mw / 1000.0 if mw is not None else None
        if "energy_mj" in f:
            values["energy_j"] = f["energy_mj"] / 1000.0
        elif not self._fields.has("energy_mj") and not self.is_mig:
            mj = self._opt("energy", "nvmlDeviceGetTotalEnergyConsumption", h)
            values["energy_j"] = mj / 1000.0 if mj is not None else None
        if not self.is_mig:
            s, now = self._state, self._clock()
            if now - s.power_limit_t >= POWER_LIMIT_REFRESH_S:
                mw = self._opt("power_limit", "nvmlDeviceGetEnforcedPowerLimit", h)
                s.power_limit_w, s.power_limit_t = (mw / 1000.0 if mw is not None else None), now
            values["power_limit_w"] = s.power_limit_w

    def _apply_memory(self, values: dict[str, Any]) -> None:
        nvml, h = self.nvml, self.handles.handle
        mem = None
        if self.has("memory_v2"):
            mem = self._opt("memory_v2", "nvmlDeviceGetMemoryInfo", h, nvml.nvmlMemory_v2, core=True)
        if mem is None and not self.has("memory_v2"):
            mem = self._opt("memory", "nvmlDeviceGetMemoryInfo", h, core=True)
        if mem is not None:
            values["mem_used_bytes"] = int(mem.used)
            values["mem_total_bytes"] = int(mem.total)

    def _clock_reasons(self, h: Any) -> int | None:
        reasons = self._opt("clock_event_reasons", "nvmlDeviceGetCurrentClocksEventReasons", h)
        if reasons is None and "clock_event_reasons" in self.absent:
            # Drivers before R535 only have the older name for the same mask.
            reasons = self._opt("clock_throttle_reasons", "nvmlDeviceGetCurrentClocksThrottleReasons", h)
        return int(reasons) if reasons is not None else None

    def _processes(self, h: Any) -> tuple[dict[int, int | None] | None, dict[int, float], frozenset[int]]:
        """PID -> used bytes, PID -> SM share, and which PIDs are MPS clients (read only when a process is on it)."""
        listed = self._opt("processes", self._compute_processes, h)
        if listed is None and "processes" in self.absent:  # drivers before R510 have only _v2
            listed = self._opt("processes_v2", self._compute_processes_v2, h)
        if listed is None:
            return None, {}, frozenset()
        pids = dict(listed)
        clients = self._mps_clients(h) if pids else {}
        for pid, used in clients.items():  # a client only the MPS list names joins with its memory
            if pids.get(pid) is None:
                pids[pid] = used
        utils: dict[int, float] = {}
        if pids and not self.is_mig:
            samples = self._opt("process_utilization", self._process_utilization, h, self._state.process_util_ts)
            for pid, stamp, sm in sorted(samples or (), key=lambda s: s[1]):
                utils[pid] = min(1.0, sm / 100.0)  # the newest sample per PID wins
                self._state.process_util_ts = max(self._state.process_util_ts, stamp)
        return pids, utils, frozenset(clients)

    def _mps_clients(self, h: Any) -> dict[int, int | None]:
        """The MPS client list (Volta+; ``_v3`` from R510, ``_v2`` from R470): one call per interval on a GPU
        with processes; NOT_SUPPORTED or a driver without the symbol switches each version off for good."""
        listed = self._opt("mps_processes", self._mps_processes, h)
        if listed is None and "mps_processes" in self.absent:
            listed = self._opt("mps_processes_v2", self._mps_processes_v2, h)
        return dict(listed or ())

    def _host_facts(self, pids: dict[int, int | None] | None, now: float) -> HostFacts:
        try:
            return self._host.facts(self.gpu, list(pids or ()), now, bus_id=self.info.pci_bus_id,
                                   uuid=self.info.uuid)
        except Exception as exc:  # noqa: BLE001 - host facts are extras; never fail a GPU over them
            log.debug("host facts for GPU %s failed: %s", self.gpu, exc)
            return HostFacts(processes={})

    # ------------------------------------------------------------------ what it can read

    def capabilities(self) -> tuple[str, ...]:
        """What the reads so far found readable, in the vocabulary of ``DeviceInfo.capabilities``."""
        names: list[str] = []
        has_gpm = self._gpm is not None and self.has("gpm")
        if has_gpm:
            names.append("gpm")
        if has_gpm or self.has("utilization"):
            names.append("gr_active")
        if has_gpm and "gpm:dram_active" not in self.absent:
            names.append("dram_active")
        if self.has("utilization") and not has_gpm:
            names.append("mem_busy")
        if has_gpm:
            for cap, field_name in (("sm_active", "sm_active"), ("sm_occupancy", "sm_occupancy"),
                                    ("tensor_active", "tensor_active"), ("pipe_activity", "fp32_active")):
                if f"gpm:{field_name}" not in self.absent:
                    names.append(cap)
        fields = self._fields
        if fields.has("pcie_tx_bytes") or (has_gpm and "gpm:pcie_tx_bytes_per_s" not in self.absent):
            names.append("pcie")
        if fields.has("nvlink_tx_kib") or (has_gpm and "gpm:link_tx_bytes_per_s" not in self.absent):
            names.append("nvlink")
        whole = not self.is_mig
        if fields.has("power_instant_mw") or (whole and self.has("power_usage")):
            names.append("power")
        if fields.has("energy_mj") or (whole and self.has("energy")):
            names.append("energy")
        if self.has("temperature") or self.has("temperature_legacy"):
            names.append("temperature")
        if self.has("sm_clock"):
            names.append("clocks")
        if self.has("clock_event_reasons") or self.has("clock_throttle_reasons"):
            names.append("clock_event_reasons")
        names.append("memory")
        if self.has("processes") or self.has("processes_v2"):
            names.append("processes")
        if whole and self.has("process_utilization"):
            names.append("process_utilization")
        if fields.has("ecc_dbe_volatile"):
            names.append("ecc")
        if fields.has("remapped_failure"):
            names.append("remapped_rows")
        return tuple(names)

    # ------------------------------------------------------------------ lifecycle

    def reset(self, handles: Handles) -> None:
        """A fresh handle after a loss: forget sample pairs and counter baselines, keep capabilities."""
        self._drop_gpm()
        self.handles = handles
        self._state = _State()

    def close(self) -> None:
        self._drop_gpm()


def _field_reason(field_id: int, code: int) -> str:
    """Why a field was switched off: an id the driver does not know, or the field's own error."""
    return f"field id {field_id} unknown to this driver" if code == INVALID_ARGUMENT else describe_code(code)


def _processes(pids: dict[int, int | None] | None, utils: dict[int, float], host: HostFacts
               ) -> tuple[ProcessSample, ...] | None:
    if pids is None:
        return None
    out = []
    for pid in sorted(pids):
        facts = host.processes.get(pid)
        out.append(ProcessSample(pid=pid, used_memory_bytes=pids[pid], sm_util=utils.get(pid),
                                 **(facts.sample_fields() if facts else {})))
    return tuple(out)
