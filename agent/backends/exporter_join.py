"""A vendor library's backend whose samples a node exporter completes: what the NVML + dcgm-exporter join
(:mod:`agent.backends.dcgm_exporter.join`) and the amdsmi + Device Metrics Exporter join
(:mod:`agent.backends.amd_exporter.join`) share.

Every sample is the wrapped backend's, read as always; the exporter's latest record for the same
device (each join says how it matches) then fills the fields the join's :meth:`ExporterJoin.updates`
picks. The exporter is read in the background by the shared reader
(:mod:`agent.backends.exporter_reader`); when its values are refused (down, stale, frozen) or the device
is not in its exposition, the samples are the library's alone and the reason is kept for ``doctor``.
Everything not about the join (devices, events, the library handles ``doctor`` probes) is the wrapped
backend's.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Any, Hashable, Mapping, Sequence

from agent.backends.exporter_reader import ExporterReader, listed
from agent.model import DeviceInfo, GpuSample, SourceState

log = logging.getLogger("roofwatch.exporter")


@dataclasses.dataclass(frozen=True, slots=True)
class JoinState:
    """How one GPU's join went at its latest sample, for ``doctor``."""

    key: Any
    """What the exporter is asked for (the join's match key); None when the library gave nothing to match."""
    problem: str | None
    """Why the exporter's values were not used, or None when they were."""
    sources: dict[str, str]
    """Sample field -> the library's source name or the exporter's."""


class ExporterJoin:
    """A library backend whose samples an exporter completes; subclasses say how devices match and which
    fields the exporter gives."""

    own: str = "library"
    """The wrapped backend's source name in :meth:`counter_sources`."""
    source: str = "exporter"
    """The exporter's source name."""
    fields: frozenset[str] = frozenset()
    """The sample fields whose source :meth:`counter_sources` names."""
    no_key = "the library gave nothing to match"

    def __init__(self, inner: Any, reader: ExporterReader) -> None:
        self.inner = inner
        self.reader = reader
        self.name = inner.name
        self._keys: dict[str, Hashable | None] = {}
        self._states: dict[str, JoinState] = {}
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        """Everything not about the join is the wrapped backend's (devices, library handles, events, warm_samples)."""
        if name in ("inner", "reader"):
            raise AttributeError(name)
        return getattr(self.inner, name)

    # ------------------------------------------------------------------ what a join says

    def match_keys(self, infos: Sequence[DeviceInfo]) -> dict[str, Hashable | None]:
        """GPU -> what the exporter is asked for (None: no match possible)."""
        raise NotImplementedError

    def lookup(self, key: Any, now: float) -> tuple[Any | None, str | None]:
        """(record, None) when the exporter has fresh values for ``key``, else (None, why not)."""
        raise NotImplementedError

    def updates(self, gpu: str, sample: GpuSample, record: Any, now: float) -> dict[str, Any]:
        """The fields the exporter's ``record`` sets on the library's ``sample``."""
        raise NotImplementedError

    # ------------------------------------------------------------------ Backend protocol

    def discover(self) -> Sequence[DeviceInfo]:
        infos = self.inner.discover()
        error = self.reader.read_once()  # once before the first cycle, so the first samples are joined
        if error is not None:
            log.warning("%s %s: %s; samples are %s's alone until it answers", self.source, self.reader.url, error,
                        self.own)
        self._keys.update(self.match_keys(infos))
        refused = self.reader.status().refused
        if refused:  # said once here; the reader itself says nothing per read
            log.warning("%s %s lists more than %d devices: %d past them are not read (%s); is the URL this "
                        "node's exporter?", self.source, self.reader.url, self.reader.max_gpus, len(refused),
                        listed(refused, 4))
        self.reader.start()
        return infos

    def sample(self, gpu: str, now: float) -> GpuSample:
        sample = self.inner.sample(gpu, now)
        key = self._keys.get(gpu)
        if key is None:
            self._remember(gpu, JoinState(None, self.no_key, self._own_sources(sample)))
            return sample
        record, problem = self.lookup(key, now)
        if record is None:
            self._remember(gpu, JoinState(key, problem, self._own_sources(sample)))
            return sample
        updates = self.updates(gpu, sample, record, now)
        joined = dataclasses.replace(sample, **updates) if updates else sample
        sources = self._own_sources(joined)
        sources.update({name: self.source for name in updates})
        self._remember(gpu, JoinState(key, None, sources))
        return joined

    def _own_sources(self, sample: GpuSample) -> dict[str, str]:
        return {name: self.own for name in sorted(self.fields) if getattr(sample, name) is not None}

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

    def join_keys(self) -> Mapping[str, Hashable | None]:
        return dict(self._keys)

    def source_states(self, now: float) -> tuple[SourceState, ...]:
        """The wrapped backend's sources, and the exporter's own state."""
        inner = getattr(self.inner, "source_states", None)
        return (*(inner(now) if inner is not None else ()), self.reader.source_state(now))

    def close(self) -> None:
        self.reader.close()
        self.inner.close()
