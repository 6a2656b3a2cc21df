"""Report a training or serving loop's throughput to the local roofwatch agent.

Counters tell the agent how busy a GPU is; only the job knows how much useful work it does
(tokens per second, FLOPs per token). One call per step::

    from agent.client import report          # or copy this file into your job as roofwatch_client.py
    report(step_time_s=dt, tokens=global_batch_tokens, flops_per_token=6 * n_params, dtype="bf16")

The agent turns that into model FLOPs utilisation (MFU) and bandwidth utilisation (MBU).

Design rules, because this module runs inside somebody else's training loop:

* **Standard library only.** It is copied into jobs that do not install roofwatch, so it never
  imports anything from ``agent``.
* **Never blocks, never raises.** :func:`report` validates cheaply and appends a dict to a
  bounded queue (full queue: the report is dropped and counted); one daemon thread does all
  I/O with short timeouts. Bad values are dropped and counted, not raised. (Python itself
  still rejects an unknown keyword or positional arguments at the first call: that is a
  typo in the code, not a runtime condition.)
* **Quiet when there is no agent.** A failed connection backs off (5 s, doubling to 60 s) and
  reports are dropped meanwhile, so a job without an agent pays one failed connect a minute.
* **Fork safe.** DataLoader workers fork the process; the child starts with an empty queue,
  fresh counters and no thread or connection, so it neither deadlocks on a lock the parent's
  thread held nor re-sends the parent's pending reports.

Transport: HTTP/1.1 ``POST /api/v1/report`` with a JSON body, over the unix socket
``ROOFWATCH_REPORT_SOCKET`` (default ``/run/roofwatch/report.sock``) when it exists, else to
``ROOFWATCH_REPORT_URL`` (e.g. ``http://127.0.0.1:9477``) when set; the connection is kept
alive between reports. ``ROOFWATCH_REPORT_TOKEN`` is sent as a bearer token when set.
"""

from __future__ import annotations

import atexit
import collections
import http.client
import json
import logging
import math
import numbers
import os
import socket
import threading
import time
import urllib.parse
import weakref
from typing import Any, Callable

__all__ = ["Reporter", "report", "get_reporter", "REPORT_PATH", "DEFAULT_SOCKET"]

log = logging.getLogger("roofwatch.client")

REPORT_PATH = "/api/v1/report"
DEFAULT_SOCKET = "/run/roofwatch/report.sock"
DTYPES = ("fp8", "bf16", "fp16", "tf32", "fp32", "fp64")
HINT_ENV = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "LOCAL_RANK")
"""Environment the agent uses to find the GPU when PIDs do not match (containers have their own PID namespace)."""
MAX_HINT_LEN = 1024
MAX_STR_LEN = 128

_DTYPE_ALIASES = {
    "bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32",
    "float64": "fp64", "double": "fp64", "float8_e4m3fn": "fp8", "float8_e5m2": "fp8",
    "float8_e4m3fnuz": "fp8", "float8_e5m2fnuz": "fp8",
}
"""torch / numpy names, so ``dtype=model.dtype`` works without the caller translating."""

_FLOAT_FIELDS = ("step_time_s", "tokens", "tokens_per_s", "flops_per_token", "model_bytes")
_INT_FIELDS = ("rank", "world_size", "step")
_MEANINGFUL = ("step_time_s", "tokens", "tokens_per_s", "flops_per_token", "model_bytes", "dtype", "step")

# Failures of a sent report that say "this agent will not take reports for a while" (auth,
# reports switched off, overloaded): back off instead of hammering it every step.
_BACKOFF_STATUSES = frozenset({401, 403, 404, 405, 411, 415, 429, 500, 502, 503, 504})


class _Invalid(Exception):
    """An argument that cannot be reported; the report is dropped and counted."""


class _Unreachable(Exception):
    """No agent to talk to (no socket, no URL, connection refused)."""


class _UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over a unix socket: the agent learns our PID from the socket itself (SO_PEERCRED)."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


_LIVE: "weakref.WeakSet[Reporter]" = weakref.WeakSet()


class Reporter:
    """Queues reports and sends them from one daemon thread. See the module docstring for the rules.

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
        self._rank = _env_int(env, "RANK")
        self._world_size = _env_int(env, "WORLD_SIZE")
        job = env.get("ROOFWATCH_JOB") or env.get("SLURM_JOB_ID") or None
        self._job = job[:MAX_STR_LEN] if job else None
        self._hints = {k: env[k] for k in HINT_ENV if k in env and len(env[k]) <= MAX_HINT_LEN}
        self._closed = False
        self._warned: str | None = None
        self._reset_state()
        _LIVE.add(self)

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
               step: int | None = None, job: str | None = None, gpu: str | int | None = None) -> None:
        """Queue one report; returns at once. ``tokens`` is what the *whole job* processed this step."""
        try:
            item = self._build(step_time_s=step_time_s, tokens=tokens, tokens_per_s=tokens_per_s,
                               flops_per_token=flops_per_token, dtype=dtype, model_bytes=model_bytes,
                               rank=rank, world_size=world_size, step=step, job=job, gpu=gpu)
        except _Invalid as exc:
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

    def _build(self, **kw: Any) -> dict[str, Any]:
        item: dict[str, Any] = {}
        for name in _FLOAT_FIELDS:
            value = kw[name]
            if value is not None:
                item[name] = _number(name, value)
        for name in _INT_FIELDS:
            value = kw[name]
            if value is not None:
                item[name] = _integer(name, value)
        if kw["dtype"] is not None:
            item["dtype"] = _dtype(kw["dtype"])
        if not any(name in item for name in _MEANINGFUL):
            raise _Invalid("nothing to report: give step_time_s, tokens, tokens_per_s, flops_per_token, model_bytes, dtype or step")
        if "rank" not in item and self._rank is not None:
            item["rank"] = self._rank
        if "world_size" not in item and self._world_size is not None:
            item["world_size"] = self._world_size
        if item.get("world_size") == 0:
            raise _Invalid("world_size must be at least 1")
        if "rank" in item and "world_size" in item and item["rank"] >= item["world_size"]:
            raise _Invalid("rank must be less than world_size")
        job = kw["job"] if kw["job"] is not None else self._job
        if job is not None:
            if not isinstance(job, str) or len(job) > MAX_STR_LEN:
                raise _Invalid(f"job must be a string of at most {MAX_STR_LEN} characters")
            item["job"] = job
        gpu = kw["gpu"]
        if gpu is not None:
            if isinstance(gpu, numbers.Integral) and not isinstance(gpu, bool) and gpu >= 0:
                gpu = str(int(gpu))
            if not isinstance(gpu, str) or not gpu or len(gpu) > MAX_STR_LEN:
                raise _Invalid("gpu must be a GPU UUID or a non-negative index")
            item["gpu"] = gpu
        item["pid"] = os.getpid()
        if self._hints:
            item["hints"] = self._hints
        return item

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
            except _Unreachable as exc:
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
        if status in _BACKOFF_STATUSES:
            self._back_off(f"the agent answered HTTP {status}", drain=True)
        else:
            self._warn_once(f"http{status}", "roofwatch: the agent rejected a report with HTTP %s", status)

    def _fail(self, why: str) -> None:
        self._close_connection()
        with self._lock:
            self._failed += 1
        self._back_off(why, drain=True)

    def _post(self, body: bytes) -> int:
        conn = self._connection()
        headers = {"Content-Type": "application/json", "User-Agent": "roofwatch-client/1"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        conn.request("POST", self._conn_path, body=body, headers=headers)
        response = conn.getresponse()
        response.read(65536)  # drain (bounded) so the connection can carry the next report
        if response.will_close:
            self._close_connection()
        return response.status

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is not None:
            return self._conn
        with self._lock:
            self._connects += 1
        if self._socket_path and os.path.exists(self._socket_path):
            conn: http.client.HTTPConnection = _UnixHTTPConnection(self._socket_path, self._timeout_s)
            self._conn_path = REPORT_PATH
        elif self._url:
            parts = urllib.parse.urlsplit(self._url)
            if parts.scheme != "http" or not parts.hostname:
                raise _Unreachable(f"ROOFWATCH_REPORT_URL {self._url!r} is not an http:// URL")
            conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=self._timeout_s)
            self._conn_path = parts.path.rstrip("/") + REPORT_PATH
        else:
            raise _Unreachable(f"no agent: {self._socket_path or 'no socket'} does not exist and ROOFWATCH_REPORT_URL is not set")
        try:
            conn.connect()
        except OSError as exc:
            conn.close()
            raise _Unreachable(f"cannot connect to the agent: {exc}") from None
        self._conn = conn
        return conn

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


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise _Invalid(f"{name} must be a number, not {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number) or number < 0.0:
        raise _Invalid(f"{name} must be finite and non-negative")
    return number


def _integer(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise _Invalid(f"{name} must be an integer, not {type(value).__name__}")
    number = int(value)
    if number < 0:
        raise _Invalid(f"{name} must be non-negative")
    return number


def _dtype(value: Any) -> str:
    if not isinstance(value, str):
        if not type(value).__name__.startswith("dtype"):  # torch.dtype, numpy's dtype[float16]; nothing else gets str()
            raise _Invalid("dtype must be one of " + ", ".join(DTYPES))
        value = str(value)
    text = value.strip().lower().removeprefix("torch.")
    text = _DTYPE_ALIASES.get(text, text)
    if text not in DTYPES:
        raise _Invalid("dtype must be one of " + ", ".join(DTYPES))
    return text


def _env_int(env: Any, key: str) -> int | None:
    text = env.get(key, "").strip()
    return int(text) if text.isdigit() else None


# -- the module-level default -------------------------------------------------------------------

_default: Reporter | None = None
_default_lock = threading.Lock()


def get_reporter() -> Reporter:
    """The process's default :class:`Reporter`, created on first use (so the environment is final)."""
    global _default
    reporter = _default
    if reporter is None:
        with _default_lock:
            if _default is None:
                _default = Reporter()
            reporter = _default
    return reporter


def report(*, step_time_s: float | None = None, tokens: float | None = None, tokens_per_s: float | None = None,
           flops_per_token: float | None = None, dtype: Any = None, model_bytes: float | None = None,
           rank: int | None = None, world_size: int | None = None, step: int | None = None,
           job: str | None = None, gpu: str | int | None = None) -> None:
    """Report one step to the local agent through the default :class:`Reporter`. Never blocks or raises.

    ``step_time_s``: wall time of the step; ``tokens``: tokens the whole job processed in it (the
    agent computes tokens/s); or ``tokens_per_s`` directly (whole job). ``flops_per_token``:
    model FLOPs per token (about 6 x parameters for training, 2 x for inference);
    ``model_bytes``: bytes of weights read per step; ``dtype``: fp8/bf16/fp16/tf32/fp32/fp64 or
    a torch dtype. ``rank``/``world_size`` default to ``RANK``/``WORLD_SIZE``; ``job`` to
    ``ROOFWATCH_JOB`` or ``SLURM_JOB_ID``; ``gpu`` (UUID or host index) only when the agent cannot
    tell by itself which GPU this process drives.
    """
    try:
        get_reporter().report(step_time_s=step_time_s, tokens=tokens, tokens_per_s=tokens_per_s,
                              flops_per_token=flops_per_token, dtype=dtype, model_bytes=model_bytes, rank=rank,
                              world_size=world_size, step=step, job=job, gpu=gpu)
    except Exception:
        pass


def _after_fork_in_child() -> None:
    global _default_lock
    _default_lock = threading.Lock()
    for reporter in list(_LIVE):
        reporter._after_fork_in_child()


def _close_all_at_exit() -> None:
    """Give the last reports of a finishing job one second, in all, to reach the agent."""
    deadline = time.monotonic() + 1.0
    for reporter in list(_LIVE):
        try:
            reporter.close(timeout=max(0.0, deadline - time.monotonic()))
        except Exception:
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_close_all_at_exit)
