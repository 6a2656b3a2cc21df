"""Read a dcgm-exporter ``/metrics`` body into per-GPU records, leniently and within bounds.

dcgm-exporter (github.com/NVIDIA/dcgm-exporter, ``internal/pkg/rendermetrics/render_metrics.go``)
renders its text with a Go template, not a Prometheus client library, so its output bends the
conventions: camelCase labels (``modelName``, ``UUID`` or ``uuid`` with ``--use-old-namespace``,
``Hostname`` until release 4.x renamed it ``hostname``), counters without ``_total``, MIG
instances as extra labels (``GPU_I_PROFILE``, ``GPU_I_ID`` = NVML's GPU instance id), static
fields as labels (``DCGM_FI_DRIVER_VERSION``), Kubernetes owners as ``pod``/``namespace``/
``container`` (``pod_name``/``pod_namespace``/``container_name`` in the old namespace), and the
XID gauge with ``err_code``/``err_msg``. Older releases print DCGM's "blank" sentinels as values
(``9223372036854775794`` = ``DCGM_INT64_NOT_SUPPORTED``); newer ones skip them. Which fields
appear at all is the operator's counters CSV: the profiling ones are commented out by default.

So this parser takes each line on its own: a line it cannot read is skipped and counted, never
fatal, unless nothing usable is left; so is a DCGM line whose ``gpu`` or ``GPU_I_ID`` is no index
(``"²"`` is a digit to ``str.isdigit`` and none to ``int``: :mod:`agent.model.indexes`, the rule every
source shares). Sizes are capped (the caller caps the
body; here lines, series and GPUs kept), and the reader's :func:`read_records` groups the lines as it
reads them, so a misdirected URL or a hostile body costs bounded memory and time. Every field is
filed under one name and in one unit whichever release printed it (DCGM 4.6 names, lower-cased
re-exports, DCGM 4.7's base units, moved units: :mod:`agent.backends.dcgm_exporter.names` and
:mod:`~agent.backends.dcgm_exporter.units`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping

from agent.backends.dcgm_exporter.names import canonical, resolve
from agent.backends.dcgm_exporter.units import Family, family_factor
from agent.backends.exposition_text import (
    MAX_LINE_CHARS,
    MAX_SERIES,
    ExporterFormatError,
    Exposition,
    Series,
    Tally,
    iter_series,
    parse_line,
)
from agent.model.indexes import MAX_INDEX_DIGITS, is_index
from agent.model import Attribution

__all__ = ["MAX_LINE_CHARS", "MAX_SERIES", "ExporterFormatError", "Exposition", "Series", "parse_line",
           "GpuRecord", "gpu_records", "parse_exposition", "read_records", "is_blank", "is_index", "MAX_INDEX_DIGITS"]

MAX_GPUS = 1024
"""GPUs and MIG instances kept from one body, the first in the body's order; the rest are refused and
counted. A node has at most 16 GPUs x 7 instances; this is the upper bound of the ``max_devices``
setting, so it only bounds what a hostile or misdirected body costs in memory."""

# DCGM's "no value" sentinels (dcgm_structs.h): BLANK, NOT_FOUND, NOT_SUPPORTED, NOT_PERMISSIONED.
_INT32_BLANKS = frozenset(float(0x7FFFFFF0 + i) for i in range(4))
_INT64_BLANK_MIN = float(0x7FFFFFFFFFFFFFF0)
_FP64_BLANKS = frozenset(140737488355328.0 + i for i in range(4))


def is_blank(value: float) -> bool:
    """A DCGM sentinel or a non-finite value: unknown, never a reading."""
    return (not math.isfinite(value) or value in _INT32_BLANKS or value >= _INT64_BLANK_MIN
            or value in _FP64_BLANKS)


def _bad_index(series: Series) -> str | None:
    """Why a DCGM series is a bad line: its ``gpu`` or ``GPU_I_ID`` label is present but no index."""
    if canonical(series.name) is None:
        return None
    gpu, instance = series.labels.get("gpu"), series.labels.get("GPU_I_ID")
    if (gpu is not None and not is_index(gpu)) or (bool(instance) and not is_index(instance)):
        return " (gpu or GPU_I_ID is no index)"
    return None


def _dcgm(series: Series) -> bool:
    return canonical(series.name) is not None


def _series(text: str, tally: Tally, max_series: int):
    return iter_series(text, tally, max_series, own=_dcgm, bad=_bad_index)


@dataclass(frozen=True, slots=True)
class Parsed:
    series: tuple[Series, ...]
    skipped: int
    """Lines that were neither comments nor readable samples (a bad GPU index included)."""
    first_bad: str | None


def parse_exposition(text: str, *, max_series: int = MAX_SERIES) -> Parsed:
    """Every readable sample line; ExporterFormatError when the body holds none of dcgm-exporter's."""
    tally = Tally()
    out = tuple(_series(text, tally, max_series))
    tally.check()
    return Parsed(out, tally.skipped, tally.first_bad)


@dataclass(frozen=True, slots=True)
class GpuRecord:
    """Everything one exposition says about one GPU, or one MIG instance of it."""

    key: str
    """``"3"``, or ``"3/7"`` for GPU instance 7 of GPU 3: the trace format's naming, as NVML's."""
    index: str
    instance: str | None
    profile: str | None
    """MIG profile (``1g.10gb``) of an instance."""
    uuid: str | None
    """The physical GPU's UUID (dcgm-exporter labels MIG instances with their parent's)."""
    model: str | None
    hostname: str | None
    pci_bus_id: str | None
    driver: str | None
    attribution: Attribution | None
    values: Mapping[str, float]
    """Field name (``DCGM_FI_DEV_POWER_USAGE``) -> value, DCGM blanks left out."""
    newest_ts_s: float | None
    xid: int | None
    """The last XID DCGM saw on this GPU (``DCGM_FI_DEV_XID_ERRORS``), 0 or None when none."""


_ATTRIBUTION = (("pod", "pod_name"), ("namespace", "pod_namespace"), ("container", "container_name"))


def _first(labels: Mapping[str, str], *names: str) -> str | None:
    for name in names:
        value = labels.get(name)
        if value:
            return value
    return None


def _attribution(labels: Mapping[str, str]) -> Attribution | None:
    found = {field: _first(labels, *names) for field, names in zip(("pod", "namespace", "container"), _ATTRIBUTION)}
    return Attribution(**found) if any(found.values()) else None


class _Grouper:
    """Series grouped by GPU (and MIG instance), at most ``max_gpus`` of them; later ones refused."""

    def __init__(self, max_gpus: int) -> None:
        self.max_gpus = max_gpus
        self.grouped: dict[str, dict] = {}
        self.refused: set[str] = set()
        self.families: dict[str, Family] = {}
        """Name as printed (upper-cased) -> its values in this body: one unit decision per family."""
        self.units: tuple[str, ...] = ()
        self.assumed: tuple[str, ...] = ()

    def add(self, s: Series) -> None:
        labels = s.labels
        index = labels.get("gpu")
        read = resolve(s.name)
        if read is None or not is_index(index) or "nvlink" in labels or "nvswitch" in labels:
            return
        field = read.field
        instance = labels.get("GPU_I_ID") or None
        if instance is not None and not is_index(instance):
            return
        key = f"{index}/{instance}" if instance is not None else str(index)
        entry = self.grouped.get(key)
        if entry is None:
            if len(self.grouped) >= self.max_gpus:
                self.refused.add(key)
                return
            entry = self.grouped[key] = {"labels": {}, "values": {}, "ts": None, "xid": None, "index": index,
                                         "instance": instance}
        for name, value in labels.items():
            entry["labels"].setdefault(name, value)
        if s.ts_s is not None:
            entry["ts"] = s.ts_s if entry["ts"] is None else max(entry["ts"], s.ts_s)
        if is_blank(s.value):
            return
        if field == "DCGM_FI_DEV_XID_ERRORS":
            entry["xid"] = int(s.value) if s.value >= 0 else None
        spelled = s.name.upper()
        family = self.families.get(spelled)
        if family is None:
            family = self.families[spelled] = Family(spelled, read)
        family.add(s.value, s.decimal)
        entry["values"].setdefault(field, (s.value, spelled))  # the first spelling of a field wins, in its own unit

    def records(self) -> dict[str, GpuRecord]:
        """The records, each value in its field's canonical unit (:mod:`agent.backends.dcgm_exporter.units`)."""
        decisions = {spelled: family_factor(family) for spelled, family in self.families.items()}
        self.units = tuple(sorted(d.unit_note for d in decisions.values() if d.unit_note))
        self.assumed = tuple(sorted(d.assumed for d in decisions.values() if d.assumed))
        return {key: GpuRecord(
            key=key, index=e["index"], instance=e["instance"], profile=e["labels"].get("GPU_I_PROFILE") or None,
            uuid=_first(e["labels"], "UUID", "uuid"), model=_first(e["labels"], "modelName", "model_name"),
            hostname=_first(e["labels"], "Hostname", "hostname"), pci_bus_id=_first(e["labels"], "pci_bus_id"),
            driver=_first(e["labels"], "DCGM_FI_DRIVER_VERSION", "DCGM_FI_SYSTEM_DRIVER_VERSION"),
            attribution=_attribution(e["labels"]),
            values={f: decisions[spelled].apply(v) for f, (v, spelled) in e["values"].items()},
            newest_ts_s=e["ts"], xid=e["xid"],
        ) for key, e in sorted(self.grouped.items(), key=lambda kv: _order(kv[0]))}


def gpu_records(series: Iterable[Series], *, max_gpus: int = MAX_GPUS) -> dict[str, GpuRecord]:
    """Group GPU series by GPU (and MIG instance). Link and switch series (``nvlink``,
    ``nvswitch`` labels) and the exporter's own process metrics are left out, and so are GPUs past
    the first ``max_gpus`` (in the order the series name them)."""
    grouper = _Grouper(max_gpus)
    for s in series:
        grouper.add(s)
    return grouper.records()


def read_records(text: str, *, max_series: int = MAX_SERIES, max_gpus: int = MAX_GPUS) -> Exposition:
    """:func:`parse_exposition` and :func:`gpu_records` in one pass, each series dropped once counted:
    a 16 MiB body costs its text and the records, not a hundred thousand series objects."""
    tally, grouper = Tally(), _Grouper(max_gpus)
    for s in _series(text, tally, max_series):
        grouper.add(s)
    tally.check()
    records = grouper.records()
    return Exposition(records, tally.skipped, tally.first_bad, tuple(sorted(grouper.refused, key=_order)),
                      grouper.units, grouper.assumed)


def _order(key: str) -> tuple[int, int]:
    index, _, instance = key.partition("/")
    return int(index), int(instance) if instance else -1
