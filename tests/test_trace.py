"""Tests for agent.trace: the trace format contract (docs/trace-format.md), both directions."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import gzip
import io
import json
import math
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.model import DTYPES, WORKLOAD_CLASSES, Attribution, GpuSample, HostSample, ProcessSample, WorkloadReport
from agent.trace import (
    TraceFormatError,
    TraceReader,
    TraceWriteError,
    TraceWriter,
    read_trace,
    sample_to_dict,
)
from agent.trace.reader import INTERVAL_MAX_S, INTERVAL_MIN_S, TS_MAX, TS_MIN


def full_sample(ts: float = 100.0, gpu: str = "0", **overrides: object) -> GpuSample:
    values: dict[str, object] = dict(
        ts=ts, gpu=gpu, node="node-a", uuid="GPU-1234", vendor="nvidia", model="NVIDIA H100 80GB HBM3",
        interval_s=1.0, gr_active=0.97, sm_active=0.8, sm_occupancy=0.4, tensor_active=0.55,
        fp64_active=0.0, fp32_active=0.1, fp16_active=0.02, dram_active=0.31,
        pcie_tx_bytes_per_s=1.5e9, pcie_rx_bytes_per_s=2e8, link_tx_bytes_per_s=1e11,
        link_rx_bytes_per_s=9.5e10, net_tx_bytes_per_s=2.5e10, net_rx_bytes_per_s=2.4e10,
        power_w=650.5, temperature_c=71.0, sm_clock_mhz=1755.0, sm_clock_max_mhz=1980.0,
        mem_used_bytes=70 * 2**30, mem_total_bytes=80 * 2**30, clock_event_reasons=0x4, dtype="bf16",
        processes=(ProcessSample(pid=4242, name="python", used_memory_bytes=69 * 2**30, cpu_cores=1.5),
                   ProcessSample(pid=7)),
        host=HostSample(cpu_iowait_ratio=0.02, io_pressure_ratio=0.0),
        workload=WorkloadReport(job="llama-70b", rank=3, world_size=64, step=1200, step_time_s=4.2,
                                tokens_per_s=1.2e6, flops_per_token=8.4e11, model_bytes=1.4e11),
        label="compute_bound", energy_j=123456.75, power_limit_w=700.0, attribution=Attribution(job_id="llama-70b"),
    )
    values.update(overrides)
    return GpuSample(**values)  # type: ignore[arg-type]


def write_lines(path: Path, *lines: str) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def format_error(path: Path, *lines: str) -> TraceFormatError:
    write_lines(path, *lines)
    with pytest.raises(TraceFormatError) as info:
        list(read_trace(path))
    return info.value


HEADER = '{"format":"roofwatch-trace","version":1}'


# --------------------------------------------------------------------------- round trips


def test_round_trip_with_nested_objects(tmp_path: Path) -> None:
    samples = [full_sample(100.0, "0"), full_sample(100.0, "1", label=None, processes=()),
               GpuSample(ts=101.0, gpu="0"), full_sample(102.0, "0/1", host=HostSample())]
    path = tmp_path / "trace.jsonl"
    with TraceWriter(path, node="node-a") as writer:
        writer.write(samples[0])
        writer.write_many(samples[1:])
    assert list(read_trace(path)) == samples


def test_gzip_round_trip(tmp_path: Path) -> None:
    samples = [full_sample(100.0 + i) for i in range(50)]
    path = tmp_path / "trace.jsonl.gz"
    with TraceWriter(path, note="gzip") as writer:
        writer.write_many(samples)
    raw = path.read_bytes()
    assert raw[:2] == b"\x1f\x8b"
    assert gzip.decompress(raw).decode().splitlines()[0].startswith('{"format":"roofwatch-trace"')
    reader = TraceReader(path)
    assert reader.header is not None and reader.header["note"] == "gzip"
    assert list(reader) == samples


def test_gzip_detected_by_magic_bytes_not_suffix(tmp_path: Path) -> None:
    sample = full_sample()
    gz = tmp_path / "trace.jsonl.gz"
    with TraceWriter(gz) as writer:
        writer.write(sample)
    misleading = tmp_path / "looks-plain.jsonl"
    misleading.write_bytes(gz.read_bytes())
    assert list(read_trace(misleading)) == [sample]
    # and the other way round: plain text behind a .gz name
    plain = write_lines(tmp_path / "plain.jsonl.gz", json.dumps(sample_to_dict(sample)))
    assert list(read_trace(plain)) == [sample]


def test_reads_stdin_text_streams_and_gzip_on_stdin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    line = '{"ts":1.5,"gpu":"2","gr_active":0.5}\n'
    expected = [GpuSample(ts=1.5, gpu="2", gr_active=0.5)]
    assert list(read_trace(io.StringIO(line))) == expected
    assert list(read_trace(io.BytesIO(line.encode()))) == expected
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(gzip.compress(line.encode()))))
    assert list(read_trace("-")) == expected


def test_bom_and_invalid_utf8_lines(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + HEADER.encode() + b'\n{"ts":1,"gpu":"\xff"}\n{"ts":2,"gpu":"0"}\n')
    reader = TraceReader(path, strict=False)
    assert reader.header == {"format": "roofwatch-trace", "version": 1}
    assert list(reader) == [GpuSample(ts=2.0, gpu="0")]
    assert [e.line for e in reader.errors] == [2] and "not valid UTF-8" in str(reader.errors[0])


def test_writes_to_stdout_for_dash(capsys: pytest.CaptureFixture[str]) -> None:
    with TraceWriter("-", header=False) as writer:
        writer.write(GpuSample(ts=1.0, gpu="0", power_w=300.0))
    assert capsys.readouterr().out == '{"ts":1.0,"gpu":"0","node":"local","power_w":300.0}\n'
    assert not sys.stdout.closed


# --------------------------------------------------------------------------- writer output


def test_header_line_and_metadata(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    before = time.time()
    with TraceWriter(path, node="node-a", agent_version="0.1.0") as writer:
        writer.write(GpuSample(ts=1.0, gpu="0"))
    first = path.read_text().splitlines()[0]
    header = json.loads(first)
    assert header["format"] == "roofwatch-trace" and header["version"] == 1
    assert header["node"] == "node-a" and header["agent_version"] == "0.1.0"
    assert before <= header["started_at"] <= time.time()
    assert "note" not in header  # None metadata is omitted
    reader = TraceReader(path)
    assert reader.header == header
    assert list(reader) == [GpuSample(ts=1.0, gpu="0")]


def test_no_header(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    with TraceWriter(path, header=False) as writer:
        writer.write(GpuSample(ts=1.0, gpu="0"))
    assert path.read_text() == '{"ts":1.0,"gpu":"0","node":"local"}\n'
    reader = TraceReader(path)
    assert reader.header is None
    assert list(reader) == [GpuSample(ts=1.0, gpu="0")]


def test_none_fields_are_omitted_and_keys_keep_model_order(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    sample = GpuSample(ts=5.0, gpu="3", dram_active=0.25, gr_active=0.5,
                       processes=(ProcessSample(pid=9, cpu_cores=2.0),), workload=WorkloadReport(step=7))
    with TraceWriter(path, header=False) as writer:
        writer.write(sample)
    assert path.read_text() == (
        '{"ts":5.0,"gpu":"3","node":"local","gr_active":0.5,"dram_active":0.25,'
        '"processes":[{"pid":9,"cpu_cores":2.0}],"workload":{"step":7}}\n'
    )


def test_non_finite_floats_are_never_written(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    sample = GpuSample(ts=1.0, gpu="0", power_w=math.nan, temperature_c=-math.inf, sm_clock_mhz=math.inf,
                       gr_active=0.5, host=HostSample(cpu_iowait_ratio=math.nan, io_pressure_ratio=0.1),
                       processes=(ProcessSample(pid=1, cpu_cores=math.nan),))
    with TraceWriter(path, header=False) as writer:
        writer.write(sample)
    text = path.read_text()
    for token in ("NaN", "Infinity", "power_w", "temperature_c", "sm_clock_mhz", "cpu_iowait_ratio", "cpu_cores"):
        assert token not in text
    (back,) = read_trace(path)
    assert back.power_w is None and back.temperature_c is None and back.gr_active == 0.5
    assert back.host == HostSample(io_pressure_ratio=0.1)
    assert back.processes == (ProcessSample(pid=1),)


# --------------------------------------------------------------------------- reader leniency


def test_unknown_fields_are_ignored_top_level_and_nested(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "t.jsonl",
        '{"format":"roofwatch-trace","version":1,"future_meta":{"x":1}}',
        '{"ts":1,"gpu":"0","new_counter":42,"host":{"io_pressure_ratio":0.5,"psi_some":0.1},'
        '"workload":{"job":"j","optimizer":"adam"},"processes":[{"pid":3,"container":"c1"}]}',
    )
    assert list(read_trace(path)) == [GpuSample(
        ts=1.0, gpu="0", host=HostSample(io_pressure_ratio=0.5), workload=WorkloadReport(job="j"),
        processes=(ProcessSample(pid=3),))]


def test_null_is_read_as_unknown(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "t.jsonl",
        '{"ts":1,"gpu":"0","node":"n","gr_active":null,"host":null,"workload":{"rank":null},'
        '"processes":[{"pid":1,"name":null}],"label":null}',
    )
    assert list(read_trace(path)) == [GpuSample(
        ts=1.0, gpu="0", node="n", workload=WorkloadReport(), processes=(ProcessSample(pid=1),))]


def test_integer_gpu_becomes_string_and_blank_lines_are_skipped(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "t.jsonl", "", HEADER, "   ", '{"ts":1,"gpu":3}', "")
    reader = TraceReader(path)
    assert reader.header == {"format": "roofwatch-trace", "version": 1}
    assert list(reader) == [GpuSample(ts=1.0, gpu="3")]


def test_later_header_from_concatenated_traces_is_skipped(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "t.jsonl", HEADER, '{"ts":1,"gpu":"0"}', HEADER, '{"ts":2,"gpu":"0"}')
    assert [s.ts for s in read_trace(path)] == [1.0, 2.0]


# --------------------------------------------------------------------------- reader errors


def test_json_types_the_contract_allows_still_read(tmp_path: Path) -> None:
    """Integral floats in int fields (older writers), booleans where the contract has them, unknown
    fields of any type: all still accepted."""
    path = write_lines(tmp_path / "t.jsonl", '{"ts":1,"gpu":"0","mem_used_bytes":1.5e11,"x":true,"y":"0.5",'
                       '"remapped_rows":{"correctable":0,"uncorrectable":0,"pending":true,"failure":false},'
                       '"links":[{"link":0,"up":false,"z":true}],"workload":{"job":"7"}}')
    [sample] = list(read_trace(path))
    assert sample.mem_used_bytes == 150_000_000_000 and sample.remapped_rows.pending is True
    assert sample.links[0].up is False and sample.workload.job == "7"


def test_malformed_json_names_line_and_column(tmp_path: Path) -> None:
    err = format_error(tmp_path / "trace.jsonl", HEADER, '{"ts":1,"gpu":"0"}', '{"ts":2 "gpu":"0"}')
    assert err.line == 3 and err.path.endswith("trace.jsonl")
    assert str(err).endswith("trace.jsonl:3: not valid JSON: Expecting ',' delimiter at column 9")


def test_out_of_range_ratio_names_field_line_and_value(tmp_path: Path) -> None:
    lines = [HEADER] + [f'{{"ts":{i},"gpu":"0"}}' for i in range(15)] + ['{"ts":99,"gpu":"0","gr_active":1.5}']
    err = format_error(tmp_path / "trace.jsonl", *lines)
    assert err.line == 17
    assert "trace.jsonl:17: field 'gr_active': Input should be less than or equal to 1 (got 1.5)" in str(err)


def test_nested_field_error_names_the_path(tmp_path: Path) -> None:
    err = format_error(tmp_path / "t.jsonl", '{"ts":1,"gpu":"0","processes":[{"pid":1},{"pid":-5}]}')
    assert err.line == 1 and "field 'processes[1].pid'" in str(err) and "(got -5)" in str(err)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('{"gpu":"0"}', "missing required field 'ts'"),
        ('{"ts":1}', "missing required field 'gpu'"),
        ('{"ts":1,"gpu":"0","label":"slow"}', "field 'label': Input should be 'idle'"),
        ('{"ts":1,"gpu":"0","vendor":"intel"}', "field 'vendor'"),
        ('{"ts":1,"gpu":"0","dtype":"int4"}', "field 'dtype'"),
        ('[1, 2]', "expected a JSON object (one sample), got list"),
        ('{"ts":1,"gpu":"0","power_w":NaN}', "not valid JSON: NaN is not allowed"),
        ('{"ts":1,"gpu":"0","power_w":1e999}', "not valid JSON: number 1e999 is out of range"),
        ('{"ts":1,"gpu":"0","gr_active":true}', "field 'gr_active': must be a number, not true"),
        ('{"ts":true,"gpu":"0"}', "field 'ts': must be a number, not true"),
        ('{"ts":1,"gpu":"0","power_w":"250"}', "field 'power_w': must be a number, not '250'"),
        ('{"ts":1,"gpu":"0","mem_used_bytes":false}', "field 'mem_used_bytes': must be a number, not false"),
        ('{"ts":1,"gpu":"0","processes":[{"pid":1},{"pid":"2"}]}', "field 'processes[1].pid': must be a number"),
        ('{"ts":1,"gpu":"0","workload":{"tokens_per_s":true}}', "field 'workload.tokens_per_s': must be a number"),
        ('{"ts":1,"gpu":"0","remapped_rows":{"correctable":0,"uncorrectable":0,"pending":1,"failure":false}}',
         "field 'remapped_rows.pending': must be true or false, not 1"),
        ('{"ts":1,"gpu":"0","links":[{"link":0,"up":"yes"}]}', "field 'links[0].up': must be true or false"),
    ],
)
def test_bad_sample_lines(tmp_path: Path, line: str, expected: str) -> None:
    err = format_error(tmp_path / "t.jsonl", HEADER, "", line)
    assert err.line == 3
    assert f"t.jsonl:3: {expected}" in str(err)


def test_unsupported_version_is_rejected_clearly(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "t.jsonl", '{"format":"roofwatch-trace","version":2}', '{"ts":1,"gpu":"0"}')
    for strict in (True, False):  # nothing after an unreadable header can be trusted
        with pytest.raises(TraceFormatError, match=r"t\.jsonl:1: trace format version 2 is newer") as info:
            list(read_trace(path, strict=strict))
        assert info.value.line == 1


def test_bad_header_format_and_version(tmp_path: Path) -> None:
    err = format_error(tmp_path / "t.jsonl", '{"format":"other-trace","version":1}')
    assert "unknown trace format 'other-trace'" in str(err)
    err = format_error(tmp_path / "t.jsonl", '{"format":"roofwatch-trace","version":"1"}')
    assert "header 'version' must be a positive integer" in str(err)


def test_ts_must_increase_per_gpu_but_gpus_may_interleave(tmp_path: Path) -> None:
    good = write_lines(tmp_path / "good.jsonl", HEADER,
                       '{"ts":1,"gpu":"0"}', '{"ts":1,"gpu":"1"}', '{"ts":0.5,"gpu":"0","node":"b"}',
                       '{"ts":2,"gpu":"1"}', '{"ts":2,"gpu":"0"}')
    assert [(s.gpu, s.ts) for s in read_trace(good)] == [("0", 1.0), ("1", 1.0), ("0", 0.5), ("1", 2.0), ("0", 2.0)]
    err = format_error(tmp_path / "bad.jsonl", HEADER, '{"ts":5,"gpu":"0"}', '{"ts":6,"gpu":"1"}',
                       '{"ts":5,"gpu":"0"}')
    assert err.line == 4
    assert "does not increase" in str(err) and "line 2" in str(err)


def test_non_strict_collects_errors_and_keeps_good_lines(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "t.jsonl", HEADER, '{"ts":1,"gpu":"0"}', "{oops", '{"ts":2,"gpu":"0","gr_active":7}',
                       '{"ts":1,"gpu":"0"}', '{"ts":3,"gpu":"0"}', '{"ts":4,"gpu":"0"')
    reader = TraceReader(path, strict=False)
    assert [s.ts for s in reader] == [1.0, 3.0]
    assert [e.line for e in reader.errors] == [3, 4, 5, 7]
    assert all(isinstance(e, TraceFormatError) for e in reader.errors)
    with pytest.raises(TraceFormatError):
        list(read_trace(path))


def test_truncated_gzip_keeps_what_came_before(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl.gz"
    with TraceWriter(path) as writer:
        writer.write_many(full_sample(float(i)) for i in range(2000))
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    reader = TraceReader(path, strict=False)
    got = list(reader)
    assert 0 < len(got) < 2000 and got == [full_sample(float(i)) for i in range(len(got))]
    assert len(reader.errors) == 1 and "truncated or corrupt" in str(reader.errors[0])
    with pytest.raises(TraceFormatError, match="truncated or corrupt"):
        list(read_trace(path))


# --------------------------------------------------------------------------- write errors


def test_full_disk_raises_clear_error() -> None:
    if not Path("/dev/full").exists():
        pytest.skip("needs Linux /dev/full")
    writer = TraceWriter("/dev/full")
    with pytest.raises(TraceWriteError) as info:
        for i in range(10_000):  # more than any buffer; at the latest flush() must fail
            writer.write(full_sample(float(i)))
        writer.flush()
    err = info.value
    assert isinstance(err, OSError) and err.errno == errno.ENOSPC
    assert "/dev/full" in str(err) and "No space left on device" in str(err)
    with contextlib.suppress(TraceWriteError):  # what is left in the buffer may fail again
        writer.close()
    writer.close()  # the writer is closed now; closing again is a no-op, not a second error


def test_full_disk_error_surfaces_from_context_manager() -> None:
    if not Path("/dev/full").exists():
        pytest.skip("needs Linux /dev/full")
    with pytest.raises(TraceWriteError, match="No space left on device"):
        with TraceWriter("/dev/full") as writer:
            writer.write(GpuSample(ts=1.0, gpu="0"))  # buffered; the flush in close() fails


def test_unopenable_path_raises_clear_error(tmp_path: Path) -> None:
    with pytest.raises(TraceWriteError, match=r"missing-dir/t\.jsonl: No such file or directory"):
        TraceWriter(tmp_path / "missing-dir" / "t.jsonl")


# --------------------------------------------------------------------------- property

finite = st.floats(allow_nan=False, allow_infinity=False)
nonneg = st.floats(min_value=0.0, allow_nan=False, allow_infinity=False)
ratio = st.floats(min_value=0.0, max_value=1.0)
nonneg_int = st.integers(min_value=0, max_value=2**64)


def opt(strategy: st.SearchStrategy) -> st.SearchStrategy:
    return st.none() | strategy


_RATIOS = ("gr_active", "sm_active", "sm_occupancy", "tensor_active", "fp64_active", "fp32_active",
           "fp16_active", "dram_active")
_NONNEG = ("pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s", "link_tx_bytes_per_s", "link_rx_bytes_per_s",
           "net_tx_bytes_per_s", "net_rx_bytes_per_s", "power_w", "sm_clock_mhz", "sm_clock_max_mhz",
           "energy_j", "power_limit_w")

samples = st.builds(
    GpuSample,
    ts=st.floats(TS_MIN, TS_MAX),
    gpu=st.text(min_size=1),
    node=st.text(),
    uuid=opt(st.text()),
    vendor=opt(st.sampled_from(["nvidia", "amd"])),
    model=opt(st.text()),
    interval_s=opt(st.floats(min_value=INTERVAL_MIN_S, max_value=INTERVAL_MAX_S)),
    temperature_c=opt(finite),
    mem_used_bytes=opt(nonneg_int),
    mem_total_bytes=opt(nonneg_int),
    clock_event_reasons=opt(nonneg_int),
    dtype=opt(st.sampled_from(DTYPES)),
    processes=opt(st.lists(st.builds(ProcessSample, pid=nonneg_int, name=opt(st.text()),
                                     used_memory_bytes=opt(nonneg_int), cpu_cores=opt(nonneg)),
                           max_size=3).map(tuple)),
    host=opt(st.builds(HostSample, cpu_iowait_ratio=opt(ratio), io_pressure_ratio=opt(ratio))),
    workload=opt(st.builds(WorkloadReport, job=opt(st.text()), rank=opt(nonneg_int),
                           world_size=opt(st.integers(min_value=1, max_value=10**6)), step=opt(nonneg_int),
                           step_time_s=opt(nonneg), tokens_per_s=opt(nonneg), flops_per_token=opt(nonneg),
                           model_bytes=opt(nonneg))),
    label=opt(st.sampled_from(WORKLOAD_CLASSES)),
    **{name: opt(ratio) for name in _RATIOS},
    **{name: opt(nonneg) for name in _NONNEG},
)


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(st.lists(samples, max_size=5))
def test_round_trip_property(tmp_path_factory: pytest.TempPathFactory, batch: list[GpuSample]) -> None:
    # ts must increase per GPU (contract), so give each sample its own GPU
    batch = [dataclasses.replace(s, gpu=f"{i}/{s.gpu}") for i, s in enumerate(batch)]
    path = tmp_path_factory.mktemp("prop") / "t.jsonl.gz"
    with TraceWriter(path, node="prop") as writer:
        writer.write_many(batch)
    assert list(read_trace(path)) == batch
