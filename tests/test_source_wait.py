"""The wait for an exporter that serves the GPUs (agent.app.source_wait), and the retry of its devices, in process.

The real processes are tests/test_late_neighbours.py; these hold the rules those rest on: only a neighbour that
does not answer is waited for (a configuration error still ends the agent), the waiting snapshot names the
source and why, and a device read from an exporter's memory is retried every interval, not after a back-off
grown while the exporter restarted (before: 1 s doubling to 60 s, so a GPU came back up to a minute late).
"""

from __future__ import annotations

import http.server
import threading

import pytest

from agent.app.assemble import make_collector
from agent.app.config import load_settings
from agent.app.source_wait import SourceWait
from agent.backends.base import BackendUnavailable
from agent.backends.dcgm_exporter import DcgmExporterBackend, ExporterReader
from agent.backends.exporter_backend import ExporterNotAnswering
from tests.agent_process import serving
from tests.dcgm_exporter_server import FakeExporter, fixture


def waiting(attempt) -> tuple[SourceWait, threading.Event]:
    done = threading.Event()
    wait = SourceWait(attempt, what="dcgm-exporter at http://127.0.0.1:9400/metrics", source="dcgm-exporter",
                      node="n1", interval_s=1.0, retry_max_s=0.05, notify=done.set)
    return wait, done


def test_a_neighbour_that_does_not_answer_is_waited_for_and_named_then_taken_when_it_answers():
    answers = iter([ExporterNotAnswering("dcgm-exporter", "http://127.0.0.1:9400/metrics?token=s3cret", "connection "
                                         "refused")] * 3 + ["collector"])

    def attempt():
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    wait, done = waiting(attempt)
    wait.start()
    assert done.wait(10), "the collector was opened after three refusals"
    assert wait.fatal is None and wait.take() == "collector" and wait.take() is None
    snapshot = wait.snapshot
    assert snapshot.health.waiting_for == "dcgm-exporter at http://127.0.0.1:9400/metrics: connection refused"
    assert [(s.name, s.state, s.detail) for s in snapshot.sources] == [("dcgm-exporter", "down", "connection refused")]
    assert wait.wait.attempts == 3


def test_a_configuration_error_is_not_waited_for():
    def attempt():
        raise BackendUnavailable("dcgm-exporter backend: no exporter to read: set dcgm_exporter_url")

    wait, done = waiting(attempt)
    wait.start()
    assert done.wait(10)
    assert wait.fatal == "dcgm-exporter backend: no exporter to read: set dcgm_exporter_url"
    assert wait.take() is None


def test_the_error_of_a_neighbour_that_does_not_answer_shows_no_credential():
    exc = ExporterNotAnswering("dcgm-exporter", "http://user:pw0rd@127.0.0.1:9400/metrics?token=s3cret",
                               "HTTP 500 for /metrics?token=s3cret")
    for text in (str(exc), exc.what, exc.why):
        assert "s3cret" not in text and "pw0rd" not in text, text


def test_a_device_read_from_an_exporters_memory_is_retried_every_interval():
    settings = load_settings(backend="dcgm-exporter", interval_s=0.5)
    with FakeExporter(fixture("a100-8x-pods.prom")) as exporter:
        backend = DcgmExporterBackend(ExporterReader(exporter.url, interval_s=0.2))
        backend.first_read()
        collector = make_collector(settings, backend)
        try:
            assert [collector.backoff.delay(n) for n in (1, 6, 30)] == [0.5, 0.5, 0.5]
        finally:
            collector.stop()


def test_an_exporter_that_refuses_the_agents_credentials_is_a_configuration_error_not_a_late_one():
    """401 or 403: the exporter is there and says no; waiting for it would wait for ever, so the start ends
    naming it (tests/test_no_secret_in_any_output.py runs that start as a process)."""
    class Refusing(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            self.send_error(401)

        def log_message(self, *args: object) -> None:
            pass

    with serving(http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refusing)) as server:
        url = f"http://127.0.0.1:{server.server_address[1]}/metrics?token=s3cret"
        backend = DcgmExporterBackend(ExporterReader(url))
        with pytest.raises(BackendUnavailable) as refused:
            backend.first_read()
    assert not isinstance(refused.value, ExporterNotAnswering)
    assert "HTTP 401" in str(refused.value) and "credentials" in str(refused.value)
    assert "s3cret" not in str(refused.value)
