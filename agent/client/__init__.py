"""Report a training or serving loop's throughput to the local roofwatch agent.

Counters tell the agent how busy a GPU is; only the job knows how much useful work it does
(tokens per second, FLOPs per token). One call per step::

    from agent.client import report          # or copy this folder into your job as roofwatch_client/
    report(step_time_s=dt, tokens=global_batch_tokens, flops_per_token=6 * n_params, dtype="bf16")

The agent turns that into model FLOPs utilisation (MFU) and bandwidth utilisation (MBU).

Design rules, because this package runs inside somebody else's training loop:

* **Standard library only.** The ``agent/client/`` folder is copied into jobs that do not install
  roofwatch (e.g. as ``roofwatch_client/``), so it never imports anything from ``agent`` and its
  modules import each other only relatively.
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

Layout: :mod:`.fields` (what a report carries and its validation), :mod:`.transport` (the
connection and the POST), :mod:`.reporter` (queue, sender thread, back-off, fork reset, stats);
this module holds the process-wide default reporter and the at-fork / at-exit hooks, because
those must exist exactly once per process whichever module is imported first.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from typing import Any, Mapping

from .fields import DTYPES, HINT_ENV, MAX_HINT_LEN, MAX_STR_LEN  # noqa: F401 (importable here, as before the split)
from .reporter import LIVE, Reporter, log  # noqa: F401 (log: the "roofwatch.client" logger)
from .transport import DEFAULT_SOCKET, REPORT_PATH

__all__ = ["Reporter", "report", "get_reporter", "REPORT_PATH", "DEFAULT_SOCKET"]

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
           job: str | None = None, gpu: str | int | None = None, serving: Mapping[str, float] | None = None) -> None:
    """Report one step to the local agent through the default :class:`Reporter`. Never blocks or raises.

    ``step_time_s``: wall time of the step; ``tokens``: tokens the whole job processed in it (the
    agent computes tokens/s); or ``tokens_per_s`` directly (whole job). ``flops_per_token``:
    model FLOPs per token (about 6 x parameters for training, 2 x for inference);
    ``model_bytes``: bytes of weights read per step; ``dtype``: fp8/bf16/fp16/tf32/fp32/fp64 or
    a torch dtype. ``rank``/``world_size`` default to ``RANK``/``WORLD_SIZE``; ``job`` to
    ``ROOFWATCH_JOB`` or ``SLURM_JOB_ID``; ``gpu`` (UUID or host index) only when the agent cannot
    tell by itself which GPU this process drives. ``serving`` (inference servers the agent does not
    scrape): a dict of running, waiting, max_running, kv_usage, kv_cache_bytes, preemptions_per_s,
    tpot_s, ttft_s, prefill_share, generated_tokens_per_s (docs/serving.md).
    """
    try:
        get_reporter().report(step_time_s=step_time_s, tokens=tokens, tokens_per_s=tokens_per_s,
                              flops_per_token=flops_per_token, dtype=dtype, model_bytes=model_bytes, rank=rank,
                              world_size=world_size, step=step, job=job, gpu=gpu, serving=serving)
    except Exception:
        pass


def _after_fork_in_child() -> None:
    global _default_lock
    _default_lock = threading.Lock()
    for reporter in list(LIVE):
        reporter._after_fork_in_child()


def _close_all_at_exit() -> None:
    """Give the last reports of a finishing job one second, in all, to reach the agent."""
    deadline = time.monotonic() + 1.0
    for reporter in list(LIVE):
        try:
            reporter.close(timeout=max(0.0, deadline - time.monotonic()))
        except Exception:
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_close_all_at_exit)
