"""NVML plus the node's dcgm-exporter: the profiling counters NVML lacks before Hopper, by UUID.

On A100, A10, L4, L40S, V100 or T4 NVML has no GPM: no SM activity, occupancy, tensor or FP pipe
activity, no DRAM bandwidth utilisation. A GPU Operator node already runs dcgm-exporter, whose
``DCGM_FI_PROF_*`` fields have them (Volta and newer). :class:`DcgmExporterJoin` wraps the NVML
backend: every sample is NVML's, read as always, and then the exporter's latest values for the
GPU with the same UUID (MIG instances: the parent's UUID and the GPU instance id) fill it:

* the profiling fields (:data:`~agent.backends.dcgm_exporter.mapping.PROFILING_FIELDS`, with
  ``gr_active`` from ``PROF_GR_ENGINE_ACTIVE``) come from the exporter as a set when NVML read no
  GPM this interval, so ratios such as SM activity over engine activity come from one source;
* every other field the exporter has fills only what NVML left unknown (PCIe and NVLink rates on
  an old driver, say); where both have a value, NVML's wins.

The exporter is read in the background (:class:`~agent.backends.dcgm_exporter.reader.ExporterReader`);
when its values are refused (down, stale, frozen) the samples are NVML's alone and the reason is
kept for ``doctor``. Which source gave each field is :meth:`DcgmExporterJoin.counter_sources`.
Everything else (devices, events, the NVML handles ``doctor`` probes) is the wrapped backend's: the
shared join (:class:`agent.backends.exporter_join.ExporterJoin`).
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

from agent.backends.cumulative import CounterWindows, WindowState, prefer
from agent.backends.dcgm_exporter.backend import SOURCE, named_totals
from agent.backends.dcgm_exporter.mapping import COUNTER_FIELDS, PROFILING_FIELDS, sample_values, totals
from agent.backends.exporter_join import ExporterJoin, JoinState
from agent.model import DeviceInfo, GpuSample

__all__ = ["DcgmExporterJoin", "JoinState"]

log = logging.getLogger("roofwatch.dcgm_exporter")

_NEVER = frozenset({"ts", "gpu", "node", "uuid", "vendor", "model", "interval_s", "attribution"})


class DcgmExporterJoin(ExporterJoin):
    """An NVML backend whose samples the node's dcgm-exporter completes.

    :attr:`JoinState.key` is (physical GPU UUID, MIG GPU instance); None when NVML gave no UUID."""

    own = "nvml"
    source = SOURCE
    fields = COUNTER_FIELDS
    no_key = "NVML gave no UUID to match"

    def __init__(self, inner: Any, reader: Any) -> None:
        super().__init__(inner, reader)
        self.windows = CounterWindows()
        """Each GPU's cumulative counters at the latest read (agent.backends.cumulative)."""

    def counter_window(self, gpu: str) -> WindowState | None:
        """How GPU ``gpu``'s cumulative counters went at the latest read; None when it has none (doctor)."""
        return self.windows.state(gpu)

    def counter_sources(self, gpu: str) -> dict[str, str]:
        return named_totals(super().counter_sources(gpu), self.windows.state(gpu))

    def match_keys(self, infos: Sequence[DeviceInfo]) -> dict[str, tuple[str, str | None] | None]:
        return {info.gpu: self._exporter_key(info) for info in infos}

    def _exporter_key(self, info: DeviceInfo) -> tuple[str, str | None] | None:
        """(UUID, None) for a whole GPU; (parent UUID, GPU instance) for a MIG instance, whose own
        ``MIG-`` UUID dcgm-exporter does not print."""
        device = getattr(self.inner, "devices", {}).get(info.gpu)
        handles = getattr(device, "handles", None)
        instance = getattr(handles, "gpu_instance_id", None)
        if instance is None:
            return (info.uuid, None) if info.uuid else None
        try:
            parent = self.inner.nvml.nvmlDeviceGetUUID(handles.parent)
        except Exception as exc:  # the parent's UUID is what matches; without it, no join for this instance
            log.warning("GPU %s: no parent UUID for the dcgm-exporter join (%s)", info.gpu, exc)
            return None
        return (parent.decode() if isinstance(parent, bytes) else str(parent), str(instance))

    def lookup(self, key: Any, now: float) -> tuple[Any | None, str | None]:
        return self.reader.lookup_uuid(key[0], key[1], now)

    def updates(self, gpu: str, sample: GpuSample, record: Any, now: float) -> dict[str, Any]:
        """The profiling fields as a set when NVML read no GPM this interval (the activity of DCGM's cumulative
        counters over the window winning over its sampled ratios); any other field only where NVML left it
        unknown."""
        nvml_profiled = sample.sm_active is not None  # GPM answered this interval
        out: dict[str, Any] = {}
        for name, value in prefer(sample_values(record), self.windows.activity(gpu, totals(record))).items():
            if name in _NEVER or value is None:
                continue
            if (name in PROFILING_FIELDS and not nvml_profiled) or getattr(sample, name) is None:
                out[name] = value
        return out
