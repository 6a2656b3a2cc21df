"""Inference-server scraping (agent.context.workload.inference.scraper): what the reports say.

Against a real HTTP server in a child process (tests/inference_server.py): token and step rates of
vLLM, SGLang and TGI, FLOPs per token configured or estimated by the server, the MFU and MBU they
give through the roofline, and which GPUs a server's report belongs to (configured, or found from
the listening process's PIDs). Expected values are computed here from the fixture text with a parser
independent of the one under test. Scrape failures, limits and the thread: test_inference_scrape.py.
"""

from __future__ import annotations

import math
import re

import psutil
import pytest

from agent.classifier.features import window_features
from agent.classifier.roofline import roofline
from agent.classifier.thresholds import Thresholds
from agent.context.workload.inference.scraper import InferenceEndpoint, InferenceScraper
from agent.model import GpuSample
from agent.model.specs import spec_by_key
from tests.inference_server import DT, FIXTURES, T0, scraped
from tests.inference_server import server  # noqa: F401 (a fixture)

pytestmark = pytest.mark.slow


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
