"""Inference-server scraping (agent.context.workload.inference.scraper): the scrape itself.

Against a real HTTP server in a child process (tests/inference_server.py): no rate on the first
scrape or across a counter reset or server restart, stale reports dropped, endpoints down, 404,
oversize, not an exposition or too slow, gzip, the background thread, and endpoint validation.
"""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest
from pydantic import ValidationError

from agent.context.workload.inference.scraper import InferenceEndpoint, InferenceScraper
from tests.prometheus_server import free_port
from tests.inference_server import DT, FIXTURES, T0, scraped
from tests.inference_server import server  # noqa: F401 (a fixture)


@pytest.mark.slow
def test_first_scrape_has_no_rate(server):
    scraper = scraped(server.seq("vllm-1.prom", "vllm-2.prom"), now=(T0,), gpus=["0"])
    (status,) = scraper.status()
    assert status.up and not status.has_rate
    assert scraper.report_for(gpu="0", uuid=None, pids=[], now=T0) is None


@pytest.mark.slow
def test_counter_reset_gives_no_rate_for_that_interval(server):
    url = server.seq("vllm-1.prom", "vllm-2.prom", "vllm-1.prom", "vllm-2.prom")
    scraper = scraped(url, now=(T0, T0 + DT, T0 + 2 * DT), gpus=["0"])
    (status,) = scraper.status()
    assert status.up and not status.has_rate and "reset" in status.error
    assert scraper.report_for(gpu="0", uuid=None, pids=[], now=T0 + 2 * DT) is None
    scraper.scrape_once(now=T0 + 3 * DT)
    report = scraper.report_for(gpu="0", uuid=None, pids=[], now=T0 + 3 * DT)
    assert report is not None and report.tokens_per_s > 0


@pytest.mark.slow
def test_stale_report_is_dropped(server):
    scraper = scraped(server.seq("vllm-1.prom", "vllm-2.prom"), gpus=["0"])
    limit = 3 * 5.0  # 3 x the default interval
    assert scraper.report_for(gpu="0", uuid=None, pids=[], now=T0 + DT + limit - 0.1) is not None
    assert scraper.report_for(gpu="0", uuid=None, pids=[], now=T0 + DT + limit + 0.1) is None


def _closed_port() -> int:
    return free_port()  # from below the ephemeral range: no other test's server can be given it meanwhile


@pytest.mark.slow
def test_endpoint_down_gives_none_and_status_says_why(server):
    scraper = scraped(f"http://127.0.0.1:{_closed_port()}/metrics", gpus=["0"])
    (status,) = scraper.status()
    assert not status.up and "refused" in status.error
    assert (status.scrapes_total, status.failures_total, status.last_success_ts) == (2, 2, None)
    assert scraper.report_for(gpu="0", uuid=None, pids=[], now=T0 + DT) is None

    scraper = scraped(server.seq("vllm-1.prom", "vllm-2.prom", "404"), gpus=["0"])
    assert scraper.report_for(gpu="0", uuid=None, pids=[], now=T0 + DT) is not None
    scraper.scrape_once(now=T0 + 2 * DT)
    (status,) = scraper.status()
    assert not status.up and status.error.startswith("HTTP 404") and status.last_success_ts == T0 + DT
    assert scraper.report_for(gpu="0", uuid=None, pids=[], now=T0 + 2 * DT) is None


@pytest.mark.slow
@pytest.mark.parametrize("query", ["", "?cl=0", "?gzip=1"])
def test_oversize_response_is_rejected(server, query):
    url = f"http://127.0.0.1:{server.port}/big/5000{query}"
    scraper = InferenceScraper([InferenceEndpoint(url=url, gpus=["0"])], max_bytes=4096)
    scraper.scrape_once(now=T0)
    (status,) = scraper.status()
    assert not status.up and "larger than 4096 bytes" in status.error


@pytest.mark.slow
def test_a_body_that_is_not_an_exposition_is_an_error(server):
    scraper = scraped(f"http://127.0.0.1:{server.port}/big/100", gpus=["0"])
    (status,) = scraper.status()
    assert not status.up and "not a Prometheus text exposition" in status.error


@pytest.mark.slow
def test_gzip_responses_are_accepted(server):
    plain_url, zipped_url = server.seq("vllm-1.prom", "vllm-2.prom"), server.seq("vllm-1.prom", "vllm-2.prom", query="?gzip=1")
    plain, zipped = scraped(plain_url, gpus=["0"]), scraped(zipped_url, gpus=["0"])
    assert zipped.status()[0].up, zipped.status()[0].error
    ask = dict(gpu="0", uuid=None, pids=[], now=T0 + DT)
    unzipped, named = plain.report_for(**ask), zipped.report_for(**ask)
    assert unzipped is not None
    # Two paths on one host and port: two servers, named apart by the path (never by the query).
    assert (unzipped.serving.server, named.serving.server) == (
        "vllm " + plain_url.split("//")[1], "vllm " + zipped_url.split("//")[1].removesuffix("?gzip=1"))
    assert dataclasses.replace(named, serving=dataclasses.replace(named.serving, server=unzipped.serving.server)) \
        == unzipped


@pytest.mark.slow
def test_slow_server_times_out_while_report_for_answers_at_once(server):
    url = server.seq("vllm-1.prom", "vllm-2.prom", "HANG")
    scraper = InferenceScraper([InferenceEndpoint(url=url, gpus=["0"])], timeout_s=2.0)
    scraper.scrape_once(now=T0)
    scraper.scrape_once(now=T0 + DT)
    hung_before = server.hung()
    stuck = threading.Thread(target=scraper.scrape_once, kwargs={"now": T0 + 2 * DT})
    stuck.start()
    deadline = time.monotonic() + 10
    while server.hung() == hung_before:
        assert time.monotonic() < deadline, "the scrape never reached the server"
    report = scraper.report_for(gpu="0", uuid=None, pids=[], now=T0 + DT + 1)
    assert stuck.is_alive()  # the answer came while the scrape was still waiting on the server
    assert report is not None
    stuck.join(timeout=10)
    assert not stuck.is_alive()
    (status,) = scraper.status()
    assert not status.up and status.error == "timed out after 2 s" and status.failures_total == 1
    assert scraper.report_for(gpu="0", uuid=None, pids=[], now=T0 + DT + 1) is None


@pytest.mark.slow
def test_background_thread_scrapes_until_closed(server):
    scraper = InferenceScraper([InferenceEndpoint(url=server.seq("vllm-1.prom", "vllm-2.prom"), gpus=["0"])],
                               interval_s=0.05)
    scraper.start()
    try:
        deadline = time.monotonic() + 10
        while not scraper.status()[0].has_rate:
            assert time.monotonic() < deadline, scraper.status()
            time.sleep(0.01)
        report = scraper.report_for(gpu="0", uuid=None, pids=[], now=time.time())
        assert report is not None and report.source == "vllm"
    finally:
        scraper.close()
    assert not any(t.name == "roofwatch-inference" and t.is_alive() for t in threading.enumerate())


@pytest.mark.slow
def test_report_for_never_raises(server):
    scraper = scraped(server.seq("vllm-1.prom", "vllm-2.prom"))
    assert scraper.report_for(gpu="0", uuid=None, pids=[server.pid], now=T0 + DT) is not None
    assert scraper.report_for(gpu="0", uuid=None, pids=None, now=T0 + DT) is None  # type: ignore[arg-type]


def test_endpoint_validation_names_the_field():
    e = InferenceEndpoint(url="http://localhost:8000", gpus=[0, 1, "GPU-ab", 1], params=7e9)
    assert e.url == "http://localhost:8000/metrics" and e.gpus == ["0", "1", "GPU-ab"] and e.port == 8000
    assert e.effective_flops_per_token == 14e9
    assert InferenceEndpoint(url="http://h:1/m", params=7e9, flops_per_token=5.0).effective_flops_per_token == 5.0
    assert InferenceEndpoint(url="https://h/metrics").port == 443
    bad = [
        ({"url": "ftp://host/metrics"}, "url", "http:// or https://"),
        ({"url": "http://host:99999/metrics"}, "url", "port"),
        ({"url": "http://user:pw@host/metrics"}, "url", "credentials"),
        ({"url": "http://h/m", "params": -1}, "params", "greater than 0"),
        ({"url": "http://h/m", "flops_per_token": 1e30}, "flops_per_token", "less than or equal"),
        ({"url": "http://h/m", "world_size": 0}, "world_size", "greater than or equal to 1"),
        ({"url": "http://h/m", "gpus": []}, "gpus", "at least 1"),
        ({"url": "http://h/m", "gpus": ["0 1"]}, "gpus", "GPU indices or UUIDs"),
        ({"url": "http://h/m", "dtype": "int4"}, "dtype", "fp8"),
        ({"url": "http://h/m", "kind": "tensorrt"}, "kind", "'llamacpp' or 'triton'"),
        ({"url": "http://h/m", "modle_bytes": 1}, "modle_bytes", "Extra inputs are not permitted"),
    ]
    for kwargs, field, message in bad:
        with pytest.raises(ValidationError) as info:
            InferenceEndpoint(**kwargs)
        (error,) = info.value.errors()
        assert error["loc"][0] == field and message in str(info.value), (kwargs, str(info.value))


def test_a_server_restart_is_a_reset_even_when_counters_grew_past_their_old_values():
    from agent.context.workload.inference.parse import CounterReset, parse, rates, totals

    before = (FIXTURES / "vllm-1.prom").read_text()
    after = (FIXTURES / "vllm-2.prom").read_text()
    restarted = after.replace("process_start_time_seconds 1.76000012e+09", "process_start_time_seconds 1.76000099e+09")
    assert restarted != after
    first = totals(parse(before), "vllm")
    assert rates(first, totals(parse(after), "vllm"), DT).prompt_per_s > 0
    with pytest.raises(CounterReset):
        rates(first, totals(parse(restarted), "vllm"), DT)
