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
Everything else (devices, events, the NVML handles ``doctor`` probes) is the wrapped backend's.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Any, Sequence

from agent.backends.dcgm_exporter.backend import SOURCE
from agent.backends.dcgm_exporter.mapping import COUNTER_FIELDS, PROFILING_FIELDS, sample_values
from agent.backends.dcgm_exporter.reader import ExporterReader, listed
from agent.model import DeviceInfo, GpuSample, SourceState

log = logging.getLogger("roofwatch.dcgm_exporter")

_NEVER = frozenset({"ts", "gpu", "node", "uuid", "vendor", "model", "interval_s", "attribution"})


@dataclasses.dataclass(frozen=True, slots=True)
class JoinState:
    """How one GPU's join went at its latest sample, for ``doctor``."""

    key: tuple[str, str | None] | None
    """(physical GPU UUID, MIG GPU instance) the exporter is asked for; None when NVML gave no UUID."""
    problem: str | None
    """Why the exporter's values were not used, or None when they were."""
    sources: dict[str, str]
    """Sample field -> ``nvml`` or ``dcgm-exporter``."""


class DcgmExporterJoin:
    """An NVML backend whose samples the node's dcgm-exporter completes."""

    def __init__(self, inner: Any, reader: ExporterReader) -> None:
        self.inner = inner
        self.reader = reader
        self.name = inner.name
        self._keys: dict[str, tuple[str, str | None] | None] = {}
        self._states: dict[str, JoinState] = {}
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        """Everything not about the join is the NVML backend's (devices, nvml, events, warm_samples)."""
        if name in ("inner", "reader"):
            raise AttributeError(name)
        return getattr(self.inner, name)

    def discover(self) -> Sequence[DeviceInfo]:
        infos = self.inner.discover()
        for info in infos:
            self._keys[info.gpu] = self._exporter_key(info)
        error = self.reader.read_once()  # once before the first cycle, so the first samples are joined
        if error is not None:
            log.warning("dcgm-exporter %s: %s; samples are NVML's alone until it answers", self.reader.url, error)
        refused = self.reader.status().refused
        if refused:  # said once here; the reader itself says nothing per read
            log.warning("dcgm-exporter %s lists more than %d GPUs and MIG instances: %d past them are not read (%s); "
                        "is the URL this node's exporter?", self.reader.url, self.reader.max_gpus, len(refused),
                        listed(refused, 4))
        self.reader.start()
        return infos

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

    def sample(self, gpu: str, now: float) -> GpuSample:
        sample = self.inner.sample(gpu, now)
        key = self._keys.get(gpu)
        if key is None:
            self._remember(gpu, JoinState(None, "NVML gave no UUID to match", self._nvml_sources(sample)))
            return sample
        record, problem = self.reader.lookup_uuid(key[0], key[1], now)
        if record is None:
            self._remember(gpu, JoinState(key, problem, self._nvml_sources(sample)))
            return sample
        theirs = sample_values(record)
        nvml_profiled = sample.sm_active is not None  # GPM answered this interval
        updates: dict[str, Any] = {}
        for name, value in theirs.items():
            if name in _NEVER or value is None:
                continue
            if (name in PROFILING_FIELDS and not nvml_profiled) or getattr(sample, name) is None:
                updates[name] = value
        joined = dataclasses.replace(sample, **updates) if updates else sample
        sources = self._nvml_sources(joined)
        sources.update({name: SOURCE for name in updates})
        self._remember(gpu, JoinState(key, None, sources))
        return joined

    @staticmethod
    def _nvml_sources(sample: GpuSample) -> dict[str, str]:
        return {name: "nvml" for name in sorted(COUNTER_FIELDS) if getattr(sample, name) is not None}

    def _remember(self, gpu: str, state: JoinState) -> None:
        with self._lock:
            self._states[gpu] = state

    def counter_sources(self, gpu: str) -> dict[str, str]:
        """Which source gave each field of GPU ``gpu``'s latest sample."""
        with self._lock:
            state = self._states.get(gpu)
        return dict(state.sources) if state is not None else {}

    def join_state(self, gpu: str) -> JoinState | None:
        with self._lock:
            return self._states.get(gpu)

    def source_states(self, now: float) -> tuple[SourceState, ...]:
        """The NVML side's sources, and the exporter's own state."""
        inner = getattr(self.inner, "source_states", None)
        return (*(inner(now) if inner is not None else ()), self.reader.source_state(now))

    def close(self) -> None:
        self.reader.close()
        self.inner.close()
