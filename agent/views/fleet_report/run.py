"""From checked options to the written page: the part of ``roofwatch fleet-report`` that is not
argument parsing (which lives in agent/app/commands_offline.py). Errors are :class:`OptionError`
naming the flag, so the command can print them and exit 2 (bad input) or 1 (server unusable)."""

from __future__ import annotations

import sys
import urllib.parse
from dataclasses import dataclass, field
from typing import Callable, TextIO

from agent.classifier.thresholds import Thresholds
from agent.context.file_input import FileInputError, read_text_file
from agent.model.redact import hide, remember, safe_url, url_secrets
from agent.views.fleet_report.aggregates import collect_aggregates
from agent.views.fleet_report.collect import FleetReport, collect
from agent.views.fleet_report.data import Prices, Problem
from agent.views.fleet_report.merge import merge
from agent.views.fleet_report.promapi import Deadline, PromClient, PromError
from agent.views.fleet_report.window import Window, parse_duration, parse_time


DEADLINE_QUERIES = 5
"""The default ``--deadline`` is this many per-query deadlines (``--timeout`` + 5 s each: 325 s at the
default 60 s). A healthy store answers the report's queries in seconds all told; a store on which five
of them would run into their own deadline is not healthy, and the page of what it did answer by then
is worth more than waiting on every remaining query in turn."""
MAX_DEADLINE_S = 86400.0


class OptionError(Exception):
    """Bad input (``usage`` True: exit 2) or a server that cannot be used (exit 1); names the flag."""

    def __init__(self, message: str, *, usage: bool = True) -> None:
        super().__init__(message)
        self.usage = usage


@dataclass
class Options:
    prometheus: list[str]
    """One store's API root, or one per cluster (the report merges their answers: merge.py)."""
    range: str = "7d"
    end: str | None = None
    cluster: str | None = None
    source: str = "roofwatch"
    costs: list[str] = field(default_factory=list)
    headers: list[str] = field(default_factory=list)
    bearer_token_file: str | None = None
    basic_auth_file: str | None = None
    timeout_s: float = 60.0
    deadline_s: float | None = None
    """The whole command's deadline; None: :data:`DEADLINE_QUERIES` per-query deadlines."""
    top: int = 25
    max_gpus: int = 64
    amd_window_us: float = 1000.0
    title: str | None = None


MERGEABLE = ("roofwatch", "aggregates")
"""The sources whose reports from several stores merge into one (dcgm and amd read one store's GPUs)."""


def client_for(opts: Options, url: str) -> PromClient:
    """A client of the store at ``url`` with the command's headers and credentials (its deadline is set by the
    caller: one for the whole command, however many stores)."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise OptionError(f"--prometheus: {safe_url(url)!r} is not an http(s) URL such as http://prometheus:9090")
    if not 0 < opts.timeout_s <= 3600:
        raise OptionError(f"--timeout: {opts.timeout_s:g} must be between 0 and 3600 seconds")
    if opts.deadline_s is not None and not 1 <= opts.deadline_s <= MAX_DEADLINE_S:
        raise OptionError(f"--deadline: {opts.deadline_s:g} must be between 1 and {MAX_DEADLINE_S:g} seconds")
    headers: dict[str, str] = {}
    for item in opts.headers:
        name, sep, value = item.partition(":")
        if not sep or not name.strip() or any(c in item for c in "\r\n"):
            raise OptionError(f"--header: {item!r} is not 'Name: value'")
        headers[name.strip()] = value.strip()
    token = _read_secret(opts.bearer_token_file, "--bearer-token-file")
    basic = _read_secret(opts.basic_auth_file, "--basic-auth-file")
    if basic is not None and ":" not in basic:
        raise OptionError("--basic-auth-file: the file must hold user:password")
    headers.update(PromClient.auth_headers(token, basic))
    return PromClient(url, timeout_s=opts.timeout_s, headers=headers)


def deadline_for(opts: Options, client: PromClient) -> float:
    """``--deadline``, or :data:`DEADLINE_QUERIES` times the client's per-query deadline."""
    return opts.deadline_s if opts.deadline_s is not None else DEADLINE_QUERIES * client.deadline_s


SECRET_FILE_BYTES = 64 * 2**10
"""A bearer token or a user:password is tens of bytes; a larger file is not one."""


def _read_secret(path: str | None, flag: str) -> str | None:
    """The credential in ``path``: a regular file only (a FIFO would block the command, ``/dev/zero`` fill its
    memory), remembered so that no message of the command shows it (agent.model.redact)."""
    if path is None:
        return None
    try:
        secret = read_text_file(path, f"{flag}: {path}", "file holding a credential", SECRET_FILE_BYTES).strip()
    except FileInputError as exc:
        raise OptionError(str(exc)) from None
    remember([secret, *secret.split(":", 1)])
    return secret


def window_for(opts: Options) -> Window:
    try:
        range_s = parse_duration(opts.range)
    except ValueError as exc:
        raise OptionError(f"--range: {exc}") from None
    try:
        end = parse_time(opts.end)
    except ValueError as exc:
        raise OptionError(f"--end: {exc}") from None
    return Window.pick(end, range_s)


def build(opts: Options, thresholds: Thresholds, progress: Callable[[str], None]) -> FleetReport:
    """Check the options, make sure the server answers, and run every section; past the command's
    deadline the queries left are listed as not run and the report holds what was answered."""
    try:
        prices = Prices.parse(opts.costs)
    except ValueError as exc:
        raise OptionError(f"--cost-per-gpu-hour: {exc}") from None
    if opts.top < 1 or opts.max_gpus < 1:
        raise OptionError("--top and --max-gpus must be at least 1")
    if not 1.0 <= opts.amd_window_us <= 1e7:
        raise OptionError(f"--amd-profiler-window-us: {opts.amd_window_us:g} must be between 1 and 10000000 microseconds")
    if not opts.prometheus:
        raise OptionError("--prometheus: give the store's API root (once per cluster store, or the global store once)")
    if len(opts.prometheus) > 1 and opts.source not in MERGEABLE:
        raise OptionError(f"--source {opts.source} reads one store: give --prometheus once")
    window = window_for(opts)
    clients = [client_for(opts, url) for url in opts.prometheus]
    deadline = Deadline.starting_now(deadline_for(opts, clients[0]))
    reports, failed = [], []
    for url, client in zip(opts.prometheus, clients):
        client.deadline = deadline  # one deadline for the whole command, however many stores
        try:
            report = _sections(opts, thresholds, progress, window, prices, client, url)
        except OptionError as exc:
            if len(clients) == 1 or exc.usage:
                raise
            failed.append(Problem(f"Store {safe_url(url)}", hide(str(exc), url_secrets(url))))  # the page shows it
            continue
        report.deadline_s = deadline.total_s
        report.not_run, report.queries = client.not_run, client.queries
        reports.append(report)
    if not reports:
        raise OptionError("--prometheus: no store answered: " + "; ".join(p.error for p in failed), usage=False)
    return reports[0] if len(clients) == 1 else merge(reports, failed, opts.top)


def _sections(opts: Options, thresholds: Thresholds, progress: Callable[[str], None], window: Window, prices: Prices,
              client: PromClient, url: str) -> FleetReport:
    try:  # one cheap query first: a wrong URL or an unreachable server is one clear error, not ten
        client.query("vector(1)", window.end)
    except PromError as exc:
        raise OptionError(f"--prometheus {safe_url(url)}: {exc} (the API root: Prometheus :9090, VictoriaMetrics "
                          f":8428, Mimir .../prometheus)", usage=False) from None
    if opts.source == "dcgm":
        from agent.views.fleet_report.dcgm import dcgm_report, dcgm_step, dcgm_thresholds

        return dcgm_report(client, window, cluster=opts.cluster, prices=prices, max_gpus=opts.max_gpus,
                           thresholds=dcgm_thresholds(thresholds, dcgm_step(window.range_s)), progress=progress)
    if opts.source == "amd":
        from agent.views.fleet_report.amd import amd_report
        from agent.views.fleet_report.dcgm import dcgm_step, dcgm_thresholds

        return amd_report(client, window, cluster=opts.cluster, prices=prices, max_gpus=opts.max_gpus,
                          window_us=opts.amd_window_us, progress=progress,
                          thresholds=dcgm_thresholds(thresholds, dcgm_step(window.range_s)))
    if opts.source == "aggregates":
        return collect_aggregates(client, window, cluster=opts.cluster, prices=prices, top=opts.top, progress=progress)
    return collect(client, window, cluster=opts.cluster, prices=prices, top=opts.top, progress=progress)


def outcome(report: FleetReport, out: str) -> str:
    """The command's last line: what it wrote, how many queries, and what is missing and why."""
    missing = f", {len(report.problems)} sections incomplete (listed on the page)" if report.problems else ""
    late = (f"; the --deadline of {report.deadline_s:g} s passed before {report.not_run} more "
            f"quer{'y' if report.not_run == 1 else 'ies'} could run" if report.not_run else "")
    return f"wrote {out}: {report.queries} queries{missing}{late}"


def terminal_progress(stream: TextIO = sys.stderr) -> Callable[[str], None]:
    """One overwritten status line on a terminal; nothing when stderr is a file or a pipe."""
    if not stream.isatty():
        return lambda _: None
    count = [0]

    def show(what: str) -> None:
        count[0] += 1
        stream.write(f"\r\x1b[Kfleet-report: query {count[0]}: {what}")
        stream.flush()

    return show
