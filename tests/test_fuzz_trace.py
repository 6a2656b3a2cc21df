"""Fuzzing the trace reader (shared/trace-format.md): whatever a file holds, the reader yields samples or
raises TraceFormatError naming the file and the right 1-based line, never anything else.

Traces come from users, other tools and hand edits, and ``roofwatch classify`` replays them, so a bad line
must be reported where it is, and a good line must read as written.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import tempfile
import zlib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from agent.model import (DTYPES, SAMPLE_FIELDS, WORKLOAD_CLASSES, Attribution, GpuSample, HostSample, LinkTraffic,
                         ProcessSample, RemappedRows, WorkloadReport, XidCount)
from agent.trace import FORMAT_NAME, TraceFormatError, TraceReader, TraceWriter, read_trace, sample_to_dict

HEADER = json.dumps({"format": FORMAT_NAME, "version": 1})
FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# --------------------------------------------------------------------------- valid samples

finite = st.floats(allow_nan=False, allow_infinity=False)
nonneg = st.floats(min_value=0.0, allow_nan=False, allow_infinity=False)
ratio = st.floats(min_value=0.0, max_value=1.0)
nonneg_int = st.integers(min_value=0, max_value=2**64)
escaped_bytes = st.integers(0x80, 0xFF).map(lambda byte: chr(0xDC00 + byte))
"""Lone surrogates as Python and psutil decode undecodable bytes (``surrogateescape``) in process names."""
text = st.lists(st.characters(codec="utf-8") | escaped_bytes, max_size=12).map("".join)


def opt(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.none() | strategy


RATIOS = ("gr_active", "sm_active", "sm_occupancy", "tensor_active", "fp64_active", "fp32_active", "fp16_active",
          "dram_active", "tensor_hmma_active", "tensor_imma_active", "tensor_dmma_active", "tensor_dfma_active")
NONNEG = ("pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s", "link_tx_bytes_per_s", "link_rx_bytes_per_s",
          "net_tx_bytes_per_s", "net_rx_bytes_per_s", "power_w", "sm_clock_mhz", "sm_clock_max_mhz", "energy_j",
          "power_limit_w", "net_congestion_per_s", "net_retransmits_per_s", "pcie_bytes_per_s")
NONNEG_INTS = ("mem_used_bytes", "mem_total_bytes", "clock_event_reasons", "ecc_corrected_errors",
               "ecc_uncorrected_errors", "driver_calls", "net_link_downs", "pcie_replays")

processes = st.builds(
    ProcessSample, pid=nonneg_int, name=opt(text), command=opt(text), user=opt(text), sm_util=opt(ratio),
    **{f: opt(nonneg_int) for f in ("used_memory_bytes", "workers", "rss_bytes", "compute_units")},
    **{f: opt(nonneg) for f in ("cpu_cores", "cpu_main_cores", "cpu_workers_cores", "cpu_limit_cores",
                                "io_read_bytes_per_s", "io_write_bytes_per_s")},
)
SAMPLE_STRATEGIES: dict[str, st.SearchStrategy[Any]] = {
    "ts": finite, "gpu": text, "node": text, "uuid": opt(text), "vendor": opt(st.sampled_from(["nvidia", "amd"])),
    "model": opt(text), "interval_s": opt(st.floats(min_value=0.0, exclude_min=True, allow_infinity=False)),
    "temperature_c": opt(finite), "memory_temperature_c": opt(finite), "dtype": opt(st.sampled_from(DTYPES)),
    "label": opt(st.sampled_from(WORKLOAD_CLASSES)),
    "processes": opt(st.lists(processes, max_size=3).map(tuple)),
    "host": opt(st.builds(HostSample, **{f: opt(ratio) for f in ("cpu_iowait_ratio", "io_pressure_ratio",
                                                                  "cpu_pressure_ratio", "cpu_utilization_ratio")})),
    "workload": opt(st.builds(
        WorkloadReport, job=opt(text), rank=opt(nonneg_int), world_size=opt(st.integers(1, 10**6)), step=opt(nonneg_int),
        step_time_s=opt(nonneg), tokens_per_s=opt(nonneg), flops_per_token=opt(nonneg), model_bytes=opt(nonneg),
        dtype=opt(st.sampled_from(DTYPES)), source=opt(st.sampled_from(["client", "vllm", "sglang", "tgi"])))),
    "clock_event_time_s": opt(st.dictionaries(text, nonneg, max_size=3)),
    "remapped_rows": opt(st.builds(RemappedRows, correctable=nonneg_int, uncorrectable=nonneg_int,
                                   pending=st.booleans(), failure=st.booleans())),
    "xid_errors": opt(st.lists(st.builds(XidCount, xid=nonneg_int, count=st.integers(1, 2**32), last_ts=finite),
                               max_size=2).map(tuple)),
    "attribution": opt(st.builds(Attribution, **{f: opt(text) for f in ("job_id", "user", "partition", "namespace",
                                                                        "pod", "container")})),
    "links": opt(st.lists(st.builds(LinkTraffic, link=nonneg_int, read_bytes=opt(nonneg), write_bytes=opt(nonneg),
                                    up=opt(st.booleans())), max_size=2).map(tuple)),
    **{f: opt(ratio) for f in RATIOS},
    **{f: opt(nonneg) for f in NONNEG},
    **{f: opt(nonneg_int) for f in NONNEG_INTS},
}
samples = st.builds(GpuSample, **SAMPLE_STRATEGIES)


def distinct_gpus(batch: list[GpuSample]) -> list[GpuSample]:
    """``ts`` must increase per GPU (contract), so each sample gets a GPU of its own."""
    return [dataclasses.replace(s, gpu=f"{i}/{s.gpu}") for i, s in enumerate(batch)]


def sample_line(sample: GpuSample) -> str:
    """One trace line as another tool could write it (ASCII-escaped JSON, unlike TraceWriter)."""
    return json.dumps(sample_to_dict(sample))


def test_the_sample_strategy_covers_every_field() -> None:
    """A field added to GpuSample must be added to the round-trip property too."""
    assert set(SAMPLE_STRATEGIES) == set(SAMPLE_FIELDS)


@FUZZ
@given(batch=st.lists(samples, max_size=4), compressed=st.booleans())
def test_round_trip_of_any_valid_sample(tmp_path_factory: pytest.TempPathFactory, batch: list[GpuSample],
                                        compressed: bool) -> None:
    """Every field, unicode and undecodable-byte names included, reads back equal, plain or gzip."""
    batch = distinct_gpus(batch)
    path = tmp_path_factory.mktemp("rt") / ("t.jsonl.gz" if compressed else "t.jsonl")
    with TraceWriter(path, node="prop") as writer:
        writer.write_many(batch)
    reader = TraceReader(path)
    assert reader.header is not None and reader.header["node"] == "prop"
    assert list(reader) == batch


# --------------------------------------------------------------------------- one bad line, named exactly

json_scalars = st.none() | st.booleans() | st.integers() | finite | st.text(max_size=8)
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=8)
not_a_number = st.sampled_from(["abc", "", "1,5", "0x10", "0.5", "7", True, False, [], [1.0], {}, {"v": 1}])
"""Values no numeric field accepts. pydantic's lax mode alone would take "0.5" and true (agent/trace/json_types.py)."""


def _is_skippable(line: str) -> bool:
    """Lines the reader skips rather than rejects: blank (Python whitespace) ones and later header lines."""
    text_ = line.removeprefix("\ufeff")
    if not text_.strip():
        return True
    try:
        obj = json.loads(text_)
    except (ValueError, RecursionError):
        return False
    return isinstance(obj, dict) and obj.get("format") == FORMAT_NAME and obj.get("version") == 1 and "ts" not in obj


@st.composite
def bad_lines(draw: st.DrawFn) -> bytes:
    """One line (without its newline) that the contract rejects, as raw bytes."""
    base = sample_to_dict(draw(samples))
    base["gpu"] = "bad"
    kind = draw(st.sampled_from(["text", "non_object", "wrong_type", "out_of_range", "non_finite", "quoted_non_finite",
                                 "missing", "utf8", "deep", "unknown_header"]))
    if kind == "text":
        line = draw(st.text(min_size=1).filter(lambda t: "\n" not in t and not _is_skippable(t)))
        try:
            assume(not isinstance(json.loads(line.removeprefix("\ufeff")), dict))
        except (ValueError, RecursionError):
            pass
        return line.encode()
    if kind == "non_object":
        return json.dumps(draw(json_values.filter(lambda v: not isinstance(v, dict)))).encode()
    if kind == "wrong_type":
        name = draw(st.sampled_from(["ts", "power_w", "mem_used_bytes", "gr_active", "host", "processes", "gpu", "node",
                                     "vendor", "label", "dtype", "workload", "attribution", "clock_event_time_s"]))
        if name in ("gpu", "node"):
            base[name] = draw(st.sampled_from([1.5, [], {}, True]))
        elif name in ("vendor", "label", "dtype"):
            base[name] = draw(st.sampled_from(["NVIDIA", "slow", "int4", 3, []]))
        elif name in ("host", "workload", "attribution", "clock_event_time_s"):
            base[name] = draw(st.sampled_from([[], "x", 1, [{}]]))
        elif name == "processes":
            base[name] = draw(st.sampled_from([{}, "x", 1, [1], [{"name": "no pid"}]]))
        else:
            base[name] = draw(not_a_number)
    elif kind == "out_of_range":
        name, value = draw(st.sampled_from([("gr_active", 1.5), ("dram_active", -0.1), ("power_w", -1.0),
                                            ("mem_used_bytes", -1), ("interval_s", 0.0), ("mem_total_bytes", 1.5)]))
        base[name] = value
    elif kind == "non_finite":
        name = draw(st.sampled_from(["ts", "power_w", "temperature_c", "gr_active"]))
        token = draw(st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", "-1e999"]))
        return json.dumps(base).replace("{", '{"%s": %s, ' % (name, token), 1).encode()
    elif kind == "quoted_non_finite":
        name = draw(st.sampled_from(["ts", "power_w", "temperature_c", "energy_j"]))
        base[name] = draw(st.sampled_from(["inf", "-inf", "NaN", "Infinity", "1e999"]))
    elif kind == "missing":
        del base[draw(st.sampled_from(["ts", "gpu"]))]
        base.pop("format", None)
    elif kind == "utf8":
        prefix = json.dumps(base)[:-1].encode()
        return prefix + b', "name": "' + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xe2\x82"])) + b'"}'
    elif kind == "deep":
        depth = draw(st.integers(2_000, 50_000))
        return b'{"ts": 1, "gpu": "bad", "extra": ' + b"[" * depth + b"]" * depth + b"}"
    else:
        return json.dumps({"format": draw(st.sampled_from(["other", FORMAT_NAME])),
                           "version": draw(st.sampled_from([2, 0, "1", None, 1.5]))}).encode()
    return json.dumps(base).encode()


@st.composite
def framed(draw: st.DrawFn, lines: list[bytes]) -> tuple[bytes, list[int]]:
    """The lines joined with LF or CRLF, blank lines sprinkled in, maybe a BOM: the file and each line's number."""
    out: list[bytes] = []
    numbers: list[int] = []
    for line in lines:
        for _ in range(draw(st.integers(0, 2))):
            out.append(draw(st.sampled_from([b"", b"   ", b"\t", b"\r"])))
        out.append(line)
        numbers.append(len(out))
    ends = [draw(st.sampled_from([b"\n", b"\r\n"])) for _ in out]
    data = b"".join(line + end for line, end in zip(out, ends))
    if draw(st.booleans()):
        data = b"\xef\xbb\xbf" + data
    return data, numbers


@FUZZ
@given(data=st.data(), good=st.lists(samples, max_size=5), header=st.booleans(), bad=bad_lines())
def test_one_bad_line_is_named_by_file_and_line(tmp_path_factory: pytest.TempPathFactory, data: st.DataObject,
                                                good: list[GpuSample], header: bool, bad: bytes) -> None:
    """Strict: TraceFormatError at exactly the bad line (header, blank lines, BOM and CRLF all counted).
    Non-strict: every good sample, and that one error."""
    good = distinct_gpus(good)
    lines = [sample_line(s).encode() for s in good]
    position = data.draw(st.integers(0, len(lines)), label="bad line index")
    lines.insert(position, bad)
    if header:
        lines.insert(0, HEADER.encode())
    content, numbers = data.draw(framed(lines), label="framing")
    bad_number = numbers[position + (1 if header else 0)]
    path = tmp_path_factory.mktemp("bad") / "trace.jsonl"
    path.write_bytes(content)

    with pytest.raises(TraceFormatError) as info:
        list(read_trace(path))
    err = info.value
    assert (err.path, err.line) == (str(path), bad_number), str(err)
    assert str(err).startswith(f"{path}:{bad_number}: ") and err.reason
    if bad.startswith(b'{"format"'):
        return  # a bad header line is fatal in both modes: nothing after it can be trusted
    reader = TraceReader(path, strict=False)
    assert list(reader) == good
    assert [(e.path, e.line, str(e)) for e in reader.errors] == [(err.path, err.line, str(err))]


@settings(FUZZ, max_examples=25)
@given(good=st.lists(samples, min_size=2, max_size=4), data=st.data())
def test_ts_that_does_not_increase_is_named_at_the_later_line(tmp_path_factory: pytest.TempPathFactory,
                                                              good: list[GpuSample], data: st.DataObject) -> None:
    """Within one GPU ``ts`` increases; the repeat is the bad line, and the message names the earlier one."""
    good = distinct_gpus(good)
    earlier = data.draw(st.integers(0, len(good) - 1), label="repeated sample")
    repeat = dataclasses.replace(good[earlier], ts=good[earlier].ts - data.draw(st.sampled_from([0.0, 1.0])))
    lines = [HEADER] + [sample_line(s) for s in good] + [sample_line(repeat)]
    path = tmp_path_factory.mktemp("ts") / "t.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(TraceFormatError) as info:
        list(read_trace(path))
    assert info.value.line == len(lines) and f"line {earlier + 2} had ts" in info.value.reason


# --------------------------------------------------------------------------- anything at all

arbitrary_line = st.one_of(
    st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")),
    st.text(max_size=30).map(lambda t: t.replace("\n", "").encode()),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.dictionaries(st.sampled_from(list(SAMPLE_FIELDS) + ["format", "version", "x"]), json_values | not_a_number,
                    max_size=5).map(lambda d: json.dumps(d).encode()),
    samples.map(lambda s: sample_line(s).encode()),
    st.just(HEADER.encode()),
)


def _read_all(source: Path | io.BytesIO, strict: bool) -> tuple[list[GpuSample], TraceFormatError | None, list[TraceFormatError]]:
    """Samples, the error raised (if any) and the errors kept; any other exception fails the test."""
    got: list[GpuSample] = []
    reader: TraceReader | None = None
    try:
        reader = TraceReader(source, strict=strict)
        for sample in reader:
            got.append(sample)
    except TraceFormatError as exc:
        return got, exc, reader.errors if reader is not None else []
    return got, None, reader.errors


@FUZZ
@given(lines=st.lists(arbitrary_line, max_size=8), crlf=st.booleans(), bom=st.booleans())
def test_arbitrary_lines_give_samples_or_a_located_error(tmp_path_factory: pytest.TempPathFactory,
                                                         lines: list[bytes], crlf: bool, bom: bool) -> None:
    """Never another exception; the error names the file and a line that exists, and that line is the first
    bad one: the file cut just before it reads cleanly. Non-strict agrees with strict."""
    content = (b"\xef\xbb\xbf" if bom else b"") + b"".join(line + (b"\r\n" if crlf else b"\n") for line in lines)
    path = tmp_path_factory.mktemp("any") / "t.jsonl"
    path.write_bytes(content)
    got, err, _ = _read_all(path, strict=True)
    lenient, fatal, kept = _read_all(path, strict=False)
    if err is None:
        assert fatal is None and kept == [] and lenient == got
        assert all(isinstance(s, GpuSample) and math.isfinite(s.ts) for s in got)
        return
    assert err.path == str(path) and 1 <= err.line <= len(lines)
    assert str(err).startswith(f"{path}:{err.line}: ")
    before = tmp_path_factory.mktemp("prefix") / "t.jsonl"
    before.write_bytes(content[: len(content) - sum(len(line) + (2 if crlf else 1) for line in lines[err.line - 1:])])
    assert _read_all(before, strict=True)[1] is None, "an earlier line was bad"
    if kept or fatal is None or fatal.line == err.line:  # non-strict reading met the same error first
        first = kept[0] if kept else fatal
        assert first is not None and (first.line, str(first)) == (err.line, str(err))
    else:  # a bad header raised while opening hides the errors kept before it (the reader never returned)
        assert fatal.line > err.line
    assert [e.line for e in kept] == sorted({e.line for e in kept})  # one error per bad line, in order
    assert len(lenient) >= len(got)


@FUZZ
@given(content=st.binary(max_size=300), as_stream=st.booleans())
def test_arbitrary_bytes_never_raise_anything_else(tmp_path_factory: pytest.TempPathFactory, content: bytes,
                                                   as_stream: bool) -> None:
    """Random bytes (gzip magic included now and then) from a path or a binary stream."""
    if content[:1] == b"\x1f":
        content = b"\x1f\x8b" + content[1:]
    if as_stream:
        source: Path | io.BytesIO = io.BytesIO(content)
        name = "<stream>"
    else:
        source = tmp_path_factory.mktemp("bytes") / "t.bin"
        source.write_bytes(content)
        name = str(source)
    _, err, _ = _read_all(source, strict=True)
    if err is not None:
        assert err.path == name and err.line >= 1 and str(err).startswith(f"{name}:{err.line}: ")
    if as_stream:
        source = io.BytesIO(content)
    _, fatal, kept = _read_all(source, strict=False)
    assert all(e.path == name and e.line >= 1 for e in kept + ([fatal] if fatal else []))


# --------------------------------------------------------------------------- unknown fields, null

KNOWN_NESTED = {"host": HostSample, "workload": WorkloadReport, "attribution": Attribution, "remapped_rows": RemappedRows}


@FUZZ
@given(sample=samples, extra=st.dictionaries(st.text(max_size=10), json_values, min_size=1, max_size=4), data=st.data())
def test_unknown_fields_are_ignored_at_every_level(sample: GpuSample, extra: dict[str, Any], data: st.DataObject) -> None:
    """Fields a reader does not know, top level or nested, with any JSON value, change nothing (the contract)."""
    obj = sample_to_dict(sample)
    top = {k: v for k, v in extra.items() if k not in SAMPLE_FIELDS and k not in ("format",)}
    obj.update(top)
    for name, cls in KNOWN_NESTED.items():
        if isinstance(obj.get(name), dict):
            known = {f.name for f in dataclasses.fields(cls)}
            obj[name].update({k: v for k, v in extra.items() if k not in known})
    for proc in obj.get("processes", []):
        known = {f.name for f in dataclasses.fields(ProcessSample)}
        proc.update({k: v for k, v in extra.items() if k not in known})
    assert list(read_trace(io.StringIO(json.dumps(obj) + "\n"))) == [sample]


def _nullable(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)
            if f.default is not dataclasses.MISSING and f.name not in ("ts", "gpu")]


@FUZZ
@given(sample=samples, data=st.data())
def test_null_reads_as_unknown_for_every_optional_field(sample: GpuSample, data: st.DataObject) -> None:
    """``null`` is unknown, never zero: every optional field (top level and nested) may be null and then reads
    as its default (None, or "local" for ``node``)."""
    obj = sample_to_dict(sample)
    nulled = data.draw(st.sets(st.sampled_from(_nullable(GpuSample))), label="null at top level")
    for name in nulled:
        obj[name] = None
    expected = dataclasses.replace(sample, **{name: GpuSample.__dataclass_fields__[name].default for name in nulled})
    for name in ("host", "workload", "attribution"):
        if isinstance(obj.get(name), dict):
            inner = data.draw(st.sets(st.sampled_from(_nullable(KNOWN_NESTED[name]))), label=f"null in {name}")
            obj[name].update(dict.fromkeys(inner, None))
            expected = dataclasses.replace(expected, **{name: dataclasses.replace(getattr(expected, name),
                                                                                   **dict.fromkeys(inner))})
    if obj.get("processes"):
        inner = data.draw(st.sets(st.sampled_from(_nullable(ProcessSample))), label="null in processes")
        for proc in obj["processes"]:
            proc.update(dict.fromkeys(inner, None))
        expected = dataclasses.replace(expected, processes=tuple(dataclasses.replace(p, **dict.fromkeys(inner))
                                                                 for p in expected.processes or ()))
    assert list(read_trace(io.StringIO(json.dumps(obj)))) == [expected]


def test_every_top_level_optional_field_null_at_once() -> None:
    """The plainest case of the contract, spelled out: a line with only ts and gpu known."""
    line = json.dumps({"ts": 5, "gpu": "0", **dict.fromkeys(_nullable(GpuSample))})
    assert list(read_trace(io.StringIO(line))) == [GpuSample(ts=5.0, gpu="0")]


# --------------------------------------------------------------------------- cut files, gzip

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
    got, err, kept = _read_all(path, strict=strict)
    for e in kept + ([err] if err else []):
        assert e.path == str(path) and e.line >= 1 and str(e).startswith(f"{path}:{e.line}: "), str(e)
    assert all(math.isfinite(s.ts) for s in got)
    if bytes(data) == GZ:  # the byte was set to its own value: nothing is wrong
        assert err is None and kept == [] and got == GZ_SAMPLES


def test_deep_nesting_is_a_format_error_not_a_recursion_error(tmp_path: Path) -> None:
    """json.loads raises RecursionError on deep nesting; the reader must turn it into a located error."""
    path = tmp_path / "t.jsonl"
    path.write_text(HEADER + "\n" + '{"ts":1,"gpu":"0","x":' + "[" * 100_000 + "]" * 100_000 + "}\n")
    with pytest.raises(TraceFormatError, match=r"t\.jsonl:2: not valid JSON: nested too deeply"):
        list(read_trace(path))
    reader = TraceReader(path, strict=False)
    assert list(reader) == [] and [e.line for e in reader.errors] == [2]


@pytest.mark.parametrize("quoted", ['"inf"', '"-Infinity"', '"NaN"', '"1e999"'])
@pytest.mark.parametrize("field", ["ts", "power_w", "temperature_c", "processes"])
def test_quoted_non_finite_numbers_are_rejected_like_bare_ones(tmp_path: Path, field: str, quoted: str) -> None:
    """Lax number parsing reads "inf" as a float; the contract says unknown is null, so it must be an error.
    A quoted number is refused as a string before pydantic sees it (agent/trace/json_types.py)."""
    value = f'[{{"pid":1,"cpu_cores":{quoted}}}]' if field == "processes" else quoted
    path = tmp_path / "t.jsonl"
    path.write_text('{"ts":1,"gpu":"0"}\n' + f'{{"ts":2,"gpu":"0","{field}":{value}}}\n')
    with pytest.raises(TraceFormatError, match=r"t\.jsonl:2: field '[a-z_\[\]0-9.]+': must be a number, not '"):
        list(read_trace(path))
