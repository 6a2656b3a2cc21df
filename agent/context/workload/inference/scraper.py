"""Workload reports from inference servers' own Prometheus metrics (vLLM, SGLang, TGI).

A serving job never calls our client, but it already counts what we need: tokens in and out,
and (depending on server and version) engine steps and estimated FLOPs. :class:`InferenceScraper`
polls the configured ``/metrics`` endpoints, each in a background thread of its own, turns counter deltas between
two scrapes into rates (agent.context.workload.inference.parse), and answers :meth:`InferenceScraper.report_for`
from memory, so a collection cycle never waits on a server.

Which GPUs an endpoint serves is configured (``gpus``) or found by PID: the process listening on
the URL's port, plus its descendants, matched against each GPU's process list.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Literal, Mapping, Sequence

from agent.context.workload.inference.endpoint import InferenceEndpoint, ModelFacts
from agent.context.workload.inference.fetch import describe_error, http_fetch, server_pids
from agent.context.workload.inference.figures import Rejected, bounded_bytes
from agent.context.workload.inference.parse import (
    CounterReset,
    ExpositionError,
    Kind,
    Rates,
    Totals,
    parse,
    rates,
    recognise,
    totals,
)
from agent.model import ServingReport, WorkloadReport
from agent.model.redact import hide
from agent.model.text import printable

log = logging.getLogger("roofwatch.inference")

DEFAULT_MAX_BYTES = 4 * 1024 * 1024
RECOVERY_S = 1.0
"""The pause before the second scrape of an endpoint that has just answered (at start, or again after being
down or restarting): a rate needs two scrapes, so its figures come one second after it does, not an interval."""
FIRST_BAD_CHARS = 120
"""The first unreadable line as the status shows it (the parser keeps 80 characters of the line itself)."""
Fetch = Callable[[str, float, int], bytes]
"""(url, timeout_s, max_bytes) -> response body; raises on any failure."""


@dataclass(frozen=True, slots=True)
class EndpointStatus:
    """How scraping one endpoint goes, for `doctor` and the agent's own metrics."""

    url: str
    kind: Kind | None
    """Detected (or configured) server kind; None until a scrape recognised one."""
    up: bool
    error: str | None
    last_success_ts: float | None
    scrapes_total: int
    failures_total: int
    models: tuple[str, ...]
    pids: tuple[int, ...] | None
    """Server PIDs found on this node (None when ``gpus`` is configured)."""
    pid_error: str | None
    has_rate: bool
    flops_source: Literal["server", "config"] | None
    """Where FLOPs/token comes from: the server's estimated-FLOPs counter, or the configuration."""
    skipped_lines: int = 0
    """Lines of the last body read that were no sample (a pasted ``curl`` line, a proxy's banner)."""
    first_bad_line: str | None = None
    """The first of them, ``line N: '...'``, printable (agent.model.text): the body is untrusted text."""
    refused_samples: int = 0
    """Samples of the last body refused by the label bounds (agent.context.workload.inference.admission)."""
    refused_note: str | None = None
    """How many, past which bounds, and the first, printable."""
    rejected_values: int = 0
    """Values of the last scrape outside the serving bounds (agent.context.workload.inference.figures)."""
    rejected_note: str | None = None
    """How many, and the first, named with its series, printable."""
    refused_total: int = 0
    """Samples refused by the label bounds since the agent started (for a counter)."""
    rejected_total: int = 0
    """Values rejected by the serving bounds since the agent started (for a counter)."""

    @property
    def skipped_note(self) -> str | None:
        """What of the last scrape was not used, or None when all of it was: ``N unreadable lines skipped
        (first: line 3: '$ curl ...')``, the samples the label bounds refused, the values the serving bounds
        rejected. The endpoint's state detail (``inference <url>``) and doctor show it."""
        notes = []
        if self.skipped_lines:
            lines = "line" if self.skipped_lines == 1 else "lines"
            first = f" (first: {self.first_bad_line})" if self.first_bad_line else ""
            notes.append(f"{self.skipped_lines} unreadable {lines} skipped{first}")
        notes += [note for note in (self.refused_note, self.rejected_note) if note]
        return "; ".join(notes) or None


@dataclass(slots=True)
class Episode:
    """A condition that is logged once when it begins, then at debug while it lasts: a server whose
    counters go backwards on every scrape, or whose body is refused or rejected in part on every scrape,
    must not write a line per scrape for ever. The episode ends at the first scrape without it."""

    on: bool = False

    def begins(self, happening: bool) -> bool:
        """Record whether the condition holds in this scrape; True when it did not in the last one."""
        started = happening and not self.on
        self.on = happening
        return started


@dataclass(slots=True)
class _State:
    endpoint: InferenceEndpoint
    kind: Kind | None = None
    up: bool = False
    error: str | None = None
    last_success_ts: float | None = None
    scrapes: int = 0
    failures: int = 0
    models: tuple[str, ...] = ()
    prev: Totals | None = None
    prev_ts: float | None = None
    rates: Rates | None = None
    rates_ts: float | None = None
    pids: frozenset[int] = frozenset()
    pid_error: str | None = None
    pids_checked: float | None = None
    skipped: int = 0
    first_bad: str | None = None
    refused: int = 0
    refused_note: str | None = None
    rejected: int = 0
    rejected_note: str | None = None
    refused_total: int = 0
    rejected_total: int = 0
    resets: Episode = field(default_factory=Episode)
    refusals: Episode = field(default_factory=Episode)
    rejections: Episode = field(default_factory=Episode)
    seen: dict[str, float] = field(default_factory=dict)
    """GPU -> when report_for last matched it by PID: the default world size."""
    quick: bool = False
    """The quick second scrape after the endpoint answered was taken (once until it has a rate or fails)."""


class InferenceScraper:
    """Polls inference servers' metrics and answers :class:`agent.context.sources.WorkloadSource` queries.

    Rates: Δcounter / Δt between the two latest successful scrapes (none after the first scrape,
    none across a counter reset). Several label sets (vLLM engines, SGLang dp ranks, models) are
    summed, ranks of one replica counted once (see agent.context.workload.inference.parse).
    """

    def __init__(self, endpoints: Sequence[InferenceEndpoint], *, interval_s: float = 5.0, timeout_s: float = 2.0,
                 max_bytes: int = DEFAULT_MAX_BYTES, clock: Callable[[], float] = time.time,
                 fetch: Fetch | None = None, pid_refresh_s: float = 60.0,
                 models: Mapping[str, ModelFacts] | None = None, recovery_s: float = RECOVERY_S) -> None:
        if interval_s <= 0 or timeout_s <= 0 or max_bytes < 1 or pid_refresh_s <= 0:
            raise ValueError("interval_s, timeout_s, pid_refresh_s and max_bytes must be positive")
        self._states = [_State(endpoint=e) for e in endpoints]
        self._interval_s, self._timeout_s, self._max_bytes = interval_s, timeout_s, max_bytes
        self._clock, self._fetch = clock, fetch or http_fetch
        self._pid_refresh_s = pid_refresh_s
        self._recovery_s = recovery_s
        self._models = dict(models or {})
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        """Scrape each endpoint every ``interval_s`` in a daemon thread of its own (idempotent): a server that
        answers slowly costs its own figures and never another's (one thread for all once let one trickling
        server empty every server's serving figures). Each fetch has one deadline, ``timeout_s``."""
        if any(thread.is_alive() for thread in self._threads):
            return
        self._stop.clear()
        self._threads = [threading.Thread(target=self._run, args=(state,), name=f"roofwatch-inference-{i}",
                                          daemon=True) for i, state in enumerate(self._states)]
        for thread in self._threads:
            thread.start()

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=self._timeout_s + 1.0)
        self._threads = []

    def _run(self, state: _State) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self._scrape(state, None)
            except Exception:  # a bug here must not kill the thread for good
                log.exception("inference scrape failed")
            self._stop.wait(max(0.0, self._next_wait_s(state) - (time.monotonic() - started)))

    def _next_wait_s(self, state: _State) -> float:
        """The interval, or once :data:`RECOVERY_S` right after the endpoint answers with no rate yet (it came up
        or restarted): a server that starts after the agent has figures a second after its first answer."""
        with self._lock:
            quick = state.up and state.rates is None and state.prev is not None and not state.quick
            state.quick = state.quick or quick
        return min(self._interval_s, self._recovery_s) if quick else self._interval_s

    def scrape_once(self, now: float | None = None) -> None:
        """Scrape every endpoint once, one after the other; ``now`` stamps the scrapes (default: the clock
        after each fetch). For tests and one-off reads; the running agent uses :meth:`start`."""
        for state in self._states:
            if self._stop.is_set() and self._threads:
                return
            self._scrape(state, now)

    def _scrape(self, state: _State, now: float | None) -> None:
        ep = state.endpoint
        if ep.gpus is None and (state.pids_checked is None
                                or time.monotonic() - state.pids_checked >= self._pid_refresh_s):
            self._find_pids(state)
        try:
            body = self._fetch(ep.url, self._timeout_s, self._max_bytes)
            # Stamped when the body arrived, not after parsing: rates divide by the time between two
            # stamps, and parsing time under load would stretch one interval and shrink the next.
            arrived = now if now is not None else self._clock()
            expo = parse(body)  # decoded a line at a time
            del body
            kind = recognise(expo, ep.kind)
            current = totals(expo, kind)
        except Exception as exc:
            self._failed(state, describe_error(exc, self._timeout_s) if not isinstance(exc, ExpositionError)
                         else str(exc))
            return
        t = arrived
        if ep.gpus is None and not state.up and not state.pids:
            # It answers now, and had no listener at the last look (a server that starts after the agent):
            # its PIDs are found now, not pid_refresh_s later.
            self._find_pids(state)
        with self._lock:
            prev, prev_ts = state.prev, state.prev_ts
        new_rates, note = None, None
        if prev is not None and prev_ts is not None:
            try:
                new_rates = rates(prev, current, t - prev_ts)
            except CounterReset:
                note = "counter reset or server restart: no rate for this interval"
        rejected = (current.serving.rejected if current.serving is not None else Rejected()) + (
            new_rates.rejected if new_rates is not None else Rejected())
        first_bad = printable(expo.first_bad, FIRST_BAD_CHARS) if expo.first_bad is not None else None
        with self._lock:
            self._log_episodes(state, reset=note is not None, refused=expo.refused_note, rejected=rejected.note())
            if not state.up and state.scrapes:
                log.info("inference endpoint %s is up again (%s)", ep.url, kind)
            if expo.skipped and (expo.skipped, first_bad) != (state.skipped, state.first_bad):
                log.info("inference endpoint %s: %d unreadable lines skipped, first %s", ep.url, expo.skipped,
                         first_bad)
            state.skipped, state.first_bad = expo.skipped, first_bad
            state.refused, state.refused_note = expo.refused, expo.refused_note
            state.rejected, state.rejected_note = rejected.count, rejected.note()
            state.refused_total += expo.refused
            state.rejected_total += rejected.count
            state.prev, state.prev_ts, state.rates = current, t, new_rates
            state.rates_ts = t if new_rates is not None else None
            state.quick = state.quick and new_rates is None
            state.kind, state.models, state.up, state.error = kind, current.models, True, note
            state.last_success_ts = t
            state.scrapes += 1

    def _find_pids(self, state: _State) -> None:
        """The server's PIDs on this node; slow (walks /proc): rarely, and outside the lock."""
        pids, problem = server_pids(state.endpoint.url, state.endpoint.port)
        with self._lock:
            state.pids, state.pid_error, state.pids_checked = pids, problem, time.monotonic()

    @staticmethod
    def _log_episodes(state: _State, *, reset: bool, refused: str | None, rejected: str | None) -> None:
        """One line when a counter reset, a refusal by the label bounds or a rejection by the serving bounds
        begins; debug while it lasts (a counter going backwards on every scrape used to log every scrape)."""
        url = state.endpoint.url
        if state.resets.begins(reset):
            log.info("inference endpoint %s: counter reset or server restart: no rate for this interval; "
                     "logged again once the counters have moved forward", url)
        elif reset:
            log.debug("inference endpoint %s: counters still going backwards", url)
        if state.refusals.begins(refused is not None):
            log.warning("inference endpoint %s: %s; logged again after a body within the bounds", url, refused)
        elif refused is not None:
            log.debug("inference endpoint %s: %s", url, refused)
        if state.rejections.begins(rejected is not None):
            log.warning("inference endpoint %s: %s; logged again after a scrape within the bounds", url, rejected)
        elif rejected is not None:
            log.debug("inference endpoint %s: %s", url, rejected)

    def _failed(self, state: _State, error: str) -> None:
        error = hide(error)  # the server's reason phrase may quote the URL's api key: it becomes the source's detail
        with self._lock:
            if state.up or state.scrapes == 0:
                log.warning("inference endpoint %s unusable: %s", state.endpoint.url, error)
            else:
                log.debug("inference endpoint %s still unusable: %s", state.endpoint.url, error)
            state.up, state.error = False, error
            state.scrapes += 1
            state.failures += 1
            state.quick = False

    def report_for(self, *, gpu: str, uuid: str | None, pids: Sequence[int], now: float) -> WorkloadReport | None:
        """The fresh report of the first endpoint that serves GPU ``gpu`` (``uuid``) whose processes are
        ``pids``. Answers from the last scrape; never blocks on I/O, never raises."""
        try:
            with self._lock:
                for state in self._states:
                    if self._serves(state, gpu, uuid, pids, now):
                        report = self._report(state, now)
                        if report is not None:
                            return report
        except Exception:
            log.debug("report_for failed", exc_info=True)
        return None

    def _serves(self, state: _State, gpu: str, uuid: str | None, pids: Sequence[int], now: float) -> bool:
        configured = state.endpoint.gpus
        if configured is not None:
            return gpu in configured or (uuid is not None and uuid in configured)
        if state.pids and any(pid in state.pids for pid in pids):
            state.seen[gpu] = now
            return True
        state.seen.pop(gpu, None)
        return False

    def _world_size(self, state: _State, now: float) -> int:
        ep = state.endpoint
        if ep.world_size is not None:
            return ep.world_size
        if ep.gpus is not None:
            return len(ep.gpus)
        window = max(3.0 * self._interval_s, 120.0)  # longer than any collection interval
        for gpu in [g for g, t in state.seen.items() if now - t > window]:
            del state.seen[gpu]
        return max(1, len(state.seen))

    @staticmethod
    def _model_name(state: _State) -> str | None:
        """The configured name, else the one model the server reports (None for several, or none)."""
        if state.endpoint.model is not None:
            return state.endpoint.model
        return state.models[0] if len(state.models) == 1 else None

    def _model_facts(self, state: _State) -> ModelFacts:
        """The ``models:`` entry of the server's model, else an empty one."""
        name = self._model_name(state)
        return self._models.get(name, ModelFacts()) if name is not None else ModelFacts()

    def _report(self, state: _State, now: float) -> WorkloadReport | None:
        r = state.rates
        if not state.up or r is None or state.rates_ts is None or now - state.rates_ts > 3.0 * self._interval_s:
            return None
        ep = state.endpoint
        facts = self._model_facts(state)
        world = self._world_size(state, now)
        tokens = r.computed_tokens_per_s
        flops_per_token = ep.effective_flops_per_token or facts.flops_per_token or (
            2.0 * facts.params if facts.params else None)
        if r.flops_per_gpu_per_s is not None and tokens:
            flops_per_token = r.flops_per_gpu_per_s * world / tokens  # the server's own estimate wins
        step_time = 1.0 / r.steps_per_s if r.steps_per_s else None
        weights = ep.model_bytes if ep.model_bytes is not None else facts.model_bytes
        model_bytes = weights
        if r.bytes_per_gpu_per_s is not None:  # bytes the server estimates it moved, KV cache included
            if step_time:
                model_bytes = r.bytes_per_gpu_per_s * world * step_time
            elif tokens:
                model_bytes = r.bytes_per_gpu_per_s * world / tokens
        return WorkloadReport(job=ep.job, world_size=world,
                              step=int(r.steps_total) if r.steps_total is not None else None,
                              step_time_s=step_time, tokens_per_s=tokens, flops_per_token=flops_per_token,
                              model_bytes=model_bytes, dtype=ep.dtype or facts.dtype, source=state.kind,
                              serving=self._serving(state, r, weights, facts, world))

    def _serving(self, state: _State, r: Rates, weights: float | None, facts: ModelFacts,
                 world: int) -> ServingReport | None:
        """The server's serving figures with what the configuration adds (weights, KV pool, batch cap)."""
        s = r.serving
        if s is None:
            return None
        ep = state.endpoint
        per_token = ep.kv_bytes_per_token or facts.kv_bytes_per_token
        pool = ep.kv_cache_bytes or facts.kv_cache_bytes or (
            s.kv_cache_bytes_per_gpu * world if s.kv_cache_bytes_per_gpu is not None else None) or (
            s.kv_pool_tokens * per_token if s.kv_pool_tokens is not None and per_token else None)
        return ServingReport(
            server=ep.job or ep.server_name(state.kind), model=self._model_name(state),
            weight_bytes=weights, kv_cache_bytes=bounded_bytes(pool), kv_usage=s.kv_usage, running=s.running,
            waiting=s.waiting, max_running=ep.max_running or facts.max_running or s.max_running,
            preemptions_per_s=s.preemptions_per_s, tpot_s=s.tpot_s, ttft_s=s.ttft_s, prefill_share=s.prefill_share,
            generated_tokens_per_s=r.generated_per_s, gpus=world)

    def status(self) -> tuple[EndpointStatus, ...]:
        with self._lock:
            return tuple(EndpointStatus(
                url=s.endpoint.url, kind=s.kind, up=s.up, error=s.error, last_success_ts=s.last_success_ts,
                scrapes_total=s.scrapes, failures_total=s.failures, models=s.models,
                pids=tuple(sorted(s.pids)) if s.endpoint.gpus is None else None,
                pid_error=s.pid_error if s.endpoint.gpus is None else None, has_rate=s.rates is not None,
                flops_source=("server" if s.rates is not None and s.rates.flops_per_gpu_per_s is not None
                              else "config" if s.endpoint.effective_flops_per_token is not None else None),
                skipped_lines=s.skipped, first_bad_line=s.first_bad, refused_samples=s.refused,
                refused_note=s.refused_note, rejected_values=s.rejected, rejected_note=s.rejected_note,
                refused_total=s.refused_total, rejected_total=s.rejected_total,
            ) for s in self._states)
