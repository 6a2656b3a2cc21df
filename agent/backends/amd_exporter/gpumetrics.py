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
thread (never on a collection cycle), with the ``/metrics`` reader's fetch, deadline and size cap.
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

from agent.backends.exporter_reader import MAX_GPUS, ExporterReader
from agent.context.workload.inference.fetch import HttpStatus, ResponseTooLarge, describe_error

log = logging.getLogger("roofwatch.amd_exporter")

PATH = "/gpumetrics"
REFRESH_S = 300.0
"""A good map is re-read this often, and whenever the ``gpu_id`` set of ``/metrics`` changes."""
_BDF = re.compile(r"^(?:([0-9a-f]{1,8}):)?([0-9a-f]{1,2}):([0-9a-f]{1,2})\.([0-7])$")
_MAX_UINT32 = 2**32 - 1


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


def parse_gpumetrics(text: str, max_gpus: int = MAX_GPUS) -> GpuMetrics:
    """``gpu_id`` -> BDF from a ``/gpumetrics`` body; raises :class:`GpuMetricsError` on a body that is not one."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        where = f" (line {exc.lineno}, column {exc.colno})" if isinstance(exc, json.JSONDecodeError) else ""
        raise GpuMetricsError(f"not JSON{where}: not DME's /gpumetrics") from None
    if not isinstance(doc, dict):
        raise GpuMetricsError(f"a JSON {type(doc).__name__}, not gpuagent's GPUGetResponse object")
    entries = doc.get("Response", [])  # omitempty: no GPUs, no key
    if not isinstance(entries, list):
        raise GpuMetricsError("Response is not a list: not gpuagent's GPUGetResponse")
    if not entries and doc.get("ApiStatus"):
        raise GpuMetricsError(f"gpuagent answered ApiStatus {doc.get('ApiStatus')} and no GPU")
    found: list[tuple[str, str]] = []
    skips: list[str] = []
    listed = 0
    for n, entry in enumerate(entries):
        if listed >= max_gpus:
            skips.append(f"entries past {max_gpus} not read")
            break
        status = entry.get("Status") if isinstance(entry, dict) else None
        if isinstance(status, dict) and status.get("GPUPartition"):
            continue  # a partitioned GPU's parent object: its partitions are listed themselves
        listed += 1
        if not isinstance(status, dict):
            skips.append(f"entry {n}: no Status")
            continue
        index = _index(status)
        pcie = status.get("PCIeStatus")
        bdf = normalise_bdf(pcie.get("PCIeBusId")) if isinstance(pcie, dict) else None
        if index is None or bdf is None:
            skips.append(f"entry {n}: " + ("Index is not a gpu_id" if index is None else "no PCIeBusId"))
            continue
        found.append((str(index), bdf))
    counts = Counter(g for g, _ in found) + Counter(b for _, b in found)  # a gpu_id never looks like a BDF
    shared = sorted(key for key, n in counts.items() if n > 1)
    if shared:
        skips.append("a gpu_id or BDF listed twice: " + ", ".join(shared[:4]))
    bdfs = {g: b for g, b in found if g not in shared and b not in shared}
    return GpuMetrics(bdfs, listed - len(bdfs), skips[0] if skips else None)


def read_gpumetrics(get: Callable[[str], bytes], url: str, timeout_s: float,
                    max_gpus: int = MAX_GPUS) -> tuple[GpuMetrics | None, str | None]:
    """(map, None), or (None, one line saying why not): GET ``url`` with ``get`` (bounded by its caller)."""
    try:
        body = get(url)
        return parse_gpumetrics(body.decode("utf-8", errors="replace"), max_gpus), None
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
    or every ``refresh_s``. A failure keeps the previous map unless the ``gpu_id`` set changed since it was read."""

    def __init__(self, reader: ExporterReader, *, refresh_s: float = REFRESH_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.reader = reader
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
        found, error = read_gpumetrics(self.reader.get, self.url, self.reader.timeout_s, self.reader.max_gpus)
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
