"""Signals reach the agent's main loop wherever they land (agent.app.signals).

CI once saw ``roofwatch run`` log ``stopping`` on SIGTERM and then never exit: the handler called
``Event.set()``, whose lock the interrupted ``Event.wait()`` held at that bytecode. The first test
fires the handler at every line the wait runs, as a signal may; the second sends the signal to
another thread than the waiting one, as the kernel may.
"""

from __future__ import annotations

import signal
import sys
import threading

import pytest

import agent.app.signals as signals_module
from agent.app.signals import SignalRequests


def _line_events_of_one_wait() -> int:
    requests = SignalRequests()
    count = 0

    def counter(frame, event, arg):
        nonlocal count
        if event == "line":
            count += 1
        return counter

    sys.settrace(counter)
    try:
        requests.wait(0.003)
    finally:
        sys.settrace(None)
        requests.close()
    return count


def test_a_signal_landing_at_any_line_of_the_wait_is_taken_and_never_hangs_it(monkeypatch):
    monkeypatch.setattr(signals_module, "SIGNAL_CHECK_S", 0.001)  # lines after a slice come a slice later
    lines = _line_events_of_one_wait()
    assert lines >= 5, "the wait ran too few lines to test anything"
    hung, missed = [], []
    for fire_at in range(1, lines + 1):
        requests = SignalRequests()
        handler = requests._handler("stop")
        seen = 0
        result: list[bool] = []

        def tracer(frame, event, arg):
            nonlocal seen
            if event == "line":
                seen += 1
                if seen == fire_at:
                    handler(signal.SIGTERM, None)  # what CPython does when a signal arrives between bytecodes
            return tracer

        def run() -> None:
            sys.settrace(tracer)
            try:
                result.append(requests.wait(30.0))
            finally:
                sys.settrace(None)

        waiter = threading.Thread(target=run, daemon=True)
        waiter.start()
        waiter.join(10.0)
        if waiter.is_alive():
            hung.append(fire_at)  # left behind as a daemon thread: the test fails below
            continue
        if result != [True] or requests.signal_name("stop") != "SIGTERM":
            missed.append(fire_at)
        requests.close()
    assert not hung, f"the wait hung when the signal landed at line events {hung}"
    assert not missed, f"the wait missed the request raised at line events {missed}"


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(),
                    reason="signal handlers can only be installed from the main thread")
def test_a_signal_taken_by_another_thread_wakes_the_main_threads_wait_at_once(monkeypatch):
    """The slice backstop is set far beyond the wait's own timeout, so only the wake-up byte written by
    the thread that took the signal can end the wait with the request seen."""
    monkeypatch.setattr(signals_module, "SIGNAL_CHECK_S", 3600.0)
    waiting = threading.Event()
    real_select = signals_module.select.select

    class WatchedSelect:
        @staticmethod
        def select(*args):
            waiting.set()
            return real_select(*args)

    monkeypatch.setattr(signals_module, "select", WatchedSelect)
    previous = signal.getsignal(signal.SIGUSR1)
    requests = SignalRequests()
    requests.install({signal.SIGUSR1: "stop"})

    def send_to_myself() -> None:
        waiting.wait(30.0)
        signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)

    sender = threading.Thread(target=send_to_myself, daemon=True)
    try:
        sender.start()
        woken = requests.wait(60.0)
    finally:
        requests.close()
        signal.signal(signal.SIGUSR1, previous)
    sender.join(5.0)
    assert woken, "the main thread slept through a signal another thread took"
    assert requests.signal_name("stop") == "SIGUSR1"
    assert requests.take("stop") and not requests.take("stop"), "a request is taken once"
