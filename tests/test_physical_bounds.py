"""One table of physical bounds for every backend's samples (issue 42, findings 6 and 7), in process.

The table (agent/model/bounds.py) covers every numeric field of a sample; each bound holds at its edges; the
collector applies it to every sample before the counters, the history, the classifier and the snapshot read it,
counts what it drops by source and field and logs it once per episode; an energy counter that flips units adds
nothing past what the board can draw; doctor names the GPU, the field, the value and the bound; ``classify`` and
``report`` drop the same values from a trace. The real agent against hostile exporters is
tests/test_physical_bounds_e2e.py.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import types
import typing

import pytest

from agent.collector import Collector, accumulate_counters
from agent.diagnostics.physical_bounds import bounds_findings
from agent.model import (DeviceCounters, DeviceInfo, GpuSample, GpuSpec, HostSample, LinkTraffic, ProcessSample,
                         RemappedRows, XidCount)
from agent.model.bounds import (ENERGY_FIRST_READ_AGE_S, EPISODE_QUIET_S, GPU_SAMPLE_BOUNDS, NOT_BOUNDED, RATIO,
                                bound_sample, energy_step_bound_for)
from exporters.prometheus import families_for

NESTED = {"processes": ProcessSample, "host": HostSample, "links": LinkTraffic, "xid_errors": XidCount,
          "remapped_rows": RemappedRows, "workload": None, "attribution": None}
H100 = GpuSpec(key="h100-test", name="H100 test", vendor="nvidia", peak_flops={"bf16": 989e12},
               mem_bandwidth_bytes_per_s=3.35e12, memory_bytes=80 * 2**30, tdp_w=700.0)


# -- the table covers every numeric field --------------------------------------------------------------

def _numeric(annotation: object) -> bool:
    """Whether a (resolved) annotation holds a number: int or float, alone, optional, in a tuple or dict value."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _numeric(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType, tuple, dict):
        args = typing.get_args(annotation)
        return any(_numeric(a) for a in (args[1:] if origin is dict else args) if a is not Ellipsis)
    return annotation in (int, float)


def numeric_fields(cls: type, prefix: str = "") -> set[str]:
    hints = typing.get_type_hints(cls, include_extras=True)
    out: set[str] = set()
    for field in dataclasses.fields(cls):
        if field.name in NESTED and not prefix:
            if NESTED[field.name] is None:
                out.add(field.name)  # a whole record the table exempts (or one without numbers)
            else:
                out |= numeric_fields(NESTED[field.name], field.name + ".")
        elif _numeric(hints[field.name]):
            out.add(prefix + field.name)
    return out


def test_every_numeric_field_of_a_sample_and_its_records_has_a_bound_or_a_reason():
    fields = numeric_fields(GpuSample)
    assert {"power_w", "temperature_c", "processes.cpu_cores", "links.read_bytes", "xid_errors.count"} <= fields
    covered = set(GPU_SAMPLE_BOUNDS) | set(NOT_BOUNDED) | {"attribution"}
    assert fields - covered == set(), "give each a bound in GPU_SAMPLE_BOUNDS, or a reason in NOT_BOUNDED"
    assert set(GPU_SAMPLE_BOUNDS) - fields == set(), "a bound for a field the sample does not have"
    for name, bound in GPU_SAMPLE_BOUNDS.items():
        assert bound.low < bound.high and len(bound.why) > 20, name
    assert all(len(reason) > 20 for reason in NOT_BOUNDED.values())


def test_the_table_holds_the_issues_numbers():
    b = GPU_SAMPLE_BOUNDS
    assert (b["temperature_c"].low, b["temperature_c"].high) == (-40.0, 150.0)
    assert (b["memory_temperature_c"].low, b["memory_temperature_c"].high) == (-40.0, 150.0)
    assert b["sm_clock_mhz"].high == 10_000.0 and b["sm_clock_max_mhz"].high == 10_000.0  # below 10 GHz
    assert all(b[f].high == 1.05 and b[f].low == 0.0 for f in ("gr_active", "tensor_active", "host.cpu_iowait_ratio"))
    assert b["energy_j"].low == 0.0


# -- every bound at its edges ----------------------------------------------------------------------------

def _edges(key: str) -> tuple[list[object], list[object]]:
    """Values at and just inside the bound (kept), and just outside it or not finite (dropped)."""
    bound = GPU_SAMPLE_BOUNDS[key]
    if isinstance(_example(key), int):
        low, high = math.ceil(bound.low), math.floor(bound.high)
        return [low, high], [low - 1, high + 1, 10**400]
    return ([bound.low, bound.high, math.nextafter(bound.high, 0.0)],
            [math.nextafter(bound.low, -math.inf), math.nextafter(bound.high, math.inf), 1e308, -1e308])


def _example(key: str) -> object:
    """The type a field holds: an int for counts, indexes and bytes, else a float."""
    ints = {"mem_used_bytes", "mem_total_bytes", "clock_event_reasons", "ecc_corrected_errors", "ecc_uncorrected_errors",
            "pcie_replays", "net_link_downs", "remapped_rows.correctable", "remapped_rows.uncorrectable",
            "xid_errors.xid", "xid_errors.count", "links.link", "processes.pid", "processes.used_memory_bytes",
            "processes.workers", "processes.rss_bytes", "processes.compute_units"}
    return 0 if key in ints else 0.0


def with_value(key: str, value: object) -> GpuSample:
    """A sample whose field ``key`` (``record.field`` when nested) holds ``value``."""
    record, _, attr = key.rpartition(".")
    base = GpuSample(ts=1000.0, gpu="0")
    if key == "clock_event_time_s":
        return dataclasses.replace(base, clock_event_time_s={"sw_power_cap": value})
    if not record:
        return dataclasses.replace(base, **{key: value})
    made = {"processes": lambda: (ProcessSample(pid=7, **{attr: value}) if attr != "pid" else ProcessSample(pid=value),),
            "links": lambda: (LinkTraffic(**{"link": 1, attr: value}),),
            "xid_errors": lambda: (XidCount(**{"xid": 79, "count": 1, "last_ts": 5.0, attr: value}),),
            "remapped_rows": lambda: RemappedRows(**{"correctable": 0, "uncorrectable": 0, "pending": False,
                                                      "failure": False, attr: value}),
            "host": lambda: HostSample(**{attr: value})}[record]()
    return dataclasses.replace(base, **{record: made})


def read_back(sample: GpuSample, key: str) -> object:
    record, _, attr = key.rpartition(".")
    if key == "clock_event_time_s":
        return (sample.clock_event_time_s or {}).get("sw_power_cap")
    if not record:
        return getattr(sample, key)
    held = getattr(sample, record)
    if isinstance(held, tuple):
        return getattr(held[0], attr) if held else None
    return getattr(held, attr) if held is not None else None


@pytest.mark.parametrize("key", sorted(GPU_SAMPLE_BOUNDS))
def test_each_bound_keeps_its_edges_and_drops_what_is_past_them(key):
    inside, outside = _edges(key)
    for value in inside:
        sample, rejected = bound_sample(with_value(key, value))
        assert rejected == (), (key, value, rejected)
        assert read_back(sample, key) == (min(value, 1.0) if GPU_SAMPLE_BOUNDS[key] is RATIO else value), (key, value)
    for value in outside:
        sample, rejected = bound_sample(with_value(key, value))
        assert [r.field for r in rejected] == [key], (key, value, rejected)
        assert read_back(sample, key) is None, (key, value)  # unknown, never 0
        assert rejected[0].bound.startswith(f"{GPU_SAMPLE_BOUNDS[key].low:g}..{GPU_SAMPLE_BOUNDS[key].high:g}")


def test_a_ratio_a_little_over_one_is_clamped_to_one_and_not_counted():
    sample, rejected = bound_sample(GpuSample(ts=1.0, gpu="0", gr_active=1.03, sm_active=1.06, dram_active=-0.01))
    assert (sample.gr_active, sample.sm_active, sample.dram_active) == (1.0, None, None)
    assert sorted(r.field for r in rejected) == ["dram_active", "sm_active"]


def test_power_is_bound_by_three_times_the_boards_limit_else_its_tdp_with_a_ceiling():
    def power(value: float, limit: float | None = None, spec: GpuSpec | None = H100) -> float | None:
        return bound_sample(GpuSample(ts=1.0, gpu="0", power_w=value, power_limit_w=limit), spec)[0].power_w

    assert power(2100.0) == 2100.0 and power(2100.5) is None  # 3 x the 700 W TDP where no limit is read
    assert power(350_000.0) is None  # milliwatts read as watts (finding 7)
    assert power(3000.0, limit=1000.0) == 3000.0 and power(3000.5, limit=1000.0) is None  # a raised limit counts
    assert power(2100.0, limit=300.0) == 2100.0  # a lowered limit does not make the TDP's range impossible
    assert power(4999.0, spec=None) == 4999.0 and power(5000.5, spec=None) is None  # the ceiling alone
    assert power(4000.0, limit=1e308, spec=None) == 4000.0  # an absurd limit is dropped, not used as a reference
    sample, rejected = bound_sample(GpuSample(ts=1.0, gpu="0", power_w=2500.0, power_limit_w=1e308), H100)
    assert sample.power_limit_w is None and sample.power_w is None
    assert [r.field for r in rejected] == ["power_limit_w", "power_w"] and "700 W TDP" in rejected[1].bound


def test_memory_is_bound_by_the_boards_size_with_a_ceiling():
    board = H100.memory_bytes
    kept, _ = bound_sample(GpuSample(ts=1.0, gpu="0", mem_used_bytes=board, mem_total_bytes=int(board * 1.25)), H100)
    assert (kept.mem_used_bytes, kept.mem_total_bytes) == (board, int(board * 1.25))
    proc = ProcessSample(pid=9, used_memory_bytes=board * 2)
    dropped, rejected = bound_sample(GpuSample(ts=1.0, gpu="0", mem_total_bytes=board * 2, processes=(proc,)), H100)
    assert dropped.mem_total_bytes is None and dropped.processes == (ProcessSample(pid=9),)
    assert {r.field for r in rejected} == {"mem_total_bytes", "processes.used_memory_bytes"}
    assert bound_sample(GpuSample(ts=1.0, gpu="0", mem_total_bytes=board * 2))[1] == ()  # no catalogue size: 4 TiB
    assert bound_sample(GpuSample(ts=1.0, gpu="0", mem_total_bytes=2**42 + 1))[0].mem_total_bytes is None


def test_a_record_whose_identity_is_impossible_is_dropped_whole_and_the_others_kept():
    good = ProcessSample(pid=12, cpu_cores=2.0)
    sample, rejected = bound_sample(GpuSample(
        ts=1.0, gpu="0", processes=(ProcessSample(pid=2**40, cpu_cores=1.0), good),
        links=(LinkTraffic(link=300, read_bytes=5.0), LinkTraffic(link=2, read_bytes=1e308)),
        xid_errors=(XidCount(xid=10**9, count=1, last_ts=1.0), XidCount(xid=79, count=2, last_ts=2.0))))
    assert sample.processes == (good,)
    assert sample.links == (LinkTraffic(link=2),)
    assert sample.xid_errors == (XidCount(xid=79, count=2, last_ts=2.0),)
    assert sorted(r.field for r in rejected) == ["links.link", "links.read_bytes", "processes.pid", "xid_errors.xid"]


def test_a_sample_within_every_bound_is_returned_as_it_came():
    sample = GpuSample(ts=1.0, gpu="0", gr_active=0.9, power_w=690.0, power_limit_w=700.0, temperature_c=-5.0,
                       sm_clock_mhz=1980.0, mem_used_bytes=70 * 2**30, energy_j=1.2e9, ecc_corrected_errors=3,
                       host=HostSample(cpu_iowait_ratio=0.1), processes=(ProcessSample(pid=1, cpu_cores=3.5),))
    assert bound_sample(sample, H100) == (sample, ())
    assert bound_sample(sample, H100)[0] is sample


# -- the collector: before anything reads a sample -------------------------------------------------------

class Scripted:
    """A backend whose next sample per GPU the test sets; ``counter_sources`` says which source gave which field."""

    name = "amd-exporter"

    def __init__(self, count: int = 2, spec: GpuSpec | None = H100) -> None:
        self.devices = [DeviceInfo(gpu=str(i), uuid=f"GPU-{i}", vendor="nvidia", model="H100", spec=spec)
                        for i in range(count)]
        self.values: dict[str, dict] = {d.gpu: {} for d in self.devices}
        self.sources: dict[str, str] = {}
        self.events: dict[str, tuple[XidCount, ...]] = {}

    def discover(self):
        return self.devices

    def sample(self, gpu: str, now: float) -> GpuSample:
        return GpuSample(ts=now, gpu=gpu, interval_s=1.0, **self.values[gpu])

    def counter_sources(self, gpu: str) -> dict[str, str]:
        return dict(self.sources)

    def device_events(self, gpu: str) -> tuple[XidCount, ...]:
        return self.events.get(gpu, ())

    def close(self) -> None:
        pass


class Clock:
    def __init__(self) -> None:
        self.t = 1_700_000_000.0

    def __call__(self) -> float:
        return self.t


def collector_of(backend: Scripted, clock: Clock, analyzer=None) -> Collector:
    return Collector(backend, node="n1", interval_s=1.0, sample_timeout_s=30.0, clock=clock, analyzer=analyzer)


def test_the_collector_drops_absurd_values_before_history_classifier_and_snapshot_and_counts_them(caplog):
    backend, clock, seen = Scripted(), Clock(), []
    backend.values["0"] = dict(power_w=1e308, temperature_c=-1e308, memory_temperature_c=1e308, sm_clock_mhz=1e308,
                               ecc_uncorrected_errors=int(1e308), gr_active=0.5)
    backend.values["1"] = dict(power_w=400.0, temperature_c=60.0, gr_active=0.7)
    backend.sources = {"temperature_c": "dcgm-exporter"}  # a joined source gave that field
    collector = collector_of(backend, clock, analyzer=lambda snap: seen.append(snap) or ())
    with caplog.at_level(logging.WARNING, logger="roofwatch.collector"):
        for _ in range(5):
            snapshot = collector.collect_once()
            clock.t += 1.0
    gpu0 = snapshot.devices[0].sample
    assert (gpu0.power_w, gpu0.temperature_c, gpu0.memory_temperature_c, gpu0.sm_clock_mhz,
            gpu0.ecc_uncorrected_errors, gpu0.gr_active) == (None, None, None, None, None, 0.5)
    assert snapshot.devices[1].sample.power_w == 400.0 and snapshot.devices[0].up
    assert all(s.power_w is None and s.temperature_c is None for s in collector.history("0"))
    assert all(d.sample.sm_clock_mhz is None for snap in seen for d in snap.devices if d.info.gpu == "0")
    counts = {(r.source, r.field): r.count for r in snapshot.rejected}
    assert counts == {("amd-exporter", "power_w"): 5, ("dcgm-exporter", "temperature_c"): 5,
                      ("amd-exporter", "memory_temperature_c"): 5, ("amd-exporter", "sm_clock_mhz"): 5,
                      ("amd-exporter", "ecc_uncorrected_errors"): 5}
    power = next(r for r in snapshot.rejected if r.field == "power_w")
    assert (power.gpu, power.value) == ("0", 1e308) and "700 W TDP" in power.bound
    lines = [r for r in caplog.records if "physical bounds" in r.getMessage()]
    assert len(lines) == 5, "one line per (source, field) episode, not one per sample"
    assert {(r.source, r.field) for r in lines} == set(counts)  # type: ignore[attr-defined]


def test_an_episode_ends_after_a_quiet_spell_and_the_next_refusal_is_logged_again(caplog):
    backend, clock = Scripted(count=1), Clock()
    collector = collector_of(backend, clock)
    with caplog.at_level(logging.WARNING, logger="roofwatch.collector"):
        for step in range(8):  # flapping units every other read: still one episode
            backend.values["0"] = dict(power_w=350.0 if step % 2 else 350_000.0)
            collector.collect_once()
            clock.t += 2.0
        backend.values["0"] = dict(power_w=350.0)
        clock.t += EPISODE_QUIET_S + 1.0
        collector.collect_once()
        backend.values["0"] = dict(power_w=350_000.0)
        collector.collect_once()
    lines = [r for r in caplog.records if "physical bounds" in r.getMessage()]
    assert len(lines) == 2
    assert collector.snapshot.rejected[0].count == 5


def test_an_xid_with_an_impossible_code_is_dropped_and_counted_once():
    backend, clock = Scripted(count=1), Clock()
    backend.events["0"] = (XidCount(xid=79, count=1, last_ts=1.0), XidCount(xid=int(1e308), count=1, last_ts=1.0))
    collector = collector_of(backend, clock)
    for _ in range(3):
        snapshot = collector.collect_once()
    assert snapshot.devices[0].xid_errors == (XidCount(xid=79, count=1, last_ts=1.0),)
    assert [(r.field, r.count) for r in snapshot.rejected] == [("xid_errors.xid", 1)]


# -- energy counters that flap (finding 7) ---------------------------------------------------------------

def test_an_energy_step_past_what_the_board_can_draw_adds_nothing_and_is_counted():
    prev = GpuSample(ts=100.0, gpu="0", energy_j=1.0e6)
    honest = GpuSample(ts=101.0, gpu="0", energy_j=1.0e6 + 700.0)
    bound = energy_step_bound_for(honest, 100.0, H100)  # 1 s at 700 W, x2
    assert bound.high == pytest.approx(1400.0)
    counters = accumulate_counters(DeviceCounters(energy_j=5.0), prev, honest, energy_bound=bound)
    assert counters.energy_j == pytest.approx(705.0) and counters.energy_steps_refused == 0
    flipped = GpuSample(ts=101.0, gpu="0", energy_j=1.0e9)  # the counter's unit changed: x1000
    counters = accumulate_counters(DeviceCounters(energy_j=5.0), prev, flipped,
                                   energy_bound=energy_step_bound_for(flipped, 100.0, H100))
    assert counters.energy_j == 5.0 and counters.energy_steps_refused == 1
    first = energy_step_bound_for(honest, None, H100)  # a first reading may be an exporter refresh old
    assert first.high == pytest.approx(700.0 * 2 * ENERGY_FIRST_READ_AGE_S)
    stepped_back = energy_step_bound_for(honest, 160.0, H100)  # the wall clock went back a minute
    assert stepped_back.high == first.high and stepped_back.admits(700.0)


def test_a_counter_and_power_flipping_units_every_read_never_grow_the_energy_total_past_the_board():
    backend, clock = Scripted(count=1), Clock()
    collector = collector_of(backend, clock)
    start, energy_mj = clock.t, 4.1e13
    for step in range(40):  # dcgm-exporter flipping between mJ and J (and W and mW) every other scrape
        energy_mj += 350.0 * 2.0 * 1000  # 350 W for the 2 s between reads
        flipped = step % 2 == 1
        backend.values["0"] = dict(energy_j=energy_mj / 1000 / (1000 if flipped else 1),
                                   power_w=350.0 * (1000 if flipped else 1))
        snapshot = collector.collect_once()
        assert snapshot.devices[0].sample.power_w in (350.0, None)
        clock.t += 2.0
    total = snapshot.devices[0].counters.energy_j
    assert total <= 700.0 * (clock.t - start + ENERGY_FIRST_READ_AGE_S) * 2, total
    counts = {r.field: r.count for r in snapshot.rejected}
    assert counts["energy_j_step"] >= 19 and counts["power_w"] == 20
    assert snapshot.devices[0].counters.energy_steps_refused == counts["energy_j_step"]


def test_an_exporter_counter_that_moves_every_30_s_is_integrated_whole():
    """dcgm-exporter's counters move once per collection (30 s by default) while the agent reads every second:
    each step covers the time since the counter last moved, and is added, at the board's full power too."""
    backend, clock = Scripted(count=1), Clock()
    collector = collector_of(backend, clock)
    energy, added = 5.0e8, 0.0
    for second in range(181):
        if second and second % 30 == 0:
            energy += 700.0 * 30  # the whole TDP for 30 s, in one step
            added += 700.0 * 30
        backend.values["0"] = dict(energy_j=energy, power_w=700.0)
        snapshot = collector.collect_once()
        clock.t += 1.0
    assert snapshot.devices[0].counters.energy_j == pytest.approx(added)
    assert snapshot.rejected == ()


# -- the counter on /metrics, doctor and traces ----------------------------------------------------------

def test_the_counter_family_is_exported_by_source_and_field():
    backend, clock = Scripted(count=1), Clock()
    backend.values["0"] = dict(power_w=1e308)
    collector = collector_of(backend, clock)
    collector.collect_once()
    collector.collect_once()
    families = {f.name: f for f in families_for(collector.snapshot)}
    samples = families["roofwatch_source_rejected_values"].samples
    assert [(s.labels, s.value) for s in samples if s.name.endswith("_total")] == [
        ({"node": "n1", "source": "amd-exporter", "field": "power_w"}, 2.0)]
    assert not families["roofwatch_gpu_power_watts"].samples


def test_doctor_names_the_gpu_the_field_the_value_and_the_bound():
    backend = Scripted()
    backend.values["1"] = dict(power_w=1e308, sm_clock_mhz=2.5e7)
    findings = bounds_findings(backend, backend.devices, now=1.0)
    assert [(f.gpu, f.status) for f in findings] == [("1", "warn"), ("1", "warn")]
    power = next(f for f in findings if "power_w" in f.detail)
    clock = next(f for f in findings if "sm_clock_mhz" in f.detail)
    assert "amd-exporter reports power_w = 1e+308" in power.detail and "0..2100 W" in power.detail
    assert "sm_clock_mhz = 2.5e+07" in clock.detail and "0..10000 MHz" in clock.detail
    assert "roofwatch_source_rejected_values_total" in power.impact
    assert bounds_findings(Scripted(), Scripted().devices, now=1.0) == []


def test_classify_drops_a_traces_absurd_values_and_says_so_once(tmp_path, capsys):
    from agent.app.commands_offline import read_traces

    path = tmp_path / "hostile.jsonl"
    path.write_text("\n".join(
        f'{{"ts": {1000 + i}, "gpu": "0", "interval_s": 1, "power_w": {"1e308" if i % 2 else "300"}, '
        f'"sm_clock_mhz": 1e300, "gr_active": 0.5}}' for i in range(10)) + "\n")
    samples = read_traces([str(path)])
    assert [s.power_w for s in samples] == [300.0, None] * 5
    assert all(s.sm_clock_mhz is None and s.gr_active == 0.5 for s in samples)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "dropped 15 readings outside their physical bounds" in err
    assert "sm_clock_mhz = 1e+300" in err and str(path) in err
