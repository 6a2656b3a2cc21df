"""The step-cycle traces in traces/published/ (jitter_a100, jitter_l40s, jitter_mi300x, jitter_h100):
synchronous 8-rank training drawn from published counter values on one step clock per job, steady and
communication-jittered. Data properties only: they regenerate byte for byte, every range cites a source,
every value lies between its compute and communication ranges, each library carries only its counters,
the three report variants, lockstep ranks, power falling as fabric bytes rise, and the step-time CVs.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from pathlib import Path

import pytest
import yaml

from agent.model import WORKLOAD_CLASSES, GpuSample
from agent.trace import read_trace
from tests.published_build import load_build

pytestmark = pytest.mark.slow

PUBLISHED = Path(__file__).resolve().parent.parent / "traces" / "published"


build = load_build("published_build_jitter")
TABLE = build.load_table()
NAMES = [name for name, trace in TABLE["traces"].items() if trace.get("kind") == "step_cycles"]
GPU_OF = {"jitter_a100": "a100", "jitter_l40s": "l40s", "jitter_mi300x": "mi300x", "jitter_h100": "h100"}
STEADY, JITTER = ("steady_dense", "steady_moe"), ("allreduce_jitter", "alltoall_jitter")

COUNTERS = ("gr_active", "sm_active", "sm_occupancy", "tensor_active", "fp64_active", "fp32_active", "fp16_active",
            "dram_active", "mem_busy", "util_gpu", "pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s", "pcie_bytes_per_s",
            "link_tx_bytes_per_s", "link_rx_bytes_per_s", "net_tx_bytes_per_s", "net_rx_bytes_per_s", "power_w",
            "temperature_c", "sm_clock_mhz", "energy_j", "memory_temperature_c", "tensor_hmma_active")
BASE = {"gr_active", "power_w", "temperature_c", "sm_clock_mhz", "net_tx_bytes_per_s", "net_rx_bytes_per_s"}
LINK = {"link_tx_bytes_per_s", "link_rx_bytes_per_s"}
LIBRARY_COUNTERS = {  # only what the real library gives on each model
    "mi300x": BASE | LINK | {"dram_active"},                                  # amdsmi: gfx, umc, XGMI
    "a100": BASE | LINK | {"mem_busy"},                                       # NVML alone: NVLink
    "l40s": BASE | {"mem_busy"},                                              # NVML alone, no NVLink
    "h100": BASE | LINK | {"sm_active", "tensor_active", "dram_active"},      # NVML with GPM
}


@pytest.fixture(scope="module")
def shipped() -> dict[str, list[tuple[str, GpuSample]]]:
    """Every shipped sample with the group/phase it was drawn from (generation order = file order)."""
    out = {}
    for name in NAMES:
        samples = list(read_trace(build.trace_path(name)))
        tagged = build.generate(TABLE, name)
        assert len(samples) == len(tagged), name
        for sample, (_, drawn) in zip(samples, tagged):
            assert (sample.ts, sample.node, sample.gpu) == (drawn.ts, drawn.node, drawn.gpu)
        out[name] = [(phase, sample) for sample, (phase, _) in zip(samples, tagged)]
    return out


def _by_gpu(samples: list[tuple[str, GpuSample]]) -> dict[tuple[str, str], list[tuple[str, GpuSample]]]:
    out: dict[tuple[str, str], list[tuple[str, GpuSample]]] = defaultdict(list)
    for phase, s in samples:
        out[(s.node, s.gpu)].append((phase, s))
    return out


def _job_of(sample: GpuSample) -> str:
    return sample.node.rsplit("-", 1)[0]


def _pearson(x: list[float], y: list[float]) -> float:
    mx, my = statistics.fmean(x), statistics.fmean(y)
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y))
    return sxy / math.sqrt(sum((a - mx) ** 2 for a in x) * sum((b - my) ** 2 for b in y))


def test_the_four_jitter_traces_are_shipped_and_regenerate_byte_for_byte(tmp_path: Path) -> None:
    assert sorted(NAMES) == sorted(GPU_OF)
    for name in NAMES:
        trace = TABLE["traces"][name]
        assert trace["phase_s"] == 300 and trace["order"] == ["steady_dense", "allreduce_jitter", "steady_moe", "alltoall_jitter"]
        assert [job["report"] for job in trace["jobs"]] == ["steps", "nostep", "none"]
        fresh = tmp_path / f"{name}.jsonl.gz"
        assert build.write_trace(TABLE, name, fresh) == 3 * 8 * 4 * 300
        assert fresh.read_bytes() == build.trace_path(name).read_bytes(), \
            f"{name}: regenerate with: python traces/published/build.py --write"


def test_every_mixed_range_and_cycle_number_cites_a_listed_source_or_says_why_not() -> None:
    used = set()
    for name in NAMES:
        group = TABLE["traces"][name]["jobs"][0]["phases"]
        for phase, spec in TABLE["phases"][group].items():
            assert spec["label"] == ("communication_jittered" if phase in JITTER else "compute_bound")
            assert spec["label"] in WORKLOAD_CLASSES
            assert set(spec["fields_compute"]) == set(spec["fields_comm"]) and spec["fields_compute"]
            entries = [(f"{part}/{key}", field) for part in ("fields", "fields_compute", "fields_comm")
                       for key, field in spec[part].items()]
            entries += [(f"cycle/{key}", [value[0], value[0], value[1]] if len(value) == 2 else value)
                        for key, value in spec["cycle"].items() if key != "layout"]
            for where, field in entries:
                source = build.parse_field(TABLE, f"{group}/{phase}/{where}", field)[2]
                used.add(source)
                assert source in TABLE["sources"] or (source.startswith("not published") and " because " in source), \
                    (group, phase, where, source)
    for key in used & set(TABLE["sources"]):
        assert TABLE["sources"][key]["url"] and len(TABLE["sources"][key]["says"]) > 30, key
    assert {"llama3", "packet-nccl", "megascale-moe", "amd-primus-moe", "dcgm-83", "issue-24"} <= used


def _refused(tmp_path: Path, edit, match: str) -> None:
    raw = yaml.safe_load((PUBLISHED / "sources.yaml").read_text(encoding="utf-8"))
    edit(raw["phases"]["a100_jitter"]["allreduce_jitter"])
    path = tmp_path / "sources.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    with pytest.raises(build.TableError, match=match):
        build.load_table(path)


def test_a_mixed_range_or_cycle_number_without_a_source_is_refused_naming_it(tmp_path: Path) -> None:
    def comm_power(spec):
        spec["fields_comm"] = dict(spec["fields_comm"], power_w=[110, 170, "a blog I remember"])
    _refused(tmp_path, comm_power, "a100_jitter/allreduce_jitter/fields_comm/power_w.*neither in sources")

    def cycle_cv(spec):
        spec["cycle"] = dict(spec["cycle"], cv=[0.25, "my guess"])
    _refused(tmp_path, cycle_cv, "a100_jitter/allreduce_jitter/cycle/cv.*neither in sources")

    def one_sided(spec):
        spec["fields_comm"] = {k: v for k, v in spec["fields_comm"].items() if k != "mem_busy"}
    _refused(tmp_path, one_sided, "must name the same fields.*mem_busy")

    def bad_share(spec):
        spec["cycle"] = dict(spec["cycle"], comm_share=[1.2, "llama3"])
    _refused(tmp_path, bad_share, "cycle/comm_share: 1.2 is not a share")

    def unknown_key(spec):
        spec["cycle"] = dict(spec["cycle"], period_s=[2.0, "llama3"])
    _refused(tmp_path, unknown_key, "allreduce_jitter/cycle: expected the keys")


def test_every_value_lies_between_its_compute_and_communication_ranges(shipped) -> None:
    checked: dict[str, int] = defaultdict(int)
    for name, samples in shipped.items():
        for tag, s in samples:
            group, phase = tag.split("/")
            spec = TABLE["phases"][group][phase]
            assert s.label == spec["label"]
            bounds = {key: build.parse_field(TABLE, key, field)[:2] for key, field in spec["fields"].items()}
            for key, field in spec["fields_compute"].items():
                lo_c, hi_c = build.parse_field(TABLE, key, field)[:2]
                lo_m, hi_m = build.parse_field(TABLE, key, spec["fields_comm"][key])[:2]
                bounds[key] = (min(lo_c, lo_m), max(hi_c, hi_m))
            for key, (lo, hi) in bounds.items():
                value = build.measured(s, key, TABLE, GPU_OF[name])
                assert value is not None, (name, s.node, s.gpu, s.ts, key)
                slack = 1e-6 * max(1.0, abs(hi))
                assert lo - slack <= value <= hi + slack, (name, s.node, s.gpu, s.ts, phase, key, value, lo, hi)
                checked[key] += 1
    for key in ("power_w", "gr_active", "mem_busy", "dram_active", "tensor_active", "net_tx_bytes_per_s",
                "link_tx_bytes_per_s", "temperature_c", "mem_used_frac"):
        assert checked[key] > 10_000, key


def test_each_library_carries_only_the_counters_it_reads_and_no_congestion_counters(shipped) -> None:
    for name, samples in shipped.items():
        gpu = GPU_OF[name]
        model = TABLE["gpus"][gpu]
        for _, s in samples:
            present = {c for c in COUNTERS if getattr(s, c) is not None}
            assert present == LIBRARY_COUNTERS[gpu], (name, sorted(present ^ LIBRARY_COUNTERS[gpu]))
            assert s.net_congestion_per_s is None and s.net_retransmits_per_s is None and s.net_link_downs is None
            assert s.model == model["model"] and s.power_limit_w == float(model["power_limit_w"])
            assert s.clock_event_reasons == (0 if model["vendor"] == "nvidia" else None)


def test_the_three_jobs_report_steps_step_times_only_or_nothing(shipped) -> None:
    for name, samples in shipped.items():
        jobs: dict[str, list[GpuSample]] = defaultdict(list)
        for _, s in samples:
            jobs[_job_of(s)].append(s)
        gpu = GPU_OF[name]
        assert set(jobs) == {f"jit-{gpu}-steps", f"jit-{gpu}-nostep", f"jit-{gpu}-noreport"}
        for job, rows in jobs.items():
            assert len(rows) == 8 * 4 * 300
            assert {(s.node, s.gpu) for s in rows} == {(f"{job}-{n}", str(i)) for n in (0, 1) for i in range(4)}
            if job.endswith("-noreport"):
                assert all(s.workload is None and s.dtype is None for s in rows)
                continue
            assert all(s.workload is not None for s in rows), job  # a report every second
            w = [s.workload for s in rows]
            assert {r.job for r in w} == {f"{gpu}-{job.rsplit('-', 1)[1]}"} and {r.world_size for r in w} == {8}
            assert {r.rank for r in w} == set(range(8))
            assert all(r.rank == int(s.gpu) + (4 if s.node.endswith("-1") else 0) for r, s in zip(w, rows))
            assert all(r.step_time_s > 0 and r.tokens_per_s > 0 and r.flops_per_token > 0 and r.dtype == "bf16" for r in w)
            if job.endswith("-steps"):
                assert all(isinstance(r.step, int) for r in w)
            else:
                assert all(r.step is None for r in w)


def test_all_ranks_of_a_job_share_the_step_clock_and_change_phase_together(shipped) -> None:
    for name, samples in shipped.items():
        at: dict[tuple[str, float], set] = defaultdict(set)
        phase_at: dict[tuple[str, float], set] = defaultdict(set)
        for phase, s in samples:
            key = (_job_of(s), s.ts)
            phase_at[key].add(phase)
            if s.workload is not None:
                at[key].add((s.workload.step, s.workload.step_time_s))
        assert all(len(p) == 1 for p in phase_at.values()), name  # no rotation across GPUs
        assert at and all(len(v) == 1 for v in at.values()), name  # lockstep: one step clock per job
        steps = [next(iter(v))[0] for k, v in sorted(at.items()) if k[0].endswith("-steps")]
        assert steps == sorted(steps) and len(set(steps)) > 300, name  # ids only move forward


def _phase_steps(samples: list[tuple[str, GpuSample]], job: str) -> dict[str, list[float]]:
    """Step lengths of the reporting job's rank 0, each step counted in the phase that first reports it."""
    seen, out = set(), defaultdict(list)
    for phase, s in samples:
        if s.node == f"{job}-0" and s.gpu == "0" and s.workload.step not in seen:
            seen.add(s.workload.step)
            out[phase.split("/")[1]].append(s.workload.step_time_s)
    return out


def test_step_times_are_steady_in_steady_phases_and_jitter_in_jittered_phases(shipped) -> None:
    for name, samples in shipped.items():
        for phase, times in _phase_steps(samples, f"jit-{GPU_OF[name]}-steps").items():
            cv = statistics.pstdev(times) / statistics.fmean(times)
            assert len(times) > 60, (name, phase)
            if phase in STEADY:
                assert cv <= 0.05, (name, phase, cv)
            else:
                assert cv >= 0.15, (name, phase, cv)
            group = TABLE["traces"][name]["jobs"][0]["phases"]
            assert 1.0 <= TABLE["phases"][group][phase]["cycle"]["mean_s"][0] <= 4.0, (name, phase)
            assert 1.0 <= statistics.fmean(times) <= 4.2, (name, phase)  # a rhythm of a few seconds


def test_power_falls_as_fabric_bytes_rise_in_the_jittered_phases(shipped) -> None:
    for name, samples in shipped.items():
        for (node, gpu), rows in _by_gpu(samples).items():
            by_phase: dict[str, list[GpuSample]] = defaultdict(list)
            for phase, s in rows:
                by_phase[phase.split("/")[1]].append(s)
            for phase in JITTER:
                power = [s.power_w for s in by_phase[phase]]
                r_net = _pearson(power, [s.net_tx_bytes_per_s for s in by_phase[phase]])
                assert r_net <= -0.4, (name, node, gpu, phase, r_net)
                if by_phase[phase][0].link_tx_bytes_per_s is not None:
                    r_link = _pearson(power, [s.link_tx_bytes_per_s for s in by_phase[phase]])
                    assert r_link <= -0.4, (name, node, gpu, phase, r_link)
            for steady, jittered in zip(STEADY, JITTER):  # the waits pull the average power down
                assert statistics.fmean(s.power_w for s in by_phase[jittered]) < \
                    statistics.fmean(s.power_w for s in by_phase[steady]), (name, node, gpu, jittered)

