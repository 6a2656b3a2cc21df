"""A small client of the Prometheus HTTP API (``/api/v1/query``, ``/api/v1/query_range``).

The same API is served by Prometheus, VictoriaMetrics, Thanos and Mimir, so the report speaks
only it. Queries go as form-encoded POSTs (long regexes of job ids or GPU UUIDs do not hit URL
limits), each with the API's own ``timeout`` parameter so the server gives up on an expensive
query instead of us waiting on it, through the agent's one bounded request
(agent.context.neighbour_http): one deadline from connect to the last byte, a little longer than
that ``timeout``, so a server that trickles its answer cannot hold the report. Over all queries
there is the command's :class:`Deadline`: past it no query is sent, and one sent when it is near
waits (and asks the server to work) only for the time left.

The server may be broken or hostile, so an answer is bounded before it is believed: in bytes, in
series and in points (the caps below, sized from the queries the report sends), in nesting, and in
its numbers: NaN and +-Inf samples (the API's ``"NaN"``, ``"+Inf"``, ``"-Inf"``: 0/0 in a recording
rule) are left out and counted. Every failure is :class:`PromError` with one line a person can read,
including the server's own ``error`` text (a PromQL parse error, "query timed out").
"""

from __future__ import annotations

import base64
import json
import math
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

from agent.context.neighbour_http import FetchFailed, Reply, fetch
from agent.model.text import printable

# What a legitimate answer can hold, worked out from the queries (queries.py, dcgm.py):
# * --source roofwatch sends instant queries only (one point per series), every one an aggregate:
#   the widest are the waste tables, ``sum by (cluster, user|namespace, model, spec, class, waste)``,
#   8 (class, waste) pairs per (cluster, user, model) (idle is held or spare); the MFU histogram is at
#   most 101 buckets; jobs and incidents are ``topk(--top)`` on the server (the job detail: --top jobs
#   x models x 8 pairs). MAX_SERIES allows 2,500 (cluster, user, model) rows of 8, some 5x a 500-user
#   fleet on two GPU models in one cluster.
# * --source dcgm lists its GPUs in one instant query (a series per GPU and pod in the period), then
#   reads each field as range queries over batches of 16 GPUs (``max by (UUID)``: 16 series) and
#   slices of at most 1440 steps (dcgm.MAX_POINTS): 16 x 1440 = 23,040 points, a quarter of MAX_POINTS.
# * Bytes: an instant series is 150-300 bytes of JSON (six or seven labels and
#   ``"value":[1795478400,"12.3456789"]``), so MAX_SERIES of them are 3-6 MiB; a range point is
#   30-40 bytes, so 23,040 of them are under 1 MiB. MAX_ANSWER_BYTES holds either with room, and
#   bounds the parse: 8 MiB of JSON is at most a few hundred MB of Python objects however it is nested.
MAX_ANSWER_BYTES = 8 * 2**20
"""Bytes of one answer's body; past it the query is refused without reading further."""
MAX_SERIES = 20_000
"""Series in one answer; past it the query is refused before any series is built."""
MAX_POINTS = 100_000
"""Samples (points of all series) in one answer; past it the query is refused likewise."""
SERVER_MARGIN_S = 5.0
"""How much longer than the API's ``timeout`` the client waits: the server's own timeout, then its answer."""


class PromError(Exception):
    """A query failed: the server refused it, timed out, could not be reached, or answered
    something the report will not read (past a cap, not the API's JSON)."""

    def __init__(self, message: str, *, unreachable: bool = False) -> None:
        super().__init__(message)
        self.unreachable = unreachable


@dataclass(frozen=True)
class Series:
    """One series of an answer: its labels and its (unix time, value) points (one for an instant
    query), every one finite."""

    labels: dict[str, str]
    points: tuple[tuple[float, float], ...]

    @property
    def value(self) -> float:
        return self.points[-1][1] if self.points else math.nan


class Answer(list):  # type: ignore[type-arg]
    """The series of one answer, and ``skipped``: how many of its samples were NaN or +-Inf and
    left out (a series with no finite sample is left out whole)."""

    skipped: int = 0


@dataclass(frozen=True)
class Deadline:
    """The whole command's deadline (``--deadline``): a per-query deadline bounds one query, not how
    many of them a slow server answers slowly (17 queries at ``--timeout 2`` once took 113 s). Past
    ``at`` no query starts; a query started before it waits at most the time left."""

    total_s: float
    at: float
    """``time.monotonic()`` when it passes."""

    @staticmethod
    def starting_now(total_s: float) -> Deadline:
        return Deadline(total_s, time.monotonic() + total_s)

    def left(self) -> float:
        return self.at - time.monotonic()


@dataclass
class PromClient:
    """The API at ``base_url`` (``http://prometheus:9090``, ``http://vm:8428``, a Thanos query
    frontend, or Mimir's ``http://mimir/prometheus``), with optional headers and auth."""

    base_url: str
    timeout_s: float = 60.0
    headers: dict[str, str] = field(default_factory=dict)
    deadline: Deadline | None = None
    """The command's deadline over all queries; None: only each query's own."""
    queries: int = 0
    """How many queries this client sent (the report prints it in its footer)."""
    not_run: int = 0
    """How many queries were not sent because ``deadline`` had passed."""

    @staticmethod
    def auth_headers(bearer_token: str | None = None, basic_auth: str | None = None) -> dict[str, str]:
        """``Authorization`` for a bearer token or ``user:password`` basic auth (at most one)."""
        if bearer_token:
            return {"Authorization": f"Bearer {bearer_token}"}
        if basic_auth:
            return {"Authorization": "Basic " + base64.b64encode(basic_auth.encode()).decode()}
        return {}

    @property
    def deadline_s(self) -> float:
        """The most one query may take, from connecting to the answer's last byte."""
        return self.timeout_s + SERVER_MARGIN_S

    def query(self, expr: str, at: float) -> Answer:
        """An instant query evaluated at unix time ``at``."""
        return self._call("query", {"query": expr, "time": _ts(at)}, "vector")

    def query_range(self, expr: str, start: float, end: float, step_s: float) -> Answer:
        """A range query from ``start`` to ``end`` (inclusive) every ``step_s`` seconds."""
        return self._call("query_range", {"query": expr, "start": _ts(start), "end": _ts(end),
                                          "step": f"{step_s:g}"}, "matrix")

    def _call(self, endpoint: str, params: dict[str, str], want: str) -> Answer:
        wait, server_wait = self.deadline_s, self.timeout_s
        if self.deadline is not None:
            left = self.deadline.left()
            if left <= 0:
                self.not_run += 1
                raise PromError(f"not run: the command's --deadline of {self.deadline.total_s:g} s had passed")
            wait, server_wait = min(wait, left), min(server_wait, left)
        self.queries += 1
        params = {**params, "timeout": _duration(server_wait)}
        url = f"{self.base_url.rstrip('/')}/api/v1/{endpoint}"
        try:  # a store is usually elsewhere: the user's proxy settings apply
            reply = fetch(url, timeout_s=wait, deadline_s=wait, max_bytes=MAX_ANSWER_BYTES,
                          method="POST", data=urllib.parse.urlencode(params).encode(), use_proxy=True,
                          headers={**self.headers, "Content-Type": "application/x-www-form-urlencoded",
                                   "Accept": "application/json"})
        except FetchFailed as exc:
            raise _failed(exc, self.base_url, wait, None if wait >= self.deadline_s else self.deadline) from None
        if not 200 <= reply.status < 300:
            raise PromError(f"HTTP {reply.status}: {_server_error(reply)}")
        return _parse(reply.body, want)


def _failed(exc: FetchFailed, base_url: str, deadline_s: float, cut: Deadline | None) -> PromError:
    """The query's one-line error; ``cut``: the command's deadline, when it (not ``--timeout``) bounded the wait."""
    if exc.kind == "too_large":
        return PromError(f"answer refused: larger than {MAX_ANSWER_BYTES // 2**20} MiB, more than a report "
                         "query can need (docs/fleet-report.md)")
    if exc.kind in ("deadline", "timeout") and cut is not None:
        return PromError(f"no whole answer within {deadline_s:.3g} s, the time left before the command's --deadline "
                         f"of {cut.total_s:g} s: the query gave up")
    if exc.kind in ("deadline", "timeout"):
        return PromError(f"no whole answer within {deadline_s:g} s (--timeout and {SERVER_MARGIN_S:g} s more for the "
                         "answer to arrive): the query gave up")
    if exc.kind in ("refused", "unreachable"):
        return PromError(f"cannot reach {base_url}: {_line(exc)}", unreachable=True)
    return PromError(f"cannot read the answer: {_line(exc)}", unreachable=True)


def _parse(raw: bytes, want: str) -> Answer:
    try:
        answer = json.loads(raw)
    except RecursionError:
        raise PromError("answer refused: JSON nested too deeply, not a Prometheus API answer") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, a 5000-digit number
        raise PromError(f"not a Prometheus API answer (not JSON: {_line(exc, 120)})") from None
    try:
        if not isinstance(answer, dict):
            raise PromError("not a Prometheus API answer (not a JSON object)")
        if answer.get("status") != "success":
            error = answer.get("error")
            raise PromError(_line(error) if isinstance(error, str) and error else "the server answered status "
                            f"{_line(answer.get('status'), 40) if isinstance(answer.get('status'), str) else 'missing'}")
        data = answer["data"]
        kind, result = data["resultType"], data["result"]
        if kind == "scalar":
            result = [{"metric": {}, "value": result}]
        elif kind != want:
            raise PromError(f"expected a {want}, got a {_line(kind, 40) if isinstance(kind, str) else 'something else'}")
        return _series(result, "values" if kind == "matrix" else "value")
    except (RecursionError, ValueError, KeyError, TypeError, AttributeError, IndexError, OverflowError) as exc:
        raise PromError(f"not a Prometheus API answer ({type(exc).__name__}: {_line(exc)})") from None


def _series(result: list[Any], key: str) -> Answer:
    """The answer's series, counted against the caps before any is built, then built one at a time
    while the parsed JSON of each is let go (the answer is never held twice)."""
    if not isinstance(result, list):
        raise TypeError("result is not a list")
    if len(result) > MAX_SERIES:
        raise PromError(f"answer refused: {len(result):,} series, more than the {MAX_SERIES:,} a report query can need")
    points = sum(len(item[key]) for item in result) if key == "values" else len(result)
    if points > MAX_POINTS:
        raise PromError(f"answer refused: {points:,} points, more than the {MAX_POINTS:,} a report query can need")
    out = Answer()
    result.reverse()
    while result:
        item = result.pop()
        samples = item[key] if key == "values" else [item[key]]
        kept = []
        for t, v in samples:
            pair = (float(t), float(v))
            if math.isfinite(pair[0]) and math.isfinite(pair[1]):
                kept.append(pair)
            else:
                out.skipped += 1
        if kept:
            out.append(Series({str(k): _label(v) for k, v in item["metric"].items()}, tuple(kept)))
    return out


def _label(value: object) -> str:
    if isinstance(value, (dict, list)):
        raise TypeError("a label value is not a string")
    return str(value)


def _server_error(reply: Reply) -> str:
    """The API's own ``error`` field (a parse error, a timeout), else the HTTP reason."""
    try:
        error = json.loads(reply.body).get("error")
    except (ValueError, AttributeError, RecursionError):
        error = None
    return _line(error if isinstance(error, str) and error else reply.reason)


def _duration(seconds: float) -> str:
    """The API's ``timeout``: whole seconds as ``60s``, else milliseconds (``1500ms``): Prometheus (and
    Thanos, Mimir) read Prometheus durations, integers with a unit, so ``1.5s`` would fail the query."""
    if seconds == int(seconds):
        return f"{int(seconds)}s"
    return f"{max(1, round(seconds * 1000))}ms"


def _ts(value: float) -> str:
    return f"{value:.3f}"


def _line(text: object, limit: int = 300) -> str:
    return printable(" ".join(str(text).split()), limit)
