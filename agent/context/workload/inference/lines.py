"""A Prometheus text exposition read one line at a time, as cheaply as a line can be read.

Kept apart from agent.context.workload.inference.parse (what the agent keeps of a body, and the
arithmetic) because this is the part every byte of a body passes through: a server's body may be up to
4 MiB, read every few seconds, most of it families the agent does not keep. So a line is one regular
expression match in C (its labels checked, not taken apart), the body is never split into a list of
lines, and bytes are decoded a line at a time. A line that is no sample (a pasted ``curl`` line, a
proxy's banner) is counted in a :class:`Tally`, never fatal.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterator

_LABEL = r'[ \t]*[A-Za-z_][A-Za-z0-9_]*[ \t]*=[ \t]*"(?:[^"\\]|\\.)*"[ \t]*(?:,|(?=[ \t]*\}))'
_LINE = re.compile(rf'([A-Za-z_:][A-Za-z0-9_:]*)(?:[ \t]*\{{((?:{_LABEL})*)[ \t]*\}})?[ \t]\s*(\S+)(?:\s+(\S+))?')
"""One text-format sample line, stripped: name, the labels' text, value, and an optional timestamp. One
match in C per line: a body is read line by line and most lines are of families the agent does not keep,
so their labels are checked but never taken apart."""
_PAIR = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\]|\\.)*)"')
_ESCAPE = re.compile(r"\\(.)")


def _unescape(value: str) -> str:
    return _ESCAPE.sub(lambda m: "\n" if m.group(1) == "n" else m.group(1), value) if "\\" in value else value


def _sample(line: str) -> tuple[str, str | None, float] | None:
    """(name, the labels' text, value) of one stripped text-format sample line, or None when it is no sample."""
    match = _LINE.fullmatch(line)
    if match is None:
        return None
    name, labels, value, stamp = match.groups()
    try:
        number = float(value)
        if stamp is not None:
            float(stamp)  # a timestamp: must be a number, is not used
    except ValueError:
        return None
    return name, labels, number


def labels_of(text: str | None) -> dict[str, str]:
    """The labels of a line :func:`_sample` read (the text is known to be well formed), unescaped."""
    return {key: _unescape(value) for key, value in _PAIR.findall(text)} if text else {}


@dataclass(slots=True)
class Tally:
    """Bad lines and readable samples of one body, for the error message and doctor."""

    samples: int = 0
    skipped: int = 0
    first_bad: str | None = None

    def bad(self, number: int, line: str) -> None:
        self.skipped += 1
        if self.first_bad is None:
            shown = line[:80].encode("ascii", "backslashreplace").decode()
            self.first_bad = f"line {number}: {shown!r}"


def _lines(body: str | bytes) -> Iterator[str]:
    """The lines of ``body`` one at a time, never all at once: a 4 MiB body of short lines held as a list
    costs some 10 MiB more while it is parsed, for each endpoint being read. Bytes are decoded a line at a
    time (an undecodable byte becomes U+FFFD), so one character outside Latin-1 in a comment does not make
    the whole body a string of four bytes per character."""
    newline: str | bytes = "\n" if isinstance(body, str) else b"\n"
    start, end = 0, len(body)
    while start <= end:
        stop = body.find(newline, start)  # type: ignore[arg-type]  # str with str, bytes with bytes
        if stop < 0:
            stop = end
        line = body[start:stop]
        yield line if isinstance(line, str) else line.decode("utf-8", errors="replace")
        start = stop + 1


def samples(text: str | bytes, tally: Tally) -> Iterator[tuple[str, str | None, float]]:
    """The readable sample lines of ``text`` (name, labels' text, value); other lines counted in ``tally``."""
    for number, raw in enumerate(_lines(text), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        sample = _sample(line)
        if sample is None:
            tally.bad(number, line)
            continue
        tally.samples += 1
        yield sample
