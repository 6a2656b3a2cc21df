"""``roofwatch top``: a live terminal view of one node's GPUs, about efficiency rather than load.

nvitop answers "is the GPU busy?"; this answers "is the busy GPU doing useful work?": the class
that bounds each GPU, its MFU, and the SM / tensor / DRAM activity behind the verdict, with a
strip of recent verdicts so flapping or a fresh change is visible at a glance.

This module is the terminal: a fetch thread, keys in cbreak mode, the full screen. What is drawn
is :mod:`agent.views.top_render`; where the numbers come from is :mod:`agent.views.top_source`.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import queue
import select
import signal
import sys
import threading
import time
from typing import Iterator

from rich.console import Console

from agent.views.top_render import SORT_ORDERS, TopState, handle_keys, render_frame
from agent.views.top_source import DEFAULT_TIMEOUT_S, NodeView, TopSourceError, fetch_view, metrics_url

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2


# -- I/O ------------------------------------------------------------------------------------


def _error(message: str) -> None:
    print(f"roofwatch top: {message}", file=sys.stderr)


def run_top(args: argparse.Namespace) -> int:
    """Entry point of ``roofwatch top``: validate, then one frame (--once, no TTY) or the live view."""
    interval = args.interval
    if not (isinstance(interval, (int, float)) and math.isfinite(interval) and interval > 0):
        _error("--interval: must be greater than 0 seconds")
        return EXIT_USAGE
    try:
        url = metrics_url(args.url)
    except TopSourceError as exc:
        _error(str(exc))
        return EXIT_USAGE
    sort = args.sort if args.sort in SORT_ORDERS else "gpu"
    if args.once or not (sys.stdin.isatty() and sys.stdout.isatty()):
        return run_once(url, sort)
    return run_live(url, sort, interval)


def run_once(url: str, sort: str, timeout: float = DEFAULT_TIMEOUT_S) -> int:
    """Print one frame to stdout and exit: for scripts, pipes and a quick look."""
    try:
        view = fetch_view(url, timeout)
    except TopSourceError as exc:
        _error(str(exc))
        return EXIT_FAILURE
    state = TopState(url=url, sort=sort)
    state.apply(view)
    # Piped output has no width; rich would squeeze the table into 80 columns.
    console = Console(width=None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 200)
    console.print(render_frame(state, console.width, interactive=False))
    return EXIT_OK


class Poller(threading.Thread):
    """Fetches every ``interval`` seconds off the key-reading thread, so a slow agent never
    freezes the keys; each result is queued and announced by a byte on ``wake_fd``."""

    def __init__(self, url: str, interval: float, wake_fd: int, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        super().__init__(name="roofwatch-top-poll", daemon=True)
        self.url, self.interval, self.wake_fd, self.timeout = url, interval, wake_fd, timeout
        self.results: queue.SimpleQueue[NodeView | Exception] = queue.SimpleQueue()
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            started = time.monotonic()
            self.results.put(self._poll())
            with contextlib.suppress(OSError):  # the main loop closed the pipe: it is leaving
                os.write(self.wake_fd, b"p")
            self.stopped.wait(max(0.0, started + self.interval - time.monotonic()))

    def _poll(self) -> NodeView | Exception:
        try:
            return fetch_view(self.url, self.timeout)
        except TopSourceError as exc:
            return exc
        except Exception as exc:  # noqa: BLE001 - the screen shows it; a traceback would wreck the terminal
            return TopSourceError(" ".join(f"{self.url}: {type(exc).__name__}: {exc}".split()))


@contextlib.contextmanager
def cbreak(fd: int) -> Iterator[None]:
    """Keys arrive one by one without Enter or echo; the terminal is restored whatever happens."""
    import termios
    import tty

    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


@contextlib.contextmanager
def _wake_on_resize(wake_fd: int) -> Iterator[None]:
    """Redraw at once when the terminal is resized (the frame is laid out for the old width)."""
    previous = signal.signal(signal.SIGWINCH, lambda *_: _poke(wake_fd))
    try:
        yield
    finally:
        signal.signal(signal.SIGWINCH, previous)


def _poke(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.write(fd, b"w")


def run_live(url: str, sort: str, interval: float) -> int:
    """Full-screen view until q or Ctrl-C (both exit 0); keys and polls both redraw at once."""
    from rich.live import Live

    state = TopState(url=url, sort=sort)
    console = Console()
    stdin_fd = sys.stdin.fileno()
    wake_r, wake_w = os.pipe()
    poller = Poller(url, interval, wake_w)
    try:
        with Live(console=console, screen=True, auto_refresh=False) as live, cbreak(stdin_fd), _wake_on_resize(wake_w):
            poller.start()
            _loop(live, console, state, poller, stdin_fd, wake_r)
    except KeyboardInterrupt:
        pass
    finally:
        poller.stopped.set()
        poller.join(timeout=0.2)
        os.close(wake_r)
        if not poller.is_alive():  # else a late fetch may still poke it; the process exit closes it
            os.close(wake_w)
    return EXIT_OK


def _loop(live, console: Console, state: TopState, poller: Poller, stdin_fd: int, wake_fd: int) -> None:
    """Wait for a key, a poll result or a resize (1 s at most, to keep the age honest); redraw."""
    while True:
        live.update(render_frame(state, console.width), refresh=True)
        readable, _, _ = select.select([stdin_fd, wake_fd], [], [], 1.0)
        if wake_fd in readable:
            os.read(wake_fd, 4096)
            while not poller.results.empty():
                state.apply(poller.results.get_nowait())
        if stdin_fd in readable:
            keys = os.read(stdin_fd, 64).decode("utf-8", errors="ignore")
            quit_now, state.sort = handle_keys(keys, state.sort)
            if quit_now or not keys:  # q, or the terminal went away
                return
