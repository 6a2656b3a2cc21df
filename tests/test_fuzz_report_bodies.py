"""Fuzzing the report body over both transports: any JSON value or report-shaped object is stored
exactly when the schema allows it, arbitrary bytes and media types get the right 4xx, pathological
JSON (deep nesting, huge numbers, non-finite tokens, other encodings) is refused, and the body size
limit holds (413 past it, inclusive at it)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from agent.context.workload.report_schema import MAX_BODY_BYTES, MAX_HINT_LEN, MAX_STR_LEN
from agent.model import DTYPES
from tests.report_fixtures import JSON
from tests.report_fuzzing import (FLOAT_LIMITS, FUZZ, HINT_NAMES, INT_LIMITS, SERVING_LIMITS, Target,  # noqa: F401 (fixtures)
                                  fresh_errors, post, run_input, socket_dir, target, valid_report)

json_scalars = (st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
                | st.sampled_from([10**18, 10**18 + 1, 2**63, 2**64, 10**400, 1e18, 1e6, 1e6 + 1e-9, -0.0, 1e-400]))
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=10)
FIELD_VALUES: dict[str, st.SearchStrategy[Any]] = {
    **{name: st.floats(-1.0, 2 * limit) | st.integers(-2, int(2 * limit)) | st.sampled_from([0, limit, -0.0])
       for name, limit in FLOAT_LIMITS.items()},
    **{name: st.integers(low - 2, high + 2) | st.sampled_from([low, high, low - 1, high + 1, float(low), True])
       for name, (low, high) in INT_LIMITS.items()},
    "dtype": st.sampled_from([*DTYPES, "int4", "FP8", "", "bf16 "]),
    "job": st.text(max_size=MAX_STR_LEN + 3) | st.just("j" * MAX_STR_LEN) | st.just("\U0001f525" * MAX_STR_LEN),
    "gpu": st.text(max_size=MAX_STR_LEN + 3) | st.just("GPU-" + "a" * (MAX_STR_LEN - 4)),
    "hints": st.fixed_dictionaries({}, optional={
        **{name: st.none() | st.text(max_size=30) | st.just("0" * MAX_HINT_LEN) | st.just("0" * (MAX_HINT_LEN + 1))
           for name in HINT_NAMES},
        "LOCAL_RANK": st.none() | st.text(max_size=20) | st.just(" 1 "),
    }) | st.dictionaries(st.text(max_size=10), json_scalars, max_size=3),
    "serving": st.fixed_dictionaries({}, optional={
        name: st.none() | st.floats(-1.0, 2 * limit) | st.integers(-2, int(2 * limit)) | st.sampled_from([limit, True, "1"])
        for name, limit in SERVING_LIMITS.items()
    }) | st.dictionaries(st.text(max_size=10), json_scalars, max_size=3),
}
report_like = st.fixed_dictionaries({}, optional={name: values | json_values for name, values in FIELD_VALUES.items()})
reports = (report_like
           | st.tuples(report_like, st.text(min_size=1, max_size=10), json_values).map(lambda t: {**t[0], t[1]: t[2]})
           | json_values)


@pytest.mark.slow
@FUZZ
@given(obj=reports, ascii_only=st.booleans())
def test_any_json_value_is_stored_only_when_valid(target: Target, obj: Any, ascii_only: bool) -> None:
    """Arbitrary JSON and report-shaped objects (wrong types per field, bounds +-1, huge numbers, NaN and
    Infinity tokens, unicode): 204 exactly when the schema allows it, else 422; the same connection then
    carries the next valid report (4xx answers to a complete body keep the connection)."""
    body = json.dumps(obj, ensure_ascii=ascii_only, allow_nan=True).encode()
    canary, step = target.canary_request()
    replies, accepted = run_input(target, post(body) + canary)
    if len(body) > MAX_BODY_BYTES:
        assert [r.status for r in replies] == [413] and replies[0].headers["connection"] == "close"
        assert accepted == 0
    else:
        expected = 204 if valid_report(obj) and target.names_a_gpu_here(obj) else 422
        assert [r.status for r in replies] == [expected, 204], (obj, replies)
        assert accepted == (2 if expected == 204 else 1)
        target.assert_canary(step)
    target.assert_healthy()


content_types = st.sampled_from([JSON, "application/json; charset=utf-8", "text/plain", "application/jsonx",
                                 "", "application/json\x00", None])


@FUZZ
@given(body=st.binary(max_size=2048) | st.text(max_size=200).map(str.encode)
       | reports.map(lambda o: json.dumps(o, allow_nan=True).encode()[:-1]),
       content_type=content_types)
def test_arbitrary_bytes_with_the_right_length(target: Target, body: bytes, content_type: str | None) -> None:
    """Random bytes, invalid UTF-8 and JSON cut short: a 4xx (or 204 when it happens to be a valid report)."""
    replies, accepted = run_input(target, post(body, content_type=content_type))
    assert len(replies) == 1
    status = replies[0].status
    media = (content_type or "").split(";")[0].strip().lower()
    if "\x00" in (content_type or ""):
        assert status == 400  # the listener (port and socket alike) refuses a control character in any header
    elif media != "application/json":
        assert status == 415
    else:
        try:
            obj = json.loads(body)
        except (ValueError, RecursionError):
            assert status == 400
        else:
            assert status in ((204, 422) if valid_report(obj) else (422,))
    assert accepted == (1 if status == 204 else 0)
    target.assert_healthy()


@pytest.mark.parametrize("body, expected", [
    (b"[" * 8000 + b"]" * 8000, (400, 422)),
    (b"[" * 900 + b"]" * 900, (400, 422)),
    (b'{"step": ' + b"[" * 5000 + b"]" * 5000 + b"}", (400, 422)),
    (b'{"step": 1' + b"0" * 5000 + b"}", (400,)),  # beyond Python's int digit limit: json.loads refuses
    (b'{"tokens": 1' + b"0" * 400 + b"}", (422,)),
    (b'{"tokens": 1e400}', (422,)),
    (b'{"step_time_s": NaN}', (422,)),
    (b'{"tokens": -Infinity}', (422,)),
    (b'{"step": 1, "job": "\\udcff"}', (422,)),  # a lone surrogate escape
    (b"\xef\xbb\xbf" + b'{"step": 1}', (400, 422)),  # UTF-8 BOM
    ('{"step": 1}'.encode("utf-16"), (400, 422)),
    (b'{"step": 1, "step": "x"}', (422,)),  # duplicate key: the last one counts, as everywhere in JSON
    (b"", (400,)),
], ids=["deep-8000", "deep-900", "deep-field", "huge-int", "huge-float-int", "1e400", "nan", "infinity",
        "surrogate", "bom", "utf16", "duplicate-key", "empty"])
def test_pathological_json(target: Target, body: bytes, expected: tuple[int, ...]) -> None:
    """Deep nesting, huge numbers, non-finite tokens, other encodings: a 4xx, nothing stored."""
    replies, accepted = run_input(target, post(body))
    assert len(replies) == 1 and replies[0].status in expected, replies
    assert accepted == 0
    target.assert_healthy()


@settings(FUZZ, max_examples=10)
@given(size=st.integers(MAX_BODY_BYTES + 1, 3 * MAX_BODY_BYTES))
def test_oversized_bodies_get_413_and_close(target: Target, size: int) -> None:
    """Past MAX_BODY_BYTES: 413 before the body is read, the connection closed, nothing stored."""
    body = b'{"step": 1}'.ljust(size)
    replies, accepted = run_input(target, post(body))
    assert [r.status for r in replies] == [413] and replies[0].headers["connection"] == "close"
    assert accepted == 0
    target.assert_healthy()


def test_body_of_exactly_the_limit_is_accepted(target: Target) -> None:
    """The limit is inclusive: a valid report padded to MAX_BODY_BYTES is kept."""
    replies, accepted = run_input(target, post(b'{"step": 1}'.ljust(MAX_BODY_BYTES)))
    assert [r.status for r in replies] == [204] and accepted == 1
    target.assert_healthy()
