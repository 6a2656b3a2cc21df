"""Serving figures scraped from vLLM, SGLang and TGI, and the serving verdicts they lead to.

Against the real fixture HTTP server (tests/inference_server.py): the fixtures
``*-serving-{1,2}.prom`` are written in each server's real exposition shape (names, labels and
histogram buckets from the servers' sources, agent.context.workload.inference.serving_parse). Expected
values are computed here from the fixture text with the plain-text parser of tests/test_inference.py,
not with the code under test. Older metric names and counter resets are checked on the parser alone.
"""

from __future__ import annotations

import re

import pytest

from agent.classifier.serving import serving_view
from agent.classifier.thresholds import DEFAULT_THRESHOLDS
from agent.context.workload.inference.endpoint import ModelFacts
from agent.context.workload.inference.parse import parse, totals
from agent.context.workload.inference.scraper import InferenceEndpoint, InferenceScraper
from agent.context.workload.inference.serving_parse import serving_rates
from agent.model.specs import spec_by_key
from tests.inference_server import DT, FIXTURES, T0, scraped
from tests.inference_server import server  # noqa: F401 (a fixture)
from tests.test_inference import fixture_series

H100 = spec_by_key("h100-sxm")


def delta(kind: str, name: str, **match: str) -> float:
    """Increase of the samples called ``name`` between the two fixtures, summed over the matching series.
    Ranks of one replica (tp_rank) count once: only tp_rank 0 (or series without ranks) are summed."""
    def total(file: str) -> float:
        return sum(v for labels, v in fixture_series(file, name)
                   if labels.get("tp_rank", "0") == "0" and all(labels.get(k) == v2 for k, v2 in match.items()))
    return total(f"{kind}-serving-2.prom") - total(f"{kind}-serving-1.prom")


def gauge(kind: str, name: str) -> float:
    return sum(v for labels, v in fixture_series(f"{kind}-serving-2.prom", name) if labels.get("tp_rank", "0") == "0")


def serving_report(server, kind: str, **endpoint):
    scraper = scraped(server.seq(f"{kind}-serving-1.prom", f"{kind}-serving-2.prom"), **endpoint)
    report = scraper.report_for(gpu="0", uuid=None, pids=[], now=T0 + DT)
    assert report is not None and report.serving is not None
    return report


@pytest.mark.slow
def test_vllm_serving_figures_match_the_fixture(server):
    report = serving_report(server, "vllm", gpus=["0"], model_bytes=16.06e9, max_running=4, job="chat")
    s = report.serving
    assert (s.running, s.waiting) == (gauge("vllm", "vllm:num_requests_running"),
                                      gauge("vllm", "vllm:num_requests_waiting")) == (4.0, 12.0)
    assert s.kv_usage == pytest.approx(gauge("vllm", "vllm:kv_cache_usage_perc"))
    itl = delta("vllm", "vllm:inter_token_latency_seconds_sum") / delta("vllm", "vllm:inter_token_latency_seconds_count")
    assert s.tpot_s == pytest.approx(itl) and 0.007 < itl < 0.008
    assert s.ttft_s == pytest.approx(delta("vllm", "vllm:time_to_first_token_seconds_sum")
                                     / delta("vllm", "vllm:time_to_first_token_seconds_count"))
    assert s.preemptions_per_s == 0.0  # the counter exists and did not move: zero, not unknown
    prefill = delta("vllm", "vllm:request_prefill_time_seconds_sum")
    decode_per_step = delta("vllm", "vllm:request_decode_time_seconds_sum") / 4.0  # each running request counts a step
    assert s.prefill_share == pytest.approx(prefill / (prefill + decode_per_step))
    assert s.generated_tokens_per_s == pytest.approx(delta("vllm", "vllm:generation_tokens_total") / DT)
    assert (s.server, s.model, s.weight_bytes, s.max_running, s.gpus) == (
        "chat", "meta-llama/Llama-3.1-8B-Instruct", 16.06e9, 4, 1)
    assert s.kv_cache_bytes is None  # kv_cache_memory_bytes="None" in cache_config_info: estimated later

    view = serving_view(report, H100, [], DEFAULT_THRESHOLDS)
    assert view.state == "under_batched" and view.advice_code == "raise_batch"
    assert "max_num_seqs" in view.advice and "12 requests waiting" in view.advice
    assert view.floor_s == pytest.approx(16.06e9 / H100.mem_bandwidth_bytes_per_s)  # KV unknown: weights only
    assert view.floor_ratio == pytest.approx(itl / view.floor_s)
    assert view.possible_batch == pytest.approx(4.0 / gauge("vllm", "vllm:kv_cache_usage_perc"))


@pytest.mark.slow
def test_sglang_with_a_full_kv_cache_and_a_queue_is_kv_saturated(server):
    report = serving_report(server, "sglang", gpus=["0", "1"], model_bytes=145e9)
    s = report.serving
    assert s.running == 60.0 and s.waiting == 30.0 and s.kv_usage == pytest.approx(0.97)  # tp ranks counted once
    assert s.preemptions_per_s == pytest.approx(delta("sglang", "sglang:num_retracted_requests_total") / DT)
    assert s.tpot_s == pytest.approx(delta("sglang", "sglang:inter_token_latency_seconds_sum")
                                     / delta("sglang", "sglang:inter_token_latency_seconds_count"))
    # No device timer: prefill forwards' share of the wall time.
    prefill = delta("sglang", "sglang:per_stage_req_latency_seconds_sum", stage="prefill_forward")
    assert s.prefill_share == pytest.approx(prefill / DT)
    assert s.gpus == 2 and re.fullmatch(rf"sglang 127\.0\.0\.1:{server.port}/seq/\d+/sglang-serving-1\.prom,"
                                        r"sglang-serving-2\.prom/metrics", s.server), s.server  # its path: not /metrics
    view = serving_view(report, H100, [], DEFAULT_THRESHOLDS)
    assert view.state == "kv_saturated" and view.advice_code == "scale_out"
    assert "scale out" in view.advice and "30 requests waiting" in view.advice


@pytest.mark.slow
def test_tgi_prefill_share_comes_from_forward_time_by_phase(server):
    report = serving_report(server, "tgi", gpus=["0"], model_bytes=16e9)
    s = report.serving
    prefill = delta("tgi", "tgi_batch_forward_duration_sum", method="prefill")
    decode = delta("tgi", "tgi_batch_forward_duration_sum", method="decode")
    assert s.prefill_share == pytest.approx(prefill / (prefill + decode)) and s.prefill_share == pytest.approx(0.45)
    assert s.kv_usage == pytest.approx(gauge("tgi", "tgi_batch_current_max_tokens") / gauge("tgi", "tgi_batch_max_total_tokens"))
    assert s.tpot_s == pytest.approx(delta("tgi", "tgi_request_mean_time_per_token_duration_sum")
                                     / delta("tgi", "tgi_request_mean_time_per_token_duration_count"))
    assert (s.running, s.waiting, s.preemptions_per_s, s.ttft_s) == (24.0, 0.0, None, None)  # TGI exports neither
    view = serving_view(report, H100, [], DEFAULT_THRESHOLDS)
    assert view.state == "prefill_heavy" and "disaggregate" in view.advice


@pytest.mark.slow
def test_the_models_setting_supplies_what_the_endpoint_leaves_out(server):
    facts = {"meta-llama/Llama-3.1-8B-Instruct": ModelFacts(model_bytes=16.06e9, kv_cache_bytes=40e9, max_running=4,
                                                             params=8e9, dtype="bf16")}
    scraper = InferenceScraper([InferenceEndpoint(url=server.seq("vllm-serving-1.prom", "vllm-serving-2.prom"),
                                                  gpus=["0"])], models=facts, clock=lambda: pytest.fail("clock"))
    for t in (T0, T0 + DT):
        scraper.scrape_once(now=t)
    report = scraper.report_for(gpu="0", uuid=None, pids=[], now=T0 + DT)
    s = report.serving
    assert (s.weight_bytes, s.kv_cache_bytes, s.max_running) == (16.06e9, 40e9, 4)
    assert report.flops_per_token == 16e9 and report.dtype == "bf16" and report.model_bytes == 16.06e9
    view = serving_view(report, H100, [], DEFAULT_THRESHOLDS)
    kv_read = 40e9 * gauge("vllm", "vllm:kv_cache_usage_perc")
    assert view.kv_bytes_read == pytest.approx(kv_read) and not view.kv_bytes_estimated
    assert view.floor_memory_s == pytest.approx((16.06e9 + kv_read) / H100.mem_bandwidth_bytes_per_s)


def _text(file: str, *replacements: tuple[str, str]) -> str:
    text = (FIXTURES / file).read_text()
    for old, new in replacements:
        text = text.replace(old, new)
    return text


def _rates(first: str, second: str, kind: str = "vllm"):
    a, b = totals(parse(first), kind), totals(parse(second), kind)
    return serving_rates(a.serving, b.serving, DT)


def test_older_vllm_names_stand_in_for_the_newer_ones():
    old = (("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
           ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"))
    r = _rates(_text("vllm-serving-1.prom", *old), _text("vllm-serving-2.prom", *old))
    new = _rates(_text("vllm-serving-1.prom"), _text("vllm-serving-2.prom"))
    assert (r.kv_usage, r.tpot_s) == (new.kv_usage, new.tpot_s) and r.tpot_s is not None


def test_a_set_kv_cache_memory_bytes_is_read_from_cache_config_info():
    sized = (('kv_cache_memory_bytes="None"', 'kv_cache_memory_bytes="42949672960"'),)
    r = _rates(_text("vllm-serving-1.prom", *sized), _text("vllm-serving-2.prom", *sized))
    assert r.kv_cache_bytes_per_gpu == 42949672960.0


def test_a_counter_that_went_backwards_gives_unknown_not_a_negative_rate():
    first = _text("vllm-serving-2.prom")
    second = _text("vllm-serving-1.prom", ("vllm:num_preemptions_total{", "vllm:num_preemptions_total{x=\"1\","))
    a, b = totals(parse(first), "vllm"), totals(parse(second), "vllm")
    r = serving_rates(a.serving, b.serving, DT)
    assert r.tpot_s is None and r.prefill_share is None  # histogram sums went backwards
    assert r.running == 4.0  # gauges are the latest scrape's


def test_a_server_without_serving_gauges_reports_unknowns_not_zeros():
    text = "\n".join(line for line in _text("tgi-1.prom").splitlines()
                     if "tgi_batch_current_size" not in line and "tgi_queue_size" not in line)
    assert "tgi_request_input_length_sum" in text  # still a TGI exposition
    t = totals(parse(text), "tgi").serving
    assert (t.running, t.waiting, t.kv_usage, t.itl) == (None, None, None, None)


@pytest.mark.slow
def test_the_pool_in_tokens_times_kv_bytes_per_token_sizes_the_kv_cache(server):
    per_token = 131072  # Llama-3.1-8B: 2 x 32 layers x 8 KV heads x 128 x 2 bytes
    vllm = serving_report(server, "vllm", gpus=["0"], model_bytes=16.06e9, kv_bytes_per_token=per_token).serving
    (config,) = [labels for labels, _ in fixture_series("vllm-serving-2.prom", "vllm:cache_config_info")]
    tokens = float(config["num_gpu_blocks"]) * float(config["block_size"])
    assert vllm.kv_cache_bytes == pytest.approx(tokens * per_token)
    tgi = serving_report(server, "tgi", gpus=["0"], model_bytes=16e9, kv_bytes_per_token=per_token).serving
    assert tgi.kv_cache_bytes == pytest.approx(gauge("tgi", "tgi_batch_max_total_tokens") * per_token)
    sglang = serving_report(server, "sglang", gpus=["0", "1", "2", "3"], model_bytes=145e9,
                            kv_bytes_per_token=327680).serving  # Qwen2.5-72B: 2 x 80 x 8 x 128 x 2
    assert sglang.kv_cache_bytes == pytest.approx(gauge("sglang", "sglang:max_total_num_tokens") * 327680)
    assert serving_report(server, "tgi", gpus=["0"], model_bytes=16e9).serving.kv_cache_bytes is None


@pytest.mark.slow
def test_a_configured_model_names_a_tgi_server_and_keys_the_models_setting(server):
    facts = {"mistralai/Mistral-7B-Instruct-v0.3": ModelFacts(model_bytes=14.5e9)}
    scraper = InferenceScraper([InferenceEndpoint(url=server.seq("tgi-serving-1.prom", "tgi-serving-2.prom"), gpus=["0"],
                                                  model="mistralai/Mistral-7B-Instruct-v0.3")],
                               models=facts, clock=lambda: pytest.fail("clock"))
    for t in (T0, T0 + DT):
        scraper.scrape_once(now=t)
    s = scraper.report_for(gpu="0", uuid=None, pids=[], now=T0 + DT).serving
    assert (s.model, s.weight_bytes) == ("mistralai/Mistral-7B-Instruct-v0.3", 14.5e9)
