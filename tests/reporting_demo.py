"""The real agent for the load tests: the ``roofwatch demo`` fleet of 8 simulated GPUs, reports on.

The demo turns HTTP reports off (``agent.app.commands_agent.report_store``: the simulated fleet reports for its own
jobs), so the agent here is the demo started by a three-line launcher that gives it the report store
a real backend gets. Everything else (settings, collector, HTTP server, exposition) is the real CLI path.
Shared by tests/test_load.py and tests/test_load_concurrency_cap.py, with the ``agent`` fixture.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import psutil
import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

from tests.agent_process import URL_PATTERN, AgentProcess, clean_env, poll

REPO = Path(__file__).resolve().parents[1]


MAX_CONCURRENT = 64
"""``AgentHTTPServer``'s default in-flight request cap; the CLI does not change it."""
GPUS = 8
CLIENT_TIMEOUT_S = 30.0
"""Socket timeout of every client: a hung agent shows up as a recorded error, never as a hung test."""


JSON = "application/json"


LAUNCHER = """\
import sys
from agent.app import cli, commands_agent
from agent.context.workload.report_store import ReportStore
commands_agent.report_store = lambda settings: ReportStore(ttl_s=settings.report_ttl_s)
sys.exit(cli.main(["demo", "--listen", "127.0.0.1:0", *sys.argv[1:]]))
"""


class ReportingDemo(AgentProcess):
    """The demo agent with HTTP workload reports on (loopback clients, no token: the real default)."""

    def __init__(self, stderr_path: Path, args: tuple[str, ...] = (), **env: str) -> None:
        """``args``: more ``demo`` flags; ``env``: settings as ROOFWATCH_* variables (a report socket, say)."""
        self.stderr_path = stderr_path
        with open(stderr_path, "w") as stderr:  # a file, not a pipe: a chatty agent can never block on it
            self.proc = subprocess.Popen([sys.executable, "-c", LAUNCHER, *args], stdout=subprocess.PIPE,
                                         stderr=stderr, text=True, env=clean_env(**env), cwd=REPO)
        line = self.proc.stdout.readline()
        match = URL_PATTERN.search(line)
        if not match:
            self.kill()
            raise AssertionError(f"agent printed no URL: {line!r}; stderr: {self.stderr_tail()}")
        self.url = match.group(1)
        host, port = self.url.removeprefix("http://").rstrip("/").rsplit(":", 1)
        self.address = (host, int(port))
        self.ps = psutil.Process(self.proc.pid)

    def threads(self) -> int:
        return self.ps.num_threads()

    def settled_threads(self) -> int:
        """The thread count once no client connection is open (a handler thread per connection is gone)."""
        poll(lambda: all(c.status == psutil.CONN_LISTEN for c in self.ps.net_connections("tcp")), 30,
             what="the agent to have no open client connection")
        return self.threads()

    def rss_mib(self) -> float:
        return self.ps.memory_info().rss / 2**20

    def client_ports(self) -> set[int]:
        """The peer ports of the connections the agent has accepted."""
        return {c.raddr.port for c in self.ps.net_connections("tcp") if c.raddr}

    def stderr_tail(self) -> str:
        return self.stderr_path.read_text(errors="replace")[-4000:]


@pytest.fixture
def agent(tmp_path) -> Iterator[ReportingDemo]:
    agent = ReportingDemo(tmp_path / "agent.stderr")
    try:
        agent.wait_healthy()
        # The collector's per-GPU workers start with it; wait for them so the baseline is the steady state.
        poll(lambda: agent.threads() >= GPUS + 3, 10, what="main, HTTP, collector and one worker per GPU")
        yield agent
    finally:
        agent.kill()


def report(n: int, reporter: int) -> bytes:
    return json.dumps({"step": n, "step_time_s": 0.5, "tokens": 4096.0, "flops_per_token": 1.4e10, "dtype": "bf16",
                       "job": f"load-{reporter}", "rank": 0, "world_size": 1, "pid": 4000 + reporter}).encode()


def gpu_up(text: str, openmetrics: bool) -> dict[str, float]:
    families = (openmetrics_families if openmetrics else text_string_to_metric_families)(text)
    up = [s for f in families for s in f.samples if s.name == "roofwatch_gpu_up"]
    values = {s.labels["gpu"]: s.value for s in up}
    assert len(values) == len(up), "duplicate roofwatch_gpu_up series"
    return values
