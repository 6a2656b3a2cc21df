"""A local user holding the report socket: 70 connections that send a request line and then a header
byte now and then, against a real agent process, while a job in another process reports twice a second.

Until the socket moved onto the agent's hardened listener (exporters/http/report_socket.py) it was
served by http.server with a 30 s timeout per read and 64 slots: these connections held every slot
and every honest report got 503 for as long as the attack lasted. Now a process may hold 16
connections, each must finish its request head within the header deadline, and the job's reports
keep getting 204.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time

import pytest

from benchmarks.neighbours_load import REPORTING_JOB, slow_connection
from tests.agent_process import poll
from tests.report_fixtures import short_dir  # noqa: F401 (a fixture)
from tests.reporting_demo import ReportingDemo

pytestmark = pytest.mark.slow

ATTACKERS = 70
HONEST_S = 12.0
"""Longer than the 10 s header deadline, so the attack's connections are cut and come back meanwhile."""


def test_seventy_dripping_connections_do_not_keep_a_job_from_reporting(short_dir):  # noqa: F811
    path = str(short_dir / "report.sock")
    agent = ReportingDemo(short_dir / "agent.stderr", ROOFWATCH_REPORT_SOCKET=path)  # the demo, reports on
    stop = threading.Event()
    opened: list[int] = []
    threads = [threading.Thread(target=slow_connection, args=(path, stop, opened), daemon=True) for _ in range(ATTACKERS)]
    try:
        agent.wait_healthy()
        poll(lambda: socket.socket(socket.AF_UNIX).connect_ex(path) == 0, 20, what="the report socket")
        for thread in threads:
            thread.start()
        poll(lambda: len(opened) >= ATTACKERS, 20, what="every hostile connection opened")
        started = time.monotonic()
        job = subprocess.run([sys.executable, "-c", REPORTING_JOB, path, str(HONEST_S)], capture_output=True, text=True,
                             timeout=HONEST_S + 60)
        statuses = job.stdout.split("\n")[:-1]
        assert statuses and set(statuses) == {"204"}, (statuses, job.stderr)
        assert len(statuses) >= HONEST_S, "the job reported the whole time"
        assert time.monotonic() - started >= HONEST_S
        assert agent.proc.poll() is None and agent.get("healthz")[0] == 200, agent.stderr_tail()
    finally:
        stop.set()
        for thread in threads:
            thread.join(5)
        agent.kill()
