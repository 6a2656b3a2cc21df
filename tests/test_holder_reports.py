"""A holder of a shared GPU with its own workload report gets its own class and MFU from it (issue 47, item 3).

The report comes through the real intake (agent.context.workload.report_store.ReportStore) and the real host
(agent.context.local_host.LocalHost): a report is a holder's own when it was matched to that holder's PIDs;
one matched by the GPU's UUID (which every pod of a time-sliced GPU sees) belongs to no holder.
"""

from __future__ import annotations

import json

import pytest

from agent.collector.holders import HolderLedger
from agent.context.local_host import LocalHost
from agent.context.workload.report_store import ReportStore
from agent.model import Attribution, GpuSample, ProcessSample
from agent.model.holders import Holder, HolderReport
from agent.model.specs import spec_by_key
from tests.report_fixtures import JSON, UUID_A, Clock

H100 = spec_by_key("h100-sxm")
PEAK = H100.peak_flops["bf16"]
BANDWIDTH = H100.mem_bandwidth_bytes_per_s
FLOPS_PER_TOKEN = 6e9


def send(store: ReportStore, payload: dict) -> None:
    status, message = store.accept(json.dumps(payload).encode(), content_type=JSON, peer_pid=None, authorization=None,
                                   from_loopback=True)
    assert status == 204, message


def test_a_report_matched_to_a_holders_own_pids_is_that_holders_and_a_uuid_match_is_nobodys(tmp_path) -> None:
    clock = Clock()
    store = ReportStore(clock=clock)
    send(store, {"pid": 101, "job": "trainer", "tokens_per_s": 0.3 * PEAK / FLOPS_PER_TOKEN,
                 "flops_per_token": FLOPS_PER_TOKEN, "world_size": 1, "dtype": "bf16"})
    send(store, {"pid": 102, "job": "decoder", "model_bytes": 1.4e10, "step_time_s": 0.05})
    send(store, {"job": "someone-on-this-gpu", "tokens_per_s": 1.0, "flops_per_token": 1.0,
                 "hints": {"NVIDIA_VISIBLE_DEVICES": UUID_A}})
    host = LocalHost(proc_root=tmp_path, sysfs_root=tmp_path, workloads=[store])
    try:
        facts = host.facts("0", [101, 102, 103], clock.t, uuid=UUID_A)
    finally:
        host.close()
    holders = {h.key: h for h in facts.attribution.holders}
    assert set(holders) == {"pid:101", "pid:102", "pid:103"}
    assert holders["pid:101"].report == HolderReport(job="trainer", world_size=1, tokens_per_s=0.3 * PEAK / FLOPS_PER_TOKEN,
                                                     flops_per_token=FLOPS_PER_TOKEN, dtype="bf16")
    assert holders["pid:102"].report is not None and holders["pid:102"].report.job == "decoder"
    assert holders["pid:103"].report is None, "the UUID-hinted report is the GPU's, not pid 103's"


def judge(holders: tuple[Holder, ...], sm: dict[int, float]) -> dict[str, object]:
    processes = tuple(ProcessSample(pid=pid, used_memory_bytes=2**30, sm_util=share) for pid, share in sm.items())
    ledger = HolderLedger()
    for t in range(1, 5):
        ledger.advance(GpuSample(ts=1000.0 + t, gpu="0", interval_s=1.0, gr_active=sum(sm.values()), processes=processes,
                                 attribution=Attribution(holders=holders)), 500.0)
    return {s.holder.key: s for s in ledger.judged(now=1004.0, window_s=60.0, gpu_class="compute_bound", spec=H100)}


def test_each_reporting_holder_gets_its_own_mfu_and_class_the_others_none() -> None:
    trainer = HolderReport(tokens_per_s=0.3 * PEAK / FLOPS_PER_TOKEN, flops_per_token=FLOPS_PER_TOKEN, world_size=1)
    decoder = HolderReport(model_bytes=0.3 * BANDWIDTH * 0.05, step_time_s=0.05)
    light = HolderReport(tokens_per_s=0.02 * PEAK / FLOPS_PER_TOKEN, flops_per_token=FLOPS_PER_TOKEN)
    holders = (Holder(kind="process", via="process", pids=(1,), report=trainer),
               Holder(kind="process", via="process", pids=(2,), report=decoder),
               Holder(kind="process", via="process", pids=(3,), report=light),
               Holder(kind="process", via="process", pids=(4,)))
    shares = judge(holders, {1: 0.5, 2: 0.4, 3: 0.05, 4: 0.05})
    # MFU 0.3 over half the SM time is 0.6 of the compute roof; MBU 0.3 over 0.4 of it is 0.75 of the memory roof;
    # MFU 0.02 over 0.05 is 0.4, past the 0.35 roof; holder 4 has no report and is one of four busy holders.
    assert shares["pid:1"].mfu == pytest.approx(0.3) and shares["pid:1"].verdict == "compute_bound"
    assert shares["pid:2"].mfu is None and shares["pid:2"].verdict == "memory_bound"
    assert shares["pid:3"].mfu == pytest.approx(0.02) and shares["pid:3"].verdict == "compute_bound"
    assert shares["pid:4"].mfu is None and shares["pid:4"].verdict is None
    slow = judge(holders, {1: 0.5, 2: 0.4, 3: 0.09, 4: 0.01})
    assert slow["pid:3"].verdict == "latency_bound", "MFU 0.02 over 0.09 of the SM time is 0.22: below both roofs"


def test_a_reporting_holder_without_sm_time_for_a_window_is_still_idle_held() -> None:
    report = HolderReport(tokens_per_s=0.3 * PEAK / FLOPS_PER_TOKEN, flops_per_token=FLOPS_PER_TOKEN)
    holders = (Holder(kind="process", via="process", pids=(1,), report=report),
               Holder(kind="process", via="process", pids=(2,)))
    processes = (ProcessSample(pid=1, used_memory_bytes=2**30, sm_util=0.0),
                 ProcessSample(pid=2, used_memory_bytes=2**30, sm_util=0.9))
    ledger = HolderLedger()
    for t in range(1, 100):
        ledger.advance(GpuSample(ts=1000.0 + t, gpu="0", interval_s=1.0, gr_active=0.9, processes=processes,
                                 attribution=Attribution(holders=holders)), 500.0)
    shares = {s.holder.key: s for s in ledger.judged(now=1099.0, window_s=60.0, gpu_class="compute_bound", spec=H100)}
    assert shares["pid:1"].verdict == "idle_held", "a stale report does not hide a window without a kernel"
    assert shares["pid:2"].verdict == "compute_bound", "the only busy holder takes the GPU's class"
