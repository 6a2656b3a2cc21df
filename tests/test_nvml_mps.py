"""MPS clients through NVML (issue 47): every nvidia-ml-py release we accept, on the driver branches that differ.

nvml.h declares ``nvmlDeviceGetMPSComputeRunningProcesses_v2`` from R470 and ``_v3`` from R510 (Volta and newer;
NOT_SUPPORTED otherwise); nvidia-ml-py 12.535 has no ``_v2`` wrapper. The NVML backend reads the client list
and makes each client a holder ``via="mps"``; an older driver, a release without a wrapper, or a GPU that answers
NOT_SUPPORTED loses only that mark, never the sample, and is asked once, not every interval.
"""

from __future__ import annotations

import pytest

from agent.collector.holders import HolderLedger
from agent.model import Attribution, GpuSample, ProcessSample
from agent.model.holders import Holder
from agent.virtual.fake_nvml import codes
from tests.nvml_harness import NVIDIA_ML_PY, Rig, release_pynvml, scenario

SHARES = (0.5, 0.3, 0.1)
MPS_SYMBOLS = ("nvmlDeviceGetMPSComputeRunningProcesses_v3", "nvmlDeviceGetMPSComputeRunningProcesses_v2")
DRIVERS = ("470.82.01", "535.104.05", "580.95.05")
"""R470 has only the ``_v2`` symbol; R535 and R580 both (the backend calls ``_v3``)."""


def mps_node(driver: str):
    model = "a100-sxm-80gb" if driver < "520" else "h100-sxm"
    return scenario(model, nvml={"driver_version": driver}, workloads=[
        {"job": "mps", "gpus": [0], "phases": [{"kind": "compute", "mfu": 0.4, "duration_s": 3600}],
         "holders": [{"via": "mps", "share": share, "mem_gib": 4 + i} for i, share in enumerate(SHARES)]},
        {"job": "train", "gpus": [1], "phases": [{"kind": "compute", "mfu": 0.5, "duration_s": 3600}]},
    ])


def sample_twice(rig: Rig, symbol: str) -> tuple[dict[str, GpuSample], int]:
    """The second interval's samples and how often it called ``symbol`` on GPU 0."""
    backend = rig.backend()
    devices = backend.discover()
    out, before = {}, 0
    for _ in range(2):
        before = rig.library.calls[("0", symbol)]
        now = rig.step()
        out = {d.gpu: backend.sample(d.gpu, now) for d in devices}
    return out, rig.library.calls[("0", symbol)] - before


def truth_clients(rig: Rig) -> list[int]:
    truth = rig.library.latest_sample("0")
    return sorted(pid for h in truth.attribution.holders for pid in h.pids)


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("release", NVIDIA_ML_PY)
def test_mps_clients_become_holders_via_mps_on_every_release_and_driver(release, driver):
    rig = Rig(mps_node(driver), pynvml=release_pynvml(release))
    try:
        used = "nvmlDeviceGetMPSComputeRunningProcesses_v2" if driver < "510" else MPS_SYMBOLS[0]
        samples, calls = sample_twice(rig, used)
        clients = truth_clients(rig)
        assert len(clients) == len(SHARES)
        holders = samples["0"].attribution.holders
        assert sorted(pid for h in holders for pid in h.pids) == clients
        assert {(h.kind, h.via) for h in holders} == {("process", "mps")}
        memory = {p.pid: p.used_memory_bytes for p in samples["0"].processes}
        assert [memory[pid] for pid in clients] == [(4 + i) * 2**30 for i in range(len(SHARES))]
        assert samples["1"].attribution is None or not samples["1"].attribution.holders, "GPU 1: one job, no MPS"
        assert calls == 1, "one driver call per interval"
        device = rig.backend().devices["0"]
        assert ("mps_processes" in device.absent) == (driver < "510")
        assert not device.failed, device.failed
    finally:
        rig.close()


@pytest.mark.parametrize("release", [NVIDIA_ML_PY[0], NVIDIA_ML_PY[-1]])
def test_a_gpu_that_answers_not_supported_loses_only_the_mps_mark_and_is_asked_once(release):
    rig = Rig(mps_node("580.95.05"), pynvml=release_pynvml(release))
    try:
        for symbol in MPS_SYMBOLS:
            rig.library.force_error(symbol, codes.ERROR_NOT_SUPPORTED)
        backend = rig.backend()
        devices = backend.discover()
        for _ in range(4):
            now = rig.step()
            samples = {d.gpu: backend.sample(d.gpu, now) for d in devices}
        holders = samples["0"].attribution.holders
        assert sorted(pid for h in holders for pid in h.pids) == truth_clients(rig), "the sample and its holders stay"
        assert {h.via for h in holders} == {"process"}, "without the MPS list a client is a plain process"
        assert samples["0"].gr_active is not None and samples["0"].processes
        device = backend.devices["0"]
        assert device.absent["mps_processes"] == device.absent["mps_processes_v2"] == "not supported"
        assert sum(rig.library.calls[("0", s)] for s in MPS_SYMBOLS) <= 2, "switched off after the first refusal"
    finally:
        rig.close()


def test_mps_clients_no_utilisation_sample_names_are_unknown_not_idle_held() -> None:
    """Under MPS the driver may time the server's context instead of its clients' (unverified on a real
    driver: docs/attribution.md). A client no sample names then has an unknown SM share, never 0: else every
    client holding memory would read ``idle_held`` while the GPU works for them."""
    clients = tuple(Holder(kind="process", via="mps", pids=(100 + i,)) for i in range(3))
    processes = (ProcessSample(pid=99, used_memory_bytes=2**28, sm_util=0.9),  # the MPS server's sample
                 *(ProcessSample(pid=100 + i, used_memory_bytes=2**30, sm_util=None) for i in range(3)))
    ledger = HolderLedger()
    for t in range(1, 200):
        sample = GpuSample(ts=1000.0 + t, gpu="0", interval_s=1.0, gr_active=0.9, energy_j=300.0 * t,
                           processes=processes, attribution=Attribution(holders=clients))
        ledger.advance(sample, 300.0)
    judged = {s.holder.key: s for s in ledger.judged(now=1199.0, window_s=60.0, gpu_class="compute_bound")}
    for i in range(3):
        share = judged[f"pid:{100 + i}"]
        assert share.sm_share is None and share.idle_since is None and share.verdict is None
    plain = tuple(Holder(kind="process", via="process", pids=(100 + i,)) for i in range(3))
    ledger = HolderLedger()
    for t in range(1, 200):
        ledger.advance(GpuSample(ts=1000.0 + t, gpu="0", interval_s=1.0, gr_active=0.9, processes=processes,
                                 attribution=Attribution(holders=plain)), 300.0)
    judged = ledger.judged(now=1199.0, window_s=60.0, gpu_class="compute_bound")
    assert {s.verdict for s in judged if s.holder.kind == "process"} == {"idle_held"}, \
        "plain processes with memory and no sample while another computes are idle_held (the control)"
