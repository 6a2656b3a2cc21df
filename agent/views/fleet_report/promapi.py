"""A small client of the Prometheus HTTP API (``/api/v1/query``, ``/api/v1/query_range``).

The same API is served by Prometheus, VictoriaMetrics, Thanos and Mimir, so the report speaks
only it. Queries go as form-encoded POSTs (long regexes of job ids or GPU UUIDs do not hit URL
limits), each with the API's own ``timeout`` parameter so the server gives up on an expensive
query instead of us waiting on it, and a socket deadline a little longer than that. Answers
are capped in size. Every failure is :class:`PromError` with one line a person can read,
including the server's own ``error`` text (a PromQL parse error, "query timed out").
"""

from __future__ import annotations

import base64
import json
import math
import socket
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field

from agent.views.safe_text import printable

MAX_ANSWER_BYTES = 256 * 2**20
"""A report query answers with aggregates; more than this means a query the report did not mean."""


class PromError(Exception):
    """A query failed: the server refused it, timed out, or could not be reached."""

    def __init__(self, message: str, *, unreachable: bool = False) -> None:
        super().__init__(message)
        self.unreachable = unreachable


@dataclass(frozen=True)
class Series:
    """One series of an answer: its labels and its (unix time, value) points (one for an instant query)."""

    labels: dict[str, str]
    points: tuple[tuple[float, float], ...]

    @property
    def value(self) -> float:
        return self.points[-1][1] if self.points else math.nan


@dataclass
class PromClient:
    """The API at ``base_url`` (``http://prometheus:9090``, ``http://vm:8428``, a Thanos query
    frontend, or Mimir's ``http://mimir/prometheus``), with optional headers and auth."""

    base_url: str
    timeout_s: float = 60.0
    headers: dict[str, str] = field(default_factory=dict)
    queries: int = 0
    """How many queries this client sent (the report prints it in its footer)."""

    @staticmethod
    def auth_headers(bearer_token: str | None = None, basic_auth: str | None = None) -> dict[str, str]:
        """``Authorization`` for a bearer token or ``user:password`` basic auth (at most one)."""
        if bearer_token:
            return {"Authorization": f"Bearer {bearer_token}"}
        if basic_auth:
            return {"Authorization": "Basic " + base64.b64encode(basic_auth.encode()).decode()}
        return {}

    def query(self, expr: str, at: float) -> list[Series]:
        """An instant query evaluated at unix time ``at``."""
        return self._call("query", {"query": expr, "time": _ts(at)}, "vector")

    def query_range(self, expr: str, start: float, end: float, step_s: float) -> list[Series]:
        """A range query from ``start`` to ``end`` (inclusive) every ``step_s`` seconds."""
        return self._call("query_range", {"query": expr, "start": _ts(start), "end": _ts(end),
                                          "step": f"{step_s:g}"}, "matrix")

    def _call(self, endpoint: str, params: dict[str, str], want: str) -> list[Series]:
        self.queries += 1
        params = {**params, "timeout": f"{self.timeout_s:g}s"}
        url = f"{self.base_url.rstrip('/')}/api/v1/{endpoint}"
        body = urllib.parse.urlencode(params).encode()
        request = urllib.request.Request(url, data=body, method="POST", headers={
            **self.headers, "Content-Type": "application/x-www-form-urlencoded", "Accept": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s + 5.0) as response:
                raw = response.read(MAX_ANSWER_BYTES + 1)
        except urllib.error.HTTPError as exc:
            raise PromError(f"HTTP {exc.code}: {_server_error(exc)}") from None
        except (socket.timeout, TimeoutError):
            raise PromError(f"no answer within {self.timeout_s + 5.0:g} s") from None
        except urllib.error.URLError as exc:
            raise PromError(f"cannot reach {self.base_url}: {_line(exc.reason)}", unreachable=True) from None
        except (OSError, ValueError) as exc:
            raise PromError(f"cannot read the answer: {_line(exc)}", unreachable=True) from None
        if len(raw) > MAX_ANSWER_BYTES:
            raise PromError(f"answer larger than {MAX_ANSWER_BYTES // 2**20} MiB")
        return _parse(raw, want)


def _parse(raw: bytes, want: str) -> list[Series]:
    try:
        answer = json.loads(raw)
        if answer.get("status") != "success":
            raise PromError(_line(answer.get("error") or answer))
        data = answer["data"]
        kind, result = data["resultType"], data["result"]
        if kind == "scalar":
            return [Series({}, ((float(result[0]), float(result[1])),))]
        if kind != want:
            raise PromError(f"expected a {want}, got a {kind}")
        out = []
        for item in result:
            points = [item["value"]] if want == "vector" else item["values"]
            out.append(Series({str(k): str(v) for k, v in item["metric"].items()},
                              tuple((float(t), float(v)) for t, v in points)))
        return out
    except PromError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
        raise PromError(f"not a Prometheus API answer ({type(exc).__name__}: {_line(exc)})") from None


def _server_error(exc: urllib.error.HTTPError) -> str:
    """The API's own ``error`` field (a parse error, a timeout), else the HTTP reason."""
    try:
        return _line(json.loads(exc.read(64 * 1024)).get("error") or exc.reason)
    except (ValueError, AttributeError, OSError):
        return _line(exc.reason)


def _ts(value: float) -> str:
    return f"{value:.3f}"


def _line(text: object, limit: int = 300) -> str:
    return printable(" ".join(str(text).split()), limit)
