"""Fuzzing what a workload report can make the agent show: numbers at every edge the schema allows
and past it, names from every Unicode category, and GPUs that are and are not on the node.

In process, for speed (the transports are fuzzed over real sockets in test_fuzz_report_*.py): the
store's answer is a status, never an exception; a stored report reaches the classifier and gives an
MFU and MBU that are unknown or within the documented bound, in valid JSON; its job name reaches the
status page as printable text; and a report naming a GPU is stored exactly when the GPU is here.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from agent.app.assemble import make_collector, open_backend_or_fail
from agent.app.config import Settings
from agent.classifier.engine import Classifier
from agent.classifier.roofline import MAX_UTILISATION
from agent.context.workload.report_store import ReportStore
from agent.model import GpuSample
from agent.model.specs import spec_by_key
from agent.views.status_page import status_page
from exporters.snapshot_json import snapshot_to_dict
from tests.agent_process import SLOW_MACHINE_SAMPLE_TIMEOUT_S
from tests.hostile_fuzzing import FUZZ, any_text, bounded, numbers

T0 = 1_800_000_000.0
SPEC = spec_by_key("h100-sxm")
GPUS = {"0": "GPU-aaaa", "1": "GPU-bbbb"}
RAW_CONTROLS = ("\x1b", "\x9b", "\x07", "\x00", "\u202e", "\u2028")

allowed = st.sampled_from([0.0, 5e-324, 1e-300, 1e-6, 1.0, 1e6, 1e12, 1e18]) | st.floats(0.0, 1e18)
report_like = st.fixed_dictionaries({"step": st.integers(0, 10**15), "gpu": st.just("0")}, optional={
    "tokens_per_s": allowed | numbers, "flops_per_token": allowed | numbers, "model_bytes": allowed | numbers,
    "tokens": allowed, "step_time_s": st.sampled_from([0.0, 5e-324, 1e-300, 1e-3, 1.0, 1e6]) | numbers,
    "world_size": st.integers(1, 1_000_000) | st.integers(-5, 0), "job": any_text | st.text(max_size=128),
})


def accept(store: ReportStore, body: bytes) -> tuple[int, str]:
    return store.accept(body, content_type="application/json", peer_pid=None, authorization=None, from_loopback=True)


@pytest.fixture(scope="module")
def page_data() -> dict[str, Any]:
    settings = Settings(backend="virtual", sample_timeout_s=SLOW_MACHINE_SAMPLE_TIMEOUT_S)
    collector = make_collector(settings, open_backend_or_fail(settings))
    collector.collect_once()
    data = snapshot_to_dict(collector.snapshot)
    collector.stop()
    return data


@pytest.mark.slow  # a property test that computes for about 2 s (over the quick tier's limit on a busy machine)
@FUZZ
@given(report=report_like)
def test_a_stored_report_gives_a_bounded_mfu_and_a_printable_job(page_data: dict[str, Any], report: dict[str, Any]) -> None:
    store = ReportStore(clock=lambda: T0, rate_per_s=None)
    body = json.dumps(report, allow_nan=True, ensure_ascii=False).encode("utf-8", "surrogatepass")
    with bounded("one report"):
        status, message = accept(store, body)
        assert status in (204, 400, 422) and "\n" not in message, (status, message)
        event(f"status {status}")
        if status != 204:
            return
        workload = store.report_for(gpu="0", uuid=GPUS["0"], pids=[], now=T0)
        samples = [GpuSample(ts=T0 + i, gpu="0", model=SPEC.name, interval_s=1.0, gr_active=0.9, tensor_active=0.5,
                             dram_active=0.4, workload=workload) for i in range(30)]
        classifier = Classifier()
        for sample in samples:
            classifier.observe(sample, SPEC)
        (verdict,) = classifier.evaluate(T0 + 30)
        line = json.loads(json.dumps(verdict.to_json(), allow_nan=False))
        for key in ("mfu", "mbu", "mfu_workload", "mbu_workload"):
            assert line[key] is None or 0.0 <= line[key] <= MAX_UTILISATION, (key, line[key])
        data = copy.deepcopy(page_data)
        data["devices"][0]["sample"]["attribution"] = {"job_id": workload.job}
        data["verdicts"][0]["reasons"] = list(verdict.reasons)
        page = status_page(data)
        page.encode("utf-8")
        assert not any(c in page for c in RAW_CONTROLS)


gpu_names = st.sampled_from(["0", "1", "2", "GPU-aaaa", "gpu-AAAA", "GPU-cccc", "00", " 0"]) | any_text


@FUZZ
@given(named=gpu_names)
def test_a_report_naming_a_gpu_is_stored_exactly_when_the_gpu_is_here(named: str) -> None:
    store = ReportStore(clock=lambda: T0, rate_per_s=None)
    for gpu, uuid in GPUS.items():
        store.report_for(gpu=gpu, uuid=uuid, pids=[], now=T0)
    body = json.dumps({"step": 1, "gpu": named}, ensure_ascii=False).encode("utf-8", "surrogatepass")
    with bounded("one report naming a GPU"):
        status, message = accept(store, body)
    here = {name.lower() for pair in GPUS.items() for name in pair}
    if status == 204:
        assert named.lower() in here
    else:
        assert status == 422 and "\n" not in message, (status, message)
        if 1 <= len(named) <= 128 and named.lower() not in here and "invalid report: gpu:" in message:
            assert "GPUs present: 0 (GPU-aaaa), 1 (GPU-bbbb)" in message
        assert named.lower() not in here or len(named) > 128
