"""Shared GPUs (issue 47): every holder of a time-sliced, MPS or DRA-shared GPU, its share, its energy, its verdict.

What is held here, in the quick tier:

* the energy split is exact: holders + ``unattributed`` == the GPU's energy-counter step, to the microjoule,
  for random inputs and over every built-in virtual scenario;
* the ``shared`` scenario: its holders, their shares against the scenario's own figures, the idle pod
  ``idle_held`` for itself while its GPU is compute-bound, and whole GPUs without holder series;
* the largest ``max_holders_per_gpu`` holders have series, the rest are summed as ``other``; totals only grow;
* DRA claims from a real gRPC kubelet (the vendored pod-resources v1 proto) found by the names NVIDIA's
  and AMD's DRA drivers give a local GPU, and time-sliced replicas marked as such;
* the setting is validated like the others.

The real agent process over the test kubelet is in tests/test_shared_gpus_e2e.py.
"""

from __future__ import annotations

import random

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent.app.config import ConfigError, load_settings
from agent.classifier.holders import holder_verdict
from agent.classifier.live import LiveClassifier
from agent.collector import Collector
from agent.collector.counters import accumulate_counters
from agent.collector.holders import HolderLedger
from agent.context.attribution.kubelet import PodResourcesCache
from agent.context.local_host import LocalHost
from agent.model import DeviceCounters, GpuSample, ProcessSample
from agent.model.holders import MICROJOULES_PER_JOULE, Holder, HolderShare, split_energy
from agent.virtual.backend import VirtualBackend
from agent.virtual.scenario import BUILTIN_SCENARIOS
from exporters.prometheus import ExpositionCache
from tests.agent_process import poll
from tests.fake_kubelet import claim, dra_pod, pod
from tests.kubelet_fixtures import kubelet  # noqa: F401 - the fixture

T0 = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t


def cycled(backend: object, cycles: int, clock: Clock, **kwargs) -> Collector:
    """A collector of ``backend`` after ``cycles`` collections on the fake ``clock``, one second apart."""
    collector = Collector(backend, node="n", interval_s=1.0, clock=clock, monotonic=clock, **kwargs)
    for _ in range(cycles):
        clock.t += 1.0
        collector.collect_once()
    return collector


def run_collector(scenario: str, cycles: int, clock: Clock | None = None, **kwargs) -> Collector:
    clock = clock or Clock()
    return cycled(VirtualBackend(scenario, clock=clock), cycles, clock, sample_timeout_s=30.0,
                  analyzer=LiveClassifier(), **kwargs)


def holders_by_key(collector: Collector, gpu: str) -> dict[str, HolderShare]:
    device = next(d for d in collector.snapshot.devices if d.info.gpu == gpu)
    return {share.holder.key: share for share in device.holders}


def scrape(collector: Collector) -> dict[str, list]:
    text = ExpositionCache(lambda: collector.snapshot).render(generate_latest, "text/plain")
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(text.decode()):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(sample)
    return out


# -- the split -------------------------------------------------------------------------------------


def test_the_energy_split_gives_out_exactly_the_gpus_energy_for_any_inputs() -> None:
    rng = random.Random(47)
    for _ in range(5000):
        holders = rng.randint(1, 9)
        total = rng.choice([0, 1, 7, rng.randint(0, 10**12)])
        shares = [rng.choice([None, 0.0, rng.random() / holders, rng.random()]) for _ in range(holders)]
        busy = rng.choice([None, 0.0, 1.0, rng.random()])
        split = split_energy(total, busy, shares)
        assert sum(split.by_holder) + split.unattributed_uj == total
        assert min(split.by_holder) >= 0 and split.unattributed_uj >= 0


def test_busy_energy_follows_sm_share_and_the_idle_floor_is_even() -> None:
    # 100 J at 60 % busy: 60 J by SM share 3:1, 40 J evenly over two holders; nothing left over.
    split = split_energy(100 * MICROJOULES_PER_JOULE, 0.6, [0.45, 0.15])
    assert split.by_holder == (45_000_000 + 20_000_000, 15_000_000 + 20_000_000)
    assert split.unattributed_uj == 0
    # No per-holder SM figure: the busy part is nobody's; the idle floor still splits evenly.
    split = split_energy(100 * MICROJOULES_PER_JOULE, 0.6, [None, None])
    assert split.by_holder == (20_000_000, 20_000_000) and split.unattributed_uj == 60_000_000


@pytest.mark.parametrize("scenario", BUILTIN_SCENARIOS)
def test_holders_energy_and_the_remainder_add_up_to_each_gpus_energy_in_every_scenario(scenario: str) -> None:
    clock = Clock()
    backend = VirtualBackend(scenario, clock=clock)
    devices = backend.discover()
    ledgers = {d.gpu: HolderLedger(2) for d in devices}  # 2: the MPS GPU's clients also fill `other`
    counters = {d.gpu: DeviceCounters() for d in devices}
    previous: dict[str, GpuSample | None] = {d.gpu: None for d in devices}
    shared_intervals = 0
    for _ in range(12):
        clock.t += 1.0
        for d in devices:
            sample = backend.sample(d.gpu, clock.t)
            new = accumulate_counters(counters[d.gpu], previous[d.gpu], sample)
            step = new.energy_j - (counters[d.gpu].energy_j or 0.0) if new.energy_j is not None else None
            before = ledgers[d.gpu].totals_uj()
            shares = ledgers[d.gpu].advance(sample, step)
            after = ledgers[d.gpu].totals_uj()
            if shares:
                shared_intervals += 1
                gained = (sum(after[0].values()) + after[1] + after[2]) - (sum(before[0].values()) + before[1] + before[2])
                assert gained == round(step * MICROJOULES_PER_JOULE), (scenario, d.gpu)
                assert all(after[0][k] >= before[0].get(k, 0) for k in after[0]), "a holder's total went down"
            counters[d.gpu], previous[d.gpu] = new, sample
    backend.close()
    assert (shared_intervals > 0) == (scenario == "shared"), "only the shared scenario shares GPUs"


# -- the shared scenario ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def shared() -> Collector:
    collector = run_collector("shared", 30)
    yield collector
    collector.stop()


def test_a_time_sliced_gpu_has_a_holder_per_pod_and_the_idle_pod_is_idle_held_on_a_busy_gpu(shared) -> None:
    verdicts = {v.gpu: v for v in shared.snapshot.verdicts}
    assert verdicts["0"].cls == "compute_bound", "the trainer keeps GPU 0 busy"
    holders = holders_by_key(shared, "0")
    assert set(holders) == {"ml/trainer-0/main", "research/notebook/main", "vision/augment/main", "unattributed"}
    assert {h.holder.via for k, h in holders.items() if k != "unattributed"} == {"time-slicing"}
    notebook, trainer, augment = (holders[k] for k in ("research/notebook/main", "ml/trainer-0/main",
                                                        "vision/augment/main"))
    assert notebook.verdict == "idle_held" and notebook.sm_share == 0.0 and notebook.memory_bytes == 20 * 2**30
    assert trainer.verdict is None and augment.verdict is None, "two busy holders: neither is judged alone"
    # The scenario gives the trainer 0.8 and the augmentation job 0.15 of the SM time: their busy energy
    # (each one's power above the idle-only notebook's) is in that ratio.
    assert trainer.sm_share / augment.sm_share == pytest.approx(0.8 / 0.15, rel=1e-3)
    assert (trainer.power_w - notebook.power_w) / (augment.power_w - notebook.power_w) == pytest.approx(0.8 / 0.15,
                                                                                                        rel=1e-3)


def test_mps_clients_dra_pods_and_whole_gpus(shared) -> None:
    mps = holders_by_key(shared, "1")
    clients = [h for h in mps.values() if h.holder.kind == "process"]
    assert len(clients) == 4 and all(h.memory_bytes == 8 * 2**30 for h in clients)
    assert {h.holder.via for h in clients} == {"mps"}, "the demo's MPS GPU says MPS, as the agent on a node would"
    assert len({h.sm_share for h in clients}) == 1, "four equal clients, equal shares"
    dra = holders_by_key(shared, "2")
    assert {k: (h.holder.via, h.holder.claim) for k, h in dra.items() if h.holder.kind == "pod"} == {
        "inference/chat-a/main": ("dra", "inference/shared-h100"), "inference/chat-b/main": ("dra", "inference/shared-h100")}
    for gpu in ("3/1", "3/3", "4", "5", "6", "7"):
        assert holders_by_key(shared, gpu) == {}, f"GPU {gpu} is not shared"


def test_only_shared_gpus_have_holder_series(shared) -> None:
    series = scrape(shared)
    energy = {(s.labels["gpu"], s.labels["holder"]): s.value for s in series["roofwatch_gpu_holder_energy_joules_total"]}
    assert {gpu for gpu, _ in energy} == {"0", "1", "2"}
    idle = [s.labels for s in series["roofwatch_gpu_holder_class"] if s.labels["class"] == "idle_held"]
    assert [(s["gpu"], s["holder"]) for s in idle] == [("0", "research/notebook/main")]
    info = {(s.labels["gpu"], s.labels["holder"]): s.labels for s in series["roofwatch_gpu_holder_info"]}
    assert info[("2", "inference/chat-a/main")]["claim"] == "inference/shared-h100"
    assert info[("0", "research/notebook/main")]["via"] == "time-slicing"


def test_past_the_largest_n_holders_the_rest_are_summed_as_other_and_totals_only_grow() -> None:
    clock = Clock()
    collector = run_collector("shared", 5, clock, max_holders=2)
    before = holders_by_key(collector, "1")
    assert len([h for h in before.values() if h.holder.kind == "process"]) == 2
    assert before["other"].memory_bytes == 2 * 8 * 2**30, "the two clients past the largest two"
    assert before["other"].energy_j_total > 0
    clock.t += 1.0
    collector.collect_once()
    after = holders_by_key(collector, "1")
    for key, share in after.items():
        assert share.energy_j_total >= before[key].energy_j_total, key
    collector.stop()


def test_holder_verdict_needs_a_whole_window_of_memory_without_sm_time() -> None:
    idle = HolderShare(holder=Holder(kind="pod", namespace="a", pod="b"), sm_share=0.0, memory_bytes=1, idle_since=100.0)
    assert holder_verdict(idle, now=119.0, window_s=20.0, gpu_class="compute_bound", only_busy=False) is None
    assert holder_verdict(idle, now=120.0, window_s=20.0, gpu_class="compute_bound", only_busy=False) == "idle_held"
    busy = HolderShare(holder=Holder(kind="job", job_id="7"), sm_share=0.5, memory_bytes=1)
    assert holder_verdict(busy, now=120.0, window_s=20.0, gpu_class="compute_bound", only_busy=True) == "compute_bound"
    assert holder_verdict(busy, now=120.0, window_s=20.0, gpu_class="compute_bound", only_busy=False) is None


def test_a_ledger_splits_amd_compute_unit_occupancy_as_sm_weight() -> None:
    """Two processes of no job on one GPU (MPS clients, plain processes) are two holders; amdsmi gives no SM
    share, so each one's compute-unit occupancy weighs the GPU's activity (90:30 of 50 % busy)."""
    sample = GpuSample(ts=T0, gpu="0", interval_s=1.0, gr_active=0.5, processes=(
        ProcessSample(pid=1, compute_units=90, used_memory_bytes=1), ProcessSample(pid=2, compute_units=30, used_memory_bytes=1)))
    shares = HolderLedger().advance(sample, 10.0)
    by_pid = {s.holder.pids[0]: s for s in shares if s.holder.pids}
    assert by_pid[1].sm_share == pytest.approx(0.5 * 90 / 120) and by_pid[2].sm_share == pytest.approx(0.5 * 30 / 120)


# -- DRA and time-slicing from the kubelet ------------------------------------------------------------

NV_BUS, AMD_BUS = "0000:1b:00.0", "0000:c1:00.0"
UUID = "GPU-5a1c0de0-0000-4000-8000-000000000047"


def test_dra_claims_map_to_the_gpu_each_driver_names(kubelet, tmp_path) -> None:  # noqa: F811
    proc, sys = tmp_path / "proc", tmp_path / "sys"
    (proc / "driver/nvidia/gpus" / NV_BUS).mkdir(parents=True)
    (proc / "driver/nvidia/gpus" / NV_BUS / "information").write_text(
        "Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 35\nDevice Minor: \t 3\nBus Location: \t 0000:1b:00.0\n")
    drm = sys / "bus/pci/devices" / AMD_BUS / "drm"
    (drm / "card1").mkdir(parents=True)
    (drm / "renderD129").mkdir()
    kubelet.pods = [
        dra_pod("llm-a", "inference", web=[claim("shared-h100", "inference", ("gpu.nvidia.com", "node-1", "gpu-3"))]),
        dra_pod("llm-b", "inference", web=[claim("shared-h100", "inference", ("gpu.nvidia.com", "node-1", "gpu-3"))]),
        dra_pod("rocm", "hpc", main=[claim("mi300", "hpc", ("gpu.amd.com", "node-1", "gpu-1-129"))]),
        dra_pod("by-uuid", "ml", main=[claim("one", "ml", ("gpu.nvidia.com", "node-1", UUID))]),
        # NVIDIA's ComputeDomain channels are DRA devices too, but not GPUs.
        dra_pod("imex", "ml", main=[claim("cd", "ml", ("compute-domain.nvidia.com", "node-1", "gpu-3"))]),
        pod("sliced", "ml", main={"nvidia.com/gpu": [UUID + "::1"]}),
    ]
    pods = PodResourcesCache(kubelet.socket_path, refresh_s=60.0)
    pods.start()
    try:
        poll(lambda: pods.status.refreshes, 10, what="the first List")
        host = LocalHost(proc_root=proc, sysfs_root=sys, pods=pods)
        nv = host.facts("0", [], T0, bus_id="00000000:1B:00.0", uuid="GPU-other").attribution
        assert [(h.pod, h.via, h.claim) for h in nv.holders] == [("llm-a", "dra", "inference/shared-h100"),
                                                                  ("llm-b", "dra", "inference/shared-h100")]
        assert host.facts("0/1", [], T0, bus_id=NV_BUS, uuid="MIG-other").attribution is None, \
            "a MIG instance shares its GPU's PCI address but not its whole-GPU DRA claim"
        amd = host.facts("1", [], T0, bus_id=AMD_BUS).attribution
        assert (amd.namespace, amd.pod, amd.holders[0].via) == ("hpc", "rocm", "dra")
        named = host.facts("2", [], T0, uuid=UUID).attribution
        assert {(h.pod, h.via) for h in named.holders} == {("by-uuid", "dra"), ("sliced", "time-slicing")}
        assert all(h.pod != "imex" for a in (nv, amd, named) for h in a.holders)
    finally:
        pods.close()


def test_processes_join_their_pods_holder_and_others_get_their_own(tmp_path) -> None:
    from agent.context.attribution.holders import gpu_holders
    from agent.context.attribution.kubelet import PodRef

    refs = (PodRef(namespace="ml", pod="a", container="main", via="time-slicing"),
            PodRef(namespace="ml", pod="b", container="main", via="time-slicing"))
    cgroup_pods = {10: PodRef(namespace="ml", pod="a", container=None), 11: PodRef(namespace=None, pod=None, container=None,
                                                                                   pod_uid="u-1")}
    holders = gpu_holders(refs, [10, 11, 12, 13], pod_of=cgroup_pods.get, job_of={12: "4242"}.get)
    assert [(h.kind, h.key, h.pids) for h in holders] == [
        ("pod", "ml/a/main", (10,)), ("pod", "ml/b/main", ()), ("pod", "/uid:u-1/", (11,)),
        ("job", "job:4242", (12,)), ("process", "pid:13", (13,))]


def test_a_whole_gpu_whose_process_pod_is_known_only_by_uid_is_not_taken_for_shared() -> None:
    from agent.context.attribution.holders import gpu_holders
    from agent.context.attribution.kubelet import PodRef

    refs = (PodRef(namespace="ml", pod="a", container="main", via="device-plugin"),)
    uid_only = {10: PodRef(namespace=None, pod=None, container=None, pod_uid="u-1"), 11: None}
    holders = gpu_holders(refs, [10, 11], pod_of=uid_only.get, job_of=lambda pid: None)
    assert [(h.key, h.pids) for h in holders] == [("ml/a/main", (10, 11))]


def test_max_holders_per_gpu_is_validated_with_a_one_line_error(monkeypatch) -> None:
    assert load_settings().max_holders_per_gpu == 4
    monkeypatch.setenv("ROOFWATCH_MAX_HOLDERS_PER_GPU", "0")
    with pytest.raises(ConfigError) as err:
        load_settings()
    assert "max_holders_per_gpu" in str(err.value).lower() and "\n" not in str(err.value)


class _SharedBackend:
    """One GPU held by two pods whose names and claim are 10 kB of hostile text, as a kubelet could send."""

    name = "test"
    HOSTILE = 'ns"\n{' + "x" * 10_000

    def discover(self):
        from agent.model import DeviceInfo

        return [DeviceInfo(gpu="0", uuid="GPU-0", vendor="nvidia", model="Test GPU")]

    def sample(self, gpu: str, now: float) -> GpuSample:
        from agent.model import Attribution

        holders = tuple(Holder(kind="pod", via="dra", namespace=self.HOSTILE, pod=f"{self.HOSTILE}{i}", container="c",
                               claim=self.HOSTILE, pids=(10 + i,)) for i in range(2))
        return GpuSample(ts=now, gpu=gpu, interval_s=1.0, gr_active=0.5, energy_j=now * 100.0,
                         processes=tuple(ProcessSample(pid=10 + i, sm_util=0.25, used_memory_bytes=2**30) for i in range(2)),
                         attribution=Attribution(holders=holders))

    def close(self) -> None:
        pass


def test_hostile_holder_names_are_clipped_in_metrics_and_json() -> None:
    from exporters.snapshot_json import snapshot_to_dict

    collector = cycled(_SharedBackend(), 3, Clock())
    series = scrape(collector)
    holder_series = [s for name, rows in series.items() if name.startswith("roofwatch_gpu_holder") for s in rows]
    assert len(holder_series) >= 8, "two holders with info, SM, memory, power and energy series, and unattributed"
    assert max(len(v) for s in holder_series for v in s.labels.values()) == 128
    energy = [s.labels["holder"] for s in series["roofwatch_gpu_holder_energy_joules_total"]]
    assert len(set(energy)) == len(energy) == 3, "two names alike for 128 characters are still two holders"
    holders = snapshot_to_dict(collector.snapshot)["devices"][0]["holders"]
    assert {len(h["holder"][k]) for h in holders[:2] for k in ("namespace", "pod", "claim")} == {128}


def test_the_status_page_says_a_gpu_is_shared_and_by_whom(shared) -> None:
    from agent.views.status_page import status_page
    from exporters.snapshot_json import snapshot_to_dict

    page = status_page(snapshot_to_dict(shared.snapshot))
    assert "shared by <b>3</b>: ml/trainer-0, research/notebook, vision/augment" in page
    assert "shared by <b>4</b>: pid " in page, "the MPS clients"
    assert page.count("shared by <b>") == 3, "GPUs 0, 1 and 2; the MIG instances and whole GPUs are not shared"


def test_the_demos_head_start_makes_the_idle_pod_idle_held_from_the_first_scrape() -> None:
    clock = Clock()
    backend = VirtualBackend("shared", clock=clock, start_time=T0 - 60.0)
    collector = Collector(backend, node="n", interval_s=1.0, clock=clock, monotonic=clock, sample_timeout_s=30.0)
    collector.prime_holders(backend.warm_samples(clock.t, 30.0))
    clock.t += 1.0
    collector.collect_once()
    notebook = holders_by_key(collector, "0")["research/notebook/main"]
    assert notebook.verdict == "idle_held"
    assert notebook.energy_j_total < 100.0, "the head start adds no energy: one interval's idle floor at most"
    collector.stop()


def test_an_amd_gpu_shared_by_pods_is_split_by_cu_occupancy_through_the_real_amdsmi_package() -> None:
    """amdsmi gives no per-process SM time: the real amdsmi package over the fake libamd_smi reads each process's
    ``cu_occupancy``, and the holders' SM shares follow the scenario's shares of the GPU's activity."""
    from agent.backends.amd_virtual import VirtualAmdBackend
    from agent.virtual.scenario import Scenario

    scenario = Scenario.model_validate({"name": "amd-shared", "seed": 3, "nodes": [{
        "name": "n", "model": "mi300x", "gpus": 1, "workloads": [{
            "job": "sliced", "gpus": [0], "phases": [{"kind": "compute", "duration_s": 600, "mfu": 0.4}],
            "holders": [{"namespace": "a", "pod": "big", "share": 0.6, "mem_gib": 40},
                        {"namespace": "b", "pod": "small", "share": 0.2, "mem_gib": 20}]}]}]})
    clock = Clock()
    collector = Collector(VirtualAmdBackend(VirtualBackend(scenario, clock=clock)), node="n", interval_s=1.0,
                          clock=clock, monotonic=clock, sample_timeout_s=30.0)
    for _ in range(3):
        clock.t += 1.0
        collector.collect_once()
    holders = holders_by_key(collector, "0")
    big, small = holders["a/big/main"], holders["b/small/main"]
    assert big.sm_share > 0 and big.sm_share / small.sm_share == pytest.approx(3.0, rel=0.05)
    assert (big.memory_bytes, small.memory_bytes) == (40 * 2**30, 20 * 2**30)
    collector.stop()


def test_holders_coming_and_going_are_remembered_up_to_a_bound_and_still_add_up() -> None:
    """80 intervals of five new MPS clients each (400 holders): at most MAX_REMEMBERED totals are kept, the
    oldest folded into `other`, and every microjoule of the GPU's energy is still somebody's or unattributed."""
    from agent.collector.holders import MAX_REMEMBERED

    ledger = HolderLedger(4)
    for step in range(80):
        processes = tuple(ProcessSample(pid=1000 * step + i, sm_util=0.2, used_memory_bytes=1) for i in range(5))
        ledger.advance(GpuSample(ts=T0 + step, gpu="0", interval_s=1.0, gr_active=1.0, processes=processes), 10.0)
    totals, other, unattributed = ledger.totals_uj()
    assert len(totals) == MAX_REMEMBERED
    assert sum(totals.values()) + other + unattributed == 80 * 10 * MICROJOULES_PER_JOULE
