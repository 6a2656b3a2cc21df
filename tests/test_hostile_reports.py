"""Workload reports whose numbers are each in range but whose product is not, and reports for GPUs
that are not there.

A report is data another person controls: ``tokens_per_s`` and ``flops_per_token`` of 1e18 each
pass the schema (``Count`` allows up to 1e18) and used to give an MFU of 1e21, exported as a
number. The chain below is the agent's own, in process: the store takes the body, the collection
loop's lookup hands the report to a sample, the classifier judges the window, and the snapshot is
rendered as the exposition, the JSON API, the status page and the verdict line.
"""

from __future__ import annotations

import json

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.classifier.engine import Classifier
from agent.classifier.roofline import MAX_UTILISATION, roofline
from agent.context.workload.report_store import ReportStore
from agent.model import CollectorHealth, DeviceInfo, DeviceState, GpuSample, NodeSnapshot
from agent.model.specs import spec_by_key
from agent.views.status_page import status_page
from exporters.prometheus import families_for
from exporters.snapshot_json import snapshot_to_dict
from tests.report_fixtures import JSON, http_post
from tests.report_fixtures import http_server_factory  # noqa: F401 (a fixture)

T0 = 1_800_000_000.0
SPEC = spec_by_key("h100-sxm")
PEAK = SPEC.peak_flops["bf16"]
BANDWIDTH = SPEC.mem_bandwidth_bytes_per_s


def accept(store: ReportStore, report: dict) -> tuple[int, str]:
    return store.accept(json.dumps(report).encode(), content_type="application/json", peer_pid=None,
                        authorization=None, from_loopback=True)


def verdict_for(report: dict):
    """Store -> lookup -> samples -> classifier, as the agent does it; returns (verdict, snapshot)."""
    store = ReportStore(clock=lambda: T0, rate_per_s=None)
    assert accept(store, report)[0] == 204
    workload = store.report_for(gpu="0", uuid="GPU-0", pids=[], now=T0)
    assert workload is not None
    samples = [GpuSample(ts=T0 + i, gpu="0", uuid="GPU-0", model=SPEC.name, interval_s=1.0, gr_active=0.95,
                         sm_active=0.9, tensor_active=0.6, dram_active=0.3, sm_clock_mhz=SPEC.ref_clock_mhz,
                         workload=workload, dtype="bf16") for i in range(30)]
    classifier = Classifier()
    for sample in samples:
        classifier.observe(sample, SPEC)
    (verdict,) = classifier.evaluate(T0 + 30)
    info = DeviceInfo(gpu="0", uuid="GPU-0", vendor="nvidia", model=SPEC.name, spec=SPEC)
    snapshot = NodeSnapshot(ts=T0 + 30, node="n1", devices=(DeviceState(info=info, up=True, sample=samples[-1]),),
                            health=CollectorHealth(backend="test"), expected_devices=1, verdicts=(verdict,))
    return verdict, snapshot


def exported(snapshot: NodeSnapshot, name: str) -> dict[str, float]:
    return {s.labels.get("source", ""): s.value for f in families_for(snapshot) for s in f.samples if s.name == name}


HOSTILE = [
    pytest.param({"tokens_per_s": 1e18, "flops_per_token": 1e18}, "mfu", id="mfu-1e21"),
    pytest.param({"tokens_per_s": 1e18, "model_bytes": 1e18}, "mbu", id="mbu-decode"),
    pytest.param({"step_time_s": 1e-300, "model_bytes": 1e18}, "mbu", id="mbu-infinite"),
    pytest.param({"tokens": 1e18, "step_time_s": 1e-300, "flops_per_token": 1e18}, "mfu", id="mfu-infinite"),
]


@pytest.mark.parametrize("report, which", HOSTILE)
def test_an_mfu_or_mbu_past_the_bound_is_unknown_with_a_reason_everywhere(report, which):
    verdict, snapshot = verdict_for({**report, "job": "j", "gpu": "0"})
    line = verdict.to_json()
    assert line[f"{which}_workload"] is None and line[which] == line[f"{which}_counters"], line
    assert line[f"{which}_source"] == "counters"
    reason = next(r for r in verdict.reasons if "unit error" in r)
    assert f"workload {which.upper()} unknown" in reason and f"outside 0 to {MAX_UTILISATION:g}" in reason
    assert "workload" not in exported(snapshot, f"roofwatch_gpu_{which}_ratio")
    assert "counters" in exported(snapshot, f"roofwatch_gpu_{which}_ratio")
    data = snapshot_to_dict(snapshot)
    assert data["verdicts"][0][f"{which}_workload"] is None and data["verdicts"][0][which] is not None
    assert reason in data["verdicts"][0]["reasons"]
    assert "unit error" in status_page(data)
    json.dumps(data, allow_nan=False)  # nothing infinite reaches the API


def test_a_plausible_report_still_gives_its_mfu_and_mbu():
    tokens, flops, model = 0.4 * PEAK / 1.4e10, 1.4e10, 14e9
    verdict, snapshot = verdict_for({"tokens_per_s": tokens, "flops_per_token": flops, "model_bytes": model,
                                     "step_time_s": 0.5, "gpu": "0"})
    assert verdict.roofline.mfu_workload == pytest.approx(0.4)
    assert verdict.roofline.mbu_workload == pytest.approx(model / 0.5 / BANDWIDTH)
    assert not any("unit error" in r for r in verdict.reasons)
    assert exported(snapshot, "roofwatch_gpu_mfu_ratio")["workload"] == pytest.approx(0.4)


def test_the_bound_sits_at_twice_the_dense_peak():
    """Structured sparsity doubles the tensor peak, so up to 2 is a real figure; past it, a unit error."""
    from agent.classifier.features import window_features
    from agent.classifier.thresholds import Thresholds
    from agent.model import WorkloadReport

    def mfu(ratio: float):
        w = WorkloadReport(tokens_per_s=ratio * PEAK / 1e10, flops_per_token=1e10)
        samples = [GpuSample(ts=T0 + i, gpu="0", interval_s=1.0, gr_active=0.9, workload=w) for i in range(10)]
        return roofline(window_features(samples, samples, SPEC, Thresholds()), SPEC).mfu_workload

    assert mfu(1.9) == pytest.approx(1.9) and mfu(2.0) == pytest.approx(2.0)
    assert mfu(2.01) is None


# -- a report for a GPU that is not there ------------------------------------------------------


def test_a_report_for_a_gpu_that_does_not_exist_is_refused_naming_the_gpus_present():
    store = ReportStore(clock=lambda: T0, rate_per_s=None)
    for gpu in ("0", "1"):  # the collection loop asks for each GPU every cycle: the store learns them
        store.report_for(gpu=gpu, uuid=f"GPU-aaaa-{gpu}", pids=[], now=T0)
    status, message = accept(store, {"step": 1, "gpu": "7"})
    assert status == 422, message
    assert "'7'" in message and "0 (GPU-aaaa-0)" in message and "1 (GPU-aaaa-1)" in message
    assert len(store) == 0 and store.stats()["rejected"]["invalid"] == 1
    for named in ("1", "GPU-aaaa-0", "gpu-AAAA-0"):  # index or UUID, UUIDs in any case
        assert accept(store, {"step": 1, "gpu": named})[0] == 204, named


def test_over_http_the_refusal_is_a_422_whose_body_names_the_gpus(http_server_factory):  # noqa: F811
    store = ReportStore(rate_per_s=None)
    store.report_for(gpu="0", uuid="GPU-aaaa-0", pids=[], now=T0)
    srv = http_server_factory(store)
    status, _, answer = http_post(srv.server_address[1], json.dumps({"step": 1, "gpu": "3"}).encode(),
                                  {"Content-Type": JSON})
    assert status == 422 and b"GPUs present: 0 (GPU-aaaa-0)" in answer, answer


def test_before_the_first_cycle_a_named_gpu_is_accepted():
    """The store learns the GPUs from the collection loop; before its first cycle it cannot judge."""
    store = ReportStore(clock=lambda: T0, rate_per_s=None)
    assert accept(store, {"step": 1, "gpu": "7"})[0] == 204


def test_the_gpus_listed_are_bounded():
    store = ReportStore(clock=lambda: T0, rate_per_s=None)
    for i in range(100):
        store.report_for(gpu=str(i), uuid=None, pids=[], now=T0)
    status, message = accept(store, {"step": 1, "gpu": "x"})
    assert status == 422 and "and 84 more" in message and len(message) < 400
