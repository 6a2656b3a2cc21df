"""Read and write roofwatch traces (JSON Lines, format version 1; see shared/trace-format.md).

A trace is what the agent saw, one GPU sample per line, so that a person can read it and
``roofwatch classify`` can replay it. Writing sits in the collector's hot path, so the writer
walks the dataclasses by hand instead of building pydantic models; reading validates every
line with pydantic because traces come from users, other tools and hand edits, and a bad
value must be reported by file, line and field rather than silently classified.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import os
import sys
import time
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import fields
from functools import cache
from typing import IO, Any

from pydantic import ConfigDict, TypeAdapter, ValidationError

from agent.model import GpuSample
from agent.trace.json_types import json_type_error

FORMAT_NAME = "roofwatch-trace"
FORMAT_VERSION = 1
GZIP_MAGIC = b"\x1f\x8b"

__all__ = ["FORMAT_NAME", "FORMAT_VERSION", "TraceFormatError", "TraceReader", "TraceWriteError",
           "TraceWriter", "read_trace", "sample_to_dict"]


class TraceWriteError(OSError):
    """Writing a trace failed (disk full, permissions, ...). The agent logs it and keeps exporting."""

    def __init__(self, path: str, exc: OSError) -> None:
        reason = os.strerror(exc.errno) if exc.errno else (exc.strerror or str(exc))
        super().__init__(f"cannot write trace {path}: {reason}")
        self.errno = exc.errno
        self.path = path


class TraceFormatError(ValueError):
    """A trace line breaks the contract. ``line`` is 1-based and counts the header and blank lines."""

    def __init__(self, path: str, line: int, message: str) -> None:
        super().__init__(f"{path}:{line}: {message}")
        self.path = path
        self.line = line
        self.reason = message


# --------------------------------------------------------------------------- writing

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
        names = _FIELD_NAMES[cls] = tuple(f.name for f in fields(cls))
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
                    "started_at": time.time() if started_at is None else started_at, "note": note}
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


# --------------------------------------------------------------------------- reading


@cache
def _adapter() -> TypeAdapter[tuple[GpuSample]]:
    # Built on first read only: the agent's write path never pays for the schema. A 1-tuple because
    # pydantic takes a config only on a wrapper type (the dataclasses inherit it): allow_inf_nan=False
    # also refuses quoted non-finite numbers ("inf", "NaN"), which lax number parsing would accept.
    return TypeAdapter(tuple[GpuSample], config=ConfigDict(allow_inf_nan=False))


def _reject_constant(token: str) -> Any:
    raise ValueError(f"{token} is not allowed (write unknown values as null or leave them out)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text} is out of range")
    return value


def _is_header(obj: dict[str, Any]) -> bool:
    return "format" in obj and "ts" not in obj


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:3]:
        loc = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"][1:]).lstrip(".")
        if err["type"] == "missing":
            parts.append(f"missing required field '{loc}'")
        else:
            got = repr(err.get("input"))
            got = got if len(got) <= 60 else got[:57] + "..."
            parts.append(f"field '{loc}': {err['msg']} (got {got})")
    return "; ".join(parts)


class TraceReader:
    """Iterates the samples of a trace, validating each line against the contract.

    ``source`` is a path (plain or gzip, detected by the ``1f 8b`` magic bytes, not the
    suffix), ``-`` for stdin, or an open binary or text stream (not closed by the reader).
    ``header`` is the header dict, or ``None`` when the trace has none. Unknown fields are
    ignored, at the top level and in nested objects, as the contract requires.

    Lenient on purpose, because people hand-write traces: an integer ``gpu`` becomes a string,
    and numbers in lax pydantic form are accepted (``1.0`` for an int field, ``"0.5"`` for a
    float). A later header line (concatenated traces) is checked for its version and skipped.
    Strict on purpose: NaN/Infinity, out-of-range values and ``ts`` that does not increase
    within one GPU (node + gpu) are errors.

    With ``strict=False`` bad lines are skipped and kept in ``errors``; an unsupported header
    version still raises, since nothing after it can be trusted.
    """

    def __init__(self, source: str | os.PathLike[str] | IO[Any], *, strict: bool = True) -> None:
        self.strict = strict
        self.errors: list[TraceFormatError] = []
        self.header: dict[str, Any] | None = None
        self._owned: IO[Any] | None = None
        if isinstance(source, (str, os.PathLike)) and os.fspath(source) != "-":
            self.path = os.fspath(source)
            stream: IO[Any] = open(self.path, "rb")
            self._owned = stream
        elif isinstance(source, (str, os.PathLike)):
            self.path, stream = "<stdin>", sys.stdin
        else:
            self.path, stream = str(getattr(source, "name", "<stream>")), source
        if isinstance(stream, io.TextIOBase):
            stream = getattr(stream, "buffer", stream)  # bytes when we can, for gzip detection
        if not isinstance(stream, io.TextIOBase) and self._peek(stream) == GZIP_MAGIC:
            stream = gzip.GzipFile(fileobj=stream, mode="rb")
        self._lines = self._numbered(stream)
        self._last_ts: dict[tuple[str, str], tuple[float, int]] = {}
        self._pending: tuple[int, dict[str, Any]] | None = None
        try:
            for lineno, text in self._lines:  # the first non-blank line may be the header
                obj = self._parse(lineno, text)
                if obj is not None and _is_header(obj):
                    self._check_header(lineno, obj)
                    self.header = obj
                elif obj is not None:
                    self._pending = (lineno, obj)
                break
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _peek(stream: IO[bytes]) -> bytes:
        if hasattr(stream, "peek"):
            return stream.peek(2)[:2]
        if stream.seekable():
            pos = stream.tell()
            head = stream.read(2)
            stream.seek(pos)
            return head
        return b""

    def _numbered(self, stream: IO[Any]) -> Iterator[tuple[int, str]]:
        lineno = 0
        try:
            for raw in stream:
                lineno += 1
                if isinstance(raw, bytes):
                    try:
                        raw = raw.decode("utf-8")
                    except UnicodeDecodeError as exc:
                        self._fail(TraceFormatError(self.path, lineno, f"not valid UTF-8 ({exc.reason})"))
                        continue
                if lineno == 1:
                    raw = raw.removeprefix("\ufeff")  # BOM from editors that add one
                if raw.strip():
                    yield lineno, raw
        except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
            # A killed agent leaves a truncated gzip stream; non-strict readers keep what came before.
            self._fail(TraceFormatError(self.path, lineno + 1,
                                        f"compressed data truncated or corrupt ({exc})"))

    def _fail(self, error: TraceFormatError) -> None:
        if self.strict:
            raise error
        self.errors.append(error)

    def _parse(self, lineno: int, text: str) -> dict[str, Any] | None:
        try:
            obj = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
        except json.JSONDecodeError as exc:
            self._fail(TraceFormatError(self.path, lineno,
                                        f"not valid JSON: {exc.msg} at column {exc.colno}"))
            return None
        except RecursionError:
            self._fail(TraceFormatError(self.path, lineno, "not valid JSON: nested too deeply"))
            return None
        except ValueError as exc:
            self._fail(TraceFormatError(self.path, lineno, f"not valid JSON: {exc}"))
            return None
        if not isinstance(obj, dict):
            what = f"expected a JSON object (one sample), got {type(obj).__name__}"
            self._fail(TraceFormatError(self.path, lineno, what))
            return None
        return obj

    def _check_header(self, lineno: int, obj: dict[str, Any]) -> None:
        fmt, version = obj.get("format"), obj.get("version")
        if fmt != FORMAT_NAME:
            what = f"unknown trace format {fmt!r} (expected {FORMAT_NAME!r})"
        elif type(version) is not int or version < 1:
            what = f"header 'version' must be a positive integer (got {version!r})"
        elif version > FORMAT_VERSION:
            what = (f"trace format version {version} is newer than this roofwatch reads "
                    f"({FORMAT_VERSION}); upgrade roofwatch")
        else:
            return
        raise TraceFormatError(self.path, lineno, what)

    def _sample(self, lineno: int, obj: dict[str, Any]) -> GpuSample | None:
        gpu = obj.get("gpu")
        if type(gpu) is int:
            obj["gpu"] = str(gpu)
        if "node" in obj and obj["node"] is None:
            del obj["node"]  # null is unknown (the contract), and an unknown node is the default "local"
        if (wrong := json_type_error(obj, GpuSample)) is not None:
            self._fail(TraceFormatError(self.path, lineno, wrong))
            return None
        try:
            sample = _adapter().validate_python((obj,))[0]
        except ValidationError as exc:
            self._fail(TraceFormatError(self.path, lineno, _describe(exc)))
            return None
        key = (sample.node, sample.gpu)
        last = self._last_ts.get(key)
        if last is not None and sample.ts <= last[0]:
            self._fail(TraceFormatError(
                self.path, lineno,
                f"ts {sample.ts!r} for gpu {sample.gpu!r} on node {sample.node!r} does not increase "
                f"(line {last[1]} had ts {last[0]!r})"))
            return None
        self._last_ts[key] = (sample.ts, lineno)
        return sample

    def __iter__(self) -> Iterator[GpuSample]:
        try:
            if self._pending is not None:
                lineno, obj = self._pending
                self._pending = None
                if (sample := self._sample(lineno, obj)) is not None:
                    yield sample
            for lineno, text in self._lines:
                obj = self._parse(lineno, text)
                if obj is None:
                    continue
                if _is_header(obj):
                    self._check_header(lineno, obj)
                    continue
                if (sample := self._sample(lineno, obj)) is not None:
                    yield sample
        finally:
            self.close()

    def close(self) -> None:
        if self._owned is not None:
            self._owned.close()
            self._owned = None

    def __enter__(self) -> TraceReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_trace(source: str | os.PathLike[str] | IO[Any], *, strict: bool = True,
               ) -> Iterator[GpuSample]:
    """Yield the samples of a trace; see :class:`TraceReader` for the rules and for the header."""
    yield from TraceReader(source, strict=strict)
