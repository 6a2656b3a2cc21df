"""Run the real ``roofwatch`` CLI as a child process and talk to it over HTTP, as a user would."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from socketserver import BaseServer
from typing import Iterator

from prometheus_client.parser import text_string_to_metric_families

URL_PATTERN = re.compile(r"on (https?://\S+/)")
SLOW_MACHINE_SAMPLE_TIMEOUT_S = 30.0
"""The per-device read deadline for in-process virtual collectors whose test asserts what every GPU shows.
The default (0.8 x the 1 s interval) is a product setting; on a loaded CI machine a virtual first read
can pass it, and the GPU is then marked down (a deadline test's business, not a chart's or a parser's)."""


def roofwatch_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "agent.app.cli", *args]


def clean_env(**extra: str) -> dict[str, str]:
    """The test's environment without roofwatch settings, and without the terminal size pytest-xdist's
    workers set (COLUMNS=80, LINES=24), which would override a child's own terminal or pipe defaults."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROOFWATCH_") and k not in ("COLUMNS", "LINES")}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def poll(condition, timeout: float, interval: float = 0.05, what: str = "condition"):
    """Return the first truthy value of ``condition()``; fail with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = condition()
            if value:
                return value
        except (OSError, ValueError, KeyError) as exc:  # not up yet, or a half-written answer
            last_error = exc
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last error: {last_error})")


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def gauge_values(text: str, name: str) -> dict[str, float]:
    """``{gpu: value}`` of one per-GPU family in an exposition."""
    for family in text_string_to_metric_families(text):
        if family.name == name:
            return {s.labels["gpu"]: s.value for s in family.samples if s.name == name}
    return {}


class AgentProcess:
    """``roofwatch demo`` (or ``run``) on a free port, with its URL read from its own output."""

    def __init__(self, *args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
                 program: list[str] | None = None) -> None:
        """``program``: what runs ``roofwatch`` in place of this checkout's (the container image's
        entrypoint under chroot, tests/test_container_image.py)."""
        self.proc = subprocess.Popen(
            [*program, *args] if program else roofwatch_cmd(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, env=env or clean_env(), cwd=cwd,
        )
        line = self.proc.stdout.readline()
        match = URL_PATTERN.search(line)
        if not match:
            self.proc.kill()
            _, err = self.proc.communicate(timeout=10)
            raise AssertionError(f"agent printed no URL: {line!r}; stderr: {err}")
        self.url = match.group(1)

    def get(self, path: str) -> tuple[int, bytes]:
        return http_get(self.url + path.lstrip("/"))

    def metrics(self) -> str:
        status, body = self.get("metrics")
        assert status == 200
        return body.decode()

    def wait_healthy(self, timeout: float = 20.0) -> None:
        poll(lambda: self.get("healthz")[0] == 200, timeout, what="/healthz 200")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> tuple[int, float, str]:
        """Send ``sig``; return (exit code, seconds until exit, stderr)."""
        started = time.monotonic()
        self.proc.send_signal(sig)
        try:
            _, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
            raise AssertionError(f"agent ignored {signal.Signals(sig).name} for {timeout}s; stderr: {err}") from None
        return self.proc.returncode, time.monotonic() - started, err

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


@contextlib.contextmanager
def running_demo(*args: str) -> Iterator[AgentProcess]:
    """A healthy ``roofwatch demo`` on a free port, killed on the way out whatever happens."""
    agent = AgentProcess("demo", "--listen", "127.0.0.1:0", *args)
    try:
        agent.wait_healthy()
        yield agent
    finally:
        agent.kill()


@contextlib.contextmanager
def serving(server: BaseServer) -> Iterator[BaseServer]:
    """An in-process HTTP server answering from a thread until the block ends."""
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def serving_collector(collector) -> Iterator:
    """The agent's HTTP server over ``collector``'s snapshots, with a clock the test sets
    (``server.test_clock["t"]``) so that staleness is decided by the test, not by time passing; its ``/`` page
    is the one the agent registers."""
    from agent.app.assemble import status_page
    from exporters.http import AgentHTTPServer

    now = {"t": collector.snapshot.health.last_cycle_ts}
    with serving(AgentHTTPServer(("127.0.0.1", 0), lambda: collector.snapshot, stale_after_s=10.0,
                                 clock=lambda: now["t"], page=status_page())) as server:
        server.test_clock = now  # type: ignore[attr-defined]
        yield server
