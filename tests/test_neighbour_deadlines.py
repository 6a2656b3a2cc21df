"""Every read of a neighbour has one deadline, from connect to the last byte (agent.context.neighbour_http).

A server that sends one byte a second never trips a per-read timeout. Before: ``roofwatch run --backend
dcgm-exporter`` never started against such an exporter, and one such inference endpoint among five held
the single scraper thread, so every server on the node lost its serving figures. Now each request ends at
its deadline, each inference endpoint has its own thread, and start-up waits no longer than the timeout.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from http.server import ThreadingHTTPServer

import pytest

from agent.context.neighbour_http import FetchFailed, fetch
from agent.context.workload.inference.endpoint import InferenceEndpoint
from agent.context.workload.inference.scraper import InferenceScraper
from tests.agent_process import clean_env, poll, roofwatch_cmd, serving
from benchmarks.neighbours_load import DrippingServer, VllmHandler

pytestmark = pytest.mark.slow  # every test here waits out a deadline



def test_a_dripping_server_is_cut_at_the_deadline_not_at_a_read_timeout():
    with DrippingServer(every_s=0.05) as drip:
        started = time.monotonic()
        with pytest.raises(FetchFailed) as failed:
            fetch(drip.url, timeout_s=1.0, max_bytes=1 << 20)
        took = time.monotonic() - started
    assert failed.value.kind == "deadline" and "within 1 s" in str(failed.value)
    assert 0.9 <= took < 5.0, "ended at its deadline, though every read got a byte within 50 ms"


def test_one_dripping_inference_server_costs_only_its_own_figures():
    honest = [ThreadingHTTPServer(("127.0.0.1", 0), VllmHandler) for _ in range(4)]
    with DrippingServer(every_s=0.2) as drip, contextlib.ExitStack() as servers:
        urls = [drip.url] + [f"http://127.0.0.1:{s.server_address[1]}/metrics" for s in honest]
        scraper = InferenceScraper([InferenceEndpoint(url=u, gpus=[str(i)]) for i, u in enumerate(urls)],
                                   interval_s=0.2, timeout_s=2.0)
        for server in honest:
            servers.enter_context(serving(server))
        try:
            scraper.start()
            # While the dripping server holds its own scrape for 2 s, the four others are read every 0.2 s.
            poll(lambda: all(s.scrapes_total >= 5 and s.up for s in scraper.status()[1:]), 1.9, interval=0.05,
                 what="five scrapes of each honest server while the dripping one is still being read")
            first = scraper.status()[0]
            assert first.scrapes_total == 0, "the dripping server's first read has not ended yet"
            statuses = poll(lambda: (s := scraper.status()) and s[0].scrapes_total >= 1 and s, 10,
                            what="the dripping read to end at its deadline")
            assert not statuses[0].up and statuses[0].error == "timed out after 2 s"
            assert all(s.up and s.kind == "vllm" for s in statuses[1:])
        finally:
            scraper.close()


def test_run_with_a_dripping_dcgm_exporter_ends_its_start_within_the_timeout():
    """The first read of the exporter is discovery: with a 2 s timeout the agent gives its one-line reason
    (as for a missing driver; a unit restarts it, or `driver_wait_s` retries) instead of waiting forever
    for the headers with no log line and no port."""
    with DrippingServer(every_s=1.0) as drip:
        started = time.monotonic()
        proc = subprocess.Popen(roofwatch_cmd("run", "--backend", "dcgm-exporter", "--dcgm-exporter-url", drip.url,
                                              "--listen", "127.0.0.1:0"),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=clean_env(ROOFWATCH_DCGM_EXPORTER_TIMEOUT_S="2"))
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
            raise AssertionError(f"still waiting on the exporter after 30 s: {err[-2000:]}") from None
        took = time.monotonic() - started
    assert proc.returncode == 1 and took < 20, (proc.returncode, took, err[-2000:])
    assert f"dcgm-exporter at {drip.url}: timed out after 2 s" in err, err[-2000:]
