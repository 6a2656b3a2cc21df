"""The serving view (agent.classifier.serving): the decode floor, the multiple, and the state with its advice.

Expected floors are computed here from published figures: an H100 SXM moves 3.35e12 B/s (HBM3) and
peaks at 989.4 TFLOP/s dense bf16 (the spec catalogue's datasheet values); Llama-3.1-8B in bf16 is
16.06e9 bytes of weights and about 2 x 8.03e9 FLOPs per token.
"""

from __future__ import annotations

import pytest

from agent.classifier.serving import serving_view
from agent.classifier.thresholds import DEFAULT_THRESHOLDS, Thresholds
from agent.model import GpuSample, ServingReport, WorkloadReport
from agent.model.specs import spec_by_key

H100 = spec_by_key("h100-sxm")
BW, PEAK = 3.35e12, 989.4e12
WEIGHTS, FLOPS = 16.06e9, 16.06e9


def view(t: Thresholds = DEFAULT_THRESHOLDS, window=(), spec=H100, world_size=1, **serving):
    report = WorkloadReport(model_bytes=WEIGHTS, flops_per_token=FLOPS, world_size=world_size, dtype="bf16",
                            serving=ServingReport(**serving))
    return serving_view(report, spec, list(window), t)


def test_the_catalogue_has_the_published_h100_figures_these_tests_rely_on():
    assert H100.mem_bandwidth_bytes_per_s == BW and H100.peak_flops["bf16"] == pytest.approx(PEAK, rel=1e-3)


def test_batch_one_decode_at_1_2x_the_weight_read_is_at_the_floor():
    v = view(running=1, waiting=0, kv_usage=0.0, kv_cache_bytes=40e9, tpot_s=1.2 * WEIGHTS / BW)
    assert v.floor_s == pytest.approx(WEIGHTS / BW) and v.floor_s == pytest.approx(4.79e-3, rel=1e-2)
    assert v.floor_ratio == pytest.approx(1.2) and v.state == "at_floor"
    assert "quantised" in v.advice and v.advice_code == "faster_memory_or_fewer_bytes"


def test_the_kv_cache_read_raises_the_floor_with_the_batch():
    v = view(running=32, kv_usage=0.5, kv_cache_bytes=16.8e9, tpot_s=0.01)
    assert v.kv_bytes_read == pytest.approx(8.4e9)
    assert v.floor_memory_s == pytest.approx((WEIGHTS + 8.4e9) / BW)
    assert v.floor_compute_s == pytest.approx(32 * FLOPS / PEAK)
    assert v.floor_s == v.floor_memory_s  # decode at batch 32 stays memory-bound


def test_tensor_parallel_gpus_share_the_read():
    one, two = view(running=1, tpot_s=0.01), view(running=1, tpot_s=0.01, gpus=2)
    assert two.floor_s == pytest.approx(one.floor_s / 2) and two.gpus == 2


def test_a_large_batch_meets_the_compute_roof():
    v = view(running=512, kv_usage=0.1, kv_cache_bytes=1e9, tpot_s=0.01)
    assert v.floor_compute_s == pytest.approx(512 * FLOPS / PEAK) and v.floor_s == v.floor_compute_s
    assert v.state == "at_floor" and "compute floor" in v.advice


def test_without_a_pool_size_the_kv_pool_is_estimated_from_memory_held_and_said_so():
    window = [GpuSample(ts=float(i), gpu="0", mem_used_bytes=int(72e9)) for i in range(3)]
    v = view(window=window, running=8, kv_usage=0.25, tpot_s=0.01)
    assert v.kv_bytes_estimated and v.kv_bytes_read == pytest.approx((72e9 - WEIGHTS) * 0.25)
    assert any("estimated from the memory held" in r for r in v.reasons)
    bare = view(running=8, kv_usage=0.25, tpot_s=0.01)
    assert bare.kv_bytes_read is None and bare.floor_s == pytest.approx(WEIGHTS / BW)
    assert any("counts the weights only" in r for r in bare.reasons)


def test_requests_waiting_on_a_full_kv_cache_mean_scale_out():
    v = view(running=60, waiting=30, kv_usage=0.95, kv_cache_bytes=40e9, tpot_s=0.02)
    assert v.state == "kv_saturated" and v.advice_code == "scale_out"
    preempting = view(running=60, waiting=5, kv_usage=0.7, preemptions_per_s=2.0, tpot_s=0.02)
    assert preempting.state == "kv_saturated" and "preempted" in preempting.advice


def test_prefill_taking_much_of_the_gpu_while_decode_lags_is_prefill_heavy():
    v = view(running=24, kv_usage=0.5, kv_cache_bytes=40e9, tpot_s=0.03, prefill_share=0.45)
    assert v.state == "prefill_heavy" and "disaggregate" in v.advice
    at_floor = view(running=1, tpot_s=1.1 * WEIGHTS / BW, prefill_share=0.45)
    assert at_floor.state == "at_floor"  # prefill does not hurt a server already at its floor


def test_a_batch_held_at_its_cap_with_a_queue_and_free_kv_is_under_batched():
    v = view(running=4, waiting=12, max_running=4, kv_usage=0.066, kv_cache_bytes=40e9, tpot_s=0.0075)
    assert v.state == "under_batched" and v.advice_code == "raise_batch"
    assert v.possible_batch == pytest.approx(4 / 0.066) and "max_num_seqs" in v.advice


def test_a_small_batch_without_a_queue_is_the_traffic_not_the_server():
    v = view(running=4, waiting=0, kv_usage=0.066, kv_cache_bytes=40e9, tpot_s=0.02)
    assert v.state == "above_floor" and v.advice_code == "find_overhead"
    assert any("the traffic, not the server" in r for r in v.reasons)


def test_near_and_far_from_the_floor_follow_the_thresholds():
    floor = WEIGHTS / BW
    assert view(running=1, tpot_s=2.0 * floor).state == "near_floor"
    assert view(running=1, tpot_s=3.0 * floor).state == "above_floor"
    strict = Thresholds(serving_at_floor_ratio=1.1, serving_far_ratio=1.5)
    assert view(strict, running=1, tpot_s=1.3 * floor).state == "near_floor"
    with pytest.raises(ValueError, match="serving_at_floor_ratio"):
        Thresholds(serving_at_floor_ratio=3.0, serving_far_ratio=2.0)


def test_missing_weights_or_latency_give_unknown_with_what_is_missing():
    report = WorkloadReport(serving=ServingReport(running=1, tpot_s=0.01))
    v = serving_view(report, H100, [], DEFAULT_THRESHOLDS)
    assert v.state == "unknown" and "model_bytes" in v.advice and v.floor_s is None
    no_latency = view(running=1)
    assert no_latency.state == "unknown" and "time per output token" in no_latency.reasons[-1]
    assert serving_view(WorkloadReport(tokens_per_s=10.0), H100, [], DEFAULT_THRESHOLDS) is None
    assert view(spec=None, running=1, tpot_s=0.01).state == "unknown"


def test_tokens_per_second_per_gpu():
    v = view(running=8, tpot_s=0.01, generated_tokens_per_s=800.0, gpus=2)
    assert v.tokens_per_s_per_gpu == pytest.approx(400.0)


def test_a_serving_gpus_workload_mbu_counts_the_kv_cache_read():
    from agent.classifier.engine import classify_samples

    serving = ServingReport(running=32, kv_usage=0.5, kv_cache_bytes=16.8e9, tpot_s=0.01, gpus=1)
    report = WorkloadReport(model_bytes=WEIGHTS, flops_per_token=FLOPS, world_size=1, dtype="bf16",
                            tokens_per_s=3200.0, step_time_s=0.01, serving=serving)
    samples = [GpuSample(ts=1_800_000_000.0 + i, gpu="0", model="NVIDIA H100 80GB HBM3", interval_s=1.0, gr_active=0.95,
                         dram_active=0.7, workload=report) for i in range(30)]
    verdict = list(classify_samples(samples))[-1]
    assert verdict.roofline.mbu_workload == pytest.approx((WEIGHTS + 8.4e9) / 0.01 / BW)  # Databricks: params + KV
    assert verdict.roofline.mbu_workload > WEIGHTS / 0.01 / BW  # what the report's weights alone would say
