"""The :class:`Reporter`: a bounded queue the caller appends to, and one daemon thread that sends.

Splitting the work this way is what lets ``report()`` promise never to block or raise inside a
training loop: the caller only validates and appends under a lock; every slow or failing step
(connecting, posting, waiting for an answer, backing off) happens on the sender thread. The
state that must not cross a ``fork()`` (locks, queue, thread, connection, counts) is gathered in
:meth:`Reporter._reset_state` so a forked child can start clean.
"""

from __future__ import annotations

import collections
import http.client
import json
import logging
import math
import os
import threading
import time
import weakref
from typing import Any, Callable, Mapping

from .fields import Invalid, JobDefaults, build_report
from .transport import BACKOFF_STATUSES, DEFAULT_SOCKET, REPORT_PATH, Unreachable, open_connection, post

__all__ = ["Reporter", "LIVE"]

log = logging.getLogger("roofwatch.client")

LIVE: "weakref.WeakSet[Reporter]" = weakref.WeakSet()
"""Every reporter not yet garbage-collected, for the package's at-fork and at-exit hooks."""


class Reporter:
    """Queues reports and sends them from one daemon thread. See the package docstring for the rules.

    ``socket_path``, ``url`` and ``token`` default to ``ROOFWATCH_REPORT_SOCKET`` (else
    :data:`DEFAULT_SOCKET`), ``ROOFWATCH_REPORT_URL`` and ``ROOFWATCH_REPORT_TOKEN``; an empty
    ``socket_path`` turns the socket off. The environment (rank, job, device hints) is read once,
    here: launchers set it before the process starts.
    """

    def __init__(self, *, socket_path: str | None = None, url: str | None = None, token: str | None = None,
                 max_queue: int = 64, timeout_s: float = 0.5, backoff_s: tuple[float, float] = (5.0, 60.0),
                 clock: Callable[[], float] = time.monotonic) -> None:
        env = os.environ
        self._socket_path = env.get("ROOFWATCH_REPORT_SOCKET", DEFAULT_SOCKET) if socket_path is None else socket_path
        self._url = (env.get("ROOFWATCH_REPORT_URL") or None) if url is None else (url or None)
        self._token = (env.get("ROOFWATCH_REPORT_TOKEN") or None) if token is None else (token or None)
        self._max_queue = max(1, int(max_queue))
        self._timeout_s = float(timeout_s)
        self._backoff_first, self._backoff_max = float(backoff_s[0]), float(backoff_s[1])
        self._clock = clock
        self._defaults = JobDefaults.from_environment(env)
        self._closed = False
        self._warned: str | None = None
        self._reset_state()
        LIVE.add(self)

    def _reset_state(self) -> None:
        """Everything a forked child must not share with its parent: locks, queue, thread, connection, counts."""
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._pending: collections.deque[dict[str, Any]] = collections.deque()
        self._busy = False
        self._thread: threading.Thread | None = None
        self._conn: http.client.HTTPConnection | None = None
        self._conn_path = REPORT_PATH
        self._down_until = -math.inf
        self._backoff = self._backoff_first
        self._sent = self._dropped = self._failed = self._invalid = self._connects = 0

    def _after_fork_in_child(self) -> None:
        conn = self._conn
        self._reset_state()
        if conn is not None and conn.sock is not None:
            try:  # our copy of the parent's socket: close the descriptor (the parent's stays open)
                conn.sock.close()
            except Exception:
                pass

    # -- the caller's side: cheap, never raises ------------------------------------------------

    def report(self, *, step_time_s: float | None = None, tokens: float | None = None,
               tokens_per_s: float | None = None, flops_per_token: float | None = None, dtype: Any = None,
               model_bytes: float | None = None, rank: int | None = None, world_size: int | None = None,
               step: int | None = None, job: str | None = None, gpu: str | int | None = None,
               serving: Mapping[str, float] | None = None) -> None:
        """Queue one report; returns at once. ``tokens`` is what the *whole job* processed this step."""
        try:
            item = build_report(dict(step_time_s=step_time_s, tokens=tokens, tokens_per_s=tokens_per_s,
                                     flops_per_token=flops_per_token, dtype=dtype, model_bytes=model_bytes,
                                     rank=rank, world_size=world_size, step=step, job=job, gpu=gpu,
                                     serving=serving), self._defaults)
        except Invalid as exc:
            with self._lock:
                self._invalid += 1
                self._dropped += 1
            self._warn_once("invalid", "roofwatch: dropping an invalid report (%s); further ones are only counted", exc)
            return
        except Exception:  # an argument whose conversion misbehaved in a way we did not foresee
            with self._lock:
                self._invalid += 1
                self._dropped += 1
            return
        try:
            self._enqueue(item)
        except Exception:
            pass  # counting failed too; nothing sensible left to do without raising

    def _enqueue(self, item: dict[str, Any]) -> None:
        start = False
        with self._cond:
            if self._closed or self._clock() < self._down_until or len(self._pending) >= self._max_queue:
                self._dropped += 1  # closed, agent known absent, or the sender cannot keep up
                return
            self._pending.append(item)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="roofwatch-reporter", daemon=True)
                start = True
            self._cond.notify()
        if start:
            self._thread.start()  # type: ignore[union-attr]

    # -- the sender thread ---------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if not self._pending:
                    self._cond.notify_all()
                    return
                item = self._pending.popleft()
                self._busy = True
            try:
                self._deliver(item)
            except Exception as exc:  # never let the thread die: count it and back off
                self._close_connection()
                with self._lock:
                    self._failed += 1
                self._back_off(f"internal error: {exc!r}")
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _deliver(self, item: dict[str, Any]) -> None:
        if self._clock() < self._down_until:
            with self._lock:
                self._dropped += 1
            return
        body = json.dumps(item, separators=(",", ":")).encode()
        attempts = 2 if self._conn is not None else 1
        while True:
            attempts -= 1
            try:
                status = self._post(body)
                break
            except Unreachable as exc:
                self._close_connection()
                with self._lock:
                    self._dropped += 1
                self._back_off(str(exc), drain=True)
                return
            except (ConnectionResetError, BrokenPipeError) as exc:  # RemoteDisconnected is a ConnectionResetError
                if attempts > 0:
                    # The agent closed our idle keep-alive connection before reading it: once more, fresh.
                    self._close_connection()
                    continue
                self._fail(f"sending failed: {exc!r}")
                return
            except (OSError, http.client.HTTPException) as exc:  # timeout waiting for an answer, garbage
                self._fail(f"sending failed: {exc!r}")
                return
        if 200 <= status < 300:
            with self._lock:
                self._sent += 1
            self._backoff = self._backoff_first
            if self._warned is not None:
                log.info("roofwatch: reports reach the agent again")
                self._warned = None
            return
        with self._lock:
            self._failed += 1
        if status in BACKOFF_STATUSES:
            self._back_off(f"the agent answered HTTP {status}", drain=True)
        else:
            self._warn_once(f"http{status}", "roofwatch: the agent rejected a report with HTTP %s", status)

    def _fail(self, why: str) -> None:
        self._close_connection()
        with self._lock:
            self._failed += 1
        self._back_off(why, drain=True)

    def _post(self, body: bytes) -> int:
        status, will_close = post(self._connection(), self._conn_path, body, self._token)
        if will_close:
            self._close_connection()
        return status

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is not None:
            return self._conn
        with self._lock:
            self._connects += 1
        self._conn, self._conn_path = open_connection(self._socket_path, self._url, self._timeout_s)
        return self._conn

    def _close_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:
                pass

    def _back_off(self, why: str, *, drain: bool = False) -> None:
        """Stop trying for a while; what is queued would be stale by then, so drop it."""
        delay = self._backoff
        self._backoff = min(self._backoff * 2.0, self._backoff_max)
        with self._lock:
            self._down_until = self._clock() + delay
            if drain:
                self._dropped += len(self._pending)
                self._pending.clear()
        self._warn_once("down", "roofwatch: %s; dropping reports, next try in %.0f s", why, delay)

    def _warn_once(self, key: str, message: str, *args: Any) -> None:
        if self._warned != key:
            self._warned = key
            try:
                log.warning(message, *args)
            except Exception:
                pass

    # -- lifecycle -----------------------------------------------------------------------------

    def flush(self, timeout: float = 1.0) -> bool:
        """Wait up to ``timeout`` s until everything queued has been sent (or given up); True if so."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._pending and not self._busy, timeout)

    def close(self, timeout: float = 1.0) -> None:
        """Send what is queued (up to ``timeout`` s), then stop; later reports are dropped. Idempotent."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        with self._lock:
            if thread is None or not thread.is_alive():
                self._dropped += len(self._pending)
                self._pending.clear()
        if thread is None or not thread.is_alive():
            self._close_connection()

    def stats(self) -> dict[str, int]:
        """Counts since start (or since the fork, in a child).

        ``sent``: accepted by the agent. ``failed``: sent but not accepted (error answer, timeout,
        reset, or an error inside the sender). ``dropped``: never sent (invalid, queue full, agent
        absent or backing off, closed); ``invalid`` is the part of ``dropped`` with bad arguments.
        ``queued``: waiting now. ``connects``: connection attempts (shows the back-off working).
        """
        with self._lock:
            return {"sent": self._sent, "dropped": self._dropped, "failed": self._failed, "invalid": self._invalid,
                    "queued": len(self._pending) + (1 if self._busy else 0), "connects": self._connects}
