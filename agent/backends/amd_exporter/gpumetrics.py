"""DME's ``/gpumetrics``: each ``gpu_id``'s PCI address (BDF), for the join's fallback where board serials are missing.

DME's ``/metrics`` names a GPU by ``gpu_id`` and ``serial_number`` only; no release puts a PCI address on it
(docs/amd.md). Its ``/gpumetrics`` endpoint (DME 1.4.0 and later: ``v1.4.0:pkg/exporter/exporter.go:98``,
``v1.5.1:pkg/exporter/exporter.go:128``, path ``v1.5.1:pkg/exporter/globals/constants.go:69``) answers gpuagent's
``GPUGetResponse``, written by Go's ``encoding/json`` (``v1.5.1:pkg/exporter/metricsutil/metrics.go:112-134``), so
the names are the Go fields' ``json`` tags (``v1.5.1:pkg/amdgpu/gen/amdgpu/gpu.pb.go``), all ``omitempty``::

    {"Response": [{"Spec": {...}, "Status": {"Index": 3, "SerialNum": "...", "PCIeStatus": {"PCIeBusId": "0000:0C:00.0", ...},
                   "PartitionId": 5, ...}, "Stats": {...}}, ...]}

* ``Status.Index`` is what DME prints as ``gpu_id`` (``getGPUInstanceIDString``,
  ``v1.5.1:pkg/amdgpu/gpuagent/gpuagent_gpu_metrics.go:1825-1830``): gpuagent's position of the handle in amdsmi's
  processor list (ROCm/gpu-agent@52879d9 ``sw/nic/gpuagent/init.cc:152``, ``api/smi/amdsmi/smi_api.cc:754``).
  ``omitempty`` drops a zero, so a ``Status`` without ``Index`` is ``gpu_id`` 0.
* ``Status.PCIeStatus.PCIeBusId`` is amdsmi's BDF of that handle in upper case (``"%04X:%02X:%02X.%X"`` of
  ``amdsmi_get_gpu_bdf_id``, gpu-agent ``smi_api.cc:685-697``); DME lower-cases it wherever it prints it. Every
  partition is its own entry with its own BDF (the function number): DME finds a partition's physical GPU by
  cutting the function off (``v1.5.1:pkg/amdgpu/gpuagent/gpuagent_gpu.go:526-533``, ``pkg/exporter/utils/utils.go:87``).
* An entry with ``Status.GPUPartition`` (the children's keys) is the parent object gpuagent makes for a
  partitioned GPU (gpu-agent ``init.cc:80-105``): no handle of its own, no ``Index``. 1.4.x leaves it out of the
  answer (``v1.4.0:pkg/amdgpu/gpuagent/gpuagent.go:387-390``), 1.5.x passes everything through; it is skipped here.

:func:`parse_gpumetrics` turns a body into ``gpu_id -> BDF`` (``"0000:0c:00.0"``, lower case, with domain);
an entry without a usable ``Index`` or ``PCIeBusId`` is skipped, and a ``gpu_id`` or BDF listed twice is dropped
(it cannot say which is which). :class:`BdfWatch` reads it for the join at set-up and then on its own daemon
thread (never on a collection cycle), with the ``/metrics`` reader's fetch and deadline.

All the agent needs from the document is an index and an address per device, so it is read within caps sized for
that, not for ``/metrics``: at most :data:`MAX_BYTES` of body, decoded one entry at a time (each from at most
:data:`MAX_ENTRY_BYTES`), and at most ``max_devices`` GPU objects; a body past any of them is refused whole, in
one line naming why. Parsed whole, 15 MiB of ``{"Response": [{}, {}, ...]}`` took the agent from 62 to 443 MiB.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable
from urllib.parse import urlsplit, urlunsplit

from agent.backends.exporter_backend import MAX_DEVICES
from agent.backends.exporter_reader import ExporterReader
from agent.context.workload.inference.fetch import HttpStatus, ResponseTooLarge, describe_error

log = logging.getLogger("roofwatch.amd_exporter")

PATH = "/gpumetrics"
REFRESH_S = 300.0
"""A good map is re-read this often, and whenever the ``gpu_id`` set of ``/metrics`` changes."""
_BDF = re.compile(r"^(?:([0-9a-f]{1,8}):)?([0-9a-f]{1,2}):([0-9a-f]{1,2})\.([0-7])$")
_MAX_UINT32 = 2**32 - 1
MAX_BYTES = 4 * 1024 * 1024
"""A ``/gpumetrics`` body read at most. gpuagent answers one object per GPU and partition, a few KiB each (an
8 x MI300X node in CPX: 72 of them, well under 1 MiB); the ``/metrics`` cap (16 MiB) let 15 MiB of
``{"Response": [{}, {}, ...]}`` take the agent from 62 to 443 MiB, all of it to learn a few PCI addresses."""
MAX_ENTRY_BYTES = 256 * 1024
"""One entry (or other member) of the body decoded at most: each is decoded on its own from this much text."""
_DECODER = json.JSONDecoder()
_SPACE = re.compile(r"[ \t\n\r]*")


class GpuMetricsError(ValueError):
    """A ``/gpumetrics`` body that is not gpuagent's ``GPUGetResponse``."""


def normalise_bdf(text: Any) -> str | None:
    """``"0000:0C:00.0"`` or ``"0c:00.0"`` -> ``"0000:0c:00.0"``; None for anything that is not a BDF."""
    if not isinstance(text, str):
        return None
    match = _BDF.match(text.strip().lower())
    if match is None:
        return None
    domain, bus, device, function = match.groups()
    if int(device, 16) > 0x1F:
        return None
    return f"{int(domain or '0', 16):04x}:{int(bus, 16):02x}:{int(device, 16):02x}.{function}"


def gpumetrics_url(metrics_url: str) -> str:
    """The same exporter's ``/gpumetrics``: ``http://h:5000/metrics`` -> ``http://h:5000/gpumetrics`` (a proxy's
    prefix before ``/metrics`` kept; query and fragment dropped)."""
    parts = urlsplit(metrics_url)
    path = parts.path
    path = path[: -len("/metrics")] + PATH if path.endswith("/metrics") else PATH
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


@dataclass(frozen=True, slots=True)
class GpuMetrics:
    """What one ``/gpumetrics`` body says about the PCI addresses."""

    bdfs: dict[str, str]
    """``gpu_id`` -> BDF, for the entries that name both once."""
    skipped: int = 0
    """Entries without a usable ``Index`` or ``PCIeBusId``, or sharing one with another (parents not counted)."""
    first_skip: str | None = None


def _index(status: dict[str, Any]) -> int | None:
    value = status.get("Index", 0)  # omitempty: gpu_id 0 has no Index
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_UINT32:
        return None
    return value


class _Cursor:
    """A position in the body and the next JSON value from it, each value decoded on its own and from at most
    :data:`MAX_ENTRY_BYTES` of text: what a value costs is bounded by its cap, never by the body."""

    def __init__(self, text: str) -> None:
        self.text, self.pos = text, 0

    def where(self) -> str:
        line = self.text.count("\n", 0, self.pos) + 1
        column = self.pos - self.text.rfind("\n", 0, self.pos)
        return f"line {line}, column {column}"

    def broken(self) -> GpuMetricsError:
        return GpuMetricsError(f"not JSON ({self.where()}): not DME's /gpumetrics")

    def next_char(self) -> str:
        """The next character that is not white space (the position left on it); "" at the end."""
        self.pos = _SPACE.match(self.text, self.pos).end()
        return self.text[self.pos:self.pos + 1]

    def take(self, char: str) -> None:
        if self.next_char() != char:
            raise self.broken()
        self.pos += 1

    def value(self, what: str) -> Any:
        self.next_char()
        window = self.text[self.pos:self.pos + MAX_ENTRY_BYTES]
        try:
            value, end = _DECODER.raw_decode(window)
        except (ValueError, RecursionError):
            if len(window) == MAX_ENTRY_BYTES:
                raise GpuMetricsError(f"{what} is over {MAX_ENTRY_BYTES // 1024} KiB or not JSON ({self.where()}): "
                                      "not DME's /gpumetrics (an entry is a few KiB)") from None
            raise self.broken() from None
        self.pos += end
        return value


def _not_an_object(text: str) -> GpuMetricsError:
    """Why a body whose first value is no JSON object is refused (a small one is named by its type)."""
    if len(text) > MAX_ENTRY_BYTES:
        return GpuMetricsError("not a JSON object: not gpuagent's GPUGetResponse")
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        where = f" (line {exc.lineno}, column {exc.colno})" if isinstance(exc, json.JSONDecodeError) else ""
        return GpuMetricsError(f"not JSON{where}: not DME's /gpumetrics")
    return GpuMetricsError(f"a JSON {type(doc).__name__}, not gpuagent's GPUGetResponse object")


class _Entries:
    """The ``Response`` entries as they are decoded: ``gpu_id`` -> BDF pairs, skips, and the bound on entries."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self.found: list[tuple[str, str]] = []
        self.skips: list[str] = []
        self.listed = self.parents = 0

    def add(self, n: int, entry: Any) -> None:
        status = entry.get("Status") if isinstance(entry, dict) else None
        parent = isinstance(status, dict) and bool(status.get("GPUPartition"))
        self.parents += parent  # a partitioned GPU's parent object: its partitions are listed themselves
        self.listed += not parent
        if max(self.listed, self.parents) > self.max_entries:
            raise GpuMetricsError(f"more than {self.max_entries} GPU entries (max_devices): not one node's gpuagent")
        if parent:
            return
        if not isinstance(status, dict):
            self.skips.append(f"entry {n}: no Status")
            return
        index = _index(status)
        pcie = status.get("PCIeStatus")
        bdf = normalise_bdf(pcie.get("PCIeBusId")) if isinstance(pcie, dict) else None
        if index is None or bdf is None:
            self.skips.append(f"entry {n}: " + ("Index is not a gpu_id" if index is None else "no PCIeBusId"))
            return
        self.found.append((str(index), bdf))

    def result(self) -> GpuMetrics:
        counts = Counter(g for g, _ in self.found) + Counter(b for _, b in self.found)  # no gpu_id looks like a BDF
        shared = sorted(key for key, n in counts.items() if n > 1)
        if shared:
            self.skips.append("a gpu_id or BDF listed twice: " + ", ".join(shared[:4]))
        bdfs = {g: b for g, b in self.found if g not in shared and b not in shared}
        return GpuMetrics(bdfs, self.listed - len(bdfs), self.skips[0] if self.skips else None)


def _response(cursor: _Cursor, entries: _Entries) -> None:
    """Decode the ``Response`` list one entry at a time (the cursor on its ``[``)."""
    cursor.take("[")
    if cursor.next_char() == "]":
        cursor.pos += 1
        return
    n = 0
    while True:
        entries.add(n, cursor.value(f"entry {n}"))
        n += 1
        char = cursor.next_char()
        cursor.pos += 1
        if char == "]":
            return
        if char != ",":
            raise cursor.broken()


def parse_gpumetrics(text: str, max_entries: int = MAX_DEVICES) -> GpuMetrics:
    """``gpu_id`` -> BDF from a ``/gpumetrics`` body; raises :class:`GpuMetricsError` on a body that is not one,
    or that lists more than ``max_entries`` GPU objects (or parents of partitioned GPUs). Streamed: the top-level
    object's members and the ``Response`` entries are decoded one at a time, each from at most
    :data:`MAX_ENTRY_BYTES`, so the entries past the bound are never decoded and a body of tiny entries
    (``{"Response": [{}, {}, ...]}``) costs no more than one of them."""
    cursor = _Cursor(text)
    if cursor.next_char() != "{":
        raise _not_an_object(text)
    cursor.pos += 1
    entries, api_status, response = _Entries(max_entries), None, False
    char = cursor.next_char()
    while char != "}":
        key = cursor.value("a member name")
        if not isinstance(key, str):
            raise cursor.broken()
        cursor.take(":")
        if key != "Response":
            value = cursor.value(f"member {ascii(key[:32])}")
            api_status = value if key == "ApiStatus" else api_status
        elif response:
            raise GpuMetricsError("Response listed twice: not gpuagent's GPUGetResponse")
        elif cursor.next_char() != "[":
            raise GpuMetricsError("Response is not a list: not gpuagent's GPUGetResponse")
        else:
            response = True
            _response(cursor, entries)
        char = cursor.next_char()
        if char not in (",", "}"):
            raise cursor.broken()
        cursor.pos += char == ","
    cursor.pos += 1
    if cursor.next_char():
        raise GpuMetricsError(f"not JSON ({cursor.where()}): extra data after the object: not DME's /gpumetrics")
    if not entries.listed and api_status:  # omitempty: no GPUs, no Response key
        raise GpuMetricsError(f"gpuagent answered ApiStatus {str(api_status)[:32]} and no GPU")
    return entries.result()


def read_gpumetrics(get: Callable[[str], bytes], url: str, timeout_s: float,
                    max_entries: int = MAX_DEVICES) -> tuple[GpuMetrics | None, str | None]:
    """(map, None), or (None, one line saying why not): GET ``url`` with ``get`` (bounded by its caller: deadline
    and :data:`MAX_BYTES`)."""
    try:
        body = get(url)
        return parse_gpumetrics(body.decode("utf-8", errors="replace"), max_entries), None
    except (GpuMetricsError, ResponseTooLarge) as exc:
        return None, str(exc)
    except HttpStatus as exc:
        if exc.code == 404:
            return None, "HTTP 404: no /gpumetrics (the Device Metrics Exporter has it from 1.4.0)"
        return None, describe_error(exc, timeout_s)
    except Exception as exc:  # noqa: BLE001 - refused, timed out, reset: one line naming the cause
        return None, describe_error(exc, timeout_s)


class BdfWatch:
    """``gpu_id`` -> BDF from the exporter's ``/gpumetrics``, read only while ``needed()`` says the join falls back:
    once at set-up (:meth:`read_once`), then on a daemon thread whenever the ``gpu_id`` set of ``/metrics`` changes
    or every ``refresh_s``. A failure keeps the previous map unless the ``gpu_id`` set changed since it was read.
    Each read takes at most :data:`MAX_BYTES` (the ``/metrics`` reader's deadline, its own cap) and ``max_entries``
    GPU objects (the agent's ``max_devices``); a body past either is refused in one line, logged and in doctor."""

    def __init__(self, reader: ExporterReader, *, refresh_s: float = REFRESH_S,
                 clock: Callable[[], float] = time.monotonic, max_entries: int = MAX_DEVICES) -> None:
        self.reader = reader
        self.max_entries = max_entries
        self.url = gpumetrics_url(reader.url)
        self.refresh_s = refresh_s
        self._clock = clock
        self._lock = threading.Lock()
        self._map: GpuMetrics | None = None
        self._error: str | None = "not read"
        self._ids: frozenset[str] | None = None
        self._read_at: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def bdfs(self) -> dict[str, str] | None:
        """``gpu_id`` -> BDF of the latest good read; None when there is none."""
        with self._lock:
            return self._map.bdfs if self._map is not None else None

    def state(self) -> tuple[GpuMetrics | None, str | None, bool]:
        """(latest good map, latest error, whether it was ever read), for doctor."""
        with self._lock:
            return self._map, self._error, self._read_at is not None

    def _gpu_ids(self) -> frozenset[str]:
        return frozenset(r.gpu_id for r in self.reader.records().values())

    def due(self) -> bool:
        with self._lock:
            read_at, ids = self._read_at, self._ids
        return read_at is None or ids != self._gpu_ids() or self._clock() - read_at >= self.refresh_s

    def read_once(self) -> str | None:
        """Read ``/gpumetrics`` now (blocking: set-up or the watch's thread only); the error, or None."""
        ids = self._gpu_ids()
        found, error = read_gpumetrics(lambda url: self.reader.get(url, MAX_BYTES), self.url, self.reader.timeout_s,
                                       self.max_entries)
        with self._lock:
            first = self._read_at is None
            changed = self._ids is not None and ids != self._ids
            fresh_failure = error is not None and (first or self._error is None)
            self._read_at, self._ids, self._error = self._clock(), ids, error
            if found is not None:
                recovered = self._map is None and not first
                self._map = found
            elif changed:
                self._map = None  # the map was of other gpu_ids: enumeration is no worse than a stale map
        if error is not None:
            (log.warning if fresh_failure else log.debug)(
                "Device Metrics Exporter %s unusable (%s): devices without a board serial are matched by gpu_id, "
                "amdsmi's enumeration order", self.url, error)
        else:
            assert found is not None
            if first or recovered:
                log.info("Device Metrics Exporter %s: PCI addresses of %d gpu_id(s)%s", self.url, len(found.bdfs),
                         f"; {found.skipped} entries skipped ({found.first_skip})" if found.skipped else "")
        return error

    def start(self, needed: Callable[[], bool]) -> None:
        """Re-read on a daemon thread, checked every reader interval, while ``needed()`` (idempotent)."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()

        def run() -> None:
            while not self._stop.wait(self.reader.interval_s):
                try:
                    if needed() and self.due():
                        self.read_once()
                except Exception:  # a bug here must not end the thread for good
                    log.exception("Device Metrics Exporter %s read failed", self.url)

        self._thread = threading.Thread(target=run, name="roofwatch-amd-exporter-bdf", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.reader.timeout_s + 1.0)
            self._thread = None
