"""Prometheus text read line by line, leniently and within bounds: what the exporter readers share.

dcgm-exporter (:mod:`agent.backends.dcgm_exporter`) and AMD's Device Metrics Exporter
(:mod:`agent.backends.amd_exporter`) both serve a ``/metrics`` text that a node agent reads every
few seconds. Each line is taken on its own: a line that cannot be read is skipped and counted (the
first one is kept to show), never fatal, unless nothing of the exporter's own is left. Sizes are
capped (the caller caps the body; here the line length and the series read), and lines are cut out
as they are reached, so a misdirected URL or a hostile body costs bounded memory and time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping

MAX_SERIES = 100_000
"""Series read from one body: a node of 8 GPUs x 7 MIG instances x 100 fields is 5,600."""
MAX_LINE_CHARS = 16_384
"""A longer line is skipped: the exporters' longest (a pod-labelled MIG series) is under 1 KiB."""

_NAME = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,|(?=\}))')
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


class ExporterFormatError(ValueError):
    """The body is no exposition of the expected exporter (or nothing in it could be read); says why."""


@dataclass(frozen=True, slots=True)
class Series:
    name: str
    labels: Mapping[str, str]
    value: float
    ts_s: float | None
    """The line's own timestamp (Prometheus text allows one, in ms); the exporters write none by default."""
    decimal: bool = False
    """Whether the value was printed with a decimal point or an exponent. dcgm-exporter prints a DCGM double
    with Go's ``%f`` (``1.000000``) and an int64 with ``%d`` (``1``), so the text says the field's type where
    one name has meant both (``DCGM_FI_DEV_GPU_UTIL_RATIO``: int percent in DCGM 4.6, a double ratio from 4.7)."""


def _unescape(text: str) -> str:
    return re.sub(r"\\[\\\"n]", lambda m: _ESCAPES[m.group(0)], text) if "\\" in text else text


def parse_line(line: str) -> Series | None:
    """One sample line, or None when it is not one (the caller counts those)."""
    match = _NAME.match(line)
    if match is None:
        return None
    name, pos = match.group(0), match.end()
    labels: dict[str, str] = {}
    if pos < len(line) and line[pos] == "{":
        pos += 1
        while True:
            while pos < len(line) and line[pos] in " \t":
                pos += 1
            if pos < len(line) and line[pos] == "}":
                pos += 1
                break
            label = _LABEL.match(line, pos)
            if label is None:
                return None
            labels[label.group(1)] = _unescape(label.group(2))
            pos = label.end()
    parts = line[pos:].split()
    if not 1 <= len(parts) <= 2:
        return None
    try:
        value = float(parts[0])
        ts = float(parts[1]) / 1000.0 if len(parts) == 2 else None
    except ValueError:
        return None
    return Series(name, labels, value, ts, any(c in parts[0] for c in ".eE"))


@dataclass(slots=True)
class Tally:
    """What one pass over a body counted: skipped lines (and the first), series read, and how many
    of them were the exporter's own (``own``). ``family`` and ``exporter`` word the refusal."""

    family: str = "DCGM_*"
    exporter: str = "a dcgm-exporter's"
    skipped: int = 0
    first_bad: str | None = None
    series: int = 0
    own: int = 0

    def bad(self, number: int, line: str, why: str = "") -> None:
        self.skipped += 1
        if self.first_bad is None:
            shown = line[:80].encode("ascii", "backslashreplace").decode()
            self.first_bad = f"line {number}: {shown!r}{why}"

    def check(self) -> None:
        if not self.own:
            why = f"; unreadable {self.first_bad}" if self.first_bad else ""
            raise ExporterFormatError(f"no {self.family} series in the response ({self.series} other series, "
                                      f"{self.skipped} unreadable lines{why}): is the URL {self.exporter} /metrics?")


def iter_series(text: str, tally: Tally, max_series: int, *, own: Callable[[Series], bool],
                bad: Callable[[Series], str | None] = lambda s: None) -> Iterator[Series]:
    """The readable sample lines of ``text`` one at a time, bad lines counted in ``tally``. ``own``
    tells the exporter's series from others; ``bad`` names why a readable line is still refused
    (a label that must be an index and is not), or None. Lines are cut out as they are reached, so a
    large body is never held a second time as a list of lines."""
    pos, number, size = 0, 0, len(text)
    while pos < size:
        end = text.find("\n", pos)
        end = size if end < 0 else end
        number += 1
        if end - pos > MAX_LINE_CHARS + 2:  # not cut out whole: only its start is shown
            tally.bad(number, text[pos:pos + 80].strip(), " (over 16 KiB)")
            pos = end + 1
            continue
        line = text[pos:end].strip()
        pos = end + 1
        if not line or line.startswith("#"):
            continue
        series = parse_line(line) if len(line) <= MAX_LINE_CHARS else None
        why = bad(series) if series is not None else None
        if series is None or why is not None:
            tally.bad(number, line, " (over 16 KiB)" if len(line) > MAX_LINE_CHARS else why or "")
            continue
        if tally.series >= max_series:
            raise ExporterFormatError(f"more than {max_series} series: not one node's exporter")
        tally.series += 1
        tally.own += own(series)
        yield series


@dataclass(frozen=True, slots=True)
class Exposition:
    """One body read into records, without holding its series (the readers' form)."""

    records: dict
    """GPU key -> the exporter's record of it."""
    skipped: int
    first_bad: str | None
    refused: tuple[str, ...]
    """GPU keys past ``max_gpus``, in index order."""
    units: tuple[str, ...] = ()
    """Families read in another unit than their field's, each with why (for ``doctor``)."""
    notes: tuple[str, ...] = ()
    """What else the exposition says about itself (naming release, prefix, profiler), for ``doctor``."""
