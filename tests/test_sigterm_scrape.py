"""SIGTERM while scrapes are in flight: every answer that started is whole, and the agent exits 0."""

from __future__ import annotations

import ctypes
import http.client
import os
import platform
import signal
import subprocess
import threading
import urllib.parse

import pytest

from tests.agent_process import AgentProcess, clean_env, poll, roofwatch_cmd

pytestmark = pytest.mark.slow


def test_sigterm_during_scrapes_leaves_no_half_answer():
    agent = AgentProcess("demo", "--listen", "127.0.0.1:0")
    agent.wait_healthy()
    target = urllib.parse.urlsplit(agent.url)
    whole, broken, refused = [], [], []
    started = threading.Event()
    stop = threading.Event()

    def scrape() -> None:
        while not stop.is_set():
            connection = http.client.HTTPConnection(target.hostname, target.port, timeout=10)
            try:
                connection.request("GET", "/metrics")
                response = connection.getresponse()
                body = response.read()  # IncompleteRead if the agent died mid-answer
                started.set()
                complete = len(body) == int(response.headers["Content-Length"])
                if response.status == 200 and body.endswith(b"\n") and complete:
                    whole.append(len(body))
                elif response.status == 503 and body == b"shutting down\n" and complete:
                    refused.append(1)  # a whole answer saying the agent stops: the client retries
                else:
                    broken.append((response.status, len(body)))
            except (ConnectionRefusedError, ConnectionResetError, http.client.RemoteDisconnected):
                refused.append(1)  # not accepted, or closed before an answer began: the client retries
            except http.client.IncompleteRead as exc:
                broken.append(("incomplete", len(exc.partial)))
            finally:
                connection.close()

    threads = [threading.Thread(target=scrape, daemon=True) for _ in range(16)]
    for t in threads:
        t.start()
    try:
        poll(lambda: len(whole) >= 50, 30, what="scrapes under way")
        code, _elapsed, err = agent.stop(signal.SIGTERM, timeout=10)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=15)
        agent.kill()
    assert code == 0 and "Traceback" not in err
    assert not broken, f"answers cut short by the shutdown: {broken[:5]}"
    assert whole


def test_drain_waits_for_the_requests_being_answered():
    from exporters.http import AgentHTTPServer

    server = AgentHTTPServer(("127.0.0.1", 0), lambda: None, stale_after_s=10.0, max_concurrent=4)
    try:
        server.slots.acquire()  # one request being answered
        assert server.drain(timeout_s=0.05) is False
        assert server.slots.acquire(blocking=False), "a failed drain gives back what it took"
        server.slots.release()
        threading.Timer(0.05, server.slots.release).start()  # the request finishes
        assert server.drain(timeout_s=5.0) is True
    finally:
        server.server_close()


def _send_to_thread(pid: int, tid: int, sig: int) -> None:
    """tgkill(2): a signal for one thread of ``pid``, the way the kernel may pick any thread that
    does not block a process-wide signal (it picked an HTTP thread in CI, under 16 scrapers)."""
    libc = ctypes.CDLL(None, use_errno=True)
    SYS_tgkill = {"x86_64": 234, "aarch64": 131}[platform.machine()]
    if libc.syscall(SYS_tgkill, pid, tid, sig) != 0:
        raise OSError(ctypes.get_errno(), f"tgkill {pid}/{tid}")


def _stop_through_a_worker_thread(proc: subprocess.Popen, sig: int) -> tuple[int, str]:
    pid = proc.pid
    workers = poll(lambda: [int(t) for t in os.listdir(f"/proc/{pid}/task") if int(t) != pid], 20,
                   what="the agent's worker threads")
    _send_to_thread(pid, workers[0], sig)
    try:
        _, err = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"{signal.Signals(sig).name} on thread {workers[0]} ignored for 10 s; stderr: {err}") from None
    return proc.returncode, err


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_delivered_to_a_worker_thread_still_stops_the_agent(sig):
    agent = AgentProcess("demo", "--listen", "127.0.0.1:0")
    try:
        agent.wait_healthy()
        code, err = _stop_through_a_worker_thread(agent.proc, sig)
    finally:
        agent.kill()
    assert code == 0, err
    assert "msg=stopping" in err


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_delivered_to_a_worker_thread_ends_a_recording(sig, tmp_path):
    out = tmp_path / "t.jsonl"
    proc = subprocess.Popen(roofwatch_cmd("record", "--backend", "virtual", "--out", str(out), "--duration", "120"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env())
    try:
        poll(lambda: out.exists() and out.stat().st_size > 0, 20, what="the first samples on disk")
        code, err = _stop_through_a_worker_thread(proc, sig)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert code == 0, err
    assert out.read_text().count("\n") >= 1
