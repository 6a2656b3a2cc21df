"""The fleet benchmark's set-up checks what it got (issue 45 item 9).

``tests/test_fleet_benchmark.py`` once had 4 set-up errors: ``promtool tsdb create-blocks-from rules``
exited 0 but wrote no output directory for one level. promtool writes a block only for the samples
its queries return, so it had been pointed at a server that answered every query empty. The
benchmark's Prometheus was given a port picked by binding port 0 and releasing it; under a loaded
suite another program can be handed that port in between, and another test's VictoriaMetrics
answers ``/-/ready`` with 200 and every range query with an empty matrix. The ready check passed
against it, our Prometheus failed to bind, and the rules were "backfilled" from the stranger.

Here a decoy answering as VictoriaMetrics does stands on the port the set-up is handed (the race
made certain), and a backfill is pointed at the decoy directly.
"""

from __future__ import annotations

import json
import shutil
import socket
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from benchmarks import fleet_prometheus
from benchmarks.fleet_prometheus import Server, backfill_rules
from tests.agent_process import serving

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not (shutil.which("promtool") and shutil.which("prometheus")),
                                reason="needs Debian's prometheus package (promtool and prometheus)")]

EMPTY_MATRIX = {"status": "success", "data": {"resultType": "matrix", "result": []}}


class LikeVictoriaMetrics(BaseHTTPRequestHandler):
    """Ready, and no data: what VictoriaMetrics answers on these paths when it holds none of ours."""

    def _answer(self) -> None:
        if self.path.startswith("/-/ready"):
            body = b"VictoriaMetrics is Ready.\n"
        elif self.path.startswith("/api/v1/status/flags"):
            body = json.dumps({"status": "success", "data": {}}).encode()
        else:
            body = json.dumps(EMPTY_MATRIX).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._answer()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._answer()

    def log_message(self, *args: object) -> None:
        pass


def decoy() -> ThreadingHTTPServer:
    return ThreadingHTTPServer(("127.0.0.1", 0), LikeVictoriaMetrics)


def hand_over(port: int) -> types.SimpleNamespace:
    """A stand-in for the socket module whose port-0 bind is "given" ``port``: the port another program
    took between the set-up picking it and Prometheus binding it."""

    class Picked(socket.socket):
        def getsockname(self):  # type: ignore[override]
            return ("127.0.0.1", port)

    return types.SimpleNamespace(socket=Picked)


def rule_file(tmp_path):
    path = tmp_path / "rules.yml"
    path.write_text("groups:\n  - name: g\n    rules:\n      - record: x:up:count\n        expr: count(up)\n")
    return path


def test_the_server_is_the_prometheus_started_even_where_its_port_was_taken(tmp_path, monkeypatch):
    data = tmp_path / "data"
    data.mkdir()
    with serving(decoy()) as stranger:
        taken = stranger.server_address[1]
        monkeypatch.setattr(fleet_prometheus, "socket", hand_over(taken), raising=False)
        server = Server(tmp_path, data)
        try:
            assert server.url != f"http://127.0.0.1:{taken}"
            assert server.api("status/flags")["storage.tsdb.path"] == str(data)
            assert server.process.poll() is None, "our Prometheus runs"
        finally:
            server.stop()


def test_a_backfill_that_got_no_samples_is_an_error_naming_the_server(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    with serving(decoy()) as stranger:
        url = f"http://127.0.0.1:{stranger.server_address[1]}"
        with pytest.raises(RuntimeError, match="wrote no block") as caught:
            backfill_rules(rule_file(tmp_path), url, 1_800_000_000, 1_800_003_600, 60, data, tmp_path / "scratch")
    assert url in str(caught.value) and "\n" not in str(caught.value).split("promtool said:")[0]
    assert list(data.iterdir()) == []


def test_a_backfill_from_the_right_server_writes_its_blocks(tmp_path):
    """The check does not refuse a good backfill: Prometheus' own ``up``-free store still answers a
    constant rule, so promtool writes one block and it lands in the data directory."""
    data = tmp_path / "data"
    data.mkdir()
    rules = tmp_path / "rules.yml"
    rules.write_text("groups:\n  - name: g\n    rules:\n      - record: x:one\n        expr: vector(1)\n")
    server = Server(tmp_path, data)
    try:
        backfill_rules(rules, server.url, 1_800_000_000, 1_800_003_600, 60, data, tmp_path / "scratch")
    finally:
        server.stop()
    blocks = [b for b in data.iterdir() if (b / "meta.json").is_file()]
    assert blocks and json.loads((blocks[0] / "meta.json").read_text())["stats"]["numSamples"] > 0
