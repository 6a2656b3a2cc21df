"""The fake nv-hostengine's state: GPUs, groups, watches, the profiling lock, restarts.

Behaviour and where it was taken from (NVIDIA/DCGM, 4.6.0 unless noted):

* **Watch, then read** (``dcgmlib/dcgm_agent.h``, dcgmWatchFields: "the first update of the field
  will not occur until the next field update cycle"; ``DcgmCacheManager::GetLatestSample``): a
  watched field with no sample yet reads back with status ``DCGM_ST_NO_DATA``, one never watched
  with ``DCGM_ST_NOT_WATCHED``, each as a blank value inside a successful call. Here a watch
  records a value every ``updateFreq`` microseconds of the clock, the average over that update.
* **Paused profiling** (dcgm_agent.h, dcgmProfPause: "DCGM will save BLANK values while
  profiling is paused"; ``testing/python3/tests/test_prof.py`` test_dcgm_prof_pause_resume_values):
  updates taken while paused store blanks (status OK, value DCGM_FP64_BLANK / DCGM_INT64_BLANK).
  ``dcgmi profile --pause`` and a profiler holding the perfmon lock both look like this.
* **GPM GPUs** (test_prof.py test_dcgm_prof_multi_pause_resume): on Hopper and newer DCGM reads
  the same fields through NVML GPM; pause/resume answer ``DCGM_ST_NOT_SUPPORTED`` there.
* **Root** (test_prof.py test_dcgm_prof_requires_root_privileges): watching profiling fields of a
  non-GPM GPU from a host engine that does not run as root fails with ``DCGM_ST_REQUIRES_ROOT``.
* **Unsupported GPUs** (test_prof.py helper_check_profiling_environment):
  dcgmProfGetSupportedMetricGroups answers ``DCGM_ST_PROFILING_NOT_SUPPORTED``; the fake also
  refuses to watch profiling fields on a group holding such a GPU (``DCGM_ST_NOT_SUPPORTED``:
  an assumption, the profiling module is closed source). GPUs without NVLink list no NVLink fields.
* **Lost GPU** (GetLatestSample: "If NVML apis failed, return their error code"): a GPU the
  simulation has lost answers ``DCGM_ST_GPU_IS_LOST`` in each value's status.
* **Cumulative counters** (DCGM 4.6.0: ``dcgmlib/dcgm_fields.h`` 1084-1096, ``DCGM_FT_INT64``, "raw monotonic
  counter"; ``DcgmCacheManager.cpp``: read through NVML GPM on GPM GPUs, else "assume that DCP is updating this
  field"): a host engine older than 4.6 knows none of them. Whether DCP offers them before Hopper is not
  documented, so the fake offers them only where the scenario's ``dcgm: {cumulative: true}`` says so
  (:class:`agent.virtual.profiles.DcgmProfile`, which may also take the sampled ratios away: a node that plays
  only the counters). They count the GPU's cycles since the fake started (the GPU's since reboot: an engine
  restart does not reset them): SMs x SM clock x time elapsed, and that times each pipe's activity active.
* **Restart**: a new host-engine process knows none of the old connections, groups or watches;
  every call on an old connection answers ``DCGM_ST_CONNECTION_NOT_VALID`` (dcgm_agent.h), and a
  stopped engine refuses connections the same way.

Values come from a twin of the virtual node (same scenario, start time and clock as the node the
fake NVML plays), with the node's counters set to ``full``: DCGM sees the SM, tensor, DRAM and
pipe activity that NVML alone hides before Hopper.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from agent.backends.base import DeviceError
from agent.model import DeviceInfo, GpuSample
from agent.virtual.backend import VirtualBackend
from agent.virtual.scenario import parse_scenario

PROFILING_FIELDS: dict[int, str] = {
    1001: "gr_active", 1002: "sm_active", 1003: "sm_occupancy", 1004: "tensor_active", 1005: "dram_active",
    1006: "fp64_active", 1007: "fp32_active", 1008: "fp16_active", 1009: "pcie_tx_bytes_per_s",
    1010: "pcie_rx_bytes_per_s", 1011: "link_tx_bytes_per_s", 1012: "link_rx_bytes_per_s",
}
"""DCGM_FI_PROF_* id -> the virtual sample's attribute that plays it."""
CUMULATIVE_FIELDS: dict[int, str | None] = {
    1084: None, 1085: "sm_active", 1086: "tensor_active", 1087: "tensor_dmma_active", 1088: "tensor_hmma_active",
    1089: "tensor_imma_active", 1090: "tensor_dfma_active", 1091: "pcie_tx_bytes_per_s", 1092: "pcie_rx_bytes_per_s",
    1093: None, 1094: "fp64_active", 1095: "fp32_active", 1096: "fp16_active",
}
"""DCGM 4.6's cumulative counters -> the sample's activity (a byte rate for 1091/1092) each integrates; 1084 is the
elapsed SM cycles, 1093 (integer pipe) has no sample field and stays 0."""
CUMULATIVE_SINCE = (4, 6)
DOUBLE_FIELDS = frozenset(range(1001, 1009))
BLANK = "blank"
"""A stored value that is DCGM's blank for its type."""


def full_counters_twin(virtual: VirtualBackend, *, clock: Any = None) -> VirtualBackend:
    """A twin of ``virtual``'s node whose samples carry every counter (DCGM's view of the same GPUs)."""
    data = virtual.engine.scenario.model_dump(mode="json", exclude_none=True)
    for node in data["nodes"]:
        if node["name"] == virtual.node:
            node["counters"] = "full"
    return VirtualBackend(parse_scenario(data), node=virtual.node, start_time=virtual.start_time,
                          clock=clock or virtual.clock, interval_s=virtual.interval_s)


@dataclass(slots=True)
class Watch:
    """One GPU's watched profiling fields: update period and the latest stored values."""

    fields: set[int]
    period_s: float
    start_t: float
    updates: int = 0
    latest: dict[int, tuple[int, Any]] = field(default_factory=dict)
    """field id -> (timestamp in microseconds, value or BLANK or a DCGM status code)."""


class FakeHostEngine:
    """One node's DCGM host engine over a virtual node; the library's C functions call into it."""

    def __init__(self, virtual: VirtualBackend, *, version: str = "4.6.0", root: bool = True,
                 unsupported: tuple[str, ...] = (), gpm: bool | None = None, cumulative: bool = False,
                 ratios: bool = True) -> None:
        """``virtual``: the node the fake NVML plays (a full-counters twin is made of it);
        ``version``: the DCGM release (its major picks the soname, 4.5+ has dcgmConnect_v3);
        ``root``: whether the engine runs as root; ``unsupported``: GPU ids (``"2"``) whose profiling
        DCGM does not support; ``gpm``: override whether the GPUs are GPM GPUs (default: by model);
        ``cumulative``: offer DCGM 4.6's cumulative counters (from 4.6.0 only); ``ratios``: offer the sampled
        SM, occupancy, tensor and FP-pipe ratios (1002-1004, 1006-1008; False with ``cumulative``: a node that plays
        only the counters for them; engine and DRAM activity, which no counter gives, stay)."""
        self.twin = full_counters_twin(virtual)
        self.clock = self.twin.clock
        self.version = version
        self.major = int(version.split(".", 1)[0])
        self.root = root
        self.unsupported = frozenset(unsupported)
        self.lock = threading.RLock()
        self.running = True
        self.generation = 1
        self.paused = False
        self.groups: dict[int, list[int]] = {}
        self.field_groups: dict[int, list[int]] = {}
        self.watches: dict[int, Watch] = {}
        self._next_id = 1
        self.devices: list[DeviceInfo] = [d for d in self.twin.discover() if "/" not in d.gpu]
        self._gpm = gpm
        self.watch_calls = 0
        self.cumulative = cumulative and tuple(int(x) for x in version.split(".")[:2]) >= CUMULATIVE_SINCE
        self.ratios = ratios
        self.totals: dict[int, dict[int, float]] = {}
        """gpu id -> cumulative field id -> its count; a GPU's counters, kept across engine restarts."""
        self._counted_to: dict[int, float] = {}

    # ------------------------------------------------------------------ process lifecycle (tests drive these)

    def restart(self) -> None:
        """nv-hostengine restarted: connections, groups and watches are gone."""
        with self.lock:
            self.generation += 1
            self.running = True
            self.groups.clear()
            self.field_groups.clear()
            self.watches.clear()

    def stop(self) -> None:
        with self.lock:
            self.running = False
            self.generation += 1
            self.watches.clear()

    def new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    # ------------------------------------------------------------------ GPUs

    def is_gpm(self, gpu_id: int) -> bool:
        if self._gpm is not None:
            return self._gpm
        model = self.devices[gpu_id].model.upper()
        return any(name in model for name in ("H100", "H200", "H800", "H20", "GH200", "B200", "B300", "GB200"))

    def supported_fields(self, gpu_id: int) -> list[int]:
        """The profiling field ids this GPU's metric groups list (none when profiling is unsupported)."""
        info = self.devices[gpu_id]
        if info.gpu in self.unsupported:
            return []
        ids = list(range(1001, 1011)) if self.ratios else [1001, 1005, 1009, 1010]
        if info.link_count:
            ids += [1011, 1012]
        if self.cumulative:
            ids += list(CUMULATIVE_FIELDS)
        return ids

    # ------------------------------------------------------------------ watches and values

    def watch(self, gpu_ids: list[int], field_ids: list[int], period_s: float) -> int:
        """Start (or re-time) watches; a DCGM status code (0 = OK)."""
        profiling = [f for f in field_ids if f in PROFILING_FIELDS or f in CUMULATIVE_FIELDS]
        if profiling:
            for g in gpu_ids:
                if not self.is_gpm(g) and not self.root:
                    return -29  # DCGM_ST_REQUIRES_ROOT
                if not self.supported_fields(g):
                    return -6  # DCGM_ST_NOT_SUPPORTED
        now = self.clock()
        for g in gpu_ids:
            old = self.watches.get(g)
            if old is not None and old.period_s == period_s:
                old.fields.update(field_ids)
            else:
                self.watches[g] = Watch(set(field_ids), period_s, now)
        self.watch_calls += 1
        return 0

    def latest(self, gpu_id: int, field_id: int) -> tuple[int, int, Any]:
        """(status, timestamp_us, value) of one field now; value may be BLANK."""
        w = self.watches.get(gpu_id)
        if w is None or field_id not in w.fields:
            return -16, 0, BLANK  # DCGM_ST_NOT_WATCHED
        self._update(gpu_id, w)
        if field_id not in w.latest:
            return -14, 0, BLANK  # DCGM_ST_NO_DATA: the first update cycle has not run yet
        ts, value = w.latest[field_id]
        if isinstance(value, tuple):  # (status,) stored by a failed update
            return value[0], ts, BLANK
        return 0, ts, value

    def _update(self, gpu_id: int, w: Watch) -> None:
        """Run the update cycles that are due: one sample of the twin per cycle (the last one only,
        when several are due: it averages over all of them, as a late reader would see)."""
        due = int((self.clock() - w.start_t) / w.period_s)
        if due <= w.updates:
            return
        w.updates = due
        t = w.start_t + due * w.period_s
        ts = int(t * 1e6)
        gpu = self.devices[gpu_id].gpu
        try:
            sample: GpuSample | None = self.twin.sample(gpu, t)
        except DeviceError:
            sample = None
        supported = set(self.supported_fields(gpu_id))
        totals = self._count(gpu_id, sample, t) if self.cumulative else {}
        for fid in w.fields:
            if sample is None:
                w.latest[fid] = (ts, (-18,))  # DCGM_ST_GPU_IS_LOST
            elif fid not in supported or (self.paused and not self.is_gpm(gpu_id)):
                w.latest[fid] = (ts, BLANK)
            elif fid in CUMULATIVE_FIELDS:
                w.latest[fid] = (ts, int(totals[fid]))
            else:
                value = getattr(sample, PROFILING_FIELDS[fid])
                w.latest[fid] = (ts, BLANK if value is None else value)

    def _count(self, gpu_id: int, sample: GpuSample | None, t: float) -> dict[int, float]:
        """The GPU's cumulative counters at ``t``: the span since they were last counted at ``sample``'s activity
        (the last update's, as the engine's own sampling sees it), SM cycles at its clock x its SMs."""
        totals = self.totals.setdefault(gpu_id, dict.fromkeys(CUMULATIVE_FIELDS, 0.0))
        since = self._counted_to.get(gpu_id)
        self._counted_to[gpu_id] = t
        if sample is None or since is None or t <= since:
            return totals
        span = t - since
        cycles = span * (self.devices[gpu_id].sm_count or 1) * (sample.sm_clock_mhz or 0.0) * 1e6
        totals[1084] += cycles
        for fid, name in CUMULATIVE_FIELDS.items():
            value = getattr(sample, name) if name is not None else None
            if value is not None:
                totals[fid] += value * (span if name.endswith("_per_s") else cycles)
        return totals
