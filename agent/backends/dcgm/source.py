"""DcgmSource: DCGM's profiling fields for some GPUs, read from an nv-hostengine or an embedded DCGM.

Start-up: load libdcgm through the bindings (``dcgm_structs._dcgmInit``, ``dcgm_agent.dcgmInit``),
connect (``dcgmConnect_v2`` to ``host[:port]``, default port 5555, or a ``unix:`` socket; it exists
in DCGM 3 and every 4.x, unlike ``dcgmConnect_v3`` which came in 4.5) or start DCGM inside the
agent (``dcgmStartEmbedded``, host ``embedded``), map DCGM's GPU ids to UUIDs
(``dcgmGetDeviceAttributes``), ask each GPU which profiling fields it has
(``dcgmProfGetSupportedMetricGroups``), put the GPUs that have some in a group, and watch the
fields at the agent's interval (``dcgmWatchFields``: update period in microseconds, keep age in
seconds, keep count).

Each read is ``dcgmEntityGetLatestValues`` for one GPU: every value carries its own status, so a
lost GPU or a field without data costs that GPU or field only. Blank values (profiling paused by
``dcgmi profile --pause``, or Nsight/CUPTI holding the perfmon counters that DCGM profiling shares
before Hopper) are unknown, never zero, and reported as "paused or unavailable". A lost connection
(nv-hostengine restarted or stopped) is re-established with back-off; the group and watches are
created again, and values return after the first update interval.

Where the host engine offers DCGM 4.6's cumulative counters (1084-1096), they are watched too, and the activity
between two reads is Δactive / Δelapsed over that span (agent.backends.cumulative), which wins over the sampled
ratio of the same field; the fields it gave are named in :attr:`ProfilingRead.counted`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

from agent.backends.base import BackendUnavailable, DeviceLostError, Meaning
from agent.backends.cumulative import CounterWindows, Totals
from agent.backends.dcgm.bindings import DcgmModules
from agent.backends.dcgm.errors import describe, describe_code, meaning, meaning_of_code
from agent.backends.dcgm.fields import BLANK, CUMULATIVE, CUMULATIVE_ELAPSED, FIELDS, NAMES, decode, sample_value
from agent.backends.profiling import ProfilingRead
from agent.model import DeviceInfo

log = logging.getLogger("roofwatch.dcgm")

PAUSED_REASON = ("DCGM profiling paused or unavailable: every profiling field reads blank (`dcgmi profile --pause` "
                 "is in force, or Nsight Systems/Compute or another CUPTI profiler holds the GPU's profiling counters)")
MIN_UPDATE_US = 100_000
"""roofwatch never asks DCGM for profiling updates more often than every 100 ms."""
BACKOFF_S = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
STALE_PERIODS = 5
"""A value older than this many update periods (at least 10 s) is stale: the engine stopped updating."""


@dataclass(slots=True)
class GpuState:
    """What DCGM offers for one GPU, and why the rest is missing (doctor reads this)."""

    uuid: str
    gpu_id: int | None = None
    fields: tuple[int, ...] = ()
    absent: dict[str, str] = field(default_factory=dict)
    paused: bool = False


class DcgmSource:
    """Profiling fields of the given GPUs, through one DCGM connection shared by all reads."""

    def __init__(self, modules: DcgmModules, devices: Iterable[DeviceInfo], *, host: str = "localhost:5555",
                 interval_s: float = 1.0, wall: Callable[[], float] = time.time,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """Connects and starts the watches; BackendUnavailable (one line, with the fix) when it cannot."""
        self.m = modules
        self.host = host
        self.update_us = max(MIN_UPDATE_US, int(interval_s * 1e6))
        self._wall, self._clock = wall, clock
        self._lock = threading.Lock()
        self.gpus: dict[str, GpuState] = {d.uuid: GpuState(d.uuid) for d in devices}
        self.handle = None
        self.version: str | None = None
        self.reconnects = 0
        self.lost_reason: str | None = None
        self._failures = 0
        self._retry_at = 0.0
        self._group = self._field_group = None
        self._closed = False
        self.windows = CounterWindows()
        """Each GPU's cumulative counters (by UUID) at the latest read."""
        self._init()
        try:
            self._connect()
            self._setup()
        except self.m.structs.DCGMError as exc:
            self._disconnect()
            raise BackendUnavailable(f"DCGM: setting up the profiling watches failed: {describe(exc)}") from None

    # ------------------------------------------------------------------ start-up

    def _init(self) -> None:
        structs, agent = self.m.structs, self.m.agent
        try:
            structs._dcgmInit()
            agent.dcgmInit()
        except structs.DCGMError as exc:
            major = getattr(structs, "DCGM_MAJOR_VERSION", None)
            soname = f"libdcgm.so.{major}" if major else "libdcgm.so"
            if getattr(exc, "value", None) == structs.DCGM_ST_LIBRARY_NOT_FOUND:
                raise BackendUnavailable(f"DCGM: the bindings in {self.m.path} found no {soname} (searched "
                                         "LD_LIBRARY_PATH, /usr/lib/<arch>-linux-gnu, /usr/lib64); install the DCGM "
                                         "package of the same major version as the bindings") from None
            raise BackendUnavailable(f"DCGM: initialisation failed: {describe(exc)}") from None
        try:
            self.version = str(agent.dcgmVersionInfo().rawBuildInfoString)
        except (structs.DCGMError, AttributeError):
            self.version = None

    def _connect(self) -> None:
        structs, agent = self.m.structs, self.m.agent
        if self.host == "embedded":
            self.handle = agent.dcgmStartEmbedded(structs.DCGM_OPERATION_MODE_AUTO)
            return
        params = structs.c_dcgmConnectV2Params_v2()
        params.persistAfterDisconnect = 0
        params.timeoutMs = 2000
        address = self.host
        if address.startswith("unix:"):
            params.addressIsUnixSocket = 1
            address = address[len("unix:"):].removeprefix("//")
        try:
            self.handle = agent.dcgmConnect_v2(address, params, structs.c_dcgmConnectV2Params_version2)
        except structs.DCGMError as exc:
            if meaning(exc) is Meaning.LIBRARY:
                raise BackendUnavailable(
                    f"DCGM: no host engine answers at {self.host} ({describe(exc)}); start it (`systemctl start "
                    "nvidia-dcgm`, or run nv-hostengine) or set dcgm_host (\"embedded\" runs DCGM inside the agent, "
                    "which needs root for profiling)") from None
            raise

    def _setup(self) -> None:
        """Map GPUs, probe their fields, create the group and field group, start the watches."""
        structs, agent = self.m.structs, self.m.agent
        by_uuid = {}
        for gpu_id in agent.dcgmGetAllSupportedDevices(self.handle):
            ident = agent.dcgmGetDeviceAttributes(self.handle, gpu_id).identifiers
            uuid = ident.uuid.decode() if isinstance(ident.uuid, bytes) else str(ident.uuid)
            by_uuid[uuid] = gpu_id
        watched: list[GpuState] = []
        for state in self.gpus.values():
            state.gpu_id, state.fields = by_uuid.get(state.uuid), ()
            state.absent.pop("profiling", None)
            if state.gpu_id is None:
                state.absent["profiling"] = "DCGM does not list this GPU (not supported by this DCGM release?)"
                continue
            try:
                groups = agent.dcgmProfGetSupportedMetricGroups(self.handle, state.gpu_id)
            except structs.DCGMError as exc:
                state.absent["profiling"] = describe(exc)
                continue
            offered = {int(g.fieldIds[j]) for g in groups.metricGroups[: groups.numMetricGroups]
                       for j in range(g.numFieldIds)}
            state.fields = tuple(f for f in (*FIELDS, *CUMULATIVE) if f in offered)
            counted = {CUMULATIVE[f][1] for f in offered if f in CUMULATIVE} if CUMULATIVE_ELAPSED in offered else set()
            for fid in FIELDS:
                if fid not in offered and FIELDS[fid] not in counted:
                    state.absent[NAMES[fid]] = "not offered by DCGM on this GPU"
            if state.fields:
                watched.append(state)
        if not watched:
            return
        name = f"roofwatch-{os.getpid()}"
        self._group = agent.dcgmGroupCreate(self.handle, structs.DCGM_GROUP_EMPTY, name)
        for state in watched:
            agent.dcgmGroupAddDevice(self.handle, self._group, state.gpu_id)
        ids = sorted({f for s in watched for f in s.fields})
        self._field_group = agent.dcgmFieldGroupCreate(self.handle, ids, name)
        keep_age = max(30.0, 10 * self.update_us / 1e6)
        try:
            agent.dcgmWatchFields(self.handle, self._group, self._field_group, self.update_us, keep_age, 8)
        except structs.DCGMError as exc:
            if meaning(exc) is not Meaning.ABSENT:
                raise
            for state in watched:
                state.absent["profiling"], state.fields = describe(exc), ()

    # ------------------------------------------------------------------ reading

    def read(self, uuid: str, now: float) -> ProfilingRead:
        """The latest values of one GPU; DeviceLostError when DCGM reports the GPU lost."""
        state = self.gpus.get(uuid)
        if state is None:
            return ProfilingRead(reason="DCGM: not asked to read this GPU")
        with self._lock:
            if self._closed:
                return ProfilingRead(reason="DCGM source closed")
            if self.handle is None and not self._reconnect():
                return ProfilingRead(reason=f"DCGM: {self.lost_reason}; retrying")
            if not state.fields:
                return ProfilingRead(reason=f"DCGM: {state.absent.get('profiling', 'no profiling fields')}")
            try:
                raw = self.m.agent.dcgmEntityGetLatestValues(self.handle, self.m.fields.DCGM_FE_GPU, state.gpu_id,
                                                             list(state.fields))
            except self.m.structs.DCGMError as exc:
                if meaning(exc) is Meaning.LIBRARY:
                    self._lost(describe(exc))
                    return ProfilingRead(reason=f"DCGM: {self.lost_reason}; retrying")
                return ProfilingRead(reason=f"DCGM: read failed: {describe(exc)}")
        return self._decode(state, raw, now)

    def _decode(self, state: GpuState, raw: object, now: float) -> ProfilingRead:
        values: dict[str, float | None] = {}
        totals: dict[int, float] = {}
        blanks = waiting = stale = 0
        oldest_ok = now - max(10.0, STALE_PERIODS * self.update_us / 1e6)
        for fv in raw:  # type: ignore[attr-defined]
            fid = int(fv.fieldId)
            if fid in CUMULATIVE:
                if fv.status == 0 and (value := decode(fv, self.m.value)) is not BLANK and fv.ts / 1e6 >= oldest_ok:
                    totals[fid] = float(value)
                continue
            if fid not in FIELDS:
                continue
            values[FIELDS[fid]] = None
            if fv.status != 0:
                kind = meaning_of_code(fv.status)
                if kind is Meaning.DEVICE_LOST:
                    raise DeviceLostError(f"DCGM: GPU {state.gpu_id} ({state.uuid}): {describe_code(fv.status)}")
                waiting += kind is Meaning.NO_DATA
                continue
            value = decode(fv, self.m.value)
            if value is BLANK:
                blanks += 1
            elif fv.ts / 1e6 < oldest_ok:
                stale += 1
            else:
                values[FIELDS[fid]] = sample_value(fid, value)
        exact = self.windows.activity(state.uuid, _totals(totals))
        values.update(exact)
        counted = tuple(sorted(exact))
        state.paused = bool(values) and blanks == len(values) and not exact
        if state.paused:
            return ProfilingRead(values, reason=PAUSED_REASON, paused=True)
        if waiting:
            return ProfilingRead(values, reason="DCGM: waiting for the first profiling update", counted=counted)
        if stale:
            return ProfilingRead(values, reason="DCGM: profiling values are stale (the host engine stopped updating)",
                                 counted=counted)
        return ProfilingRead(values, counted=counted)

    # ------------------------------------------------------------------ connection loss


    def _lost(self, why: str) -> None:
        if self.handle is not None:
            log.warning("DCGM: %s; reconnecting with back-off", why)
        self.lost_reason = why
        self._disconnect()
        self._failures += 1
        self._retry_at = self._clock() + BACKOFF_S[min(self._failures, len(BACKOFF_S)) - 1]

    def _reconnect(self) -> bool:
        if self._clock() < self._retry_at:
            return False
        try:
            self._connect()
            self._setup()
        except (BackendUnavailable, self.m.structs.DCGMError) as exc:
            self._lost(str(exc) if isinstance(exc, BackendUnavailable) else describe(exc))
            return False
        self._failures, self.lost_reason = 0, None
        self.reconnects += 1
        log.info("DCGM: reconnected to %s; profiling watches restored", self.host)
        return True

    def _disconnect(self) -> None:
        handle, self.handle = self.handle, None
        self._group = self._field_group = None
        if handle is None:
            return
        agent = self.m.agent
        try:
            if self.host == "embedded":
                agent.dcgmStopEmbedded(handle)
            else:
                agent.dcgmDisconnect(handle)
        except self.m.structs.DCGMError:
            pass

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self.handle is not None and self._group is not None:
                try:
                    self.m.agent.dcgmFieldGroupDestroy(self.handle, self._field_group)
                    self.m.agent.dcgmGroupDestroy(self.handle, self._group)
                except self.m.structs.DCGMError:
                    pass
            self._disconnect()


def _totals(counts: dict[int, float]) -> Totals | None:
    """The cumulative counters of one read as :class:`Totals` (sample field -> active cycles); None without the
    elapsed cycles to divide by."""
    if CUMULATIVE_ELAPSED not in counts:
        return None
    return Totals(counts[CUMULATIVE_ELAPSED], {CUMULATIVE[f][1]: v for f, v in counts.items()  # type: ignore[misc]
                                               if CUMULATIVE[f][1] is not None})
