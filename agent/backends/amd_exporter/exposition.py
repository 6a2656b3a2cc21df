"""Read a Device Metrics Exporter ``/metrics`` body into one record per GPU or compute partition.

Lines are read by the shared lenient parser (:mod:`agent.backends.exposition_text`). A DME series
carries the mandatory labels ``gpu_id`` (gpuagent's ``Status.Index``, one per partition),
``gpu_partition_id`` (0..N-1, ``"NA"`` for an unpartitioned GPU object from 1.4.0),
``gpu_compute_partition_type``/``gpu_memory_partition_type`` (``spx``, ``cpx``, ``nps1``: taken from
the partition-0 sibling), ``serial_number``/``card_model`` (the card's, shared by its partitions),
``hostname``, and Kubernetes ``pod``/``namespace``/``container`` (v1.5.1
``gpuagent_gpu_metrics.go:40-55, 2000-2142``). Per-index series add ``clock_index``+``clock_type``,
``xcc_index``, ``link_index``, ``hbm_index``: those are kept per index (:attr:`AmdRecord.indexed`).

A line is skipped and counted (the exposition's skipped lines, which ``doctor`` shows with the first) when one of
those id labels, ``gpu_id`` or ``gpu_partition_id`` is present but no index (:mod:`agent.model.indexes`:
``link_index="²"`` raised ``ValueError`` and stopped the agent), or when its value cannot be converted into its
sample field (:mod:`agent.backends.amd_exporter.units`: ``gpu_total_vram 1e308`` is ``inf`` bytes). The GPU's other
lines are kept.

Devices are named as the amdsmi backend names them (:mod:`agent.backends.amd.discovery`): a GPU in
SPX is ``"<gpu>"``, a partition ``"<gpu>/<partition id>"``, ``<gpu>`` counting physical GPUs in
``gpu_id`` order. A physical GPU starts at each partition 0 (or unpartitioned object) in ``gpu_id``
order, or where the serial number changes.

Per-process series (``gpu_process_cu_occupancy{process_id="1234", <GPU labels>}``, DME 1.5.0+,
v1.5.1 ``gpuagent_gpu_metrics.go:1748-1752, 2760-2772``) are kept per GPU object by PID
(:attr:`AmdRecord.processes`), at most :data:`MAX_PROCESSES_PER_GPU` of them: a GPU object listing more has
its processes unknown for that exposition (never a truncated list, whose shares would be overstated), and a
note says which. A ``process_id`` that is no PID skips the line as a bad index does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping

from agent.backends.amd.values import partition_count
from agent.backends.amd_exporter.names import clock_type, release_hints, split
from agent.backends.amd_exporter.units import unconvertible
from agent.backends.exposition_text import MAX_SERIES, Exposition, Series, Tally, iter_series
from agent.model.indexes import index_value, is_index
from agent.model import Attribution

MAX_GPUS = 1024
INDEX_LABELS = ("xcc_index", "link_index", "hbm_index", "clock_index")
ID_LABELS = ("gpu_id", *INDEX_LABELS)
"""Labels that must be an index wherever they appear; ``gpu_partition_id`` too, unless it says "no partition"."""
NO_PARTITION = frozenset({"NA", "N/A", ""})
"""``gpu_partition_id`` of an unpartitioned GPU object (``"NA"`` from 1.4.0)."""
PROCESS_FAMILY = "gpu_process_cu_occupancy"
"""DME's one per-process family (1.5.0+; field GPU_PROCESS_CU_OCCUPANCY), labelled ``process_id``."""
MAX_PROCESSES_PER_GPU = 256
"""Process series kept per GPU object. A hostile or broken exposition may print 100,000 of them for one GPU
(every one a holder for the ledger, a host lookup and a series): past this bound the GPU's processes are
unknown for that exposition. amdsmi's own wrapper asks for at most 1024 processes per device
(``MAX_NUM_PROCESSES``); a GPU shared by more than 256 processes at once is not a workload this reads."""
MAX_PID = 2**31 - 1
SENTINELS = frozenset(float(x) for x in (0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF))
"""gpuagent's "not applicable" values (``utils.IsValueApplicable``, v1.5.1 ``pkg/exporter/utils/utils.go:179-191``;
0xFF is left out: no exported field can be 255 by accident except one that DME already drops)."""


@dataclass(frozen=True, slots=True)
class AmdRecord:
    """Everything one exposition says about one GPU object (a whole GPU, or one partition)."""

    key: str
    gpu_id: str
    partition: int | None
    """``gpu_partition_id``; None for ``"NA"`` or no label (an unpartitioned GPU)."""
    partitions: int
    """Partitions of its physical GPU (from ``gpu_compute_partition_type``, or as many as listed)."""
    partition_type: str | None
    memory_partition_type: str | None
    serial: str | None
    model: str | None
    series: str | None
    """``card_series`` (an optional label: ``GPUConfig.Labels`` CARD_SERIES)."""
    hostname: str | None
    uuid: str | None
    """``gpu_uuid`` (optional label); a partition's has the partition id in bytes 4..7."""
    attribution: Attribution | None
    values: Mapping[str, float]
    """Series name (1.4+, prefix taken off) -> value, for series without an index label."""
    indexed: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    """Series name -> index (``"3"``, ``"system/2"`` for clocks) -> value."""
    processes: Mapping[int, float] | None = None
    """PID -> ``gpu_process_cu_occupancy`` of each process DME lists on this GPU object (empty: none, while
    another GPU object's processes show the field is on); None when unknown: no object has the family (DME
    before 1.5.0, the field disabled, or no process anywhere: a gauge vector without children prints nothing,
    so these look alike), or this object listed more than :data:`MAX_PROCESSES_PER_GPU`."""
    newest_ts_s: float | None = None
    instance: None = None
    xid: None = None
    pci_bus_id: None = None

    @property
    def primary(self) -> bool:
        """The GPU's partition 0 (or the whole GPU): the only one whose activity, power and energy are real."""
        return self.partition in (None, 0)


def pid_value(text: str | None) -> int | None:
    """A ``process_id`` label as a PID: ASCII digits, no leading zero, 1 to 2^31-1 (DME skips PID 0 itself);
    None for anything else (``str.isdigit`` accepts "²", which ``int`` refuses)."""
    if not text or len(text) > 10 or not text.isascii() or not text.isdigit() or text[0] == "0":
        return None
    pid = int(text)
    return pid if pid <= MAX_PID else None


def _text(labels: Mapping[str, str], name: str) -> str | None:
    value = labels.get(name)
    return value if value and value != "N/A" else None


class _Grouper:
    def __init__(self, max_gpus: int) -> None:
        self.max_gpus = max_gpus
        self.grouped: dict[str, dict] = {}
        self.refused: set[str] = set()
        self.prefixes: dict[str, int] = {}
        self.spelled: set[str] = set()
        self.label_values: dict[str, set[str]] = {}
        self.crowded: set[str] = set()
        """GPU objects that listed more than MAX_PROCESSES_PER_GPU processes."""

    def add(self, s: Series, split_name: tuple[str, str]) -> None:
        prefix, name = split_name
        self.prefixes[prefix] = self.prefixes.get(prefix, 0) + 1
        self.spelled.add(s.name[len(prefix):])
        labels = s.labels
        for label in ("clock_type", "deployment_mode"):
            if label in labels and len(self.label_values.setdefault(label, set())) < 16:
                self.label_values[label].add(labels[label])
        gpu = labels.get("gpu_id")
        if not is_index(gpu):
            return
        entry = self.grouped.get(gpu)
        if entry is None:
            if len(self.grouped) >= self.max_gpus:
                self.refused.add(gpu)
                return
            entry = self.grouped[gpu] = {"labels": dict(labels), "values": {}, "indexed": {}, "ts": None}
        if s.ts_s is not None:
            entry["ts"] = s.ts_s if entry["ts"] is None else max(entry["ts"], s.ts_s)
        if not math.isfinite(s.value) or s.value in SENTINELS:
            return
        if name == PROCESS_FAMILY:
            self._process(gpu, entry, labels, s.value)
            return
        index = next((labels[i] for i in INDEX_LABELS if i in labels), None)
        if index is None:
            entry["values"].setdefault(name, s.value)
            return
        if "clock_type" in labels:
            index = f"{clock_type(labels['clock_type'])}/{index}"
        entry["indexed"].setdefault(name, {}).setdefault(index, s.value)

    def _process(self, gpu: str, entry: dict, labels: Mapping[str, str], value: float) -> None:
        """One process's CU occupancy, within the per-GPU bound (past it the GPU's list is dropped, not grown)."""
        pid = pid_value(labels.get("process_id"))
        if pid is None or gpu in self.crowded:
            return
        procs = entry.setdefault("processes", {})
        if pid not in procs and len(procs) >= MAX_PROCESSES_PER_GPU:
            self.crowded.add(gpu)
            entry["processes"] = None
            return
        procs.setdefault(pid, value)

    def records(self) -> dict[str, AmdRecord]:
        out: dict[str, AmdRecord] = {}
        listed = bool(self.crowded) or any(e.get("processes") for e in self.grouped.values())
        physical, serial, members = -1, None, 0
        for gpu in sorted(self.grouped, key=int):
            e = self.grouped[gpu]
            labels = e["labels"]
            part = labels.get("gpu_partition_id")
            pid = index_value(part)
            ptype = _text(labels, "gpu_compute_partition_type")
            count = partition_count(ptype)
            this_serial = _text(labels, "serial_number")
            if pid in (None, 0) or physical < 0 or (this_serial and serial and this_serial != serial) \
                    or members >= count:
                physical, serial, members = physical + 1, this_serial, 0
            members += 1
            key = str(physical) if count == 1 and pid in (None, 0) else f"{physical}/{pid if pid is not None else 0}"
            found = {f: _text(labels, f) for f in ("pod", "namespace", "container")}
            out[key] = AmdRecord(
                key=key, gpu_id=gpu, partition=pid, partitions=count, partition_type=ptype,
                memory_partition_type=_text(labels, "gpu_memory_partition_type"), serial=this_serial,
                model=_text(labels, "card_model"), series=_text(labels, "card_series"),
                hostname=_text(labels, "hostname"), uuid=_text(labels, "gpu_uuid"),
                attribution=Attribution(**found) if any(found.values()) else None,
                values=dict(e["values"]), indexed={k: dict(v) for k, v in e["indexed"].items()}, newest_ts_s=e["ts"],
                processes=dict(e.get("processes") or {}) if listed and gpu not in self.crowded else None)
        return out

    def notes(self) -> tuple[str, ...]:
        prefixes = sorted(p for p in self.prefixes if p)
        named = tuple(f"MetricsFieldPrefix {p!r} taken off the series names" for p in prefixes)
        profiler = any(n.startswith("gpu_prof_") for n in self.spelled)
        state = ("profiler series present (gpu_prof_*)" if profiler else "no profiler series (gpu_prof_*)",)
        crowded = sorted(self.crowded, key=int)
        processes = (f"gpu_id {', '.join(crowded[:8])}{' ...' if len(crowded) > 8 else ''}: more than "
                     f"{MAX_PROCESSES_PER_GPU} {PROCESS_FAMILY} series, processes unknown (their holders' shares too)",
                     ) if crowded else ()
        return (*named, *release_hints(self.spelled, self.label_values), *state, *processes)


def _own(series: Series) -> bool:
    return split(series.name) is not None


def unusable(series: Series) -> str | None:
    """Why a DME line that parsed is still skipped: an id label that is no index, or a value that cannot be
    converted (:func:`agent.backends.amd_exporter.units.unconvertible`); None for a usable line or another's."""
    named = split(series.name)
    if named is None:
        return None
    labels = series.labels
    for label in ID_LABELS:
        value = labels.get(label)
        if value is not None and not is_index(value):
            return f" ({label} {ascii(value[:16])} is no index)"
    part = labels.get("gpu_partition_id")
    if part is not None and part not in NO_PARTITION and not is_index(part):
        return f" (gpu_partition_id {ascii(part[:16])} is no index)"
    if named[1] == PROCESS_FAMILY and pid_value(labels.get("process_id")) is None:
        return f" (process_id {ascii(labels.get('process_id', '')[:16])} is no PID)"
    why = unconvertible(named[1], series.value)
    return f" ({why})" if why else None


def read_records(text: str, *, max_series: int = MAX_SERIES, max_gpus: int = MAX_GPUS) -> Exposition:
    """One pass over a DME body: its records by device key, what it skipped, and notes for doctor.
    ExporterFormatError when no line is DME's."""
    tally = Tally(family="Device Metrics Exporter (gpu_*)", exporter="an AMD Device Metrics Exporter's")
    grouper = _Grouper(max_gpus)
    for s in iter_series(text, tally, max_series, own=_own, bad=unusable):
        named = split(s.name)
        if named is not None:
            grouper.add(s, named)
    tally.check()
    return Exposition(grouper.records(), tally.skipped, tally.first_bad, tuple(sorted(grouper.refused, key=int)),
                      notes=grouper.notes())
