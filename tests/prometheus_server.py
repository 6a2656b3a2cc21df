"""A real Prometheus server (Debian package ``prometheus``) as a test fixture: start, query, stop."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import socket
import subprocess
import urllib.parse
from pathlib import Path

from tests.agent_process import http_get, poll


_RANGE_START, _RANGE_SIZE = 20000, 12000
"""Ports for programs that must be told theirs: 20000-31999, below Linux's ephemeral range (32768 up),
shared out in equal blocks among the pytest-xdist workers."""
_next_port = itertools.count()


def free_port() -> int:
    """A loopback port nothing listens on, for a program that must be given one (Prometheus, vmagent).

    Binding port 0 and releasing it would hand out a port from the ephemeral range, which another
    test's agent binding 127.0.0.1:0 may be given before the program binds it. So ports come from below
    that range, from this worker's own block (PYTEST_XDIST_WORKER gw0, gw1, ... of
    PYTEST_XDIST_WORKER_COUNT), each checked free first."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    count = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")
    span = _RANGE_SIZE // max(1, int(count) if count.isdigit() else 1)
    first = _RANGE_START + (int(worker) if worker.isdigit() else 0) * span
    for _ in range(span):
        port = first + next(_next_port) % span
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue  # something else on the machine holds it
            return port
    raise AssertionError(f"no free port in {first}-{first + span - 1}")


class PrometheusServer:
    """One Prometheus scraping ``targets`` every second, with optional rule files loaded.

    Prometheus 2.x applies discovered targets on a fixed 5 s tick, so the first samples take
    about 6 s to appear: callers poll with a generous bound instead of sleeping.
    """

    def __init__(self, workdir: Path, targets: list[str], *, rule_files: list[Path] = (),
                 target_labels: dict[str, dict[str, str]] | None = None, job_options: dict | None = None,
                 config_text: str | None = None) -> None:
        """``target_labels`` maps a target to extra labels Prometheus attaches (say, a cluster);
        ``job_options`` adds keys to the scrape job (``scheme``, ``tls_config``, ``basic_auth``);
        ``config_text`` is a whole configuration used instead of all three (the shipped one, its targets
        pointed at a test's agents)."""
        binary = shutil.which("prometheus")
        assert binary, "the prometheus server is required (Debian package 'prometheus'; ./dev.sh test installs it)"
        labels = target_labels or {}
        groups = [{"targets": [t], "labels": labels.get(t, {})} for t in targets]
        config = workdir / "prometheus.yml"
        config.write_text(config_text if config_text is not None else (
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            f"rule_files: {json.dumps([str(p) for p in rule_files])}\n"
            "scrape_configs:\n"
            f"  - job_name: roofwatch\n    static_configs: {json.dumps(groups)}\n"
            + "".join(f"    {key}: {json.dumps(value)}\n" for key, value in (job_options or {}).items())
        ))
        port = free_port()
        self.base = f"http://127.0.0.1:{port}"
        self.process = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        try:
            poll(lambda: http_get(self.base + "/-/ready")[0] == 200, timeout=30, what="Prometheus ready")
        except BaseException:
            self.stop()
            raise

    def api(self, path: str, **params: str) -> object:
        status, body = http_get(f"{self.base}/api/v1/{path}?{urllib.parse.urlencode(params)}")
        data = json.loads(body)
        assert status == 200 and data["status"] == "success", data
        return data["data"]

    def query(self, promql: str) -> list[dict]:
        return self.api("query", query=promql)["result"]

    def alerts(self) -> list[dict]:
        """Active alerts (pending and firing), as the /api/v1/alerts endpoint lists them."""
        return self.api("alerts")["alerts"]

    def stop(self) -> str:
        """Stop the server; returns what it logged (warnings and errors), for failure messages."""
        if self.process.poll() is None:
            self.process.terminate()
        _, err = self.process.communicate(timeout=20)
        return err
