"""Reading an exporter's ``/metrics`` in the background, and judging whether what it says is still true.

Shared by dcgm-exporter (:mod:`agent.backends.dcgm_exporter`) and AMD's Device Metrics Exporter
(:mod:`agent.backends.amd_exporter`): a :class:`Dialect` names the exporter, its parser and the
energy and power fields of rule 4. The rules below are worded for dcgm-exporter; the AMD exporter's
differ only in its fields (``gpu_energy_consumed`` in uJ, ``gpu_package_power`` in W) and its refresh
(gpuagent's answers are cached 15 s: docs/amd.md).

:class:`ExporterReader` GETs the URL every ``interval_s`` in a daemon thread (a deadline for the
whole body, at most ``max_bytes``, proxies ignored: the inference scraper's fetch) and keeps the
latest records. Backends ask it from memory (:meth:`ExporterReader.lookup`), so a collection
cycle never waits on the exporter.

Lines the dialect's parser skips (unreadable, an index label that is no index, a value that cannot be
converted) are counted, the first named, in :meth:`ExporterReader.status` (``doctor`` shows both) and
logged once when an episode of them starts, not once per read.

**When the values stop counting** (the rule, documented in docs/nvidia.md). A GPU's record is
refused, with the reason, when:

1. the last read failed (refused, timed out, HTTP error, too large, not an exposition): the
   exporter is down, and all its GPUs with it;
2. the last good read is older than ``stale_s`` (reads have been failing since);
3. the exporter's own sample timestamps, where lines carry them, are ``stale_s`` older than the read;
4. the GPU's energy counter (``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION``, mJ) has not moved for
   ``stale_s`` while the same exposition says it draws power. A powered GPU adds at least
   1,000 mJ a second, so the counter moves at every DCGM refresh (30 s by default); when it
   does not, DCGM's watches have stopped (a hung or restarted host engine) and the exporter
   serves its last values forever. Without an energy counter (MIG instances, a CSV without it)
   frozen values cannot be told from an idle GPU, and only rules 1-3 apply;
5. the GPU is not in the latest exposition (an exporter restarted with fewer GPUs, a GPU lost).

A counter that goes backwards (energy, after a driver reload or an exporter on another node)
restarts the energy watch; the collector already adds nothing for a step back. XIDs: dcgm-exporter
exports only the *last* XID per GPU, so an event is counted when that value changes to another
non-zero code; the same XID twice in a row is one event, and the code seen at the first read
(from before the agent started) is not counted.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from agent.backends.exposition_text import ExporterFormatError, Exposition
from agent.context.workload.inference.fetch import HttpStatus, ResponseTooLarge, describe_error, http_fetch
from agent.model import SourceState, XidCount
from agent.model.redact import hide

log = logging.getLogger("roofwatch.exporter")

MAX_GPUS = 1024
"""GPUs (and MIG instances or partitions) kept from one body: the upper bound of ``max_devices``."""

DEFAULT_MAX_BYTES = 16 * 1024 * 1024
"""An 8-GPU node with every profiling field and pod labels is about 200 KiB; MIG multiplies it by 7."""
Fetch = Callable[[str, float, int], bytes]
"""(url, timeout_s, max_bytes) -> body; raises on any failure."""

@dataclass(frozen=True, slots=True)
class Dialect:
    """Which exporter a reader reads: its name in messages, its parser, and the fields of rule 4."""

    source: str
    parse: Callable[..., Exposition]
    """(text, max_gpus=...) -> :class:`Exposition`; raises ExporterFormatError on a body not its exporter's."""
    energy: str
    power: str
    no_gpu: str
    stopped: str
    """Why a powered GPU's energy counter that does not move means the exporter stopped updating."""


@dataclass(slots=True)
class _Energy:
    value: float
    changed_at: float


@dataclass(frozen=True, slots=True)
class ReaderStatus:
    """How reading the exporter goes, for ``doctor``."""

    url: str
    up: bool
    error: str | None
    last_success_ts: float | None
    reads_total: int
    failures_total: int
    gpus: tuple[str, ...]
    """GPU keys in the latest good exposition."""
    skipped_lines: int
    first_bad_line: str | None
    refused: tuple[str, ...] = ()
    """GPU keys the latest good exposition lists past the reader's ``max_gpus``."""
    units: tuple[str, ...] = ()
    """Families of the latest good exposition read in another unit than their field's, each with why."""
    notes: tuple[str, ...] = ()
    """What the latest good exposition says about itself (AMD: naming release, prefix, profiler state)."""


def listed(keys: "list[str] | tuple[str, ...]", most: int = 16) -> str:
    """GPU keys for a log line or an error: the first ``most``, then how many more (never 10,000 names)."""
    shown = ", ".join(keys[:most])
    return shown + (f" and {len(keys) - most} more" if len(keys) > most else "") if keys else "none"


@dataclass(slots=True)
class _State:
    records: dict[str, Any] = field(default_factory=dict)
    by_uuid: dict[tuple[str | None, str | None], Any] = field(default_factory=dict)
    refused: tuple[str, ...] = ()
    read_at: float | None = None
    error: str | None = "not read yet"
    reads: int = 0
    failures: int = 0
    skipped: int = 0
    first_bad: str | None = None
    units: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    energy: dict[str, _Energy] = field(default_factory=dict)
    xid_last: dict[str, int] = field(default_factory=dict)
    xids: dict[str, dict[int, XidCount]] = field(default_factory=dict)


class ExporterReader:
    """One exporter endpoint, read in the background and answered from memory."""

    def __init__(self, url: str, *, interval_s: float = 5.0, timeout_s: float = 2.0, stale_s: float = 120.0,
                 max_bytes: int = DEFAULT_MAX_BYTES, fetch: Fetch | None = None,
                 clock: Callable[[], float] = time.time, max_gpus: int = MAX_GPUS, dialect: Dialect) -> None:
        if interval_s <= 0 or timeout_s <= 0 or stale_s <= 0 or max_bytes < 1 or max_gpus < 1:
            raise ValueError("interval_s, timeout_s, stale_s, max_bytes and max_gpus must be positive")
        self.url, self.max_gpus, self.dialect = url, max_gpus, dialect
        self.source = dialect.source
        self.log = logging.getLogger("roofwatch." + dialect.source.replace("-", "_"))
        self.interval_s, self.timeout_s, self.stale_s, self.max_bytes = interval_s, timeout_s, stale_s, max_bytes
        self._fetch = fetch or http_fetch
        self._clock = clock
        self._state = _State()
        self.refused_status: int | None = None
        """401 or 403 when the last read was refused for its credentials (a configuration error, not a late
        exporter: the start does not wait for it); None otherwise."""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ the background read

    def start(self) -> None:
        """Read every ``interval_s`` in a daemon thread (idempotent)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"roofwatch-{self.source}", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s + 1.0)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.read_once()
            except Exception:  # a bug here must not end the thread for good
                self.log.exception("%s read failed", self.source)

    def get(self, url: str, max_bytes: int | None = None) -> bytes:
        """GET another path of the same exporter (AMD's ``/gpumetrics``) with this reader's fetch and deadline, and
        its size cap or the smaller ``max_bytes`` (what that path needs); raises on any failure. Blocking: only from
        set-up or a background thread, never a collection cycle."""
        return self._fetch(url, self.timeout_s, min(self.max_bytes, max_bytes or self.max_bytes))

    def read_once(self, now: float | None = None) -> str | None:
        """Read the exporter once; returns the error, or None when the read was good."""
        try:
            body = self._fetch(self.url, self.timeout_s, self.max_bytes)
            arrived = now if now is not None else self._clock()
            parsed = self.dialect.parse(body.decode("utf-8", errors="replace"), max_gpus=self.max_gpus)
            del body
            records = parsed.records
            if not records:
                raise ExporterFormatError(self.dialect.no_gpu)
        except (ExporterFormatError, ResponseTooLarge) as exc:
            self.refused_status = None
            return self._failed(str(exc))
        except Exception as exc:  # refused, timed out, HTTP error, reset: one line naming the cause
            self.refused_status = exc.code if isinstance(exc, HttpStatus) and exc.code in (401, 403) else None
            return self._failed(describe_error(exc, self.timeout_s))
        self.refused_status = None
        with self._lock:
            state = self._state
            skipped_before = state.skipped
            if state.error is not None and state.reads:
                self.log.info("%s %s answers again (%d GPUs)", self.source, self.url, len(records))
            for key, record in records.items():
                self._watch_energy(state, key, record, arrived, self.dialect.energy)
                self._count_xid(state, key, record, arrived)
            gone = [key for key in state.records if key not in records]
            if gone and state.records:
                self.log.warning("%s %s no longer lists GPU(s) %s", self.source, self.url, listed(gone))
            state.records, state.read_at, state.error = records, arrived, None
            state.by_uuid = {(r.uuid, r.instance): r for r in reversed(records.values())}
            state.skipped, state.first_bad, state.refused = parsed.skipped, parsed.first_bad, parsed.refused
            state.units, state.notes = parsed.units, parsed.notes
            state.reads += 1
        if parsed.skipped and not skipped_before:  # once per episode of unreadable lines, not once per read
            self.log.warning("%s %s: %d unreadable line(s) skipped, the rest read; first %s", self.source, self.url,
                             parsed.skipped, parsed.first_bad)
        return None

    def _failed(self, error: str) -> str:
        error = hide(error)  # a server's reason phrase may quote the URL's token: it becomes the source's detail
        with self._lock:
            state = self._state
            if state.error is None or state.reads == 0:
                self.log.warning("%s %s unusable: %s", self.source, self.url, error)
            state.error = error
            state.reads += 1
            state.failures += 1
        return error

    @staticmethod
    def _watch_energy(state: _State, key: str, record: Any, arrived: float, energy: str) -> None:
        value = record.values.get(energy)
        if value is None:
            state.energy.pop(key, None)
            return
        seen = state.energy.get(key)
        if seen is None or value != seen.value:
            if seen is not None and value < seen.value:
                log.info("exporter GPU %s: energy counter went back (driver reloaded?)", key)
            state.energy[key] = _Energy(value, arrived)

    @staticmethod
    def _count_xid(state: _State, key: str, record: Any, arrived: float) -> None:
        code = record.xid or 0
        previous = state.xid_last.get(key)
        state.xid_last[key] = code
        if previous is None or code == previous or code == 0:
            return
        counts = state.xids.setdefault(key, {})
        old = counts.get(code)
        counts[code] = XidCount(xid=code, count=(old.count + 1) if old else 1, last_ts=arrived)

    # ------------------------------------------------------------------ answers from memory

    def lookup(self, key: str, now: float) -> tuple[Any | None, str | None]:
        """(record, None) when GPU ``key``'s values are fresh, else (None, why not)."""
        with self._lock:
            state = self._state
            return self._judge(state, state.records.get(key), key, now)

    def lookup_uuid(self, uuid: str, instance: str | None, now: float) -> tuple[Any | None, str | None]:
        """The same, found by the physical GPU's UUID (and MIG GPU instance id): how the NVML join matches."""
        with self._lock:
            state = self._state
            record = state.by_uuid.get((uuid, instance))
            return self._judge(state, record, f"{uuid}" + (f" instance {instance}" if instance else ""), now)

    def find(self, select: Callable[[dict[str, Any]], Any | None], what: str,
             now: float) -> tuple[Any | None, str | None]:
        """The same, for the record ``select`` picks from the latest exposition's records (by key):
        how the amdsmi join matches on serial number and partition."""
        with self._lock:
            state = self._state
            return self._judge(state, select(state.records), what, now)

    def _judge(self, state: _State, record: Any | None, what: str,
               now: float) -> tuple[Any | None, str | None]:
        if state.error is not None:
            return None, f"{self.source} {self.url}: {state.error}"
        assert state.read_at is not None
        age = now - state.read_at
        if age > self.stale_s:
            return None, f"{self.source} {self.url}: last good read {age:.0f} s ago (stale after {self.stale_s:g} s)"
        if record is None:
            return None, (f"GPU {what} is not in {self.source}'s exposition ({len(state.records)} GPU(s) listed: "
                          f"{listed(list(state.records))})")
        if record.newest_ts_s is not None and state.read_at - record.newest_ts_s > self.stale_s:
            return None, (f"{self.source}'s own timestamps for GPU {record.key} are "
                          f"{state.read_at - record.newest_ts_s:.0f} s old (stale after {self.stale_s:g} s)")
        energy = state.energy.get(record.key)
        power = record.values.get(self.dialect.power)
        frozen_s = state.read_at - energy.changed_at if energy is not None else 0.0
        if power is not None and power >= 1.0 and frozen_s > self.stale_s:
            return None, (f"{self.source} serves GPU {record.key}'s energy counter unchanged for "
                          f"{frozen_s:.0f} s while it draws {power:.0f} W: {self.dialect.stopped}; restart the exporter")
        return record, None

    def records(self) -> dict[str, Any]:
        """The latest good exposition's records (also while the exporter is down)."""
        with self._lock:
            return dict(self._state.records)

    def xids(self, key: str) -> tuple[XidCount, ...]:
        with self._lock:
            return tuple(sorted(self._state.xids.get(key, {}).values(), key=lambda x: x.xid))

    def source_state(self, now: float) -> SourceState:
        """``dcgm-exporter``: down when its last read failed (its earlier values serve until they are
        ``stale_s`` old), stale when the last good read is older than that, else up."""
        with self._lock:
            s = self._state
            if s.error is not None or s.read_at is None:
                return SourceState(self.source, "down", s.error)
            if now - s.read_at > self.stale_s:
                return SourceState(self.source, "stale", f"last good read {now - s.read_at:.0f} s ago")
            return SourceState(self.source, "up")

    def status(self) -> ReaderStatus:
        with self._lock:
            s = self._state
            return ReaderStatus(url=self.url, up=s.error is None, error=s.error, last_success_ts=s.read_at,
                                reads_total=s.reads, failures_total=s.failures, gpus=tuple(s.records),
                                skipped_lines=s.skipped, first_bad_line=s.first_bad, refused=s.refused,
                                units=s.units, notes=s.notes)
