"""Inference-server scraping (agent.context.workload.inference.scraper) against a real HTTP server in a child process.

The server serves the fixture expositions in tests/fixtures/inference in the order the URL
names them, so PID discovery, timeouts and size limits are exercised for real. Expected values
are computed here from the fixture text with a parser independent of the one under test.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
import selectors
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
from pydantic import ValidationError

from agent.classifier.features import window_features
from agent.classifier.roofline import roofline
from agent.classifier.thresholds import Thresholds
from agent.context.workload.inference.scraper import InferenceEndpoint, InferenceScraper
from agent.model import GpuSample
from agent.model.specs import spec_by_key

FIXTURES = Path(__file__).parent / "fixtures" / "inference"
T0, DT = 1_000.0, 5.0

# /seq/<nonce>/<file,file,...>/metrics serves the files in turn (the last one again afterwards);
# HANG accepts and never answers, 404 answers Not Found. /big/<n> serves n bytes of junk.
# ?gzip=1 compresses, but only when the client asked for gzip; ?cl=0 leaves out Content-Length.
SERVER = r'''
import gzip, http.server, os, subprocess, sys, threading, time, urllib.parse
root = sys.argv[1]
child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
hits, hung, lock = {}, [0], threading.Lock()

class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def reply(self, code, body, query):
        gz = query.get("gzip") == ["1"] and "gzip" in self.headers.get("Accept-Encoding", "")
        if query.get("gzip") == ["1"] and not gz:
            code, body = 406, b"gzip required"
        if gz:
            body = gzip.compress(body)
        self.send_response(code)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        if gz:
            self.send_header("Content-Encoding", "gzip")
        if query.get("cl") != ["0"]:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        query, parts = urllib.parse.parse_qs(url.query), url.path.strip("/").split("/")
        if parts[0] == "hung":
            return self.reply(200, str(hung[0]).encode(), {})
        if parts[0] == "big":
            return self.reply(200, b"x" * int(parts[1]), query)
        with lock:
            i = hits.get(url.path, 0)
            hits[url.path] = i + 1
        files = parts[2].split(",")
        name = files[min(i, len(files) - 1)]
        if name == "HANG":
            with lock:
                hung[0] += 1
            time.sleep(3600)
        elif name == "404":
            self.reply(404, b"not found", {})
        else:
            with open(os.path.join(root, name), "rb") as f:
                self.reply(200, f.read(), query)

httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
httpd.daemon_threads = True
print(httpd.server_address[1], child.pid, flush=True)
httpd.serve_forever()
'''


@dataclasses.dataclass
class Server:
    pid: int
    port: int
    grandchild: int
    nonce: itertools.count

    def seq(self, *files: str, query: str = "") -> str:
        """A fresh URL (its own position in the sequence) serving ``files`` in turn."""
        return f"http://127.0.0.1:{self.port}/seq/{next(self.nonce)}/{','.join(files)}/metrics{query}"

    def hung(self) -> int:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/hung", timeout=5) as r:
            return int(r.read())


@pytest.fixture(scope="module")
def server():
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(FIXTURES)], stdout=subprocess.PIPE, text=True)
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            assert sel.select(timeout=20), "fixture server did not start"
        port, grandchild = map(int, proc.stdout.readline().split())
        yield Server(proc.pid, port, grandchild, itertools.count())
    finally:
        proc.kill()
        proc.wait(timeout=10)


def _labels(text: str) -> dict[str, str]:
    return dict(re.findall(r'(\w+)="([^"]*)"', text))


def fixture_series(file: str, name: str) -> list[tuple[dict[str, str], float]]:
    """(labels, value) of every sample called ``name`` in a fixture, by plain text matching."""
    out = []
    for line in (FIXTURES / file).read_text().splitlines():
        m = re.match(r"^([A-Za-z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)$", line)
        if m and m.group(1) == name:
            out.append((_labels(m.group(2) or ""), float(m.group(3))))
    return out


def fixture_sum(file: str, name: str) -> float:
    return math.fsum(v for _, v in fixture_series(file, name))


def delta(name: str, kind_prefix: str) -> float:
    return fixture_sum(f"{kind_prefix}-2.prom", name) - fixture_sum(f"{kind_prefix}-1.prom", name)


def scraped(url: str, now: tuple[float, ...] = (T0, T0 + DT), **endpoint) -> InferenceScraper:
    scraper = InferenceScraper([InferenceEndpoint(url=url, **endpoint)], clock=lambda: pytest.fail("clock used"))
    for t in now:
        scraper.scrape_once(now=t)
    return scraper


EIGHT = [str(i) for i in range(8)]


def test_vllm_rates_match_the_fixture_counters(server):
    scraper = scraped(server.seq("vllm-1.prom", "vllm-2.prom"), gpus=EIGHT, params=70e9, dtype="bf16", job="chat")
    report = scraper.report_for(gpu="3", uuid=None, pids=[], now=T0 + DT)
    tokens = delta("vllm:prompt_tokens_total", "vllm") + delta("vllm:generation_tokens_total", "vllm")
    steps = delta("vllm:iteration_tokens_total_count", "vllm")
    assert tokens > 0 and steps > 0
    assert report is not None
    assert report.tokens_per_s == pytest.approx(tokens / DT)
    assert report.step_time_s == pytest.approx(DT / steps)
    assert report.step == int(fixture_sum("vllm-2.prom", "vllm:iteration_tokens_total_count"))
    assert report.flops_per_token == pytest.approx(2 * 70e9)
    assert (report.world_size, report.dtype, report.source, report.job) == (8, "bf16", "vllm", "chat")
    (status,) = scraper.status()
    assert status.up and status.has_rate and status.kind == "vllm" and status.error is None
    assert status.models == ("meta-llama/Llama-3.1-70B-Instruct",)
    assert (status.scrapes_total, status.failures_total, status.last_success_ts) == (2, 0, T0 + DT)
    assert status.flops_source == "config" and status.pids is None


def test_explicit_gpus_match_by_index_or_uuid_only(server):
    scraper = scraped(server.seq("vllm-1.prom", "vllm-2.prom"), gpus=["1", "GPU-abc"])
    assert scraper.report_for(gpu="1", uuid="GPU-x", pids=[], now=T0 + DT) is not None
    assert scraper.report_for(gpu="5", uuid="GPU-abc", pids=[], now=T0 + DT) is not None
    assert scraper.report_for(gpu="2", uuid="GPU-y", pids=[server.pid], now=T0 + DT) is None
    assert scraper.report_for(gpu="1", uuid=None, pids=[], now=T0 + DT).world_size == 2


def test_pid_discovery_maps_the_listening_process_and_its_descendants(server):
    scraper = scraped(server.seq("vllm-1.prom", "vllm-2.prom"))
    (status,) = scraper.status()
    assert server.pid in status.pids and server.grandchild in status.pids, status.pid_error
    first = scraper.report_for(gpu="0", uuid="GPU-0", pids=[4_000_000, server.pid], now=T0 + DT)
    assert first is not None and first.world_size == 1
    assert scraper.report_for(gpu="1", uuid="GPU-1", pids=[4_000_001], now=T0 + DT) is None
    assert scraper.report_for(gpu="2", uuid="GPU-2", pids=[], now=T0 + DT) is None
    second = scraper.report_for(gpu="3", uuid="GPU-3", pids=[server.grandchild], now=T0 + DT)
    assert second is not None and second.world_size == 2  # two GPUs now map to the server
    assert second.flops_per_token is None  # nothing configured, nothing estimated by the server


def test_pid_discovery_without_privileges_falls_back_to_gpus_or_none(server, monkeypatch):
    def denied(*args, **kwargs):
        raise psutil.AccessDenied()

    monkeypatch.setattr(psutil, "net_connections", denied)
    url = server.seq("vllm-1.prom", "vllm-2.prom")
    scraper = InferenceScraper([InferenceEndpoint(url=url), InferenceEndpoint(url=url, gpus=["7"])])
    scraper.scrape_once(now=T0)
    scraper.scrape_once(now=T0 + DT)
    found, configured = scraper.status()
    assert found.up and found.pids == () and "cannot list listening sockets" in found.pid_error
    assert configured.pid_error is None
    assert scraper.report_for(gpu="0", uuid=None, pids=[server.pid], now=T0 + DT) is None
    assert scraper.report_for(gpu="7", uuid=None, pids=[server.pid], now=T0 + DT) is not None


@pytest.mark.parametrize("kind", ["vllm", "sglang", "tgi"])
def test_detects_each_server_kind(server, kind):
    scraper = scraped(server.seq(f"{kind}-1.prom", f"{kind}-2.prom"), gpus=["0"])
    assert scraper.status()[0].kind == kind
    report = scraper.report_for(gpu="0", uuid=None, pids=[], now=T0 + DT)
    assert report is not None and report.source == kind and report.tokens_per_s > 0


def test_a_configured_kind_that_does_not_match_is_an_error(server):
    scraper = scraped(server.seq("vllm-1.prom", "vllm-2.prom"), gpus=["0"], kind="tgi")
    (status,) = scraper.status()
    assert not status.up and "no tgi token counters" in status.error and "vllm" in status.error
    assert scraper.report_for(gpu="0", uuid=None, pids=[], now=T0 + DT) is None


def _replica_max_sum(file: str, name: str) -> float:
    """SGLang: ranks of one replica (pp_rank, tp_rank) count the same passes: max over them, sum the rest."""
    groups: dict[frozenset, float] = {}
    for labels, value in fixture_series(file, name):
        key = frozenset((k, v) for k, v in labels.items() if k not in ("pp_rank", "tp_rank", "moe_ep_rank"))
        groups[key] = max(groups.get(key, 0.0), value)
    return math.fsum(groups.values())


def _mean_rate(prefix: str, name: str) -> float:
    before = {frozenset(l.items()): v for l, v in fixture_series(f"{prefix}-1.prom", name)}
    after = {frozenset(l.items()): v for l, v in fixture_series(f"{prefix}-2.prom", name)}
    assert before.keys() == after.keys() and len(after) > 1
    return math.fsum(after[k] - before[k] for k in after) / len(after) / DT


def test_sglang_counts_decode_passes_once_per_replica_and_prefers_estimated_flops(server):
    scraper = scraped(server.seq("sglang-1.prom", "sglang-2.prom"), gpus=["0", "1"], flops_per_token=1.0)
    report = scraper.report_for(gpu="0", uuid=None, pids=[], now=T0 + DT)
    name = "sglang:cuda_graph_passes_total"
    passes = _replica_max_sum("sglang-2.prom", name) - _replica_max_sum("sglang-1.prom", name)
    assert passes < delta(name, "sglang")  # the pp ranks' duplicate counts are not summed
    tokens = (delta("sglang:prompt_tokens_total", "sglang") + delta("sglang:generation_tokens_total", "sglang")
              - delta("sglang:cached_tokens_total", "sglang"))
    assert report.step_time_s == pytest.approx(DT / passes)
    assert report.tokens_per_s == pytest.approx(tokens / DT)
    flops_per_gpu = _mean_rate("sglang", "sglang:estimated_flops_per_gpu_total")
    assert report.flops_per_token == pytest.approx(flops_per_gpu * 2 / report.tokens_per_s)
    moved = (_mean_rate("sglang", "sglang:estimated_read_bytes_per_gpu_total")
             + _mean_rate("sglang", "sglang:estimated_write_bytes_per_gpu_total"))
    assert report.model_bytes == pytest.approx(moved * 2 * report.step_time_s)
    assert scraper.status()[0].flops_source == "server"


def test_tgi_tokens_come_from_request_histograms_and_steps_from_forward_calls(server):
    scraper = scraped(server.seq("tgi-1.prom", "tgi-2.prom"), gpus=["0"], params=8e9)
    report = scraper.report_for(gpu="0", uuid=None, pids=[], now=T0 + DT)
    tokens = delta("tgi_request_input_length_sum", "tgi") + delta("tgi_request_generated_tokens_sum", "tgi")
    calls = delta("tgi_batch_inference_count", "tgi")  # prefill + decode forward calls
    assert report.tokens_per_s == pytest.approx(tokens / DT)
    assert report.step_time_s == pytest.approx(DT / calls)
    assert report.flops_per_token == pytest.approx(16e9)


def test_vllm_estimated_flops_across_engines_give_the_workload_mfu_on_an_h100(server):
    url = server.seq("vllm-mfu-1.prom", "vllm-mfu-2.prom")
    scraper = scraped(url, gpus=EIGHT, flops_per_token=1.0, model_bytes=64e9, dtype="bf16")
    report = scraper.report_for(gpu="0", uuid="GPU-0", pids=[], now=T0 + DT)
    tokens = (delta("vllm:prompt_tokens_total", "vllm-mfu") + delta("vllm:generation_tokens_total", "vllm-mfu")
              - delta("vllm:prompt_tokens_cached_total", "vllm-mfu"))
    assert report.tokens_per_s == pytest.approx(tokens / DT)  # both engines, cached prefixes cost no FLOPs
    assert report.step_time_s == pytest.approx(DT / delta("vllm:iteration_tokens_total_count", "vllm-mfu"))
    spec = spec_by_key("h100-sxm")
    mfu = _roofline(report, spec).mfu_workload
    flops_per_gpu = _mean_rate("vllm-mfu", "vllm:estimated_flops_per_gpu_total")
    assert mfu == pytest.approx(flops_per_gpu / spec.peak_flops["bf16"])
    assert 0.0 < mfu < 1.0


def _roofline(report, spec):
    samples = [GpuSample(ts=T0 + i, gpu="0", interval_s=1.0, gr_active=0.9, tensor_active=0.3, dram_active=0.5,
                         sm_clock_mhz=spec.ref_clock_mhz, workload=report, dtype=report.dtype) for i in range(10)]
    return roofline(window_features(samples, samples, spec, Thresholds()), spec)


def test_params_report_through_roofline_gives_the_expected_mfu_and_mbu(server):
    scraper = scraped(server.seq("vllm-1.prom", "vllm-2.prom"), gpus=EIGHT, params=70e9, model_bytes=140e9,
                      dtype="bf16")
    report = scraper.report_for(gpu="4", uuid=None, pids=[], now=T0 + DT)
    spec = spec_by_key("h100-sxm")
    r = _roofline(report, spec)
    tokens = (delta("vllm:prompt_tokens_total", "vllm") + delta("vllm:generation_tokens_total", "vllm")) / DT
    steps = delta("vllm:iteration_tokens_total_count", "vllm") / DT
    assert r.mfu_workload == pytest.approx(tokens * 2 * 70e9 / (8 * spec.peak_flops["bf16"]))
    assert r.mbu_workload == pytest.approx(140e9 * steps / (8 * spec.mem_bandwidth_bytes_per_s))
    assert r.mfu_source == "workload" and r.dtype == "bf16" and not r.dtype_assumed


def test_first_scrape_has_no_rate(server):
    scraper = scraped(server.seq("vllm-1.prom", "vllm-2.prom"), now=(T0,), gpus=["0"])
    (status,) = scraper.status()
    assert status.up and not status.has_rate
    assert scraper.report_for(gpu="0", uuid=None, pids=[], now=T0) is None


def test_counter_reset_gives_no_rate_for_that_interval(server):
    url = server.seq("vllm-1.prom", "vllm-2.prom", "vllm-1.prom", "vllm-2.prom")
    scraper = scraped(url, now=(T0, T0 + DT, T0 + 2 * DT), gpus=["0"])
    (status,) = scraper.status()
    assert status.up and not status.has_rate and "reset" in status.error
    assert scraper.report_for(gpu="0", uuid=None, pids=[], now=T0 + 2 * DT) is None
    scraper.scrape_once(now=T0 + 3 * DT)
    report = scraper.report_for(gpu="0", uuid=None, pids=[], now=T0 + 3 * DT)
    assert report is not None and report.tokens_per_s > 0


def test_stale_report_is_dropped(server):
    scraper = scraped(server.seq("vllm-1.prom", "vllm-2.prom"), gpus=["0"])
    limit = 3 * 5.0  # 3 x the default interval
    assert scraper.report_for(gpu="0", uuid=None, pids=[], now=T0 + DT + limit - 0.1) is not None
    assert scraper.report_for(gpu="0", uuid=None, pids=[], now=T0 + DT + limit + 0.1) is None


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


@pytest.mark.parametrize("query", ["", "?cl=0", "?gzip=1"])
def test_oversize_response_is_rejected(server, query):
    url = f"http://127.0.0.1:{server.port}/big/5000{query}"
    scraper = InferenceScraper([InferenceEndpoint(url=url, gpus=["0"])], max_bytes=4096)
    scraper.scrape_once(now=T0)
    (status,) = scraper.status()
    assert not status.up and "larger than 4096 bytes" in status.error


def test_a_body_that_is_not_an_exposition_is_an_error(server):
    scraper = scraped(f"http://127.0.0.1:{server.port}/big/100", gpus=["0"])
    (status,) = scraper.status()
    assert not status.up and "not a Prometheus text exposition" in status.error


def test_gzip_responses_are_accepted(server):
    plain = scraped(server.seq("vllm-1.prom", "vllm-2.prom"), gpus=["0"])
    zipped = scraped(server.seq("vllm-1.prom", "vllm-2.prom", query="?gzip=1"), gpus=["0"])
    assert zipped.status()[0].up, zipped.status()[0].error
    ask = dict(gpu="0", uuid=None, pids=[], now=T0 + DT)
    assert zipped.report_for(**ask) == plain.report_for(**ask) != None  # noqa: E711


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
        ({"url": "http://h/m", "kind": "triton"}, "kind", "vllm"),
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
