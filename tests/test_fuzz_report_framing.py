"""Fuzzing HTTP framing over both transports: missing, garbage, negative or huge Content-Length,
any Transfer-Encoding (refused with 411), arbitrary request lines and header lines, and an
absolute-form target with a bad host."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, strategies as st

from agent.context.workload.report_http import REPORT_PATH
from agent.context.workload.report_schema import MAX_BODY_BYTES
from agent.context.workload.report_store import ReportStore
from tests.report_fixtures import JSON
from tests.report_fuzzing import (FUZZ, Target, fresh_errors, http_target, latin1_text, post,  # noqa: F401 (fixtures)
                                  run_input, socket_dir, target)

lengths = st.one_of(
    st.none(), latin1_text, st.integers(-10**6, 3 * MAX_BODY_BYTES).map(str),
    st.integers(0, 10**40).map(lambda n: str(n).rjust(19, "0")), st.sampled_from(
        ["\u00b2", "1\u00b2", "\u00b9\u00b2", "+5", "5.0", "1e3", "0x10", " 11 ", "11\x85", "\u00a011", "-0", "", "11, 11"]))


@FUZZ
@given(length=lengths, body=st.sampled_from([b'{"step": 1}', b"", b"x" * 100, b'{"step": 1}{"step": 2}']))
def test_missing_garbage_negative_or_huge_content_length(target: Target, length: str | None, body: bytes) -> None:
    """411 without a length, 400 for one that is not a plain number (superscript digits included), 413 past
    the limit, 400 when the body is shorter; a length shorter than the body leaves the rest as the next request."""
    replies, accepted = run_input(target, post(body, length=length))
    assert replies, "no answer"
    first = replies[0].status
    text = (length or "").strip()
    same = {part.strip() for part in text.split(",")}
    if "," in text and len(same) == 1:
        text = same.pop()  # RFC 9110 8.6: a list of one repeated length is that length (h11 reads it so)
    if length is None:
        assert first == 411
    elif not (text.isascii() and text.isdigit()):
        assert first == 400
    elif len(text) > 20:
        assert first == 400  # the listener's parser (h11) refuses a length of over 20 digits as bad framing
    elif len(text) > 18 or int(text) > MAX_BODY_BYTES:
        assert first == 413
    elif int(text) > len(body):
        assert first == 400
    else:
        assert first in (204, 400, 422)
    for reply in replies:
        assert reply.status is None or reply.status // 100 in (2, 4), replies
    assert accepted == sum(1 for r in replies if r.status == 204)
    target.assert_healthy()


@pytest.mark.parametrize("encoding", ["chunked", "Chunked", "gzip, chunked", "identity", "x"])
@pytest.mark.parametrize("with_length", [False, True])
def test_transfer_encoding_is_refused_with_411(target: Target, encoding: str, with_length: bool) -> None:
    """Chunked (or any Transfer-Encoding) is refused before reading, also beside a Content-Length
    (the request-smuggling combination), and the chunks left unread do not become a second request."""
    chunked = b'b\r\n{"step": 1}\r\n0\r\n\r\n'
    request = (f"POST {REPORT_PATH} HTTP/1.1\r\nHost: x\r\nContent-Type: {JSON}\r\nTransfer-Encoding: {encoding}\r\n"
               + (f"Content-Length: {len(chunked)}\r\n" if with_length else "") + "\r\n").encode() + chunked
    replies, accepted = run_input(target, request)
    assert [r.status for r in replies] == [411] and replies[0].headers["connection"] == "close"
    assert accepted == 0
    target.assert_healthy()


METHODS = ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "CONNECT", "BREW", "post", "G\x00T"]
VERSIONS = ["HTTP/1.1", "HTTP/1.0", "HTTP/0.9", "HTTP/2.0", "HTTP/3", "HTTP/1.1.1", "HTTP/1.x", "http/1.1",
            "HTTP/\u00b9.1", "HTTP/01.1", "HTTP/1.12345678901", "HTTPS/1.1", ""]
request_lines = st.one_of(
    st.binary(max_size=120).map(lambda b: b.replace(b"\n", b"")),
    st.tuples(st.sampled_from(METHODS) | latin1_text,
              st.sampled_from([REPORT_PATH, REPORT_PATH + "?x=1", "/", "*", "//evil", "/metrics", "/healthz",
                               "http://h/api/v1/report", "/%00", "/\u00ff"]) | latin1_text,
              st.sampled_from(VERSIONS)).map(lambda t: " ".join(part for part in t if part).encode("latin-1")),
    st.just(b"POST /" + b"a" * 70_000 + b" HTTP/1.1"),
)


def _version(word: str) -> tuple[int, int] | None:
    """``HTTP/x.y`` as http.server accepts it (ASCII digits), else None."""
    match = re.fullmatch(r"HTTP/([0-9]{1,10})\.([0-9]{1,10})", word)
    return (int(match.group(1)), int(match.group(2))) if match else None


@FUZZ
@given(line=request_lines, tail=st.sampled_from([b"\r\n\r\n", b"\r\nContent-Length: 0\r\n\r\n", b"\n\n", b""]))
def test_garbage_request_lines(target: Target, line: bytes, tail: bytes) -> None:
    """Arbitrary request lines: unknown methods get 501, HTTP/2+ gets 505, everything else a 2xx/4xx; an
    unparseable line gets http.server's error page sent bare (HTTP/0.9 style); a blank line is closed."""
    replies, _ = run_input(target, line + tail)
    words = line.decode("latin-1").split()
    if not words:  # a blank request line: 400, or closed when nothing else arrived
        assert replies == [] or [r.status for r in replies] == [400]
        return
    version = _version(words[-1]) if len(words) >= 3 else None
    parsed = len(line) <= 65_536 and len(words) == 3 and version is not None and version[0] < 2
    if not (parsed and version is not None and version[0] == 0 and words[0] == "HEAD"):
        assert replies, f"no answer to {line[:80]!r}"  # (an HTTP/0.x HEAD answer has neither headers nor body)
    if parsed and version is not None and version[0] == 1:
        assert replies[0].status is not None
    unknown_method = parsed and not hasattr(target.handler, "do_" + words[0])
    for reply in replies:
        status = reply.status
        if status is None:
            continue
        assert (status // 100 in (2, 4) or (status == 501 and unknown_method)
                or (status == 505 and version is not None and version[0] >= 2)), (line[:80], replies)
    target.assert_healthy()


header_names = st.sampled_from(["Content-Type", "Content-Length", "Transfer-Encoding", "Authorization", "Expect",
                                "Connection", "Host", "X-A"]) | latin1_text.filter(lambda t: ":" not in t)
header_lines = st.one_of(
    st.tuples(header_names, latin1_text).map(lambda t: f"{t[0]}: {t[1]}".encode("latin-1")),
    st.binary(min_size=1, max_size=60).map(lambda b: b.replace(b"\n", b"").replace(b"\r", b"")).filter(bool),
    latin1_text.map(lambda t: b" " + t.encode("latin-1")),  # folded continuation line
)


@FUZZ
@given(headers=st.lists(header_lines, max_size=8), huge=st.sampled_from([None, "long-line", "many"]))
def test_garbage_headers(target: Target, headers: list[bytes], huge: str | None) -> None:
    """Arbitrary header lines before a valid report: a 2xx/4xx answer (431 for a 64 kB line or 2000 headers)."""
    extra = b"".join(h + b"\r\n" for h in headers)
    if huge == "long-line":
        extra += b"X-Long: " + b"a" * 70_000 + b"\r\n"
    elif huge == "many":
        extra += b"X-Many: 1\r\n" * 2000  # past http.server's 100 headers and the agent's 16 KiB
    replies, accepted = run_input(target, post(b'{"step": 7}', extra=extra))
    assert replies, "no answer"
    for reply in replies:
        assert reply.status is None or reply.status // 100 in (2, 4), replies
    if huge is not None:  # the parser may meet a malformed or refused header first (400, 411 for a
        # Transfer-Encoding other than chunked) once the head is whole
        assert replies[0].status == 431 or (headers and replies[0].status in (400, 411))
    assert accepted == sum(1 for r in replies if r.status == 204)
    target.assert_healthy()


def test_http_absolute_form_target_with_bad_host() -> None:
    """``POST http://[x/api/v1/report`` must get a 4xx like any other bad target (the unix socket answers 404)."""
    made, stop = http_target(ReportStore(rate_per_s=None))
    try:
        replies, _ = run_input(made, f"POST http://[x{REPORT_PATH} HTTP/1.1\r\nContent-Length: 0\r\n\r\n".encode())
        assert replies and replies[0].status is not None and replies[0].status // 100 == 4
        made.assert_healthy()
    finally:
        stop()
