"""``roofwatch top`` over HTTP: the metrics URL, fetch errors, the poller, and the command itself.

A local HTTP server serves the golden exposition (tests/top_exposition.py) and pages that are not
one; every error is one line naming the URL.
"""

from __future__ import annotations

import http.server
import os
import re
import socket
import threading

import pytest

from agent.app.cli import build_parser
from agent.app.config import DEFAULT_PORT
from agent.views.top import Poller, run_top
from agent.views.top_source import TopSourceError, fetch_view, metrics_url
from tests.prometheus_server import free_port
from tests.top_exposition import FIXTURE, per_gpu, series
from tests.top_exposition import text  # noqa: F401 (a fixture)

# -- URL and fetch errors -------------------------------------------------------------------


@pytest.mark.parametrize("given, expected", [
    (None, f"http://127.0.0.1:{DEFAULT_PORT}/metrics"),
    ("http://node:9477", "http://node:9477/metrics"),
    ("http://node:9477/", "http://node:9477/metrics"),
    ("http://node:9477/metrics", "http://node:9477/metrics"),
    ("http://node:9477/metrics/", "http://node:9477/metrics"),
    ("node:9477", "http://node:9477/metrics"),
    ("node", "http://node/metrics"),
    ("https://proxy/roofwatch/n1/", "https://proxy/roofwatch/n1/metrics"),
    ("[::1]:9477", "http://[::1]:9477/metrics"),
])
def test_metrics_url(given, expected):
    assert metrics_url(given) == expected


def test_non_http_url_is_refused():
    with pytest.raises(TopSourceError, match="file:///etc/passwd"):
        metrics_url("file:///etc/passwd")


class _Handler(http.server.BaseHTTPRequestHandler):
    pages = {
        "/good/metrics": FIXTURE.read_bytes(),
        "/html/metrics": b"<html><body>It works!</body></html>\n",
        "/other/metrics": b"# TYPE up gauge\nup 1.0\nprocess_cpu_seconds_total 3.0\n",
    }

    def do_GET(self):  # noqa: N802 - http.server's name
        body = self.pages.get(self.path)
        if body is None:
            self.send_error(404, "Not Found")
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def closed_port() -> int:
    return free_port()  # from below the ephemeral range: no other test's server can be given it meanwhile


def _error_of(url: str, timeout: float = 2.0) -> str:
    with pytest.raises(TopSourceError) as info:
        fetch_view(url, timeout)
    message = str(info.value)
    assert "\n" not in message and url in message, message
    return message


def test_fetch_good_exposition(server, text):
    fetched = fetch_view(metrics_url(server + "/good"))
    assert len(fetched.rows) == len(series(text, "roofwatch_gpu_info"))


def test_fetch_errors_are_one_line_naming_the_url(server, closed_port):
    assert "404" in _error_of(server + "/missing/metrics")
    assert "Prometheus exposition" in _error_of(server + "/html/metrics")
    assert "roofwatch_gpu_info" in _error_of(server + "/other/metrics")
    assert "refused" in _error_of(f"http://127.0.0.1:{closed_port}/metrics").lower()


def test_fetch_times_out_on_a_silent_server():
    with socket.socket() as silent:  # accepts connections (backlog) but never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/metrics"
        assert "did not answer within 0.2 s" in _error_of(url, timeout=0.2)


def test_poller_delivers_results_and_errors(server, closed_port):
    for url, kind in ((server + "/good/metrics", "NodeView"), (f"http://127.0.0.1:{closed_port}/metrics", "TopSourceError")):
        wake_r, wake_w = os.pipe()
        poller = Poller(url, 0.05, wake_w)
        poller.start()
        try:
            assert os.read(wake_r, 1) == b"p"  # blocks until the first poll is announced
            assert type(poller.results.get(timeout=5)).__name__ == kind
        finally:
            poller.stopped.set()
            poller.join(timeout=5)
            os.close(wake_r)
            os.close(wake_w)
        assert not poller.is_alive()


# -- the command ----------------------------------------------------------------------------


def _top(*argv: str) -> int:
    return run_top(build_parser().parse_args(["top", *argv]))


def test_bad_interval_is_a_usage_error(capsys):
    assert _top("--interval", "0", "--once") == 2
    assert _top("--interval", "-1") == 2
    err = capsys.readouterr().err.splitlines()
    assert err and all(line.startswith("roofwatch top: --interval") for line in err)


def test_once_prints_a_frame(server, capsys, text):
    assert _top(server, "--once", "--sort", "power") == 1  # the base URL has no /metrics here: 404
    assert _top(server + "/good", "--once", "--sort", "power") == 0
    out = capsys.readouterr().out
    shown = [line.split()[0] for line in out.splitlines() if re.match(r"^\s*\d", line)]
    powers = per_gpu(text, "roofwatch_gpu_power_watts")
    assert shown == sorted(powers, key=lambda g: -powers[g]) and "sorted by power" in out


def test_once_against_nothing_exits_1_with_one_line(closed_port, capsys):
    assert _top(f"127.0.0.1:{closed_port}", "--once") == 1
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert captured.out == "" and len(lines) == 1
    assert lines[0].startswith("roofwatch top: ") and f"127.0.0.1:{closed_port}/metrics" in lines[0]
