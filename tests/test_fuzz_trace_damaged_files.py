"""Fuzzing the trace reader (docs/trace-format.md): files cut anywhere, truncated or corrupt gzip.

A trace as the agent writes it, cut at any byte (a killed writer) or with any byte changed: the
complete lines read, and the error names the first line not read, never another exception.
"""

from __future__ import annotations

import math
import tempfile
import zlib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.model import Attribution, GpuSample, ProcessSample
from agent.trace import TraceFormatError, TraceReader, TraceWriter, read_trace
from tests.trace_fuzzing import FUZZ, read_all


def _trace_bytes(count: int, compressed: bool) -> tuple[bytes, list[GpuSample]]:
    """A trace as the agent writes it (TraceWriter): header, then ``count`` samples of two GPUs."""
    batch = [GpuSample(ts=1000.0 + i // 2, gpu=str(i % 2), node="n", power_w=300.0 + i, gr_active=0.5,
                       processes=(ProcessSample(pid=i + 1, name=f"py\u00e9{i}", used_memory_bytes=i),),
                       attribution=Attribution(job_id=f"job-{i}", pod="p\u202etrain"))
             for i in range(count)]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / ("t.jsonl.gz" if compressed else "t.jsonl")
        with TraceWriter(path, node="n", started_at=0.0) as writer:
            writer.write_many(batch)
        return path.read_bytes(), batch


PLAIN, PLAIN_SAMPLES = _trace_bytes(300, compressed=False)
GZ, GZ_SAMPLES = _trace_bytes(300, compressed=True)


@FUZZ
@given(cut=st.integers(1, len(PLAIN)))
def test_plain_file_cut_anywhere(tmp_path_factory: pytest.TempPathFactory, cut: int) -> None:
    """A file cut mid-line (a killed writer): the complete lines read, the partial one is an error at its line."""
    data = PLAIN[:cut]
    path = tmp_path_factory.mktemp("cut") / "t.jsonl"
    path.write_bytes(data)
    complete = data.count(b"\n")  # the header is line 1
    partial = data.rsplit(b"\n", 1)[-1]
    reader = TraceReader(path, strict=False) if complete or not partial else None
    if not partial or PLAIN[cut:cut + 1] == b"\n":  # nothing cut, or only the last newline
        lines = complete + (1 if partial else 0)
        assert list(read_trace(path)) == PLAIN_SAMPLES[: max(0, lines - 1)]
        return
    if reader is not None:
        assert list(reader) == PLAIN_SAMPLES[: max(0, complete - 1)]
        assert [e.line for e in reader.errors] == [complete + 1]
    with pytest.raises(TraceFormatError) as info:
        list(read_trace(path))
    assert (info.value.line, info.value.path) == (complete + 1, str(path))


@FUZZ
@given(cut=st.integers(2, len(GZ) - 1))
def test_truncated_gzip_names_the_first_line_not_read(tmp_path_factory: pytest.TempPathFactory, cut: int) -> None:
    """A truncated .gz keeps every line that decompresses whole; the error names the line after them."""
    data = GZ[:cut]
    readable = zlib.decompressobj(wbits=31).decompress(data)  # what any gzip reader can recover
    complete = readable.count(b"\n")
    path = tmp_path_factory.mktemp("gz") / "t.jsonl.gz"
    path.write_bytes(data)
    reader: TraceReader | None = None
    try:
        reader = TraceReader(path, strict=False)
        got = list(reader)
    except TraceFormatError:  # pragma: no cover - only a bad header raises in non-strict mode
        pytest.fail("non-strict reading raised")
    assert got == GZ_SAMPLES[: max(0, complete - 1)]
    assert [e.line for e in reader.errors] == [complete + 1]
    assert "truncated or corrupt" in str(reader.errors[0]) and reader.errors[0].path == str(path)
    with pytest.raises(TraceFormatError) as info:
        list(read_trace(path))
    assert info.value.line == complete + 1


@FUZZ
@given(position=st.integers(0, len(GZ) - 1), value=st.integers(0, 255), strict=st.booleans())
def test_corrupt_gzip_gives_samples_or_a_located_error(tmp_path_factory: pytest.TempPathFactory, position: int,
                                                       value: int, strict: bool) -> None:
    """A changed byte anywhere (header, deflate data, CRC): never an exception other than TraceFormatError."""
    data = bytearray(GZ)
    data[position] = value
    path = tmp_path_factory.mktemp("corrupt") / "t.jsonl.gz"
    path.write_bytes(bytes(data))
    got, err, kept = read_all(path, strict=strict)
    for e in kept + ([err] if err else []):
        assert e.path == str(path) and e.line >= 1 and str(e).startswith(f"{path}:{e.line}: "), str(e)
    assert all(math.isfinite(s.ts) for s in got)
    if bytes(data) == GZ:  # the byte was set to its own value: nothing is wrong
        assert err is None and kept == [] and got == GZ_SAMPLES
