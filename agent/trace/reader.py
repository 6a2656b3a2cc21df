"""Reading traces: every line validated, and a bad value reported by file, line and field.

Traces come from users, other tools and hand edits, so nothing is classified on a guess: the
JSON types are checked first (agent.trace.json_types), then pydantic validates the sample.
"""


from __future__ import annotations

import gzip
import io
import json
import math
import os
import sys
import zlib
from collections.abc import Iterator
from functools import cache
from typing import IO, Any

from pydantic import ConfigDict, TypeAdapter, ValidationError

from agent.model import GpuSample
from agent.trace.format import FORMAT_NAME, FORMAT_VERSION, GZIP_MAGIC, MEM_BUSY_HEADER_KEY, TraceFormatError
from agent.trace.json_types import json_type_error

MAX_LINE_BYTES = 4 * 2**20
"""Longest line read. The agent's longest is about 1.5 MB (1024 processes with 256-character
commands, every byte escaped); a longer line is refused, and it is read past in bounded chunks,
so it never sits in memory whole."""

MAX_KEPT_ERRORS = 100
"""Errors a lenient reader keeps for the message; past it they are only counted."""

_SKIP_CHUNK = 2**20
"""Bytes read at a time while skipping the rest of a line that is too long."""

TS_MIN = 0.0
"""The Unix epoch: hand-written and synthetic traces count from 0, and nothing earlier is a GPU sample."""

TS_MAX = 4_102_444_800.0
"""2100-01-01 UTC: past it a timestamp is a unit error (milliseconds, nanoseconds) or garbage, and
the grid and the report's calendar arithmetic stop being meaningful."""

DEFAULT_MAX_GPUS = 4096
"""Distinct GPUs (node, gpu) a reader accepts by default. A node has 8 to 16 GPUs (56 MIG instances
at most on 8 GPUs, 72 in an NVL72 rack), so 4096 is a fleet trace of 256 full nodes. Each GPU costs
the classifier about 5 KB for every evaluation it is in: a 2.4 MB trace naming 400 000 GPUs took
2 GB. Past the limit the reader stops at the first sample of one GPU too many (:class:`TooManyGpus`)."""

INTERVAL_MIN_S = 1e-3
INTERVAL_MAX_S = 86_400.0
"""A sample averages over a millisecond to a day: no counter is read faster, and a longer
``interval_s`` would stretch a window past the trace (a subnormal one made a window's expected
sample count infinite)."""


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


@cache
def _decoder() -> json.JSONDecoder:
    """One decoder for every line (``json.loads`` with options builds a new one per call)."""
    return json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite_float)


_PROFILING_FIELDS = ("sm_active", "sm_occupancy", "tensor_active", "fp64_active", "fp32_active", "fp16_active")


def move_legacy_mem_busy(obj: dict[str, Any]) -> None:
    """An older NVIDIA trace's ``dram_active`` that was really utilization.memory becomes ``mem_busy``.

    Before the contract had ``mem_busy``, writers put NVML's utilization.memory (a busy-time
    share) in ``dram_active`` for GPUs without GPM (trace format, ``mem_busy``). Such a sample is
    recognisable: NVIDIA, a DRAM figure, and none of the profiling counters that a real DRAM
    bandwidth reading (GPM, DCGM) always comes with. Only traces an older roofwatch wrote are
    touched (a header with ``agent_version`` and without ``MEM_BUSY_HEADER_KEY``): a hand-written
    or third-party trace says what it means.
    """
    value = obj.get("dram_active")
    in_range = isinstance(value, (int, float)) and not isinstance(value, bool) and 0.0 <= value <= 1.0
    if (in_range and obj.get("vendor") == "nvidia" and obj.get("mem_busy") is None  # a bad value is reported as dram_active
            and all(obj.get(name) is None for name in _PROFILING_FIELDS)):
        obj["mem_busy"] = obj.pop("dram_active")


def _is_header(obj: dict[str, Any]) -> bool:
    return "format" in obj and "ts" not in obj


def _short(value: object) -> str:
    """``repr`` (control characters escaped) cut to 60 characters: names in a trace can be 10 kB."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class TooManyGpus(TraceFormatError):
    """A trace names more distinct GPUs than ``max_gpus``: raised at the first sample past the limit,
    strict or not (skipping every later GPU would classify a part of the trace as if it were all)."""

    def __init__(self, path: str, line: int, message: str, limit: int) -> None:
        super().__init__(path, line, message)
        self.limit = limit


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
    Strict on purpose: NaN/Infinity, out-of-range values, ``ts`` outside 1970..2100 (``TS_MIN``,
    ``TS_MAX``) or not increasing within one GPU (node + gpu), and lines over ``MAX_LINE_BYTES``
    are errors. Traces come from other people: a timestamp in milliseconds or a 2 GB line must
    be refused by file and line, not replayed into a hang or an out-of-memory kill.

    With ``strict=False`` bad lines are skipped and counted in ``error_count``; the first
    ``MAX_KEPT_ERRORS`` are kept in ``errors`` (a damaged 10 GB file must not fill memory with
    them). An unsupported header version still raises, since nothing after it can be trusted.

    At most ``max_gpus`` distinct GPUs (node + gpu; ``None``: no limit) are read: the sample of one
    more raises :class:`TooManyGpus`, strict or not. ``gpus`` is the set of GPUs already seen, to
    share one limit between the readers of several traces replayed together; it is filled in.
    """

    def __init__(self, source: str | os.PathLike[str] | IO[Any], *, strict: bool = True,
                 max_gpus: int | None = DEFAULT_MAX_GPUS, gpus: set[tuple[str, str]] | None = None) -> None:
        self.strict = strict
        self.max_gpus = max_gpus
        self.gpus: set[tuple[str, str]] = set() if gpus is None else gpus
        """Distinct (node, gpu) keys read so far (with those of the readers sharing the set)."""
        self.errors: list[TraceFormatError] = []
        self.error_count = 0
        self.lines_read = 0
        self.header: dict[str, Any] | None = None
        self._legacy_mem_busy = False
        """An older roofwatch wrote this trace: NVML-only dram_active is utilization.memory."""
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
                    self._legacy_mem_busy = "agent_version" in obj and not obj.get(MEM_BUSY_HEADER_KEY)
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
            while True:
                raw = stream.readline(MAX_LINE_BYTES + 1)
                if not raw:
                    return
                lineno += 1
                self.lines_read = lineno
                if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n" if isinstance(raw, bytes) else "\n"):
                    del raw
                    self._skip_rest(stream)
                    self._fail(TraceFormatError(self.path, lineno,
                                                f"line longer than {MAX_LINE_BYTES // 2**20} MiB (not read)"))
                    continue
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

    @staticmethod
    def _skip_rest(stream: IO[Any]) -> None:
        """Read past the rest of an over-long line, one bounded chunk at a time."""
        while True:
            chunk = stream.readline(_SKIP_CHUNK)
            if not chunk or chunk.endswith(b"\n" if isinstance(chunk, bytes) else "\n"):
                return

    def _fail(self, error: TraceFormatError) -> None:
        if self.strict:
            raise error
        self.error_count += 1
        if len(self.errors) < MAX_KEPT_ERRORS:
            self.errors.append(error)

    def _parse(self, lineno: int, text: str) -> dict[str, Any] | None:
        try:
            obj = _decoder().decode(text)
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
        if self._legacy_mem_busy:
            move_legacy_mem_busy(obj)
        try:
            sample = _adapter().validate_python((obj,))[0]
        except ValidationError as exc:
            self._fail(TraceFormatError(self.path, lineno, _describe(exc)))
            return None
        if not TS_MIN <= sample.ts <= TS_MAX:
            self._fail(TraceFormatError(
                self.path, lineno, f"field 'ts': {sample.ts!r} is not a Unix time from {TS_MIN:.0f} to {TS_MAX:.0f} "
                                   "(1970-01-01 to 2100-01-01 UTC; seconds, not milliseconds)"))
            return None
        if sample.interval_s is not None and not INTERVAL_MIN_S <= sample.interval_s <= INTERVAL_MAX_S:
            self._fail(TraceFormatError(
                self.path, lineno, f"field 'interval_s': {sample.interval_s!r} is not from {INTERVAL_MIN_S:g} s "
                                   f"to {INTERVAL_MAX_S:.0f} s (a day)"))
            return None
        key = (sample.node, sample.gpu)
        if key not in self.gpus:
            self._admit(lineno, key)
        last = self._last_ts.get(key)
        if last is not None and sample.ts <= last[0]:
            self._fail(TraceFormatError(
                self.path, lineno,
                f"ts {sample.ts!r} for gpu {_short(sample.gpu)} on node {_short(sample.node)} does not increase "
                f"(line {last[1]} had ts {last[0]!r})"))
            return None
        self._last_ts[key] = (sample.ts, lineno)
        return sample

    def _admit(self, lineno: int, key: tuple[str, str]) -> None:
        if self.max_gpus is not None and len(self.gpus) >= self.max_gpus:
            raise TooManyGpus(self.path, lineno, f"more than {self.max_gpus} distinct GPUs (node, gpu): gpu "
                                                 f"{_short(key[1])} on node {_short(key[0])} is the first past the limit",
                              self.max_gpus)
        self.gpus.add(key)

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
               max_gpus: int | None = DEFAULT_MAX_GPUS) -> Iterator[GpuSample]:
    """Yield the samples of a trace; see :class:`TraceReader` for the rules and for the header."""
    yield from TraceReader(source, strict=strict, max_gpus=max_gpus)
