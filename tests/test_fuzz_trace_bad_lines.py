"""Fuzzing the trace reader (docs/trace-format.md): whatever a line holds, the reader yields samples or
raises TraceFormatError naming the file and the right 1-based line, never anything else.

Traces come from users, other tools and hand edits, and ``roofwatch classify`` replays them, so a bad line
must be reported where it is: one bad line among good ones (with blank lines, BOM and CRLF), a ``ts``
that does not increase, arbitrary lines and bytes, deep nesting and quoted non-finite numbers.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from agent.model import SAMPLE_FIELDS, GpuSample
from agent.trace import FORMAT_NAME, TraceFormatError, TraceReader, read_trace, sample_to_dict
from agent.trace.reader import TS_MIN
from tests.trace_fuzzing import FUZZ, distinct_gpus, json_values, read_all, samples

HEADER = json.dumps({"format": FORMAT_NAME, "version": 1})


def sample_line(sample: GpuSample) -> str:
    """One trace line as another tool could write it (ASCII-escaped JSON, unlike TraceWriter)."""
    return json.dumps(sample_to_dict(sample))


# --------------------------------------------------------------------------- one bad line, named exactly


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


@pytest.mark.slow
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


@pytest.mark.slow
@settings(FUZZ, max_examples=25)
@given(good=st.lists(samples, min_size=2, max_size=4), data=st.data())
def test_ts_that_does_not_increase_is_named_at_the_later_line(tmp_path_factory: pytest.TempPathFactory,
                                                              good: list[GpuSample], data: st.DataObject) -> None:
    """Within one GPU ``ts`` increases; the repeat is the bad line, and the message names the earlier one."""
    good = distinct_gpus(good)
    earlier = data.draw(st.integers(0, len(good) - 1), label="repeated sample")
    back = data.draw(st.sampled_from([0.0, 1.0]))
    repeat = dataclasses.replace(good[earlier], ts=max(TS_MIN, good[earlier].ts - back))  # never before the epoch
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


@FUZZ
@given(lines=st.lists(arbitrary_line, max_size=8), crlf=st.booleans(), bom=st.booleans())
def test_arbitrary_lines_give_samples_or_a_located_error(tmp_path_factory: pytest.TempPathFactory,
                                                         lines: list[bytes], crlf: bool, bom: bool) -> None:
    """Never another exception; the error names the file and a line that exists, and that line is the first
    bad one: the file cut just before it reads cleanly. Non-strict agrees with strict."""
    content = (b"\xef\xbb\xbf" if bom else b"") + b"".join(line + (b"\r\n" if crlf else b"\n") for line in lines)
    path = tmp_path_factory.mktemp("any") / "t.jsonl"
    path.write_bytes(content)
    got, err, _ = read_all(path, strict=True)
    lenient, fatal, kept = read_all(path, strict=False)
    if err is None:
        assert fatal is None and kept == [] and lenient == got
        assert all(isinstance(s, GpuSample) and math.isfinite(s.ts) for s in got)
        return
    assert err.path == str(path) and 1 <= err.line <= len(lines)
    assert str(err).startswith(f"{path}:{err.line}: ")
    before = tmp_path_factory.mktemp("prefix") / "t.jsonl"
    before.write_bytes(content[: len(content) - sum(len(line) + (2 if crlf else 1) for line in lines[err.line - 1:])])
    assert read_all(before, strict=True)[1] is None, "an earlier line was bad"
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
    _, err, _ = read_all(source, strict=True)
    if err is not None:
        assert err.path == name and err.line >= 1 and str(err).startswith(f"{name}:{err.line}: ")
    if as_stream:
        source = io.BytesIO(content)
    _, fatal, kept = read_all(source, strict=False)
    assert all(e.path == name and e.line >= 1 for e in kept + ([fatal] if fatal else []))


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
