"""A real ``roofwatch`` agent process for the tests of neighbours that start late, go away and come back
(tests/test_late_neighbours.py, tests/test_dcgm_exporter_report_mfu.py): on a port of its own, recording every
sample it takes, so a test can say when the agent first had a source's readings from the agent's own clock."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

from tests.agent_process import clean_env, http_get, roofwatch_cmd

INTERVAL = "0.5"


def free_port() -> int:
    """A loopback port for a server that is not there yet (an exporter that starts after the agent), asked of the
    kernel: tests/prometheus_server.py's block of ports is the same in every pytest session on a machine, and
    a neighbour that goes away for seconds gives another session's server time to take its port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Agent:
    """A real ``roofwatch`` process on a free port, recording every sample it takes to ``trace``."""

    def __init__(self, tmp_path: Path, command: str, *args: str, **env: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.trace = tmp_path / "trace.jsonl"
        self.log = tmp_path / "agent.log"  # a file, not a pipe: a minute of log lines never blocks the agent
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(roofwatch_cmd(command, *args, "--listen", f"127.0.0.1:{self.port}",
                                                       "--interval", INTERVAL, "--record", str(self.trace)),
                                         stdout=subprocess.DEVNULL, stderr=log, env=clean_env(**env))

    def get(self, path: str) -> tuple[int, str]:
        """Status and text (the probes' one line without its newline)."""
        status, body = http_get(self.url + path)
        return status, body.decode().strip() if path in ("healthz", "readyz") else body.decode()

    def snapshot(self) -> dict:
        return json.loads(self.get("api/v1/snapshot")[1])

    def samples(self) -> dict[str, dict]:
        return {d["info"]["gpu"]: d for d in self.snapshot()["devices"]}

    def finish(self) -> str:
        """SIGTERM (when still running) and the whole log; a clean stop exits 0 and logs no traceback."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        log = self.log.read_text()
        assert self.proc.returncode == 0 and "Traceback" not in log, log[-3000:]
        return log

    def first_sample_after(self, arrived: float, has) -> dict[str, float]:
        """GPU -> how long after ``arrived`` the first recorded sample for which ``has(sample)`` holds was taken."""
        first: dict[str, float] = {}
        for line in self.trace.read_text().splitlines()[1:]:
            sample = json.loads(line)
            if sample["ts"] >= arrived and has(sample) and sample["gpu"] not in first:
                first[sample["gpu"]] = sample["ts"] - arrived
        return first
