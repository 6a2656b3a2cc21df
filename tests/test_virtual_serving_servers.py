"""The fake vLLM, SGLang and TGI servers of the virtual fleet: their pages look like the real servers'
(names, types, label sets, bucket boundaries, counters that only grow, the start time), the agent's own
scraper reads them over HTTP into the numbers the job state says, and the virtual backend scrapes them.

Expected numbers come from tests/serving_scenario_expectations.py (published figures); the real
servers' shapes from the fixtures in tests/fixtures/inference (checked against their sources) and
the bucket lists written out below.
"""

from __future__ import annotations

import math
import time
import urllib.error
import urllib.request
from dataclasses import fields

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.app.config import Settings
from agent.backends.options import BackendOptions
from agent.backends.registry import open_virtual
from agent.backends.virtual_serving import endpoint_for
from agent.context.workload.inference.scraper import InferenceScraper
from agent.model import ServingReport
from agent.virtual.engine import VirtualEngine
from agent.virtual.scenario import builtin_scenario
from agent.virtual.serving.server import FakeInferenceServer
from tests.agent_process import http_get, poll
from tests.serving_scenario_expectations import expected_servers
from tests.test_inference import FIXTURES

START = 1_760_000_000.0
EXPECTED = expected_servers()
ENGINE = VirtualEngine(builtin_scenario("serving"))
JOBS = {job.name: job for job in ENGINE.serving_jobs("serving-node")}

VLLM_ITL = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80]
VLLM_TTFT = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160,
             640, 2560]
VLLM_REQUEST = [0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920, 7680]
SGLANG_ITL = [0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06, 0.08, 0.1, 0.2, 0.4, 0.6,
              0.8, 1, 2, 4, 6, 8]
SGLANG_TTFT = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400]
SGLANG_STAGE = [0.001 * 1.62**i for i in range(30)]
TGI_DURATION = [0.0001 * 1.5**k for k in range(1, 36)]


class VirtualClock:
    """Wall time that only the test moves: virtual time ``t`` is wall time ``START + t``."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return START + self.t


def families(text: str) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def shapes(text: str) -> dict[str, frozenset[str]]:
    """Sample name -> its label names (``le`` aside), and ``TYPE:<family>`` -> its type, ``_total`` dropped from
    counters (older prometheus_client writes ``# TYPE x counter``, newer ``# TYPE x_total counter``)."""
    out = {s.name: frozenset(k for k in s.labels if k != "le")
           for f in text_string_to_metric_families(text) for s in f.samples}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            out["TYPE:" + (name.removesuffix("_total") if kind == "counter" else name)] = frozenset({kind})
    return out


def assert_shaped_like(text: str, fixture: str, prefix: str) -> None:
    """Every sample name and family type of the real server's fixture, with the same label names."""
    ours, real = shapes(text), shapes((FIXTURES / fixture).read_text())
    for name, value in real.items():
        if name.removeprefix("TYPE:").startswith(prefix) and not name.endswith("_created"):
            assert ours.get(name) == value, (name, ours.get(name), value)


def buckets(text: str, family: str, **match: str) -> list[float]:
    """The finite ``le`` bounds of the first series of ``family`` whose labels include ``match`` (``+Inf`` checked)."""
    f = families(text)[family]
    series = [s for s in f.samples if s.name.endswith("_bucket") and all(s.labels.get(k) == v for k, v in match.items())]
    first = {k: v for k, v in series[0].labels.items() if k != "le"}
    bounds = [float(s.labels["le"]) for s in series if {k: v for k, v in s.labels.items() if k != "le"} == first]
    assert bounds[-1] == math.inf, family
    return bounds[:-1]


def page(job: str, t: float) -> str:
    server = FakeInferenceServer(JOBS[job], clock=VirtualClock(), start_time=START)
    try:
        return server.render(t).decode()
    finally:
        server.close()


@pytest.mark.parametrize("job", sorted(EXPECTED))
def test_each_page_scraped_over_http_gives_the_job_states_numbers(job: str) -> None:
    """Two scrapes of the real HTTP endpoint through the agent's scraper: the report the direct path gives,
    and the floor, ratio and prefill share the published figures give."""
    clock, e, serving_job = VirtualClock(), EXPECTED[job], JOBS[job]
    with FakeInferenceServer(serving_job, clock=clock, start_time=START) as server:
        scraper = InferenceScraper([endpoint_for(serving_job, server.url)], clock=clock)
        for t in (300.0, 301.5):
            clock.t = t
            scraper.scrape_once(now=clock())
        scraped = scraper.report_for(gpu=e.gpus[-1], uuid=None, pids=[], now=clock())
    direct = serving_job.report(clock.t)
    assert scraped is not None and direct is not None and scraped.source == e.server
    for name in ("job", "world_size", "step", "dtype", "source"):
        assert getattr(scraped, name) == getattr(direct, name), name
    for name in ("step_time_s", "tokens_per_s", "flops_per_token", "model_bytes"):
        assert getattr(scraped, name) == pytest.approx(getattr(direct, name), rel=1e-9), name
    for f in fields(ServingReport):
        a, b = getattr(scraped.serving, f.name), getattr(direct.serving, f.name)
        assert (a == pytest.approx(b, rel=1e-9)) if isinstance(b, float) else a == b, f.name
    s = scraped.serving
    assert s.weight_bytes == pytest.approx(e.weight_bytes, rel=1e-3) and s.kv_cache_bytes == pytest.approx(e.kv_pool_bytes)
    assert s.kv_usage == pytest.approx(e.kv_usage, rel=1e-4) and s.prefill_share == pytest.approx(e.prefill_share)
    floor = (s.weight_bytes + s.kv_usage * s.kv_cache_bytes) / (len(e.gpus) * 3.35e12)
    assert floor == pytest.approx(e.floor_s, rel=1e-5) and s.tpot_s / floor == pytest.approx(e.ratio, rel=1e-5)
    assert (s.running, s.waiting) == (e.phase["running"], e.phase.get("waiting", 0))


def test_vllm_page_has_the_v1_names_labels_and_buckets() -> None:
    text = page("chat-8b", 120.0)
    got = families(text)
    assert_shaped_like(text, "vllm-serving-1.prom", "vllm:")
    assert buckets(text, "vllm:inter_token_latency_seconds") == VLLM_ITL
    assert buckets(text, "vllm:time_to_first_token_seconds") == VLLM_TTFT
    for name in ("e2e_request_latency", "request_queue_time", "request_inference_time", "request_prefill_time",
                 "request_decode_time"):
        assert buckets(text, f"vllm:{name}_seconds") == VLLM_REQUEST, name
    assert "vllm:time_per_output_token_seconds" not in got and "vllm:gpu_cache_usage_perc" not in got  # removed names
    assert "vllm:num_preemptions_total{" in text and "vllm:prompt_tokens_created{" in text
    labels = got["vllm:num_requests_running"].samples[0].labels
    assert labels == {"engine": "0", "model_name": "meta-llama/Llama-3.1-8B-Instruct"}
    assert got["process_start_time_seconds"].samples[0].value == START
    config = got["vllm:cache_config_info"].samples[0].labels
    assert config["num_gpu_blocks"] == str(math.floor(60e9 / (16 * 131072))) and config["kv_cache_memory_bytes"] == "None"


def test_sglang_page_has_per_rank_scheduler_series_and_unrounded_stage_buckets() -> None:
    text = page("chat-70b", 120.0)
    got = families(text)
    assert_shaped_like(text, "sglang-serving-1.prom", "sglang:")
    running = got["sglang:num_running_reqs"].samples
    assert sorted(s.labels["tp_rank"] for s in running) == ["0", "1", "2", "3"] and {s.value for s in running} == {164.0}
    assert buckets(text, "sglang:inter_token_latency_seconds") == SGLANG_ITL
    assert buckets(text, "sglang:time_to_first_token_seconds") == SGLANG_TTFT
    assert buckets(text, "sglang:per_stage_req_latency_seconds", stage="prefill_forward") == SGLANG_STAGE
    device = got["sglang:forward_execution_seconds"]  # SGLANG_ENABLE_METRICS_DEVICE_TIMER=1 on this server
    assert {s.labels["category"] for s in device.samples if s.name.endswith("_total")} == {"extend", "decode"}
    assert "sglang:forward_execution_seconds" not in families(page("tiny-1b", 120.0))
    assert got["process_start_time_seconds"].samples[0].value == START


def test_tgi_page_is_the_rust_exporters() -> None:
    text = page("rag-7b", 120.0)
    assert_shaped_like(text, "tgi-serving-1.prom", "tgi_")
    names = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if not line.startswith("#")}
    assert not {n for n in names if n.endswith(("_total", "_created"))} and "process_start_time_seconds" not in names
    assert "# HELP" not in text
    assert "tgi_batch_current_size 8\n" in text and "tgi_queue_size 0\n" in text  # Rust writes whole numbers bare
    assert buckets(text, "tgi_batch_forward_duration", method="decode") == pytest.approx(TGI_DURATION, rel=1e-12)
    assert buckets(text, "tgi_request_mean_time_per_token_duration") == pytest.approx(TGI_DURATION, rel=1e-12)
    assert buckets(text, "tgi_request_input_length") == pytest.approx([8191 / 100 * (i + 1) for i in range(100)])
    assert buckets(text, "tgi_request_generated_tokens") == pytest.approx([8192 / 100 * (i + 1) for i in range(100)])
    assert 'le="0.00015000000000000001"' in text  # the router multiplies 0.0001 by 1.5, step by step


@pytest.mark.parametrize("job", ["chat-8b", "chat-70b", "rag-7b"])
def test_counters_and_histograms_only_grow_and_buckets_are_cumulative(job: str) -> None:
    previous: dict[tuple[str, tuple], float] = {}
    for t in [0.0, 0.01, 0.5, 1.0, 7.3, 60.0, 61.0, 3599.0, 3600.0, 3601.5, 9000.0]:
        text = page(job, t)
        for family in text_string_to_metric_families(text):
            if family.type not in ("counter", "histogram"):
                continue
            by_series: dict[tuple, list[float]] = {}
            for s in family.samples:
                key = (s.name, tuple(sorted(s.labels.items())))
                if key in previous:
                    assert s.value >= previous[key], (key, t)
                previous[key] = s.value
                if s.name.endswith("_bucket"):
                    rest = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
                    by_series.setdefault(rest, []).append(s.value)
            for counts in by_series.values():
                assert counts == sorted(counts), (family.name, t)


def test_only_get_metrics_answers() -> None:
    with FakeInferenceServer(JOBS["chat-8b"], clock=VirtualClock(), start_time=START) as server:
        status, body = http_get(server.url)
        assert status == 200 and b"vllm:num_requests_running" in body
        assert http_get(server.url.replace("/metrics", "/v1/models"))[0] == 404
        with urllib.request.urlopen(server.url) as response:
            assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")


def test_the_virtual_backend_scrapes_its_fake_servers_and_closes_them() -> None:
    before = time.time()
    backend = open_virtual(BackendOptions.of(Settings(backend="virtual", scenario="serving", inference_interval_s=0.5)))
    try:
        now = backend.clock()
        warm = backend.warm_samples(now, 3.0)
        # the scraper was played the servers' pages of two and one interval before it started (issue 43: serving
        # figures from the first scrape, agent.backends.virtual_serving_warm); before those, nothing was scraped.
        # "It started" is somewhere between `before` and `now` (opening starts five servers: on a loaded machine
        # that took more than the 0.25 s margin), so older is judged from `before`, newest from `now`.
        older = [s for s in warm if s.ts < before - 0.5 - 0.25]
        newest = [s for s in warm if s.ts >= now - 0.5 + 0.25 and s.gpu == "3"]
        assert older and all(s.workload is None for s in older)
        assert newest and all(s.workload is not None and s.workload.serving.server == "chat-70b" for s in newest)

        def scraped():
            s = backend.sample("3", backend.clock())
            return s if s.workload is not None and s.workload.serving is not None else None

        report = poll(scraped, 20, what="a scraped report for GPU 3").workload
        assert report.source == "sglang" and report.world_size == 4 and report.serving.server == "chat-70b"
        assert report.serving.running == 164 and report.serving.prefill_share == pytest.approx(0.15)
    finally:
        ports = _listening_ports()
        backend.close()
    closed = _listening_ports()
    assert len(ports - closed) == 5  # one fake server per serving job, all gone


def _listening_ports() -> set[int]:
    import os

    import psutil

    return {c.laddr.port for c in psutil.Process(os.getpid()).net_connections("tcp") if c.status == psutil.CONN_LISTEN}


def test_a_closed_fake_server_refuses_connections() -> None:
    server = FakeInferenceServer(JOBS["tiny-1b"], clock=VirtualClock(), start_time=START).start()
    url = server.url
    server.close()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url, timeout=2)
