"""Which answer a whole request gets, and where it is worked out: on the event loop at once, or in a worker.

Kept apart from exporters.http.connection (a connection's states and deadlines) and
exporters.http.routes (what each GET answers). The agent's port answers GET and HEAD for its pages and
``POST /api/v1/report``; the unix report socket (a server with ``reports_only``) answers the report
and nothing else.
"""

from __future__ import annotations

from typing import Any, Callable, Hashable

from agent.context.workload.report_http import REPORT_PATH, judge_body
from exporters.http.framing import from_answer
from exporters.http.routes import NeedsWorker, Request, Response, answer_get, text

ALLOW = "GET, HEAD"


def quick_answer(server: Any, request: Request) -> Response | None:
    """The answer when the loop can give it at once (no bcrypt, no render), else None."""
    if getattr(server, "reports_only", False):  # the report socket: reports and nothing else
        if request.method == "POST" and request.path == REPORT_PATH:
            return None
        if request.method == "POST":
            return text(404, f"not found; reports go to POST {REPORT_PATH}", close=True)
        return text(405, f"only POST {REPORT_PATH} is supported", headers={"Allow": "POST"}, close=True)
    if request.method in ("GET", "HEAD"):
        try:
            return answer_get(server, request, inline=True)
        except NeedsWorker:
            return None
    if request.method == "POST" and request.path == REPORT_PATH:
        return None
    return text(405, "only GET and HEAD are supported", headers={"Allow": ALLOW})


def worker_answer(server: Any, request: Request, *, local: bool, peer_pid: int | None,
                  client: Hashable) -> Callable[[], Response]:
    """The work a worker thread does for a request the loop could not answer at once. ``local``: from
    loopback or the unix socket; ``peer_pid``: the reporting process, as the kernel says (the socket only);
    ``client``: whom the report rate limit counts it against."""
    if request.method in ("GET", "HEAD"):
        return lambda: answer_get(server, request)
    if request.method == "POST" and request.path == REPORT_PATH:
        store = server.reports
        if store is None:
            # Its body may be unread: the connection cannot carry another request.
            return lambda: text(404, "workload reports are not enabled on this agent", close=True)
        return lambda: from_answer(judge_body(request.body, request.headers, store, peer_pid=peer_pid,
                                               from_loopback=local, client=client))
    return lambda: text(405, "only GET and HEAD are supported", headers={"Allow": ALLOW})
