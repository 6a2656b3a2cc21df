"""Profiling counters from a second source, joined into another backend's samples by GPU UUID.

NVML gives power, clocks, memory and processes on every NVIDIA GPU, but SM, tensor, DRAM and pipe
activity only through GPM, which is Hopper and newer. On A100, A10, L4, L40S, V100 and T4 those
counters come from DCGM profiling (agent.backends.dcgm), read by a *profiling source*. This module
is the small, source-neutral part: which sample fields are profiling fields, the merge rule, and
:class:`ProfilingJoin`, a backend that wraps another one and fills its samples.

Merge rule (:func:`merge_profiling`): a profiling value fills a field the sample left unknown;
it replaces a known one only for fields named in ``replace`` (the NVML backend's ``gr_active`` on
a GPU without GPM is utilization.gpu, which DCGM's engine activity measures over the same
interval as its other fields; NVML's utilization.memory is ``mem_busy``, never ``dram_active``,
so DRAM activity is DCGM's alone). A profiling value that is unknown never erases anything.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence

from agent.backends.base import Backend, BackendUnavailable, DeviceError
from agent.model import DeviceInfo, GpuSample, SourceState

log = logging.getLogger("roofwatch.profiling")

PROFILING_FIELDS = ("gr_active", "sm_active", "sm_occupancy", "tensor_active", "dram_active", "fp64_active",
                    "fp32_active", "fp16_active", "pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s",
                    "link_tx_bytes_per_s", "link_rx_bytes_per_s")
"""GpuSample fields a profiling source may provide."""
FALLBACK_FIELDS = frozenset({"gr_active", "dram_active"})
"""Fields a GPU without GPM may carry from elsewhere (utilization.gpu; an older trace's DRAM figure): a profiling source's values win."""


def merge_profiling(sample: GpuSample, values: Mapping[str, float | None], *,
                    replace: frozenset[str] | set[str] = frozenset()) -> GpuSample:
    """``sample`` with ``values`` filled in where it had None (or replaced, for fields in ``replace``)."""
    update = {k: v for k, v in values.items()
              if k in PROFILING_FIELDS and v is not None and (getattr(sample, k) is None or k in replace)}
    return dataclasses.replace(sample, **update) if update else sample


@dataclass(frozen=True, slots=True)
class ProfilingRead:
    """One GPU's profiling values now; ``reason`` says why some or all are unknown."""

    values: Mapping[str, float | None] = field(default_factory=dict)
    reason: str | None = None
    paused: bool = False
    """Every supported field read blank: profiling paused, or a profiler holds the counters."""
    counted: tuple[str, ...] = ()
    """Fields whose value is the activity of cumulative counters over the span since the previous read
    (agent.backends.cumulative), not a sampled ratio: named ``<label>-totals`` in
    :meth:`ProfilingJoin.counter_sources`."""


class ProfilingSource(Protocol):
    """What ProfilingJoin needs of a source (agent.backends.dcgm.DcgmSource is one)."""

    def read(self, uuid: str, now: float) -> ProfilingRead: ...

    def close(self) -> None: ...


class ProfilingJoin:
    """``inner``'s samples with profiling fields from a source opened for its GPUs without GPM.

    The source is opened once the inner backend has discovered its devices (only whole GPUs
    whose capabilities lack ``gpm`` are joined; MIG instances are left as they are). When it
    cannot open, ``required`` makes that fatal; otherwise the agent carries on without it and
    ``unavailable`` says why (for doctor and the log). A source failing for one GPU leaves that
    GPU's profiling fields unknown this interval; the GPU's own sample still reports.
    Everything else (doctor's probes, events, ports) is the inner backend's, looked up on it.
    """

    def __init__(self, inner: Backend, open_source: Callable[[Sequence[DeviceInfo]], Any], *, label: str,
                 required: bool = False) -> None:
        self.inner = inner
        self.label = label
        self._open_source = open_source
        self.required = required
        self.source: Any | None = None
        self.unavailable: str | None = None
        self.joined: dict[str, str] = {}
        self.needed = False
        """Whether some GPU lacks GPM, so the source is wanted (its state is then exported)."""
        """gpu -> uuid of the GPUs the source fills."""
        self.last: dict[str, ProfilingRead] = {}
        self._filled: dict[str, tuple[str, ...]] = {}
        """gpu -> the fields the source gave its latest sample (:meth:`counter_sources`)."""
        self._counted: dict[str, tuple[str, ...]] = {}
        """gpu -> those of them its cumulative counters gave over the window."""

    def __getattr__(self, name: str) -> Any:  # devices, nvml, device_events, nic_ports, ...
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def discover(self) -> Sequence[DeviceInfo]:
        devices = self.inner.discover()
        wanted = [d for d in devices if "/" not in d.gpu and "gpm" not in d.capabilities]
        if not wanted:
            self.unavailable = f"{self.label} not needed: every GPU has GPM" if devices else None
            return devices
        self.needed = True
        try:
            self.source = self._open_source(wanted)
        except BackendUnavailable as exc:
            if self.required:
                self.inner.close()
                raise
            self.unavailable = str(exc)
            log.warning("%s (profiling counters of %d GPU(s) without GPM stay unknown)", exc, len(wanted))
            return devices
        self.joined = {d.gpu: d.uuid for d in wanted}
        return devices

    def sample(self, gpu: str, now: float) -> GpuSample:
        sample = self.inner.sample(gpu, now)
        uuid = self.joined.get(gpu)
        if self.source is None or uuid is None:
            return sample
        try:
            read = self.source.read(uuid, now)
        except DeviceError as exc:
            read = ProfilingRead(reason=str(exc))
        self.last[gpu] = read
        merged = merge_profiling(sample, read.values, replace=FALLBACK_FIELDS)
        self._filled[gpu] = tuple(k for k in PROFILING_FIELDS if read.values.get(k) is not None
                                  and (getattr(sample, k) is None or k in FALLBACK_FIELDS))
        self._counted[gpu] = read.counted
        if merged.gr_active is not sample.gr_active and sample.gr_active is not None and sample.util_gpu is None:
            # the duty NVML read (utilization.gpu: these GPUs have no GPM) stays beside the profiling one
            merged = dataclasses.replace(merged, util_gpu=sample.gr_active)
        return merged

    def counter_sources(self, gpu: str) -> dict[str, str]:
        """Which source gave each field of GPU ``gpu``'s latest sample: this one's (``dcgm``) for the profiling
        fields it filled, the inner backend's word for the rest where it has one (agent.model.counter_source)."""
        inner = getattr(self.inner, "counter_sources", None)
        out = dict(inner(gpu)) if inner is not None else {}
        counted = set(self._counted.get(gpu, ()))
        own = self.label.lower()
        out.update({name: f"{own}-totals" if name in counted else own for name in self._filled.get(gpu, ())})
        return out

    def source_states(self, now: float) -> tuple[SourceState, ...]:
        """The inner backend's sources, and this one: ``dcgm`` up while it fills its GPUs, down with why."""
        inner = getattr(self.inner, "source_states", None)
        own = None
        if self.source is not None:
            own = SourceState(self.label.lower(), "up")
        elif self.needed:
            own = SourceState(self.label.lower(), "down", self.unavailable)
        return (*(inner(now) if inner is not None else ()), *((own,) if own is not None else ()))

    def close(self) -> None:
        if self.source is not None:
            self.source.close()
        self.inner.close()
