"""Device Metrics Exporter series onto :class:`agent.model.GpuSample` fields, in the sample's units.

Units (Help strings and ``gpu.proto`` at v1.5.1; docs/amd.md has every source line):
activity and busy in percent 0-100, power in W, energy in uJ accumulated, clocks in MHz, VRAM in MB
(amdsmi's MB: MiB), XGMI link data in KB (1024 bytes) accumulated since boot.

Profiler series (``gpu_prof_*``) are each one sample over a window of ``window_us`` microseconds
that rocpctl counts and then sums over the agent's XCCs; the window is not in ``/metrics``
(``amd_exporter_profiler_window_us``). So FLOP/s = ops / window and HBM bytes/s = (fetch + write)
KiB x 1024 / window. The percentages are of GPU-active cycles (GRBM_GUI_ACTIVE), so each is scaled by
``gpu_prof_gui_util_percent`` (GPU-active over elapsed) to a share of elapsed time, as the
trace contract's ratios are.

Partitions: activity, UMC activity, power and energy are real on partition 0 only (v1.5.1
``docs/configuration/metricslist.md:77-95``); another partition never shows them. A partition's
duty is the mean of its XCCs' ``gpu_gfx_busy_instantaneous``; the profiler's values are its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from agent.backends.amd.values import MAX_COMPUTE_UNITS, bounded
from agent.backends.amd_exporter.exposition import AmdRecord
from agent.backends.amd_exporter.units import KIB, MIB
from agent.model.indexes import index_value
from agent.model import GpuSpec, LinkTraffic, ProcessSample

DEFAULT_WINDOW_US = 1000.0
"""rocpctl's window from DME 1.4.1 on (and 1.5's ``ProfilerConfig.SamplingInterval`` default)."""
SHORT_WINDOW_US = 10.0
"""DME 1.3.x-1.4.0.1 counted each profiler field for 10 us: too short for a rate (PR #329)."""
CACHE_S = 15.0
"""gpuagent answers are cached this long (``cacheTimer``): a value repeated within it is no new reading."""
LINK_HOLD_S = 2 * CACHE_S + 5.0
"""An XGMI rate is held until the accumulators move again; unchanged longer than this, the link is idle."""

PROFILER_CAPABILITIES = ("tensor_active", "sm_active", "dram_active")


@dataclass(slots=True)
class _Mark:
    value: float
    at: float


@dataclass(slots=True)
class LinkRates:
    """XGMI accumulators of one device across reads: a rate only between two *different* values."""

    marks: dict[tuple[str, str], _Mark] = field(default_factory=dict)
    rates: dict[tuple[str, str], float] = field(default_factory=dict)

    def rate(self, series: str, link: str, value: float, now: float | None) -> float | None:
        """Bytes/s of ``series`` on ``link`` (KB accumulated) as of ``now``; ``now`` None only peeks."""
        key = (series, link)
        mark = self.marks.get(key)
        if now is None:
            return self.rates.get(key)
        if mark is None or value < mark.value:
            self.marks[key] = _Mark(value, now)
            self.rates.pop(key, None)
            return None
        if value == mark.value:  # the 15 s cache, or an idle link
            if now - mark.at > LINK_HOLD_S:
                self.rates[key] = 0.0
            return self.rates.get(key)
        if now > mark.at:
            rate = (value - mark.value) * KIB / (now - mark.at)
            if math.isfinite(rate):  # two convertible totals a microsecond apart can still overflow
                self.rates[key] = rate
        self.marks[key] = _Mark(value, now)
        return self.rates.get(key)


def _percent(value: float | None) -> float | None:
    return None if value is None or value < 0 else min(1.0, value / 100.0)


def _mean(values: Any) -> float | None:
    values = [v for v in values if v is not None]
    if not values:
        return None
    total = sum(values)
    return total / len(values) if math.isfinite(total) else sum(v / len(values) for v in values)  # 1e308 + 1e308


def _of_type(indexed: Mapping[str, float], kind: str) -> list[float]:
    return [v for k, v in indexed.items() if k.split("/")[0] == kind and v > 0]


@dataclass(frozen=True, slots=True)
class Profiled:
    """What one record's profiler series give, before the trace contract's ratios."""

    gui: float | None
    """GPU-active share of the window (``gpu_prof_gui_util_percent`` / 100)."""
    mfma: float | None
    valu: float | None
    occupancy: float | None
    flops: dict[str, float]
    """``"16"``/``"32"``/``"64"`` -> ops per second (ops in the window / window)."""
    hbm_bytes_per_s: float | None


def profiled(values: Mapping[str, float], window_us: float) -> Profiled | None:
    """The record's profiler reading, or None when it has no ``gpu_prof_*`` series this backend reads."""
    window_s = window_us * 1e-6
    flops = {bits: values[f"gpu_prof_total_{bits}_ops"] / window_s
             for bits in ("16", "32", "64") if values.get(f"gpu_prof_total_{bits}_ops", -1) >= 0}
    flops = {bits: rate for bits, rate in flops.items() if math.isfinite(rate)}  # a window under the setting's 1 us
    fetch, write = values.get("gpu_prof_fetch_size"), values.get("gpu_prof_write_size")
    hbm = (fetch + (write or 0.0)) * KIB / window_s if fetch is not None and fetch >= 0 else None
    hbm = hbm if hbm is None or math.isfinite(hbm) else None
    reading = Profiled(gui=_percent(values.get("gpu_prof_gui_util_percent")),
                       mfma=_percent(values.get("gpu_prof_tensor_active_percent")),
                       valu=_percent(values.get("gpu_prof_sm_active")),
                       occupancy=_percent(values.get("gpu_prof_occupancy_percent")), flops=flops, hbm_bytes_per_s=hbm)
    if reading.mfma is None and reading.valu is None and not flops and hbm is None:
        return None
    return reading


def _elapsed(share: float | None, gui: float | None) -> float | None:
    """A share of GPU-active cycles as a share of elapsed time (unchanged without the GPU_UTIL series)."""
    return None if share is None else share * gui if gui is not None else share


def profiler_values(p: Profiled, spec: GpuSpec | None) -> dict[str, Any]:
    """tensor_active (MFMA busy), sm_active (VALU busy), sm_occupancy and dram_active (HBM bytes/s over
    the device's bandwidth). Without MFMA utilisation, 16-bit ops over the 16-bit dense peak stand in."""
    out: dict[str, Any] = {}
    tensor = _elapsed(p.mfma, p.gui)
    peak16 = spec.peak_flops.get("bf16") if spec is not None else None
    if tensor is None and "16" in p.flops and peak16:
        tensor = min(1.0, p.flops["16"] / peak16)
    for name, value in (("tensor_active", tensor), ("sm_active", _elapsed(p.valu, p.gui)),
                        ("sm_occupancy", _elapsed(p.occupancy, p.gui))):
        if value is not None:
            out[name] = min(1.0, value)
    bandwidth = spec.mem_bandwidth_bytes_per_s if spec is not None else None
    if p.hbm_bytes_per_s is not None and bandwidth:
        out["dram_active"] = min(1.0, p.hbm_bytes_per_s / bandwidth)
    return out


def sample_values(record: AmdRecord, spec: GpuSpec | None, window_us: float, links: LinkRates | None = None,
                  now: float | None = None) -> dict[str, Any]:
    """The sample fields this record gives (only those it has). ``links``/``now``: the device's XGMI
    accumulators across reads (None: no link rates)."""
    v, ix = record.values, record.indexed
    out: dict[str, Any] = {}
    busy = _mean(_percent(x) for x in ix.get("gpu_gfx_busy_instantaneous", {}).values())
    partitioned = record.partitions > 1 or record.partition not in (None, 0)
    if partitioned:
        gr = busy if busy is not None else _percent(v.get("gpu_gfx_activity")) if record.primary else None
    else:
        gr = _percent(v.get("gpu_gfx_activity"))
        gr = gr if gr is not None else busy
    if gr is not None:
        out["gr_active"] = gr
    reading = profiled(v, window_us)
    if reading is not None:
        out.update(profiler_values(reading, spec))
    if "dram_active" not in out and record.primary and (umc := _percent(v.get("gpu_umc_activity"))) is not None:
        out["dram_active"] = umc
    if record.primary:
        power = next((v[n] for n in ("gpu_package_power", "gpu_power_usage", "gpu_average_package_power")
                      if v.get(n, -1) >= 0), None)  # the last is MI2xx's (metricslist.md "MI2xx-Only Metrics")
        if power is not None:
            out["power_w"] = power
        if v.get("gpu_energy_consumed", -1) >= 0:
            out["energy_j"] = v["gpu_energy_consumed"] * 1e-6
    for name, target in (("gpu_junction_temperature", "temperature_c"), ("gpu_edge_temperature", "temperature_c"),
                         ("gpu_memory_temperature", "memory_temperature_c")):
        if name in v and target not in out:
            out[target] = v[name]
    hbm = list(ix.get("gpu_hbm_temperature", {}).values())
    if "memory_temperature_c" not in out and hbm:
        out["memory_temperature_c"] = max(hbm)
    for name, target in (("gpu_clock", "sm_clock_mhz"), ("gpu_max_clock", "sm_clock_max_mhz")):
        clock = _mean(_of_type(ix.get(name, {}), "system"))
        if clock is not None:
            out[target] = clock
    if v.get("gpu_used_vram", -1) >= 0:
        out["mem_used_bytes"] = int(v["gpu_used_vram"] * MIB)
    if v.get("gpu_total_vram", 0) > 0:
        out["mem_total_bytes"] = int(v["gpu_total_vram"] * MIB)
    for name, target in (("gpu_ecc_correct_total", "ecc_corrected_errors"),
                         ("gpu_ecc_uncorrect_total", "ecc_uncorrected_errors")):
        if v.get(name, -1) >= 0:
            out[target] = int(v[name])
    out.update(_links(record, links, now))
    processes = process_samples(record)
    if processes is not None:
        out["processes"] = processes
    return out


def process_samples(record: AmdRecord) -> tuple[ProcessSample, ...] | None:
    """The processes DME lists on this GPU object, each with its ``gpu_process_cu_occupancy`` as its compute units;
    None when unknown (:attr:`AmdRecord.processes`).

    DME's Help says "Compute Unit occupancy for a process in percent" (v1.5.1 ``gpuagent_gpu_metrics.go:1750``,
    ``gpu.proto:606``), but the value is gpuagent's copy of amdsmi's ``cu_occupancy``, which amdsmi.h documents
    as the number of CUs the process's queues occupy (KFD's ``/sys/class/kfd/kfd/proc/<pid>/stats_*/cu_occupancy``).
    It is read as compute units, the unit amdsmi gives; the holders' shares use it only as a weight among one
    GPU's processes, which either unit gives alike. A value past any GPU's CU count is unknown, never 0."""
    if record.processes is None:
        return None
    out = []
    for pid in sorted(record.processes):
        cus = bounded(record.processes[pid], 0, MAX_COMPUTE_UNITS)
        out.append(ProcessSample(pid=pid, compute_units=round(cus) if cus is not None else None))
    return tuple(out)


def _links(record: AmdRecord, rates: LinkRates | None, now: float | None) -> dict[str, Any]:
    """XGMI per-link totals in bytes, and the summed rates between reads that changed them."""
    rx, tx = record.indexed.get("gpu_xgmi_link_rx", {}), record.indexed.get("gpu_xgmi_link_tx", {})
    if not rx and not tx:
        return {}
    traffic, totals = [], {"link_rx_bytes_per_s": None, "link_tx_bytes_per_s": None}
    for link in sorted(set(rx) | set(tx), key=lambda k: index_value(k) or 0):
        number = index_value(link)  # the parser skips a line whose link_index is no index; never int("²") here
        if number is None:
            continue
        for series, target, table in (("rx", "link_rx_bytes_per_s", rx), ("tx", "link_tx_bytes_per_s", tx)):
            if link in table and rates is not None:
                rate = rates.rate(series, link, table[link], now)
                if rate is not None:
                    totals[target] = (totals[target] or 0.0) + rate
        traffic.append(LinkTraffic(link=number, read_bytes=rx[link] * KIB if link in rx else None,
                                   write_bytes=tx[link] * KIB if link in tx else None))
    out: dict[str, Any] = {"links": tuple(traffic)}
    out.update({k: r for k, r in totals.items() if r is not None})
    return out


CAPABILITIES: dict[str, tuple[str, ...]] = {
    "gr_active": ("gr_active",), "tensor_active": ("tensor_active",), "sm_active": ("sm_active",),
    "sm_occupancy": ("sm_occupancy",), "dram_active": ("dram_active",), "power": ("power_w",),
    "energy": ("energy_j",), "xgmi": ("links",), "temperature": ("temperature_c",), "clocks": ("sm_clock_mhz",),
    "memory": ("mem_used_bytes",), "ecc": ("ecc_uncorrected_errors",), "processes": ("processes",),
}


def capabilities(values: Mapping[str, Any]) -> tuple[str, ...]:
    """What a record's fields let the agent read, named as the amdsmi backend names it."""
    return tuple(cap for cap, fields in CAPABILITIES.items() if any(f in values for f in fields))
