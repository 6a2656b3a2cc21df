"""Tests for the classifier rules, roofline/MFU arithmetic, hysteresis and honesty about missing data."""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

import pytest
from pydantic import ValidationError

from agent.classifier.engine import Classifier, classify_samples
from agent.classifier.evaluate import evaluate
from agent.classifier.features import step_statistics, step_times, window_features
from agent.classifier.peaks import mig_profile, spec_for_sample
from agent.classifier.roofline import roofline
from agent.classifier.decision import decide
from agent.classifier.evidence import evidence_of
from agent.classifier.explain import DETAILS, explain
from agent.classifier.jobs import JobContext
from agent.classifier.rules import score
from agent.classifier.scoring import sigmoid
from agent.classifier.thresholds import DEFAULT_THRESHOLDS, SOURCES, Thresholds
from agent.model import GpuSample, Verdict, WorkloadReport
from agent.model.specs import spec_by_key
from agent.virtual.engine import VirtualEngine
from agent.virtual.scenario import parse_scenario

T0 = 1_800_000_000.0


def engine_for(*workloads: dict[str, Any], model: str = "h100-sxm", gpus: int | None = None, seed: int = 5,
               **node: Any) -> VirtualEngine:
    count = gpus if gpus is not None else max((g for w in workloads for g in w["gpus"]), default=0) + 1
    spec = {"name": "n", "model": model, "gpus": count, "workloads": list(workloads), **node}
    return VirtualEngine(parse_scenario({"name": "t", "seed": seed, "nodes": [spec]}))


def job(name: str, gpus: list[int], *phases: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"job": name, "gpus": gpus, "phases": list(phases), **extra}


def verdicts_of(engine: VirtualEngine, seconds: float, **kw: Any) -> list[Verdict]:
    return list(classify_samples(engine.iter_trace(seconds, 1.0, start_ts=T0), **kw))


def settled(verdicts: list[Verdict], gpu: str = "0", after_s: float = 40.0) -> list[Verdict]:
    return [v for v in verdicts if v.gpu == gpu and v.window_end - T0 >= after_s]


def dominant(verdicts: list[Verdict]) -> str:
    return Counter(v.cls for v in verdicts).most_common(1)[0][0]


# ----------------------------------------------------------------------------- each class


@pytest.mark.parametrize(
    ("phase", "expected"),
    [
        ({"kind": "compute", "duration_s": 300, "mfu": 0.8}, "compute_bound"),
        ({"kind": "compute", "duration_s": 300, "mfu": 0.4}, "compute_bound"),
        ({"kind": "memory", "duration_s": 300, "mbu": 0.55}, "memory_bound"),
        ({"kind": "latency", "duration_s": 300}, "latency_bound"),
        ({"kind": "input_starved", "duration_s": 300, "duty": 0.55}, "input_starved"),
        ({"kind": "idle_held", "duration_s": 300}, "idle"),
        ({"kind": "idle", "duration_s": 300}, "idle"),
    ],
)
def test_steady_single_gpu_workloads_get_their_class(phase: dict[str, Any], expected: str) -> None:
    verdicts = settled(verdicts_of(engine_for(job("j", [0], phase)), 120))
    assert verdicts and all(v.cls == expected for v in verdicts), Counter(v.cls for v in verdicts)
    assert min(v.confidence for v in verdicts) > 0.5


def test_at_roof_and_leaning_are_told_apart() -> None:
    at_roof = settled(verdicts_of(engine_for(job("j", [0], {"kind": "compute", "duration_s": 200, "mfu": 0.85})), 90))
    leaning = settled(verdicts_of(engine_for(job("j", [0], {"kind": "compute", "duration_s": 200, "mfu": 0.4})), 90))
    assert {v.detail for v in at_roof} == {"at_roof"}
    assert {v.detail for v in leaning} == {"leaning"}


def test_straggler_and_its_victims_are_both_jittered() -> None:
    phase = {"kind": "comm_jitter", "duration_s": 400, "mfu": 0.5, "compute_s": 1.6, "comm_s": 0.7,
             "stall_prob": 0.0, "straggler_rank": 1, "straggler_slowdown": 1.4}
    verdicts = verdicts_of(engine_for(job("ddp", [0, 1, 2], phase)), 200)
    straggler, victim = settled(verdicts, "1", 60), settled(verdicts, "0", 60)
    assert dominant(straggler) == "communication_jittered" and dominant(victim) == "communication_jittered"
    assert Counter(v.detail for v in straggler).most_common(1)[0][0] == "straggler"
    assert Counter(v.detail for v in victim).most_common(1)[0][0] == "straggler_victim"
    # The straggler looks busy: its own tensor activity is the highest of the job.
    assert straggler[-1].features.tensor_mean > victim[-1].features.tensor_mean
    assert victim[-1].rank_skew >= DEFAULT_THRESHOLDS.rank_skew


def test_steady_multi_gpu_training_is_not_jitter() -> None:
    phase = {"kind": "comm_jitter", "duration_s": 400, "mfu": 0.5, "compute_s": 1.6, "comm_s": 0.3,
             "stall_prob": 0.0, "step_jitter": 0.01, "link_util": 0.3}
    verdicts = settled(verdicts_of(engine_for(job("ddp", [0, 1], phase)), 200), "0", 60)
    assert dominant(verdicts) == "compute_bound"


def test_starvation_sub_reasons_follow_host_evidence() -> None:
    loader = {"kind": "input_starved", "duration_s": 200, "duty": 0.5, "dataloader_cpu_cores": 8.0}
    fetch = {"kind": "input_starved", "duration_s": 200, "duty": 0.5, "dataloader_cpu_cores": 0.2, "iowait": 0.2}
    launch = {"kind": "input_starved", "duration_s": 200, "duty": 0.5, "dataloader_cpu_cores": 0.0}
    for phase, detail in ((loader, "dataloader"), (fetch, "io"), (launch, "host_launch")):
        verdicts = settled(verdicts_of(engine_for(job("j", [0], phase)), 90))
        assert {v.cls for v in verdicts} == {"input_starved"}
        assert {v.detail for v in verdicts} == {detail}, phase


def test_power_capped_gemm_is_compute_bound_and_flagged() -> None:
    verdicts = settled(verdicts_of(engine_for(job("j", [0], {"kind": "compute", "duration_s": 200, "mfu": 0.8,
                                                               "power_cap_w": 350})), 90))
    assert {v.cls for v in verdicts} == {"compute_bound"}
    assert all(v.throttled for v in verdicts)
    assert any("power cap" in r for r in verdicts[-1].reasons)
    free = settled(verdicts_of(engine_for(job("j", [0], {"kind": "compute", "duration_s": 200, "mfu": 0.6})), 90))
    assert not any(v.throttled for v in free)


def test_thermal_slowdown_is_severe() -> None:
    verdicts = settled(verdicts_of(engine_for(job("j", [0], {"kind": "compute", "duration_s": 200, "mfu": 0.6,
                                                               "thermal": True})), 90))
    assert all(v.throttled and v.throttle_severe for v in verdicts)


# ----------------------------------------------------------------------------- MFU, MBU, roofline


def test_counter_and_workload_mfu_agree_with_the_simulated_truth() -> None:
    phase = {"kind": "compute", "duration_s": 200, "mfu": 0.42, "flops_per_token": 4.8e10}
    v = settled(verdicts_of(engine_for(job("j", [0], phase)), 90))[-1]
    r = v.roofline
    assert r.mfu_workload == pytest.approx(0.42, abs=0.01)
    assert r.mfu_counters == pytest.approx(0.42, abs=0.02)
    assert r.mfu == r.mfu_workload and r.mfu_source == "workload"
    spec = spec_by_key("h100-sxm")
    assert r.ridge_point == pytest.approx(spec.peak_flops["bf16"] / spec.mem_bandwidth_bytes_per_s)
    assert r.achieved_flops >= r.mfu_counters * spec.peak_flops["bf16"]  # plus the FP pipes
    assert r.intensity == pytest.approx(r.achieved_flops / r.achieved_bytes_per_s)
    assert r.compute_headroom == pytest.approx(1 - r.achieved_flops / spec.peak_flops["bf16"])
    assert not r.dtype_assumed  # the workload said bf16


def test_dtype_is_flagged_when_assumed_and_configurable() -> None:
    sample = GpuSample(ts=T0, gpu="0", vendor="nvidia", model="NVIDIA H100 80GB HBM3", gr_active=1.0,
                       tensor_active=0.5, dram_active=0.2, sm_clock_mhz=1830.0)
    spec = spec_for_sample(sample)
    f = window_features([sample], [sample], spec, DEFAULT_THRESHOLDS)
    assumed, fp8 = roofline(f, spec), roofline(f, spec, "fp8")
    assert assumed.dtype == "bf16" and assumed.dtype_assumed
    assert fp8.dtype == "fp8" and not fp8.dtype_assumed
    assert fp8.achieved_flops == pytest.approx(2 * assumed.achieved_flops, rel=0.01)
    assert fp8.mfu_counters == pytest.approx(assumed.mfu_counters)  # same activity, same share of its peak


def test_mbu_from_workload_report_and_from_counters() -> None:
    spec = spec_by_key("h100-sxm")
    report = WorkloadReport(job="decode", world_size=1, step_time_s=0.01, model_bytes=16e9, tokens_per_s=100.0)
    sample = GpuSample(ts=T0, gpu="0", vendor="nvidia", model="NVIDIA H100 80GB HBM3", gr_active=1.0,
                       dram_active=0.5, workload=report)
    f = window_features([sample], [sample], spec, DEFAULT_THRESHOLDS)
    r = roofline(f, spec)
    assert r.mbu_workload == pytest.approx(16e9 / 0.01 / spec.mem_bandwidth_bytes_per_s)
    assert r.mbu_counters == pytest.approx(0.5) and r.mbu_source == "workload"


def test_gpu_without_tensor_counter_has_no_counter_mfu_and_lower_confidence() -> None:
    phase = {"kind": "compute", "duration_s": 200, "mfu": 0.7}
    full = settled(verdicts_of(engine_for(job("j", [0], phase), model="mi300x", counters="full"), 90))
    amd = settled(verdicts_of(engine_for(job("j", [0], phase), model="mi300x"), 90))
    assert all(v.roofline.mfu_counters is None and v.roofline.achieved_flops is None for v in amd)
    assert all(v.roofline.mfu_counters is not None for v in full)
    assert dominant(amd) == "compute_bound" and dominant(full) == "compute_bound"
    assert max(v.confidence for v in amd) < min(v.confidence for v in full)
    assert any("no tensor" in r for r in amd[-1].reasons)


def test_unreadable_counters_give_unknown_not_a_crash() -> None:
    phase = {"kind": "compute", "duration_s": 200, "mfu": 0.7}
    verdicts = settled(verdicts_of(engine_for(job("j", [0], phase), counters="minimal"), 90))
    assert {v.cls for v in verdicts} == {"unknown"}
    assert {v.detail for v in verdicts} == {"no_counters"}
    assert all(v.confidence == 0.0 for v in verdicts)
    bare = [GpuSample(ts=T0 + k, gpu="0") for k in range(60)]  # nothing but the required fields
    out = list(classify_samples(bare))
    assert out and {v.cls for v in out} == {"unknown"} and all(v.roofline.mfu is None for v in out)


def test_gaps_in_a_window_lower_validity_to_unknown() -> None:
    samples = list(engine_for(job("j", [0], {"kind": "compute", "duration_s": 200, "mfu": 0.7})).iter_trace(120, 1.0, start_ts=T0))
    holey = [s for s in samples if not (60 <= s.ts - T0 < 90)]  # the GPU was down for 30 s
    during = [v for v in classify_samples(holey) if 85 <= v.window_end - T0 <= 90]
    assert during and all(v.cls == "unknown" for v in during)


def test_mig_instance_name_resolves_to_a_scaled_spec() -> None:
    assert mig_profile("NVIDIA H100 80GB HBM3 MIG 3g.40gb") == ("NVIDIA H100 80GB HBM3", 3, 40)
    assert mig_profile("NVIDIA H100 80GB HBM3") is None
    parent = spec_by_key("h100-sxm")
    spec = spec_for_sample(GpuSample(ts=T0, gpu="0/1", vendor="nvidia", model="NVIDIA H100 80GB HBM3 MIG 3g.40gb"))
    assert spec.peak_flops["bf16"] == pytest.approx(parent.peak_flops["bf16"] * 3 / 7)
    assert spec.mem_bandwidth_bytes_per_s == pytest.approx(parent.mem_bandwidth_bytes_per_s * 0.5)


# ----------------------------------------------------------------------------- stability


def test_steady_jittered_job_does_not_flap() -> None:
    phase = {"kind": "comm_jitter", "duration_s": 900, "mfu": 0.5, "compute_s": 1.5, "comm_s": 0.7,
             "stall_prob": 0.3, "stall_s": 2.0}
    verdicts = verdicts_of(engine_for(job("ddp", [0, 1, 2, 3], phase)), 600)
    for gpu in "0123":
        published = [v.cls for v in settled(verdicts, gpu, 60)]
        changes = sum(1 for a, b in zip(published, published[1:]) if a != b)
        assert changes <= 1, (gpu, Counter(published))


def test_hysteresis_holds_the_incumbent_until_a_challenger_wins_twice() -> None:
    t = Thresholds(min_dwell_s=0.0)
    engine = engine_for(job("j", [0], {"kind": "compute", "duration_s": 60, "mfu": 0.7},
                            {"kind": "memory", "duration_s": 60, "mbu": 0.6}))
    verdicts = [v for v in verdicts_of(engine, 120, thresholds=t) if v.gpu == "0"]
    switch = next(i for i, v in enumerate(verdicts) if v.cls == "memory_bound")
    assert verdicts[switch].raw_class == "memory_bound" and verdicts[switch - 1].raw_class == "memory_bound"
    assert verdicts[switch - 1].cls == "compute_bound"
    assert any(r.startswith("holding compute_bound") for r in verdicts[switch - 1].reasons)


# ----------------------------------------------------------------------------- pure parts


def test_step_statistics_ignore_a_level_shift_but_see_dispersion() -> None:
    def trace(times: list[float]) -> list[GpuSample]:
        return [GpuSample(ts=T0 + k, gpu="0", workload=WorkloadReport(step=k, step_time_s=x)) for k, x in enumerate(times)]

    steady_then_slow = [1.0] * 20 + [2.5] * 10
    cv, n = step_statistics(step_times(trace(steady_then_slow))[0], 30, 5)
    assert n == 5 and cv == pytest.approx(0.0)
    jittered = [1.0, 1.0, 3.0, 1.0, 1.0, 1.0, 2.8, 1.0, 1.0, 1.0] * 3
    cv, n = step_statistics(step_times(trace(jittered))[0], 30, 5)
    assert n == 30 and cv > 0.5


def test_scores_are_monotonic_logistic_steps() -> None:
    assert sigmoid(0.0) == pytest.approx(0.5)
    assert sigmoid(-800.0) == 0.0 and sigmoid(800.0) == 1.0
    assert sigmoid(1.0) > sigmoid(0.5) > sigmoid(-0.5)


def test_decide_reports_only_known_detail_codes() -> None:
    engine = engine_for(job("j", [0], {"kind": "input_starved", "duration_s": 100, "duty": 0.5}))
    samples = list(engine.iter_trace(40, 1.0, start_ts=T0))
    spec = spec_by_key("h100-sxm")
    f = window_features(samples[-20:], samples, spec, DEFAULT_THRESHOLDS)
    e = evidence_of(f, roofline(f, spec), JobContext(), 20, DEFAULT_THRESHOLDS)
    rules = score(e, DEFAULT_THRESHOLDS)
    d = decide(e, rules, DEFAULT_THRESHOLDS)
    assert d.cls == "input_starved" and explain(d.cls, d, e, rules, DEFAULT_THRESHOLDS).detail in DETAILS
    assert set(d.scores) == {"idle", "compute_bound", "memory_bound", "input_starved", "communication_jittered", "latency_bound"}


def test_every_threshold_has_a_source_and_ordering_is_enforced() -> None:
    assert set(SOURCES) == set(Thresholds.model_fields)
    assert all(kind and source for kind, source in SOURCES.values())
    with pytest.raises(ValidationError, match="dominant_roof_exit"):
        Thresholds(dominant_roof=0.3, dominant_roof_exit=0.4)
    with pytest.raises(ValidationError, match="window_s"):
        Thresholds(window_s=400.0)
    with pytest.raises(ValidationError):
        Thresholds(bogus=1)  # type: ignore[call-arg]


def test_streaming_classifier_ignores_repeated_samples_and_forgets_silent_gpus() -> None:
    samples = list(engine_for(job("j", [0], {"kind": "compute", "duration_s": 100, "mfu": 0.7})).iter_trace(30, 1.0, start_ts=T0))
    c = Classifier()
    for s in samples:
        c.observe(s)
        c.observe(s)
    once = Classifier()
    for s in samples:
        once.observe(s)
    a, b = c.evaluate(T0 + 30), once.evaluate(T0 + 30)
    assert [dataclasses.replace(v, features=None) for v in a] == [dataclasses.replace(v, features=None) for v in b]
    assert c.evaluate(T0 + 30 + DEFAULT_THRESHOLDS.long_window_s + 1) == [] and not c.tracking


def test_evaluation_skips_settling_windows_and_counts_errors() -> None:
    engine = engine_for(job("j", [0], {"kind": "compute", "duration_s": 100, "mfu": 0.7},
                            {"kind": "idle", "duration_s": 100}))
    verdicts = verdicts_of(engine, 200)
    result = evaluate(verdicts)
    assert result.settling >= 2 * 30 / DEFAULT_THRESHOLDS.evaluate_every_s - 2
    assert result.recall("compute_bound") == 1.0 and result.recall("idle") == 1.0
    forced = [dataclasses.replace(v, cls="memory_bound") for v in verdicts]
    wrong = evaluate(forced)
    assert wrong.recall("compute_bound") == 0.0 and wrong.precision("memory_bound") == 0.0
    assert "| compute_bound |" in wrong.table()


@pytest.mark.parametrize(("attribution", "processes", "detail", "named"), [
    ({"namespace": "ml", "pod": "notebook-0"}, None, "idle_held", "pod ml/notebook-0"),  # dcgm-exporter: no process list
    ({"namespace": "ml", "pod": "notebook-0"}, (), "idle_held", "pod ml/notebook-0"),  # allocated, no process yet
    ({"job_id": "4711"}, None, "idle_held", "job 4711"),
    (None, None, "idle_free", None),
    (None, (), "idle_free", None),
])
def test_an_idle_gpu_allocated_by_the_scheduler_is_held_whether_or_not_a_process_shows(attribution, processes,
                                                                                        detail, named):
    """A GPU a pod or job was given cannot be handed out, so idle on it is waste held, not free
    capacity: dcgm-exporter's pod labels say so where there is no process list at all."""
    from agent.model import Attribution

    samples = [GpuSample(ts=T0 + i, gpu="0", node="n", uuid="GPU-1", vendor="nvidia", model="NVIDIA L40S",
                         interval_s=1.0, gr_active=0.0, processes=processes,
                         attribution=Attribution(**attribution) if attribution else None) for i in range(90)]
    last = [v for v in classify_samples(samples) if v.gpu == "0"][-1]
    assert (last.cls, last.detail) == ("idle", detail)
    assert named is None or any(named in reason for reason in last.reasons), last.reasons


def _t4(i: int, **fields: Any) -> GpuSample:
    """A T4 as NVIDIA/dcgm-exporter#662 describes one under load: GPU_UTIL 91 %, 68 of 70 W, 660 of
    1,590 MHz; dcgm-exporter's default CSV exports no clock-event reasons."""
    values = dict(gr_active=0.91, mem_busy=0.73, power_w=68.0, power_limit_w=70.0, sm_clock_mhz=660.0,
                  sm_clock_max_mhz=1590.0)
    values.update(fields)
    return GpuSample(ts=T0 + i, gpu="0", node="n", uuid="GPU-t4", vendor="nvidia", model="Tesla T4",
                     interval_s=1.0, **values)


def test_without_clock_event_reasons_the_throttle_is_unknown_and_a_power_cap_is_called_likely():
    """Before, no reasons read as "not throttled" (throttled 0, throttle="none") even for a T4 held at
    its power limit at 42 % of its clock."""
    capped = [v for v in classify_samples([_t4(i) for i in range(90)]) if v.gpu == "0"][-1]
    assert (capped.throttled, capped.throttle) == (False, "likely_power_capped")
    assert any(r.startswith("likely power-capped: power at 97% of its limit") for r in capped.reasons), capped.reasons
    cool = [v for v in classify_samples([_t4(i, power_w=40.0) for i in range(90)]) if v.gpu == "0"][-1]
    assert cool.throttle == "unknown" and not any("power-capped" in r for r in cool.reasons)
    read = [v for v in classify_samples([_t4(i, clock_event_reasons=0x4) for i in range(90)]) if v.gpu == "0"][-1]
    assert (read.throttled, read.throttle) == (True, "severe"), "with the SW power cap bit it is known"
    assert read.to_json()["throttle"] == "severe" and capped.to_json()["throttle"] == "likely_power_capped"


def test_profiling_counters_that_contradict_utilisation_and_power_give_no_class():
    """NVIDIA/dcgm-exporter#662: a T4 under full load, GPU_UTIL 91 %, MEM_COPY_UTIL 73 %, power at its
    limit, while PROF_GR_ENGINE_ACTIVE reads 0.156. It was called input_starved."""
    dead = [_t4(i, gr_active=0.156, util_gpu=0.91) for i in range(90)]
    verdict = [v for v in classify_samples(dead) if v.gpu == "0"][-1]
    assert (verdict.cls, verdict.detail, verdict.counters_suspect) == ("unknown", "counters_disagree", True)
    assert verdict.features.duty_check == pytest.approx((0.156, 0.91))
    (why,) = [r for r in verdict.reasons if r.startswith("counters disagree")]
    assert "91% busy" in why and "16%" in why and "power at 97%" in why
    agree = [v for v in classify_samples([_t4(i, gr_active=0.88, util_gpu=0.91) for i in range(90)]) if v.gpu == "0"][-1]
    assert agree.detail != "counters_disagree" and not agree.counters_suspect
    quiet = [_t4(i, gr_active=0.05, util_gpu=0.60, power_w=20.0) for i in range(90)]
    sides = [v for v in classify_samples(quiet) if v.gpu == "0"][-1]
    assert sides.detail != "counters_disagree", "power at 29% sides with the profiling counter"
