"""Fuzzing what a trace written by someone else can do to ``classify`` and ``report``.

Lines shaped like samples but holding extreme numbers (non-finite tokens, 1e308, subnormals,
400-digit integers) and text from every Unicode category, mixed with lines nested 100 000 deep,
lines of up to 12 MiB and raw bytes. For every input, within a time and memory bound: the reader
returns samples and errors naming lines (never another exception), the verdicts are valid JSON with
every MFU and MBU unknown or within the documented bound, and the report page encodes as UTF-8 with
no control character in it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from agent.classifier.engine import classify_samples
from agent.classifier.roofline import MAX_UTILISATION
from agent.trace import TraceFormatError, TraceReader
from agent.trace.reader import MAX_LINE_BYTES, TS_MAX, TS_MIN
from agent.views.report import build_report
from tests.hostile_fuzzing import FUZZ, any_text, bounded, deep, numbers

RAW_CONTROLS = ("\x1b", "\x9b", "\x07", "\x00", "\u202e", "\u2028")

plausible_ts = st.floats(TS_MIN, TS_MAX) | st.sampled_from([TS_MIN, TS_MAX, 1.8e9])
big = st.sampled_from([0.0, 5e-324, 1e-300, 1e-9, 1.0, 1e18, 1e300, 1.7976931348623157e308]) | st.floats(0.0, allow_infinity=False)
"""Numbers the contract allows (non-negative, finite) at their extremes: these reach the classifier."""
ratio = st.sampled_from([0.0, 5e-324, 1e-300, 0.5, 1.0]) | st.floats(0.0, 1.0)
edgy = big | numbers  # mostly allowed, sometimes anything at all (refused by line)
sample_like = st.fixed_dictionaries(
    {"ts": plausible_ts | numbers, "gpu": st.sampled_from(["0", "1"]) | any_text},
    optional={
        "node": any_text, "model": st.sampled_from(["NVIDIA H100 80GB HBM3", "AMD Instinct MI300X"]) | any_text,
        "interval_s": big, "gr_active": ratio, "sm_active": ratio, "tensor_active": ratio,
        "dram_active": ratio | numbers, "power_w": edgy, "power_limit_w": edgy, "sm_clock_mhz": edgy,
        "sm_clock_max_mhz": edgy, "mem_used_bytes": st.integers(0, 2**64), "temperature_c": edgy,
        "workload": st.fixed_dictionaries({}, optional={
            "tokens_per_s": edgy, "flops_per_token": edgy, "model_bytes": edgy, "step_time_s": edgy,
            "world_size": st.integers(-2, 2**40), "step": st.integers(0, 2**64), "job": any_text}),
        "attribution": st.fixed_dictionaries({}, optional={"job_id": any_text, "user": any_text, "pod": any_text}),
        "processes": st.lists(st.fixed_dictionaries({"pid": st.integers(0, 2**64)}, optional={
            "name": any_text, "cpu_cores": numbers}), max_size=3),
    })


def encoded(obj: dict[str, Any], ascii_only: bool) -> bytes:
    """NaN and Infinity written as the tokens a careless writer would; lone surrogates as raw bytes."""
    return json.dumps(obj, allow_nan=True, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")


hostile_line = st.one_of(
    st.tuples(sample_like, st.booleans()).map(lambda t: encoded(*t)),
    st.integers(1, 100_000).map(lambda d: ('{"ts": 1.8e9, "gpu": "0", "x": ' + deep(d) + "}").encode()),
    st.integers(MAX_LINE_BYTES - 64, 3 * MAX_LINE_BYTES).map(lambda n: b'{"ts": 1.8e9, "gpu": "0", "m": "' + b"x" * n + b'"}'),
    st.binary(max_size=64).map(lambda b: b.replace(b"\n", b"")),
)


def busy_minute(gpu: str, start: float) -> list[bytes]:
    return [json.dumps({"ts": start + i, "gpu": gpu, "interval_s": 1.0, "gr_active": 0.9, "tensor_active": 0.5,
                        "dram_active": 0.3, "model": "NVIDIA H100 80GB HBM3"}).encode() for i in range(60)]


def check_verdict_json(verdict) -> None:
    line = json.dumps(verdict.to_json(), allow_nan=False)  # `classify` prints this: it must be JSON
    data = json.loads(line)
    for key in ("mfu", "mbu", "mfu_workload", "mbu_workload"):
        value = data[key]
        assert value is None or 0.0 <= value <= MAX_UTILISATION, (key, value)


@pytest.mark.slow
@FUZZ
@given(lines=st.lists(hostile_line, min_size=1, max_size=6), strict=st.booleans())
def test_any_trace_is_replayed_or_refused_by_line_within_bounds(tmp_path_factory: pytest.TempPathFactory,
                                                                lines: list[bytes], strict: bool) -> None:
    path = tmp_path_factory.mktemp("hostile") / "t.jsonl"
    path.write_bytes(b"\n".join(busy_minute("9", 1.8e9) + lines) + b"\n")
    with bounded("read, classify and report"):
        reader = TraceReader(path, strict=strict)
        try:
            samples = list(reader)
        except TraceFormatError as exc:
            assert strict and exc.path == str(path) and exc.line > 60 and "\n" not in exc.reason
            return
        assert all(60 < e.line <= 60 + len(lines) for e in reader.errors)
        assert all(TS_MIN <= s.ts <= TS_MAX for s in samples)
        verdicts = list(classify_samples(samples))
        for verdict in verdicts:
            check_verdict_json(verdict)
        page = build_report(samples, verdicts, title="fuzz", sources=[path.name])
        page.encode("utf-8")  # strict: a lone surrogate here used to stop the report
        assert not any(c in page for c in RAW_CONTROLS)


@FUZZ
@given(sample=sample_like)
def test_extreme_numbers_in_a_long_enough_trace_give_finite_verdicts(tmp_path_factory: pytest.TempPathFactory,
                                                                     sample: dict[str, Any]) -> None:
    """One GPU's minute of the same fuzzed sample (so the classifier has full windows to judge)."""
    lines = []
    for i in range(40):
        lines.append(encoded({**sample, "ts": 1.8e9 + i, "gpu": "0"}, True))
    path = tmp_path_factory.mktemp("extreme") / "t.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    with bounded("an extreme minute"):
        reader = TraceReader(path, strict=False)
        samples = list(reader)
        event(f"samples read: {bool(samples)}")
        for verdict in classify_samples(samples):
            check_verdict_json(verdict)
            assert all(math.isfinite(v) for v in verdict.scores.values()) and math.isfinite(verdict.confidence)
