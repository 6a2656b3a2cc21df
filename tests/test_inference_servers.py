"""More inference servers, as their users run them (issue 46 item 4): llama.cpp, vLLM of 2026, Triton with
TensorRT-LLM, each recognised by any of its families and read for what those families allow.

Bodies: the llama.cpp capture of ggml-org/llama.cpp PR #13196 (tests/fixtures/captures, byte for byte), the
Triton TensorRT-LLM backend README's example and the lines vllm-project/vllm-metal#479 quotes (verbatim), and
fixture pairs built from each server's sources (tests/fixtures/inference/README.md says which is which).
Expected figures are worked out here from the fixture text with the plain-text reader of
tests/test_inference.py, never taken from the code under test. The scrapes go over real HTTP
(tests/inference_server.py); a real agent process over all three: tests/test_inference_servers_e2e.py.
"""

from __future__ import annotations

import typing
from pathlib import Path

import pytest

from agent.classifier.serving import serving_view
from agent.classifier.thresholds import DEFAULT_THRESHOLDS
from agent.context.workload.inference.endpoint import InferenceEndpoint
from agent.context.workload.inference.parse import KINDS, detect, parse, rates, recognise, totals
from agent.model import WorkloadReport
from agent.model.specs import spec_by_key
from tests.inference_server import DT, FIXTURES, T0, scraped
from tests.inference_server import server  # noqa: F401 (a fixture)
from tests.test_inference import fixture_series

H100 = spec_by_key("h100-sxm")
CAPTURES = Path(__file__).parent / "fixtures" / "captures"
LLAMACPP_CAPTURE = "llamacpp/llamacpp-pr13196-vulkan-metrics-excerpt.txt"


def total(file: str, name: str, **match: str) -> float:
    """The sum of the samples called ``name`` in a fixture whose labels include ``match``."""
    return sum(v for labels, v in fixture_series(file, name) if all(labels.get(k) == w for k, w in match.items()))


def step(stem: str, name: str, **match: str) -> float:
    """How much the samples called ``name`` grew from ``<stem>-1.prom`` to ``<stem>-2.prom``."""
    return total(f"{stem}-2.prom", name, **match) - total(f"{stem}-1.prom", name, **match)


def text(file: str, *drop: str) -> str:
    """A fixture's text without the lines that contain any of ``drop``."""
    return "\n".join(line for line in (FIXTURES / file).read_text().splitlines()
                     if not any(d in line for d in drop)) + "\n"


def pair(stem: str, kind: str, *drop: str):
    """The rates between the two fixtures of ``stem``, each read without the lines containing ``drop``."""
    a, b = (totals(parse(text(f"{stem}-{i}.prom", *drop)), kind) for i in (1, 2))
    return rates(a, b, DT)


def report(server, stem: str, **endpoint) -> WorkloadReport:
    """The report a scraper makes of the fixture pair ``stem`` served over HTTP, two scrapes ``DT`` apart."""
    scraper = scraped(server.seq(f"{stem}-1.prom", f"{stem}-2.prom"), gpus=["0"], **endpoint)
    got = scraper.report_for(gpu="0", uuid=None, pids=[], now=T0 + DT)
    assert got is not None and got.serving is not None, scraper.status()
    return got


# -- llama.cpp ------------------------------------------------------------------------------------------------


def test_the_llamacpp_capture_is_recognised_and_its_counters_read():
    """PR #13196's four counters, as published: prompt 143 tokens in 8.168 s, 673 predicted in 29.567 s."""
    expo = parse((CAPTURES / LLAMACPP_CAPTURE).read_bytes())
    assert detect(expo) == "llamacpp" and recognise(expo, "auto") == "llamacpp"
    got = totals(expo, "llamacpp")
    assert (got.prompt, got.generated) == ({frozenset(): 143.0}, {frozenset(): 673.0})
    assert got.models == () and got.steps is None  # no labels; n_decode_total is not in the excerpt
    assert (got.serving.prefill_s, got.serving.decode_s) == (8.168, 29.567)
    assert got.serving.itl == {frozenset(): (29.567, 673.0)}


@pytest.mark.slow
def test_llamacpp_figures_match_the_fixture(server):
    stem = "llamacpp-serving"
    got = report(server, stem, model_bytes=4.92e9, model="Llama-3.1-8B-Instruct-Q4_K_M")
    s = got.serving
    running = total(f"{stem}-2.prom", "llamacpp:requests_processing")
    assert (s.running, s.waiting) == (running, total(f"{stem}-2.prom", "llamacpp:requests_deferred")) == (4.0, 6.0)
    tpot = step(stem, "llamacpp:tokens_predicted_seconds_total") / step(stem, "llamacpp:tokens_predicted_total")
    assert s.tpot_s == pytest.approx(tpot) and tpot == pytest.approx(0.02)
    prefill, decode = step(stem, "llamacpp:prompt_seconds_total"), step(stem, "llamacpp:tokens_predicted_seconds_total")
    assert s.prefill_share == pytest.approx(prefill / (prefill + decode / running))  # decode counted once per slot
    assert (s.kv_usage, s.ttft_s, s.preemptions_per_s) == (None, None, None)  # no such family since PR #13660
    tokens = step(stem, "llamacpp:prompt_tokens_total") + step(stem, "llamacpp:tokens_predicted_total")
    assert got.tokens_per_s == pytest.approx(tokens / DT)  # 1.22856e+06 -> 1.23456e+06: C++ stream format
    assert got.step_time_s == pytest.approx(DT / step(stem, "llamacpp:n_decode_total"))
    assert got.source == "llamacpp" and s.server.startswith(f"llamacpp 127.0.0.1:{server.port}/")
    assert s.model == "Llama-3.1-8B-Instruct-Q4_K_M"  # llama.cpp names no model: the configured one
    view = serving_view(got, H100, [], DEFAULT_THRESHOLDS)
    assert view.floor_s == pytest.approx(4.92e9 / H100.mem_bandwidth_bytes_per_s)
    assert view.floor_ratio == pytest.approx(tpot / view.floor_s) and view.floor_ratio > 2.5
    assert view.state == "above_floor"  # the KV cache is not exported: no possible batch to be under


def test_an_older_llamacpp_gives_its_kv_cache_usage_and_a_full_cache_with_a_queue_is_saturated():
    """Releases before PR #13660 (2025-05) export ``llamacpp:kv_cache_usage_ratio`` ("1 means 100 percent")."""
    added = "# TYPE llamacpp:kv_cache_usage_ratio gauge\nllamacpp:kv_cache_usage_ratio 0.96\n"
    a, b = (totals(parse(text(f"llamacpp-serving-{i}.prom") + added), "llamacpp") for i in (1, 2))
    r = rates(a, b, DT)
    assert r.serving.kv_usage == 0.96 and r.serving.waiting == 6.0
    got = WorkloadReport(model_bytes=4.92e9, serving=_serving(r))
    assert serving_view(got, H100, [], DEFAULT_THRESHOLDS).state == "kv_saturated"


def _serving(r):
    from agent.model import ServingReport

    s = r.serving
    return ServingReport(kv_usage=s.kv_usage, running=s.running, waiting=s.waiting, tpot_s=s.tpot_s,
                         prefill_share=s.prefill_share, weight_bytes=4.92e9, gpus=1)


# -- vLLM of 2026 ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_vllm_2026_waits_for_capacity_only_and_is_not_told_to_raise_its_batch(server):
    """12 requests wait, all ``deferred`` (a KV transfer, a LoRA slot): none waits for room in the batch, so a
    batch of 8 in a cache 8 % full is the traffic's, not a cap's. The whole queue used to read as waiting
    for capacity, and the advice was to raise ``max_num_seqs``."""
    stem = "vllm-2026-serving"
    got = report(server, stem, model_bytes=65.5e9)
    s = got.serving
    capacity = total(f"{stem}-2.prom", "vllm:num_requests_waiting_by_reason", reason="capacity")
    assert total(f"{stem}-2.prom", "vllm:num_requests_waiting") == 12.0 and capacity == 0.0
    assert s.waiting == capacity and s.running == 8.0 and s.model == "Qwen/Qwen3-32B"
    itl = step(stem, "vllm:inter_token_latency_seconds_sum") / step(stem, "vllm:inter_token_latency_seconds_count")
    assert s.tpot_s == pytest.approx(itl)
    computed = (step(stem, "vllm:prompt_tokens_total") + step(stem, "vllm:generation_tokens_total")
                - step(stem, "vllm:prompt_tokens_cached_total"))
    assert got.tokens_per_s == pytest.approx(computed / DT)
    assert computed == step(stem, "vllm:prompt_tokens_by_source_total", source="local_compute") + step(
        stem, "vllm:generation_tokens_total"), "the fixture keeps vLLM's invariant"
    view = serving_view(got, H100, [], DEFAULT_THRESHOLDS)
    assert view.floor_ratio == pytest.approx(itl / (65.5e9 / H100.mem_bandwidth_bytes_per_s))
    assert 1.5 < view.floor_ratio <= 2.5 and view.state == "near_floor" and view.advice_code == "none"


def test_prefix_cache_hits_stand_in_for_cached_tokens_where_a_release_lacks_the_counter():
    """vLLM 0.9-0.1x export ``prefix_cache_hits_total`` (tokens) but no ``prompt_tokens_cached_total``: a hit
    costs no prefill FLOPs either way."""
    stem = "vllm-2026-serving"
    r = pair(stem, "vllm", "vllm:prompt_tokens_cached", "vllm:prompt_tokens_by_source")
    hits = step(stem, "vllm:prefix_cache_hits_total")
    assert hits > 0 and r.cached_per_s == pytest.approx(hits / DT)
    assert r.computed_tokens_per_s == pytest.approx(
        (step(stem, "vllm:prompt_tokens_total") + step(stem, "vllm:generation_tokens_total") - hits) / DT)


def test_vllm_is_known_by_a_family_of_2026_alone():
    """An excerpt with only the by-reason queue (or only the sleep state) is still vLLM, with its figure."""
    only = text("vllm-2026-serving-2.prom", "vllm:num_requests_running", "vllm:num_requests_waiting{",
                "vllm:kv_cache", "vllm:prompt", "vllm:generation", "_seconds", "vllm:iteration", "cache_config",
                "vllm:num_preemptions", "vllm:request_", "vllm:prefix", "vllm:external", "vllm:mm_", "sleep_state")
    expo = parse(only)
    assert detect(expo) == "vllm"
    assert totals(expo, "vllm").serving.waiting == total("vllm-2026-serving-2.prom",
                                                          "vllm:num_requests_waiting_by_reason", reason="capacity")
    sleeping = parse('vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="awake"} 0.0\n')
    assert detect(sleeping) == "vllm"


def test_the_elided_by_reason_lines_of_vllm_metal_479_cost_their_lines_and_the_total_queue_stands():
    """``{...,reason="capacity"}`` is no sample line: skipped and counted; the plain gauge gives 6 waiting."""
    expo = parse((FIXTURES / "vllm-metal479-excerpt.prom").read_text())
    assert detect(expo) == "vllm" and expo.skipped == 3
    got = totals(expo, "vllm")
    assert (got.serving.running, got.serving.waiting, got.serving.kv_usage) == (0.0, 6.0, 0.0)
    assert got.models == ("mlx-community/Qwen3.6-27B-5bit",)


# -- Triton and TensorRT-LLM ----------------------------------------------------------------------------------


def test_the_tensorrt_llm_backend_readme_example_is_recognised_and_read():
    """The README's block: scheduled 1, waiting 1, max 512; KV fraction 0.4875 of 6239 blocks of 64 tokens."""
    file = "triton-trtllm-readme.prom"
    expo = parse((FIXTURES / file).read_text())
    assert detect(expo) == "triton"
    got = totals(expo, "triton")
    s = got.serving

    def of(name: str, label: str, value: str) -> float:
        return total(file, name, **{label: value})
    req, kv = "nv_trt_llm_request_metrics", "nv_trt_llm_kv_cache_block_metrics"
    assert (s.running, s.waiting, s.max_running) == (of(req, "request_type", "scheduled"),
                                                      of(req, "request_type", "waiting"), of(req, "request_type", "max"))
    assert s.kv_usage == of(kv, "kv_cache_block_type", "fraction") == 0.4875
    assert s.kv_pool_tokens == of(kv, "kv_cache_block_type", "max") * of(kv, "kv_cache_block_type", "tokens_per")
    assert got.steps == {frozenset({("model", "tensorrt_llm"), ("version", "1"),
                                    ("general_type", "iteration_counter")}): 0.0}
    assert got.models == ("tensorrt_llm",) and not got.has_tokens


@pytest.mark.slow
def test_triton_with_tensorrt_llm_figures_match_the_fixture(server):
    stem, second = "triton-serving", "triton-serving-2.prom"
    llm = {"model": "tensorrt_llm"}
    got = report(server, stem, model_bytes=16.06e9, kv_bytes_per_token=131072)
    s = got.serving
    req, kv = "nv_trt_llm_request_metrics", "nv_trt_llm_kv_cache_block_metrics"
    assert s.running == total(second, req, request_type="scheduled") == 24.0
    # The executor's waiting requests and every model's pending ones (2 wait in preprocessing).
    assert s.waiting == total(second, req, request_type="waiting") + total(second, "nv_inference_pending_request_count")
    assert s.waiting == 32.0 and s.max_running == total(second, req, request_type="max") == 64
    assert s.kv_usage == pytest.approx(total(second, kv, kv_cache_block_type="fraction"))
    pool = total(second, kv, kv_cache_block_type="max") * total(second, kv, kv_cache_block_type="tokens_per")
    assert s.kv_cache_bytes == pytest.approx(pool * 131072)
    first_n = step(stem, "nv_inference_first_response_histogram_ms_count", **llm)
    first_s = step(stem, "nv_inference_first_response_histogram_ms_sum", **llm) / 1e3
    assert s.ttft_s == pytest.approx(first_s / first_n) and s.ttft_s == pytest.approx(0.35)  # the engine's, not the ensemble's
    out = step(stem, "nv_llm_output_token_len_sum")
    after_first = step(stem, "nv_inference_request_duration_us", **llm) / 1e6 - first_s
    assert s.tpot_s == pytest.approx(after_first / (out - first_n)) and s.tpot_s == pytest.approx(0.025)
    assert got.tokens_per_s == pytest.approx((step(stem, "nv_llm_input_token_len_sum") + out) / DT)
    assert s.generated_tokens_per_s == pytest.approx(out / DT)
    assert got.step_time_s == pytest.approx(DT / step(stem, "nv_trt_llm_general_metrics", general_type="iteration_counter"))
    assert (got.source, s.model, s.prefill_share, s.preemptions_per_s) == ("triton", "tensorrt_llm", None, None)
    view = serving_view(got, H100, [], DEFAULT_THRESHOLDS)
    assert view.state == "kv_saturated" and view.advice_code == "scale_out" and "32 requests waiting" in view.advice


def test_without_the_first_response_histogram_the_time_per_token_is_the_backends_compute_time():
    stem = "triton-serving"
    r = pair(stem, "triton", "nv_inference_first_response_histogram_ms")
    compute = step(stem, "nv_inference_compute_infer_duration_us", model="tensorrt_llm") / 1e6
    assert r.serving.ttft_s is None
    assert r.serving.tpot_s == pytest.approx(compute / step(stem, "nv_llm_output_token_len_sum"))


def test_a_triton_server_without_tensorrt_llm_is_known_by_its_queue():
    """Any Triton model: the pending requests are its queue; no batch, KV or token figure is made up."""
    body = ("# TYPE nv_inference_pending_request_count gauge\n"
            'nv_inference_pending_request_count{model="resnet50",version="1"} 7\n'
            'nv_inference_pending_request_count{model="bert",version="2"} 3\n'
            'nv_inference_request_success{model="resnet50",version="1"} 1200\n')
    expo = parse(body)
    assert detect(expo) == "triton"
    got = totals(expo, "triton")
    assert got.serving.waiting == 10.0 and got.serving.running is None and got.serving.kv_usage is None
    assert got.models == ("bert", "resnet50") and not got.has_tokens


# -- bounds, labels and settings ------------------------------------------------------------------------------


@pytest.mark.parametrize(("file", "kind", "old", "new", "named"), [
    ("llamacpp-serving-2.prom", "llamacpp", "llamacpp:requests_processing 4", "llamacpp:requests_processing 1e308",
     "llamacpp:requests_processing: running requests 1e+308"),
    ("llamacpp-serving-2.prom", "llamacpp", "llamacpp:tokens_predicted_seconds_total 8064.68",
     "llamacpp:tokens_predicted_seconds_total 1e308", "llamacpp:tokens_predicted_seconds["),
    ("triton-serving-2.prom", "triton", 'request_type="waiting",version="1"} 30',
     'request_type="waiting",version="1"} 1e308', "nv_inference_pending_request_count[+waiting]{"),
    ("triton-serving-2.prom", "triton", 'model="tensorrt_llm",version="1"} 0.960090',
     'model="tensorrt_llm",version="1"} 7', "nv_trt_llm_kv_cache_block_metrics[fraction]{"),
    ("vllm-2026-serving-2.prom", "vllm", 'reason="capacity"} 0.0', 'reason="capacity"} -1e308',
     "vllm:num_requests_waiting_by_reason[capacity]{"),
], ids=["llamacpp-running", "llamacpp-time", "triton-waiting", "triton-kv", "vllm-capacity"])
def test_the_serving_bounds_hold_the_new_families(file, kind, old, new, named):
    """A value no server can have is left out of its figure, counted, and named with the series it came from."""
    body = (FIXTURES / file).read_text()
    assert old in body
    got = totals(parse(body.replace(old, new)), kind).serving
    assert got.rejected.count >= 1 and named in got.rejected.first, got.rejected
    clean = totals(parse(body), kind).serving
    assert clean.rejected.count == 0


def test_the_label_bounds_hold_triton_models():
    """A Triton body naming 1,000 models keeps the first 64 and refuses the rest, counted, before storing them."""
    body = "".join(f'nv_inference_pending_request_count{{model="m{i:04d}",version="1"}} 1\n' for i in range(1000))
    expo = parse(body)
    assert expo.refused == 1000 - 64 and "model > 64 values" in expo.refused_note
    assert totals(expo, "triton").serving.waiting == 64.0


def test_every_server_kind_is_a_setting_and_a_report_source():
    """One list of kinds (parse.KINDS): each may be configured, and a report naming it survives a trace."""
    for kind in KINDS:
        assert InferenceEndpoint(url="http://h/m", kind=kind).kind == kind
    sources = typing.get_args(typing.get_args(typing.get_type_hints(WorkloadReport)["source"])[0])
    assert set(KINDS) <= set(sources), sources
