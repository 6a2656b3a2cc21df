"""Fuzzing the trace reader (docs/trace-format.md): valid lines read as written.

Any valid sample round-trips through TraceWriter and TraceReader, plain or gzip; fields a reader does
not know are ignored at every level, and ``null`` reads as unknown for every optional field. Bad
lines are in test_fuzz_trace_bad_lines.py, cut and corrupt files in test_fuzz_trace_damaged_files.py;
the strategies in tests/trace_fuzzing.py.
"""

from __future__ import annotations

import dataclasses
import io
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.model import (SAMPLE_FIELDS, Attribution, GpuSample, HostSample, ProcessSample, RemappedRows,
                         WorkloadReport)
from agent.trace import TraceReader, TraceWriter, read_trace, sample_to_dict
from tests.trace_fuzzing import FUZZ, SAMPLE_STRATEGIES, distinct_gpus, json_values, samples


def test_the_sample_strategy_covers_every_field() -> None:
    """A field added to GpuSample must be added to the round-trip property too."""
    assert set(SAMPLE_STRATEGIES) == set(SAMPLE_FIELDS)


@pytest.mark.slow
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


# --------------------------------------------------------------------------- unknown fields, null

KNOWN_NESTED = {"host": HostSample, "workload": WorkloadReport, "attribution": Attribution, "remapped_rows": RemappedRows}


@pytest.mark.slow
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


@pytest.mark.slow  # like the test above: a whole GpuSample per example, 0.6-4 s by the examples drawn (fresh clone)
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
