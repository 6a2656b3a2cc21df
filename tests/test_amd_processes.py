"""Holders of a shared AMD GPU and their SM shares, from each source of per-process compute-unit occupancy.

* amdsmi, per release (tests/wheels.py): ``amdsmi_get_gpu_process_list`` has ``cu_occupancy`` from 6.4.2 (the
  6.4.0/6.4.1 wrappers' ``amdsmi_proc_info_t`` has 256-byte names and no such field; 6.2/6.3 have 32-byte names
  and none either). The real wrapper of each release over the fake libamd_smi: with the field the holders' SM
  shares follow it, without it they are unknown and the GPU's busy energy is unattributed, never split as 0.
* libamd_smi answers NO_PERM when it could not read a listed process's ``/proc`` entry (its name is then empty:
  another user's process, seen by an unprivileged agent), after filling the list; the wrapper raises and drops it.
* AMD's Device Metrics Exporter (1.5.0+): ``gpu_process_cu_occupancy{process_id=...}`` per process, read into the
  samples' processes over the fake exporter's HTTP server; bounded per GPU against a hostile exposition.
"""

from __future__ import annotations

import tracemalloc

import pytest

from agent.backends.amd_exporter.backend import AmdExporterBackend, amd_exporter_reader
from agent.backends.amd_exporter import exposition as dme_exposition
from agent.backends.amd_exporter.exposition import read_records
from agent.backends.exposition_text import MAX_SERIES
from agent.collector import Collector
from agent.model import ProcessSample
from agent.model.holders import HolderShare
from agent.virtual.fake_dme import VirtualDme
from agent.virtual.scenario import parse_scenario
from tests.amd_backend_rig import Rig
from tests.amdsmi_releases import package, release, version_of  # noqa: F401 (release is a fixture)
from tests.nvml_harness import ManualClock
from tests.test_shared_gpus import holders_by_key

SHARED = {"name": "amd-shared", "seed": 3, "nodes": [{
    "name": "n1", "model": "mi300x", "gpus": 1, "workloads": [{
        "job": "sliced", "gpus": [0], "phases": [{"kind": "compute", "duration_s": 3600, "mfu": 0.4}],
        "holders": [{"namespace": "a", "pod": "big", "share": 0.6, "mem_gib": 40},
                    {"namespace": "b", "pod": "small", "share": 0.2, "mem_gib": 20}]}]}]}
"""One MI300X time-sliced between two pods doing 3:1 of its work."""


def holders(collector: Collector, gpu: str = "0") -> dict[str, HolderShare]:
    return holders_by_key(collector, gpu)


def run(backend, clock: ManualClock, cycles: int = 4) -> Collector:
    collector = Collector(backend, node="n1", interval_s=1.0, clock=clock, monotonic=clock, sample_timeout_s=30.0)
    for _ in range(cycles):
        clock.advance(1.0)
        collector.collect_once()
    return collector


def with_cu_occupancy(version: str) -> bool:
    """Whether the release's ``amdsmi_get_gpu_process_list`` has ``cu_occupancy`` (6.4.2+)."""
    major, minor, patch, *_ = (int(p) for p in version.split("."))
    return (major, minor, patch) >= (6, 4, 2)


# -- amdsmi, per release ------------------------------------------------------------------------------------------

def test_a_gpu_shared_by_two_pods_per_amdsmi_release(release):
    rig = Rig(parse_scenario(SHARED), package(release))
    try:
        raw = rig.amdsmi.amdsmi_get_gpu_process_list(rig.backend._found["0"].handle)
        assert len(raw) == 2 and ("cu_occupancy" in raw[0]) is with_cu_occupancy(release)
        collector = run(rig.backend, rig.clock)
        shares = holders(collector)
        big, small, rest = shares["a/big/main"], shares["b/small/main"], shares["unattributed"]
        assert (big.memory_bytes, small.memory_bytes) == (40 * 2**30, 20 * 2**30)
        assert big.energy_j_total > 0 and small.energy_j_total > 0, "each holds the GPU: the idle floor is theirs"
        if with_cu_occupancy(release):
            assert big.sm_share > 0 and big.sm_share / small.sm_share == pytest.approx(3.0, rel=0.05)
            assert big.energy_j_total > small.energy_j_total
        else:  # no per-process figure: unknown, never 0 (0 would make both idle_held on a busy GPU)
            assert big.sm_share is None and small.sm_share is None
            assert big.verdict != "idle_held" and small.verdict != "idle_held"
            assert big.energy_j_total == pytest.approx(small.energy_j_total, rel=1e-6), "the idle floor, evenly"
            assert rest.energy_j_total > big.energy_j_total + small.energy_j_total, "the busy part: unattributed"
        collector.stop()
    finally:
        rig.close()


def test_a_process_the_caller_may_not_read_keeps_the_list_per_amdsmi_release(release):
    """libamd_smi fills the list, then answers NO_PERM because one process's name was unreadable (another user's,
    to an unprivileged agent); the wrapper raises and drops the list. The backend keeps it, every interval."""
    rig = Rig(parse_scenario(SHARED), package(release))
    try:
        handle = rig.backend._found["0"].handle
        rig.library.unreadable_pids = {min(p["pid"] for p in rig.amdsmi.amdsmi_get_gpu_process_list(handle))}
        with pytest.raises(rig.amdsmi.AmdSmiLibraryException) as raised:
            rig.amdsmi.amdsmi_get_gpu_process_list(handle)
        assert raised.value.get_error_code() == 10  # AMDSMI_STATUS_NO_PERM
        for _ in range(3):
            samples = rig.cycle()
            procs = samples["0"].processes
            assert procs is not None and len(procs) == 2, "the list libamd_smi filled is kept"
            assert all(p.used_memory_bytes for p in procs), "VRAM comes from KFD, readable to all"
            assert (procs[0].compute_units is not None) is with_cu_occupancy(release)
        assert "processes" in rig.backend.devices["0"].capabilities()
    finally:
        rig.close()


# -- AMD Device Metrics Exporter ----------------------------------------------------------------------------------

@pytest.mark.slow
def test_amd_exporter_mode_gives_holder_shares_from_gpu_process_cu_occupancy():
    """The backend over the fake exporter's HTTP server (DME's names and labels verbatim): each process a holder,
    its SM share its CU occupancy's weight of the GPU's activity (DME has no per-process memory)."""
    clock = ManualClock()
    rig = Rig(parse_scenario(SHARED))
    dme = VirtualDme(rig.library)
    try:
        rig.cycle()  # the fake library plays a sample for the exporter to render
        body = dme.body("/metrics")[0].decode()
        lines = [line for line in body.splitlines() if line.startswith("gpu_process_cu_occupancy{")]
        assert len(lines) == 2 and all('process_id="' in line and 'gpu_id="0"' in line for line in lines)
        reader = amd_exporter_reader(dme.url, interval_s=0.2, clock=clock)
        backend = AmdExporterBackend(reader)
        backend.first_read()
        (info,) = backend.discover()
        assert "processes" in info.capabilities
        truth = {p.pid: p.compute_units for p in rig.library.devices[0].latest.processes}
        sample = backend.sample(info.gpu, clock())
        assert {p.pid: p.compute_units for p in sample.processes} == truth
        collector = run(backend, clock, cycles=3)
        shares = [s for s in holders(collector).values() if s.holder.kind == "process"]
        by_pid = {s.holder.pids[0]: s for s in shares}
        assert set(by_pid) == set(truth)
        big, small = sorted(truth, key=truth.get, reverse=True)
        assert by_pid[big].sm_share / by_pid[small].sm_share == pytest.approx(truth[big] / truth[small], rel=1e-6)
        collector.stop()
        backend.close()
    finally:
        dme.close()
        rig.close()


GPU = 'gpu_id="0",gpu_partition_id="NA",serial_number="S1",card_model="102-G30211-0C",hostname="n"'


def exposition(processes: int, gpus: int = 1) -> str:
    lines = [f'gpu_gfx_activity{{{GPU.replace(chr(48), str(g), 1)}}} 50' for g in range(gpus)]
    lines += [f'gpu_process_cu_occupancy{{process_id="{1000 + i}",{GPU}}} {1 + i % 100}' for i in range(processes)]
    return "\n".join(lines) + "\n"


def test_process_series_are_read_per_gpu_by_pid():
    records = read_records(exposition(3, gpus=2)).records
    assert records["0"].processes == {1000: 1.0, 1001: 2.0, 1002: 3.0}
    assert records["1"].processes == {}, "the family is on: GPU 1 lists none"
    assert read_records(exposition(0)).records["0"].processes is None, "no family anywhere: unknown"


def test_a_process_id_that_is_no_pid_skips_its_line_only():
    body = exposition(2) + "".join(f'gpu_process_cu_occupancy{{process_id="{bad}",{GPU}}} 7\n'
                                  for bad in ("²", "0", "012", "-5", "99999999999", ""))
    parsed = read_records(body)
    assert parsed.records["0"].processes == {1000: 1.0, 1001: 2.0}
    assert parsed.skipped == 6 and "process_id" in parsed.first_bad


def test_past_the_bound_a_gpus_processes_are_unknown_and_a_note_says_which():
    """Past ``MAX_PROCESSES_PER_GPU`` a GPU's processes are unknown: no partial list, whose shares would be
    overstated; its other readings are kept."""
    bound = dme_exposition.MAX_PROCESSES_PER_GPU
    at_bound = read_records(exposition(bound)).records["0"]
    assert at_bound.processes is not None and len(at_bound.processes) == bound
    parsed = read_records(exposition(bound + 1))
    assert parsed.records["0"].processes is None and parsed.records["0"].values["gpu_gfx_activity"] == 50
    assert any(f"more than {bound}" in note and "gpu_id 0" in note for note in parsed.notes)


@pytest.mark.slow  # 100,000 lines under tracemalloc: about 10 s
def test_a_hostile_exposition_of_100000_process_series_holds_no_more_than_the_bound():
    """The most series a body may hold (the GPU's own line plus MAX_SERIES - 1 process lines; one more and it is
    refused whole) grows nothing with them: without the bound the PIDs alone held about 15 MiB."""
    body = exposition(MAX_SERIES - 1)
    tracemalloc.start()
    try:
        parsed = read_records(body)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2**20, f"{peak / 2**20:.1f} MiB: a dict of every PID would be ~15 MiB"
    assert parsed.records["0"].processes is None and parsed.records["0"].values["gpu_gfx_activity"] == 50


def test_an_unreadable_occupancy_is_unknown_never_zero():
    from agent.backends.amd_exporter.mapping import process_samples

    body = exposition(1) + f'gpu_process_cu_occupancy{{process_id="7",{GPU}}} 1e12\n'
    record = read_records(body).records["0"]
    assert process_samples(record) == (ProcessSample(pid=7, compute_units=None),
                                       ProcessSample(pid=1000, compute_units=1))


def test_amdsmi_without_cu_occupancy_joined_to_the_exporter_takes_its_occupancy_per_pid():
    """amdsmi 6.2.4 lists the processes but has no ``cu_occupancy``; DME 1.5 beside it has: the join fills each
    process's compute units by PID, and the holders' shares follow them (amdsmi's memory kept)."""
    from agent.backends.amd_exporter.join import AmdExporterJoin
    from agent.virtual.fake_dme import IN_PROCESS_URL

    rig = Rig(parse_scenario(SHARED), package("6.2.4"))
    dme = VirtualDme(rig.library, serve=False)
    try:
        reader = amd_exporter_reader(IN_PROCESS_URL, interval_s=0.2, fetch=dme.fetch, clock=rig.clock)
        join = AmdExporterJoin(rig.backend, reader)
        join.discover()
        rig.cycle()  # the fake library plays a sample for the exporter to render
        assert reader.read_once() is None
        truth = {p.pid: p.compute_units for p in rig.library.devices[0].latest.processes}
        sample = join.sample("0", rig.clock())
        assert {p.pid: p.compute_units for p in sample.processes} == truth
        assert all(p.used_memory_bytes for p in sample.processes), "amdsmi's own fields stay"
        collector = run(join, rig.clock, cycles=4)
        shares = holders(collector)
        big, small = shares["a/big/main"], shares["b/small/main"]
        assert big.sm_share > 0 and big.sm_share / small.sm_share == pytest.approx(3.0, rel=0.05)
        collector.stop()
        join.close()
    finally:
        dme.close()
        rig.close()


class PodsByPid:
    """A node's side that knows which pod each PID runs in (as its cgroups would say): it records the PIDs the
    backend asks about and groups them into holders with the real join (agent.context.attribution.holders)."""

    def __init__(self, pods: dict[int, tuple[str, str]]) -> None:
        self.pods = pods
        self.asked: list[list[int]] = []

    def facts(self, gpu, pids, now, *, bus_id=None, uuid=None):
        from types import SimpleNamespace

        from agent.context.attribution.holders import gpu_holders
        from agent.context.sources import HostFacts
        from agent.model import Attribution

        self.asked.append(list(pids))

        def pod_of(pid):
            if pid not in self.pods:
                return None
            namespace, name = self.pods[pid]
            return SimpleNamespace(namespace=namespace, pod=name, container="main")

        holders = gpu_holders((), list(pids), pod_of=pod_of, job_of=lambda _pid: None)
        return HostFacts(processes={}, attribution=Attribution(holders=holders) if holders else None)


@pytest.mark.slow
def test_amd_exporter_mode_joins_the_listed_processes_to_their_pods():
    """The exporter's PIDs go to the node's side, so each process joins its pod as on the amdsmi backend (before,
    the exporter backends asked the host about no PIDs, and every process stayed a bare ``pid:<n>``)."""
    clock = ManualClock()
    rig = Rig(parse_scenario(SHARED))
    dme = VirtualDme(rig.library)
    try:
        rig.cycle()
        pids = sorted(p.pid for p in rig.library.devices[0].latest.processes)
        host = PodsByPid({pids[0]: ("ml", "trainer"), pids[1]: ("research", "notebook")})
        backend = AmdExporterBackend(amd_exporter_reader(dme.url, interval_s=0.2, clock=clock), host=host)
        backend.first_read()
        (info,) = backend.discover()
        sample = backend.sample(info.gpu, clock())
        assert host.asked[-1] == pids, "the exporter's listed PIDs reach the node's side"
        assert sorted(h.key for h in sample.attribution.holders) == ["ml/trainer/main", "research/notebook/main"]
        backend.close()
    finally:
        dme.close()
        rig.close()
