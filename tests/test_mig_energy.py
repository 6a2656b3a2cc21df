"""MIG instances' energy (issue 47, item 2): each instance's estimated share of its GPU's energy, and the remainder.

NVML counts energy per board: a MIG device handle answers NOT_SUPPORTED, the parent handle gives the whole GPU's
counter. What is held here:

* the split's arithmetic: the instances' parts plus the remainder are the board's step to the microjoule for any
  inputs; seven busy 1g instances and seven idle ones share the board evenly; unconfigured slices stay
  unattributed;
* the fake driver answers as the real one does (the board's energy on the parent handle, NOT_SUPPORTED on a MIG
  handle; an idle board draws its idle power, whichever slices are configured), and the backend calls it once
  per board per cycle;
* over every built-in scenario with MIG GPUs, through the real NVML backend over the fake driver and the
  collector: instances + remainder == the fake parent counter's step, every cycle, to the microjoule; the idle
  instance gets only its floor, less than the busy 3g one;
* a parent counter that goes back counts no negative energy; a step past the board's power is refused;
* the exposition: energy per instance (marked ``mig-share`` in the device's counter sources), one remainder
  series per MIG parent with its index and UUID; whole-GPU nodes keep their series; the trace leaves the
  parent's counter out;
* the virtual backend (the demo's default) hands its MIG instances the same board counter;
* a real ``roofwatch demo --scenario shared`` process, on the virtual and the nvml-virtual backend, serves it
  all (slow).
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent.collector import Collector
from agent.model import DeviceInfo, GpuSample, ProcessSample
from agent.model.holders import split_energy
from agent.trace import TraceWriter, read_trace
from agent.virtual.physics import idle_power_w
from agent.virtual.scenario import BUILTIN_SCENARIOS, builtin_scenario, parse_scenario
from agent.model.specs import spec_by_key
from exporters.prometheus import ExpositionCache
from exporters.snapshot_json import snapshot_to_dict
from tests.agent_process import AgentProcess, clean_env, poll
from tests.nvml_harness import Rig

UJ = 1_000_000
ENERGY_CALL = "nvmlDeviceGetTotalEnergyConsumption"


def samples(text: str, name: str) -> list:
    return [s for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]


def scrape(collector: Collector) -> str:
    return ExpositionCache(lambda: collector.snapshot).render(generate_latest, "text/plain").decode()


def nvml_collector(rig: Rig) -> Collector:
    return Collector(rig.backend(), node="n", interval_s=1.0, clock=rig.clock, monotonic=rig.clock,
                     sample_timeout_s=30.0)


def board_mj(rig: Rig, index: int) -> int:
    """The fake driver's board counter of GPU ``index`` in mJ, asked through pynvml as any program would."""
    return int(rig.nvml.nvmlDeviceGetTotalEnergyConsumption(rig.nvml.nvmlDeviceGetHandleByIndex(index)))


def energy_by_gpu(text: str) -> dict[str, float]:
    return {s.labels["gpu"]: s.value for s in samples(text, "roofwatch_gpu_energy_joules_total")}


def mig_scenario(profiles: list[str], workloads: list[dict] | None = None):
    return parse_scenario({"name": "m", "seed": 3, "nodes": [
        {"name": "n1", "model": "h100-sxm", "gpus": 1, "mig": {0: profiles}, "workloads": workloads or []}]})


# -- the arithmetic ------------------------------------------------------------------------------------------------

instances = st.lists(st.tuples(st.sampled_from([1, 2, 3, 4, 7]), st.none() | st.floats(0.0, 1.0)), min_size=1,
                     max_size=7)


@settings(max_examples=400, deadline=None)
@given(instances, st.one_of(st.just(0), st.integers(0, 10**13)))
def test_the_split_gives_out_exactly_the_boards_step_and_nothing_negative(members, total) -> None:
    fractions = [g / 7 for g, _ in members]
    weights = [None if busy is None else busy * f for (_, busy), f in zip(members, fractions)]
    split = split_energy(total, None, weights, idle_shares=fractions)
    assert sum(split.by_holder) + split.unattributed_uj == total
    assert min(split.by_holder) >= 0 and split.unattributed_uj >= 0


def test_seven_busy_1g_instances_and_seven_idle_ones_share_the_board_evenly() -> None:
    step = 7 * UJ
    busy = split_energy(step, None, [1.0 / 7] * 7, idle_shares=[1 / 7] * 7)
    idle = split_energy(step, None, [0.0] * 7, idle_shares=[1 / 7] * 7)
    assert busy.by_holder == (UJ,) * 7 and busy.unattributed_uj == 0
    assert idle.by_holder == (UJ,) * 7 and idle.unattributed_uj == 0
    # One busy 1g, six idle: the busy seventh of the step is its own, the idle 6/7 split by slices (6 µJ of
    # integer-division leftovers stay unattributed): 1,000,000 + 857,142 and 857,142 each.
    one = split_energy(step, None, [1.0 / 7] + [0.0] * 6, idle_shares=[1 / 7] * 7)
    assert one.by_holder == (1_857_142,) + (857_142,) * 6 and one.unattributed_uj == 6


def test_unconfigured_slices_keep_their_idle_share_unattributed() -> None:
    # 1g + 2g + 3g of 7 slices, all idle: the 7th slice's floor, 1/7 of the step, is nobody's.
    split = split_energy(7 * UJ, None, [0.0, 0.0, 0.0], idle_shares=[1 / 7, 2 / 7, 3 / 7])
    assert split.by_holder == (UJ, 2 * UJ, 3 * UJ) and split.unattributed_uj == UJ


# -- the fake driver and the backend -------------------------------------------------------------------------------


def test_the_fake_driver_gives_the_board_energy_on_the_parent_handle_only() -> None:
    rig = Rig(mig_scenario(["1g.10gb", "3g.40gb"]))
    try:
        nvml = rig.nvml
        nvml.nvmlInit()
        parent = nvml.nvmlDeviceGetHandleByIndex(0)
        mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 0)
        with pytest.raises(nvml.NVMLError) as refused:
            nvml.nvmlDeviceGetTotalEnergyConsumption(mig)
        assert refused.value.value == nvml.NVML_ERROR_NOT_SUPPORTED
        before = board_mj(rig, 0)
        rig.step(10.0)
        drawn_w = (board_mj(rig, 0) - before) / 1000.0 / 10.0
        # Nothing runs on it: the board draws its idle power (10 % of the H100's 700 W TDP), configured slices
        # or not, plus the engine's idle noise of at most 1.5 W per instance.
        idle = idle_power_w(spec_by_key("h100-sxm").tdp_w)
        assert idle <= drawn_w <= idle + 2 * 1.5, drawn_w
    finally:
        rig.close()


def test_the_backend_reads_the_board_once_per_cycle_for_all_its_instances() -> None:
    rig = Rig(builtin_scenario("shared"))
    try:
        collector = nvml_collector(rig)
        before = rig.library.calls[("3", ENERGY_CALL)]
        for _ in range(5):
            rig.step(1.0)
            collector.collect_once()
        assert rig.library.calls[("3", ENERGY_CALL)] - before == 5
        assert all(rig.library.calls[(f"3/{i}", ENERGY_CALL)] == 0 for i in (1, 2, 3))
    finally:
        rig.close()


# -- the split over every scenario, through the real backend -------------------------------------------------------


def published_uj(snapshot) -> dict[str, int]:
    """Every MIG instance's energy total and every board's remainder (key ``"<index>/unattributed"``) in the
    snapshot, in whole µJ: the split works in µJ, so the published joules round back exactly."""
    out = {d.info.gpu: round(d.counters.energy_j * UJ) for d in snapshot.devices
           if "/" in d.info.gpu and d.counters.energy_j is not None}
    out.update({f"{p.gpu}/unattributed": round(p.unattributed_j * UJ) for p in snapshot.mig_parents})
    return out


def _mig_nodes() -> list[tuple[str, str]]:
    return [(name, node.name) for name in BUILTIN_SCENARIOS for node in builtin_scenario(name).nodes if node.mig]


@pytest.mark.parametrize(("scenario", "node"), _mig_nodes())
def test_instances_and_remainder_add_up_to_the_boards_counter_step_in_every_scenario(scenario, node) -> None:
    rig = Rig(builtin_scenario(scenario), node=node)
    try:
        collector = nvml_collector(rig)
        boards = sorted({int(gpu.split("/")[0]) for gpu in (d.gpu for d in collector.devices) if "/" in gpu})
        assert boards, "a scenario listed for its MIG GPUs has some"
        last = {b: None for b in boards}
        gained_some = False
        before: dict[str, int] = {}
        for _ in range(8):
            rig.step(1.0)
            after = published_uj(collector.collect_once())
            for b in boards:
                counter = board_mj(rig, b)
                mine = [key for key in after if key.split("/")[0] == str(b)]
                gained = sum(after[key] - before.get(key, 0) for key in mine)
                if last[b] is not None:
                    assert gained == (counter - last[b]) * 1000, (scenario, b)
                    gained_some |= gained > 0
                assert all(after[key] >= before.get(key, 0) for key in mine), "an energy total went down"
                last[b] = counter
            before = after
        assert gained_some
    finally:
        rig.close()


def test_the_virtual_backend_splits_the_same_board_as_the_fake_driver_gives() -> None:
    """``--backend virtual`` (the demo's default) hands each instance the board's counter as the fake driver's
    parent handle answers it, under the same UUID: the same scenario played both ways bills its boards alike."""
    plain, driven = Rig(builtin_scenario("shared")), Rig(builtin_scenario("shared"))
    try:
        virtual = plain.virtual
        assert virtual.mig_parent("0") is None
        driven.backend()
        parent_uuid = driven.nvml.nvmlDeviceGetUUID(driven.nvml.nvmlDeviceGetHandleByIndex(3))
        assert virtual.mig_parent("3/3") == ("3", parent_uuid)
        collectors = [Collector(virtual, node="n", interval_s=1.0, clock=plain.clock, monotonic=plain.clock),
                      nvml_collector(driven)]
        plain.clock.advance(driven.clock() - plain.clock())  # the NVML probe's 120 ms: both read at the same times
        for _ in range(4):
            for rig, collector in zip((plain, driven), collectors):
                rig.step(1.0)
                collector.collect_once()
        sample = next(d.sample for d in collectors[0].snapshot.devices if d.info.gpu == "3/3")
        assert sample.energy_j is None and sample.parent_energy_j is not None  # no energy of its own, as NVML
        boards = []
        for collector in collectors:
            energy = energy_by_gpu(scrape(collector))
            assert all(energy[g] > 0 for g in ("3/1", "3/2", "3/3"))
            (parent,) = collector.snapshot.mig_parents
            assert (parent.gpu, parent.uuid) == ("3", parent_uuid)
            boards.append(sum(energy[g] for g in ("3/1", "3/2", "3/3")) + parent.unattributed_j)
        # Three steps of the same board from the same seed: the same joules, however each side splits them.
        assert boards[0] == pytest.approx(boards[1], abs=1e-3) and boards[0] > 3 * 100
    finally:
        plain.close()
        driven.close()


@pytest.fixture(scope="module")
def shared_scrape():
    rig = Rig(builtin_scenario("shared"))
    try:
        collector = nvml_collector(rig)
        rig.step(1.0)
        collector.collect_once()
        first = scrape(collector)
        start = board_mj(rig, 3)
        for _ in range(10):
            rig.step(1.0)
            collector.collect_once()
        yield first, scrape(collector), (board_mj(rig, 3) - start) / 1000.0, collector.snapshot
    finally:
        rig.close()


def test_the_idle_instance_gets_only_its_floor_less_than_the_busy_3g(shared_scrape) -> None:
    first, text, board_j, _ = shared_scrape
    start, end = energy_by_gpu(first), energy_by_gpu(text)
    gained = {gpu: end[gpu] - start[gpu] for gpu in ("3/1", "3/2", "3/3")}
    # 3/2 (2g.20gb) runs nothing: it gets its 2/7 of the idle floor and no busy energy, so less than its slice
    # share of the board and less than the fine-tuning 3g instance, yet more than nothing (it keeps 2/7 allocated).
    assert 0 < gained["3/2"] < board_j * 2 / 7
    assert gained["3/2"] < gained["3/3"]
    assert gained["3/3"] > board_j * 3 / 7  # the busy one takes the busy energy beyond its floor


def test_each_instance_has_energy_and_its_board_one_remainder_series(shared_scrape) -> None:
    _, text, board_j, snapshot = shared_scrape
    info = {s.labels["gpu"]: s.labels["uuid"] for s in samples(text, "roofwatch_gpu_info")}
    energy = energy_by_gpu(text)
    assert {"3/1", "3/2", "3/3"} <= set(energy)
    remainder = samples(text, "roofwatch_gpu_mig_unattributed_energy_joules_total")
    assert [(s.labels["gpu"], s.labels["node"]) for s in remainder] == [("3", "n")]
    parent_uuid = remainder[0].labels["uuid"]
    assert parent_uuid.startswith("GPU-") and parent_uuid not in info.values()  # the board, not an instance
    assert all(info[g].startswith("MIG-") for g in ("3/1", "3/2", "3/3"))
    assert remainder[0].value > 0  # the 7th slice, in no instance, idles there
    devices = {d.info.gpu: d for d in snapshot.devices}
    assert all(devices[g].counter_sources.get("energy_j") == "mig-share" for g in ("3/1", "3/2", "3/3"))
    assert all("energy_j" not in devices[g].counter_sources for g in ("0", "4"))
    data = snapshot_to_dict(snapshot)  # what /api/v1/snapshot serves: the estimate marked, the board's remainder
    marked = {d["info"]["gpu"] for d in data["devices"] if d["counter_sources"].get("energy_j") == "mig-share"}
    assert marked == {"3/1", "3/2", "3/3"}
    assert [(p["gpu"], p["uuid"]) for p in data["mig_parents"]] == [("3", parent_uuid)]


def test_whole_gpu_nodes_have_no_mig_series() -> None:
    rig = Rig(builtin_scenario("demo"))
    try:
        collector = nvml_collector(rig)
        for _ in range(2):
            rig.step(1.0)
            collector.collect_once()
        text = scrape(collector)
        assert samples(text, "roofwatch_gpu_mig_unattributed_energy_joules_total") == []
        assert all(d.sample is None or d.sample.parent_energy_j is None for d in collector.snapshot.devices)
    finally:
        rig.close()


# -- resets and bounds ---------------------------------------------------------------------------------------------


class _Board:
    """Two 1g MIG instances of one H100 whose board counter the test sets (a reset, a jump)."""

    name = "test"
    counter = 1000.0

    def discover(self):
        return [DeviceInfo(gpu=f"0/{i}", uuid=f"MIG-{i}", vendor="nvidia", model="NVIDIA H100 80GB HBM3 MIG 1g.10gb",
                           spec=spec_by_key("h100-sxm")) for i in (1, 2)]

    def mig_parent(self, gpu: str):
        return "0", "GPU-board"

    def sample(self, gpu: str, now: float) -> GpuSample:
        return GpuSample(ts=now, gpu=gpu, interval_s=1.0, gr_active=0.5, parent_energy_j=self.counter)

    def close(self) -> None:
        pass


def test_a_parent_counter_that_goes_back_counts_no_negative_energy() -> None:
    board, t = _Board(), [1_800_000_000.0]
    collector = Collector(board, node="n", interval_s=1.0, clock=lambda: t[0], monotonic=lambda: t[0])
    totals = []
    for counter in (1000.0, 1300.0, 50.0, 350.0):  # +300 J, a driver reload back to 50 J, +300 J
        board.counter = counter
        t[0] += 1.0
        snap = collector.collect_once()
        energy = {d.info.gpu: d.counters.energy_j for d in snap.devices}
        remainder = snap.mig_parents[0].unattributed_j
        totals.append(sum(energy.values()) + remainder)
        assert all(later >= earlier for earlier, later in zip(totals, totals[1:])), "energy went down"
    assert totals == pytest.approx([0.0, 300.0, 300.0, 600.0], abs=1e-6)


class _SharedInstanceBoard(_Board):
    """Instance 0/1 time-sliced between two processes (3:1 SM time); 0/2 whole."""

    def sample(self, gpu: str, now: float) -> GpuSample:
        sample = super().sample(gpu, now)
        if gpu != "0/1":
            return sample
        return dataclasses.replace(sample, processes=(ProcessSample(pid=11, sm_util=0.3, used_memory_bytes=2**30),
                                                      ProcessSample(pid=12, sm_util=0.1, used_memory_bytes=2**30)))


def test_the_holders_of_a_shared_instance_split_its_share_of_the_board() -> None:
    board, t = _SharedInstanceBoard(), [1_800_000_000.0]
    collector = Collector(board, node="n", interval_s=1.0, clock=lambda: t[0], monotonic=lambda: t[0])
    for counter in (1000.0, 1300.0, 1600.0):
        board.counter = counter
        t[0] += 1.0
        snap = collector.collect_once()
    instance = next(d for d in snap.devices if d.info.gpu == "0/1")
    shares = {s.holder.key: s.energy_j_total for s in instance.holders}
    assert set(shares) == {"pid:11", "pid:12", "unattributed"}
    # The holders' energy with their remainder is the instance's share of the board, not 0 as before.
    assert sum(shares.values()) == pytest.approx(instance.counters.energy_j, abs=1e-6) and instance.counters.energy_j > 0
    assert shares["pid:11"] > shares["pid:12"] > 0


def test_a_parent_step_past_what_the_board_can_draw_is_refused_and_counted() -> None:
    board, t = _Board(), [1_800_000_000.0]
    collector = Collector(board, node="n", interval_s=1.0, clock=lambda: t[0], monotonic=lambda: t[0])
    for counter in (1000.0, 1300.0, 1e9):  # 1e9 J in a second: no H100 draws a gigawatt
        board.counter = counter
        t[0] += 1.0
        snap = collector.collect_once()
    assert sum(d.counters.energy_j for d in snap.devices) + snap.mig_parents[0].unattributed_j == pytest.approx(300.0)
    assert [(r.gpu, r.field) for r in snap.rejected] == [("0", "energy_j_step")]


def test_the_parent_counter_stays_out_of_traces(tmp_path) -> None:
    path = tmp_path / "t.jsonl"
    with TraceWriter(path, node="n") as writer:
        writer.write(GpuSample(ts=1.0, gpu="3/1", parent_energy_j=123.0, gr_active=0.5))
    assert "parent_energy" not in path.read_text()
    (sample,) = list(read_trace(path))
    assert sample.parent_energy_j is None and sample.gr_active == 0.5


def test_a_parent_counter_past_its_bound_is_dropped_as_it_arrives() -> None:
    from agent.model.bounds import bound_sample

    sample, rejected = bound_sample(GpuSample(ts=1.0, gpu="3/1", parent_energy_j=1e308), None)
    assert sample.parent_energy_j is None and [r.field for r in rejected] == ["parent_energy_j"]


# -- a real agent --------------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["virtual", "nvml-virtual"])
def test_a_real_agent_serves_each_instances_energy_and_the_boards_remainder(backend: str) -> None:
    agent = AgentProcess("demo", "--listen", "127.0.0.1:0", "--backend", backend, "--scenario", "shared",
                         env=clean_env())
    try:
        agent.wait_healthy(60)

        def grown() -> str | None:
            text = agent.metrics()
            energy = energy_by_gpu(text)
            remainder = samples(text, "roofwatch_gpu_mig_unattributed_energy_joules_total")
            ready = all(energy.get(g, 0.0) > 0 for g in ("3/1", "3/2", "3/3")) and remainder
            return text if ready else None

        first = poll(grown, 60, interval=0.5, what="MIG instances' energy in /metrics")

        def later_on() -> str | None:
            text = agent.metrics()
            return text if energy_by_gpu(text)["3/3"] > energy_by_gpu(first)["3/3"] + 100 else None

        later = poll(later_on, 60, interval=0.5, what="100 J more on the 3g instance")
        start, end = energy_by_gpu(first), energy_by_gpu(later)
        assert end["3/2"] - start["3/2"] < end["3/3"] - start["3/3"]  # idle 2g: its floor only
        (remainder,) = samples(later, "roofwatch_gpu_mig_unattributed_energy_joules_total")
        assert remainder.labels["gpu"] == "3" and remainder.labels["uuid"].startswith("GPU-")
        whole = {s.labels["gpu"] for s in samples(later, "roofwatch_gpu_info")}
        assert "3" not in whole and {"0", "3/1", "3/2", "3/3"} <= whole
    finally:
        agent.stop()


# -- doctor ---------------------------------------------------------------------------------------------------------


def _mig_doctor(**nvml: object) -> dict[str, list]:
    """doctor's MIG findings per instance of one H100 in two 3g instances, after one read of each."""
    from agent.diagnostics.nvidia import nvml_findings
    from tests.nvml_harness import scenario

    rig = Rig(scenario(gpus=1, mig={0: ["3g.40gb", "3g.40gb"]}, nvml=nvml,
                       workloads=[{"job": "j", "gpus": ["0/1"], "phases": [{"kind": "compute", "mfu": 0.4,
                                                                            "duration_s": 3600}]}]))
    try:
        backend = rig.backend()
        infos = backend.discover()
        now = rig.step()
        for info in infos:
            backend.sample(info.gpu, now)
        findings, _ = nvml_findings(backend)
        out: dict[str, list] = {}
        for f in findings:
            if f.check.startswith("MIG"):
                out.setdefault(f.gpu, []).append(f)
        return out
    finally:
        rig.close()


def test_doctor_says_an_instances_energy_is_an_estimate_and_warns_when_the_board_counter_is_unreadable() -> None:
    readable = _mig_doctor()
    assert set(readable) == {"0/1", "0/2"}
    for found in readable.values():
        assert [f.status for f in found] == ["info"] and "estimate" in found[0].detail
    refused = _mig_doctor(not_supported=["nvmlDeviceGetTotalEnergyConsumption"])
    for gpu, found in refused.items():
        warn = [f for f in found if f.check == "MIG energy"]
        assert len(warn) == 1 and warn[0].status == "warn", gpu
        assert "0 kWh" in warn[0].impact and "unreadable" in warn[0].detail
