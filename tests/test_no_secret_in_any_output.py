"""No credential the settings hold reaches any output of any command, whoever quotes it back.

Credentials planted everywhere the settings take one: a bearer token and an API key in the OTLP headers, a
password and a query value in the OTLP endpoint, a ``?token=`` on the dcgm-exporter URL and an ``?api_key=``
on an inference endpoint, the report token, and ``fleet-report``'s bearer-token file. Every server the
agent talks to is a nosy neighbour: it answers what it does not like with its status line, body and
headers quoting the request line and the Authorization it got. Then every output is searched: the logs of
``run`` (logfmt and JSON, at debug) and of a failed start, ``/metrics``, ``/api/v1/snapshot`` and the ``/``
page, ``doctor`` in text and JSON, a report refused for a wrong token, and ``fleet-report``'s stdout,
stderr, page and JSON. The settings name every credential once (agent/app/secrets.py); the log formatter,
errors on stderr and doctor hide them (agent.model.redact.hide), wherever they appear.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.agent_process import clean_env, http_get, poll, roofwatch_cmd
from tests.dcgm_exporter_server import fixture

pytestmark = pytest.mark.slow  # starts servers and roofwatch processes

HEADER_TOKEN = "hdr-SECRET-41c9e2"
API_KEY = "key-SECRET-9d03aa"
PASSWORD = "pw-SECRET-77ab10"
ENDPOINT_QUERY = "q-SECRET-0f5e33"
EXPORTER_TOKEN = "exp-SECRET-c1d2e3"
INFERENCE_KEY = "inf-SECRET-a4b5c6"
REPORT_TOKEN = "rpt-SECRET-d7e8f9"
FLEET_TOKEN = "flt-SECRET-102938"
PLANTED = (HEADER_TOKEN, API_KEY, PASSWORD, ENDPOINT_QUERY, EXPORTER_TOKEN, INFERENCE_KEY, REPORT_TOKEN, FLEET_TOKEN)
SERVING = re.compile(r"serving\"?,?\s*\"?url\"?[=:]\"?(http://[^\"\s]+)")
DCGM_BODY = fixture("a100-8x-pods.prom").encode()


class Nosy(BaseHTTPRequestHandler):
    """Serves the dcgm-exporter fixture to a request carrying the exporter's token; to anything else it
    answers 401 (OTLP, a wrong token, the fleet report's Prometheus) or 500 (the inference server), quoting
    the request line and the Authorization it got in its reason phrase, a header and its body."""

    protocol_version = "HTTP/1.0"

    def _quote(self, status: int) -> None:
        said = f"{self.requestline} auth={self.headers.get('Authorization', '')}"
        body = f"refused: {said}".encode()
        self.send_response(status, f"Refused {said}"[:200])
        self.send_header("X-Echo", said[:200])
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.path == f"/metrics?token={EXPORTER_TOKEN}":
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(DCGM_BODY)))
            self.end_headers()
            self.wfile.write(DCGM_BODY)
        else:
            self._quote(500 if self.path.startswith("/infer") else 401)

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._quote(401)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def nosy():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Nosy)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def settings_file(directory: Path, nosy: str, *, exporter_token: str = EXPORTER_TOKEN, log_format: str = "logfmt") -> Path:
    path = directory / f"roofwatch-{log_format}-{exporter_token[:3]}.yaml"
    path.write_text(json.dumps({
        "dcgm_exporter_url": f"http://{nosy}/metrics?token={exporter_token}",
        "dcgm_exporter_interval_s": 1.0,
        "inference_endpoints": [{"url": f"http://{nosy}/infer/metrics?api_key={INFERENCE_KEY}", "gpus": ["0"]}],
        "inference_interval_s": 1.0,
        "otlp_endpoint": f"http://roofwatch:{PASSWORD}@{nosy}/v1/metrics?signature={ENDPOINT_QUERY}",
        "otlp_headers": {"authorization": f"Bearer {HEADER_TOKEN}", "x-api-key": API_KEY},
        "otlp_interval_s": 1.0, "otlp_timeout_s": 2.0,
        "report_token": REPORT_TOKEN,
        "log_level": "debug", "log_format": log_format,
    }))
    return path


def no_secret(where: str, text: str) -> None:
    for secret in PLANTED:
        assert secret not in text, f"{secret} in {where}: ...{text[max(0, text.find(secret) - 300):][:600]}"


def command(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(roofwatch_cmd(*args), capture_output=True, text=True, timeout=90, env=clean_env())


def post_report(url: str, token: str) -> int:
    body = json.dumps({"gpu": "0", "job": "secret-test", "tokens_per_s": 1000.0}).encode()
    request = urllib.request.Request(url + "api/v1/report", data=body, method="POST",
                                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status
    except urllib.error.HTTPError as refused:
        return refused.code


@pytest.mark.parametrize("log_format", ["logfmt", "json"])
def test_a_running_agent_never_shows_a_credential_in_its_log_or_its_pages(tmp_path, nosy, log_format):
    config = settings_file(tmp_path, nosy, log_format=log_format)
    agent = subprocess.Popen(roofwatch_cmd("run", "--backend", "dcgm-exporter", "--config", str(config),
                                           "--listen", "127.0.0.1:0"),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean_env())
    head: list[str] = []
    try:
        while not (found := SERVING.findall("".join(head))) and len(head) < 400 and agent.poll() is None:
            head.append(agent.stderr.readline())
        assert found, "".join(head)[-3000:]
        url = found[0]
        poll(lambda: re.search(r'roofwatch_otlp_dropped_batches_total\{[^}]*reason="export_failed"[^}]*\} [1-9]',
                               http_get(url + "metrics")[1].decode()), 60, what="a counted failed OTLP push")
        poll(lambda: re.search(r'roofwatch_source_up\{[^}]*source="inference [^"]*"[^}]*\} 0',
                               http_get(url + "metrics")[1].decode()), 60, what="the inference server down")
        assert post_report(url, "wrong-token-0000") == 401
        assert post_report(url, REPORT_TOKEN) == 204, "the report token was in use"
        pages = {path: http_get(url + path)[1].decode() for path in ("metrics", "api/v1/snapshot", "")}
        agent.send_signal(signal.SIGTERM)
        out, err = agent.communicate(timeout=30)
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.communicate()
    log = "".join(head) + err
    assert agent.returncode == 0, log[-3000:]
    assert "OTLP push failed" in log and "401" in log, "the collector refused, quoting what it got"
    assert "<hidden>" in log, "something was hidden: the neighbours quoted the credentials back"
    for where, text in {"stdout": out, "log": log, **pages}.items():
        no_secret(where, text)


def test_a_failed_start_and_doctor_never_show_a_credential(tmp_path, nosy):
    config = settings_file(tmp_path, nosy, exporter_token="bad-SECRET-token")  # the exporter refuses it
    PLANTED_HERE = ("bad-SECRET-token",)
    start = command("run", "--backend", "dcgm-exporter", "--config", str(config), "--listen", "127.0.0.1:0")
    assert start.returncode == 1 and "dcgm-exporter" in start.stderr, start.stderr[-2000:]
    for secret in PLANTED_HERE:
        assert secret not in start.stdout + start.stderr, start.stderr[-2000:]
    no_secret("a failed start", start.stdout + start.stderr)
    good = settings_file(tmp_path, nosy)
    for flags in ((), ("--json",)):
        result = command("doctor", "--backend", "dcgm-exporter", "--config", str(good), *flags)
        assert "inference" in result.stdout and "otlp" in result.stdout, result.stdout[-2000:]
        no_secret(f"doctor {' '.join(flags)}", result.stdout + result.stderr)
        refused = command("doctor", "--backend", "dcgm-exporter", "--config", str(config), *flags)
        for secret in PLANTED_HERE:
            assert secret not in refused.stdout + refused.stderr, refused.stdout[-2000:]


def test_fleet_report_never_shows_its_token(tmp_path, nosy):
    token = tmp_path / "token"
    token.write_text(FLEET_TOKEN + "\n")
    out, data = tmp_path / "fleet.html", tmp_path / "fleet.json"
    result = command("fleet-report", "--prometheus", f"http://{nosy}", "--bearer-token-file", str(token),
                     "--out", str(out), "--json", str(data), "--timeout", "5")
    assert result.returncode != 0 or out.exists(), result.stderr
    assert "401" in result.stdout + result.stderr, result.stderr[-2000:]
    written = "".join(p.read_text() for p in (out, data) if p.exists())
    no_secret("fleet-report", result.stdout + result.stderr + written)
