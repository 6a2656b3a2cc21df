"""Every read of a neighbour has one deadline, from connect to the last byte (agent.context.neighbour_http).

A server that sends one byte a second never trips a per-read timeout. Before: ``roofwatch run --backend
dcgm-exporter`` never started against such an exporter, and one such inference endpoint among five held
the single scraper thread, so every server on the node lost its serving figures. Now each request ends at
its deadline, each inference endpoint has its own thread, and the agent serves while an exporter's first read
drips.
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
from tests.agent_process import clean_env, http_get, poll, roofwatch_cmd, serving
from tests.prometheus_server import free_port
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


def test_run_with_a_dripping_dcgm_exporter_serves_while_its_first_read_drips_and_cuts_it_at_the_timeout():
    """The first read of the exporter used to be the start itself: no port until it ended, then exit 1 (issue 46:
    a crash loop). Now the agent serves at once while that read drips (it runs on a thread of its own), says
    what it waits for, cuts the read at ``dcgm_exporter_timeout_s`` and keeps waiting; SIGTERM ends it at once."""
    with DrippingServer(every_s=1.0) as drip:
        port = free_port()
        url = f"http://127.0.0.1:{port}/"
        proc = subprocess.Popen(roofwatch_cmd("run", "--backend", "dcgm-exporter", "--dcgm-exporter-url", drip.url,
                                              "--listen", f"127.0.0.1:{port}"),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=clean_env(ROOFWATCH_DCGM_EXPORTER_TIMEOUT_S="10"))
        try:
            first = poll(lambda: (h := http_get(url + "healthz"))[0] == 200 and h, 9, what="/healthz while the read drips")
            assert first[1].decode().strip() == f"waiting for dcgm-exporter at {drip.url}", first
            assert http_get(url + "readyz")[0] == 503
            cut = poll(lambda: b"timed out after 10 s" in (h := http_get(url + "healthz"))[1] and h, 30,
                       what="the reason once the read is cut at its deadline")
            assert cut[0] == 200 and cut[1].decode().strip() == \
                f"waiting for dcgm-exporter at {drip.url}: timed out after 10 s", cut
            proc.terminate()
            _, err = proc.communicate(timeout=10)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert proc.returncode == 0, err[-2000:]
    assert f"waiting for dcgm-exporter at {drip.url}" in err and "Traceback" not in err, err[-2000:]
