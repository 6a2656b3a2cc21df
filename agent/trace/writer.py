"""Writing traces: one JSON line per sample, walked by hand because it sits in the collector's hot path."""


from __future__ import annotations

import gzip
import io
import json
import math
import os
import sys
import time
from collections.abc import Iterable
from dataclasses import fields
from typing import IO, Any

from agent.model import GpuSample
from agent.trace.format import FORMAT_NAME, FORMAT_VERSION, MEM_BUSY_HEADER_KEY, TraceWriteError

_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False, ensure_ascii=False)


_ASCII_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
"""For the rare line UTF-8 cannot encode: lone surrogates, which is how Python (and psutil) decode the
undecodable bytes of a process or file name. JSON writes them as ``\\udcxx`` escapes that read back the same."""


def sample_to_dict(obj: Any) -> dict[str, Any]:
    """A trace-ready dict of a model dataclass: ``None`` and non-finite floats omitted (unknown),
    nested dataclasses and tuples of them converted, keys in field order."""
    cls = type(obj)
    names = _FIELD_NAMES.get(cls)
    if names is None:
        # A field marked ``metadata={"trace": False}`` is live-only (GpuSample.parent_energy_j): never written.
        names = _FIELD_NAMES[cls] = tuple(f.name for f in fields(cls) if f.metadata.get("trace", True))
    out: dict[str, Any] = {}
    for name in names:
        value = getattr(obj, name)
        if value is None:
            continue
        kind = type(value)
        if kind is float:
            if not math.isfinite(value):
                continue
        elif kind is tuple or kind is list:
            value = [sample_to_dict(v) if hasattr(v, "__dataclass_fields__") else v for v in value]
        elif hasattr(kind, "__dataclass_fields__"):
            value = sample_to_dict(value)
        out[name] = value
    return out


class TraceWriter:
    """Writes a trace; gzip-compressed when the path ends with ``.gz``; ``-`` is stdout.

    Lines are buffered, so that writing a sample stays a dict walk and one JSON encode: call
    :meth:`flush` when the data must reach the disk. Every ``OSError`` (full disk, permissions)
    surfaces as :class:`TraceWriteError` naming the path and the reason; after one, the caller
    should stop writing to this writer and :meth:`close` it.
    """

    def __init__(self, path: str | os.PathLike[str], *, node: str | None = None,
                 agent_version: str | None = None, note: str | None = None, header: bool = True,
                 started_at: float | None = None) -> None:
        self.path = os.fspath(path)
        self._owned = self.path != "-"
        self._closed = False
        self._file: IO[str]
        try:
            if not self._owned:
                self._file = sys.stdout
            elif self.path.endswith(".gz"):
                # mtime=0: the same samples give the same bytes (shipped traces stay diff-free).
                self._file = io.TextIOWrapper(gzip.GzipFile(self.path, "wb", mtime=0), encoding="utf-8", newline="\n")
            else:
                self._file = open(self.path, "w", encoding="utf-8", newline="\n")
        except OSError as exc:
            raise TraceWriteError(self.path, exc) from exc
        if header:
            meta = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "node": node,
                    "agent_version": agent_version,
                    "started_at": time.time() if started_at is None else started_at, "note": note,
                    MEM_BUSY_HEADER_KEY: True}
            self._write_line({k: v for k, v in meta.items() if v is not None})

    def _write_line(self, obj: dict[str, Any]) -> None:
        line = _ENCODER.encode(obj) + "\n"
        try:
            try:
                self._file.write(line)
            except UnicodeEncodeError:  # raised while encoding, before anything is buffered
                self._file.write(_ASCII_ENCODER.encode(obj) + "\n")
        except OSError as exc:
            raise TraceWriteError(self.path, exc) from exc

    def write(self, sample: GpuSample) -> None:
        """Append one sample; unknown (``None``) and non-finite values are left out."""
        self._write_line(sample_to_dict(sample))

    def write_many(self, samples: Iterable[GpuSample]) -> None:
        for sample in samples:
            self._write_line(sample_to_dict(sample))

    def flush(self) -> None:
        try:
            self._file.flush()
        except OSError as exc:
            raise TraceWriteError(self.path, exc) from exc

    def close(self) -> None:
        """Flush and close (stdout is only flushed). Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        try:
            self._file.close() if self._owned else self._file.flush()
        except OSError as exc:
            raise TraceWriteError(self.path, exc) from exc

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.close()
        else:  # the original error matters more than a failing final flush
            try:
                self.close()
            except TraceWriteError:
                pass
