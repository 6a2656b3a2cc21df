"""Labelled traces from PUBLISHED counter values (traces/published/): they regenerate byte for byte,
every value lies in a range the source table cites, and the classifier reads them right.

These traces exist because traces/labelled/ comes from our own simulator; the classifier must also
hold on numbers other people measured, on GPUs without tensor counters (A100 and L40S through NVML
alone, MI300X through amdsmi), on a gappy collector and on a jittering multi-node MoE job.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import pytest

from agent.classifier.engine import classify_samples
from agent.classifier.evaluate import Evaluation, evaluate
from agent.model import WORKLOAD_CLASSES, GpuSample, Verdict
from agent.model.specs.lookup import lookup
from agent.trace import read_trace
from tests.published_build import load_build

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
PUBLISHED = REPO / "traces" / "published"


build = load_build("published_build")
TABLE = build.load_table()
NAMES = list(TABLE["traces"])
CLASSIFIED = [name for name in NAMES if TABLE["traces"][name].get("kind") != "step_cycles"]
"""The traces classified here; the step-cycle traces (jitter_*) have their data tests in
tests/test_published_jitter_traces.py and are classified elsewhere."""


@pytest.fixture(scope="module")
def shipped() -> dict[str, list[GpuSample]]:
    return {name: list(read_trace(build.trace_path(name))) for name in NAMES}


@pytest.fixture(scope="module")
def evaluations(shipped: dict[str, list[GpuSample]]) -> dict[str, tuple[Evaluation, list[Verdict]]]:
    out = {}
    for name in CLASSIFIED:
        verdicts = list(classify_samples(shipped[name]))
        out[name] = (evaluate(verdicts), verdicts)
    return out


def test_every_trace_is_shipped_and_regenerates_byte_for_byte(tmp_path: Path) -> None:
    assert sorted(p.name for p in PUBLISHED.glob("*.jsonl.gz")) == sorted(f"{n}.jsonl.gz" for n in NAMES)
    for name in CLASSIFIED:  # the jitter_* files: tests/test_published_jitter_traces.py
        fresh = tmp_path / f"{name}.jsonl.gz"
        build.write_trace(TABLE, name, fresh)
        assert fresh.read_bytes() == build.trace_path(name).read_bytes(), \
            f"{name}: regenerate with: python traces/published/build.py --write"


def test_every_range_cites_a_listed_source_or_says_it_is_not_published() -> None:
    used = set()
    for group, phases in TABLE["phases"].items():
        for phase, spec in phases.items():
            assert spec["label"] in WORKLOAD_CLASSES, (group, phase)
            for key, field in spec["fields"].items():
                source = build.parse_field(TABLE, f"{group}/{phase}/{key}", field)[2]
                used.add(source)
                assert source in TABLE["sources"] or " because " in source, (group, phase, key, source)
    for key, src in TABLE["sources"].items():
        assert src["url"] and len(src["says"]) > 30, key
    assert {"issue-24", "internlm-248", "dcgm-83", "rocm-5231", "inferencex-828", "yolov3-1926"} <= used


def test_a_range_without_a_source_is_refused_naming_the_field() -> None:
    with pytest.raises(build.TableError, match="a100/train/power_w.*neither in sources"):
        build.parse_field(TABLE, "a100/train/power_w", [300, 345, "a blog I remember"])
    with pytest.raises(build.TableError, match="x/y/gr_active: low 0.9 above high 0.5"):
        build.parse_field(TABLE, "x/y/gr_active", [0.9, 0.5, "dcgm-83"])


def test_every_value_lies_in_the_range_its_phase_cites(shipped: dict[str, list[GpuSample]]) -> None:
    checked = Counter()
    for name in CLASSIFIED:  # the jitter_* files mix two ranges: tests/test_published_jitter_traces.py
        phase_of = {(s.node, s.gpu, s.ts): phase for phase, s in build.generate(TABLE, name)}
        for sample in shipped[name]:
            group, phase = phase_of[(sample.node, sample.gpu, sample.ts)].split("/")
            spec = TABLE["phases"][group][phase]
            assert sample.label == spec["label"]
            gpu_key = build.gpu_key_of(TABLE, group)
            for key, field in spec["fields"].items():
                lo, hi, _, _ = build.parse_field(TABLE, key, field)
                value = build.measured(sample, key, TABLE, gpu_key)
                if value is None:
                    continue
                # derived workload figures carry the rounding of the reported tokens/s and step time
                slack = (1e-4 if key.startswith("workload.") else 1e-6) * max(1.0, abs(hi))
                assert lo - slack <= value <= hi + slack, (name, sample.node, sample.gpu, sample.ts, phase, key, value)
                checked[key] += 1
    for key in ("gr_active", "mem_busy", "dram_active", "power_w", "workload.mfu", "workload.mbu",
                "workload.step_time_s", "net_tx_bytes_per_s", "process.cpu_workers_cores"):
        assert checked[key] > 500, key


def test_gpus_without_tensor_counters_carry_only_what_their_library_reads(shipped: dict[str, list[GpuSample]]) -> None:
    for name, samples in shipped.items():
        for s in samples:
            if s.model == "NVIDIA H100 80GB HBM3":
                assert s.tensor_active is not None and s.sm_active is not None
                continue
            assert s.tensor_active is None and s.sm_active is None and s.sm_occupancy is None, (name, s.model)
            if s.vendor == "nvidia":  # NVML alone: utilization.memory, never a bandwidth fraction
                assert s.dram_active is None, name
            else:  # amdsmi: umc_activity in dram_active, no NVML busy-time ratio, no NVML bitmask
                assert s.mem_busy is None and s.clock_event_reasons is None, name
    a100 = shipped["a100"]
    assert {s.gpu for s in a100 if s.power_limit_w is None} == {"2", "3"}
    assert {s.power_limit_w for s in a100 if s.power_limit_w is not None} == {400.0}
    capped = [s for s in a100 if s.label == "compute_bound" and s.clock_event_reasons == 0x4]
    assert capped and all(s.power_w >= 385 for s in capped)


def test_the_gappy_collector_misses_about_15_percent_of_reads_and_nulls_single_fields(shipped: dict[str, list[GpuSample]]) -> None:
    trace = TABLE["traces"]["gappy"]
    expected = trace["gpus"] * trace["phase_s"] * len(trace["phases"])
    samples = shipped["gappy"]
    assert 0.12 <= 1 - len(samples) / expected <= 0.18
    per_gpu: dict[str, list[float]] = {}
    for s in samples:
        per_gpu.setdefault(s.gpu, []).append(s.ts)
    assert all(max(b - a for a, b in zip(ts, ts[1:])) >= 3.0 for ts in per_gpu.values())  # real holes
    null_power = sum(s.power_w is None for s in samples) / len(samples)
    null_busy = sum(s.mem_busy is None and s.label != "idle" for s in samples)
    assert 0.03 <= null_power <= 0.07 and null_busy > 50


def test_the_mi300x_training_job_reports_mfu_35_percent_against_the_catalogue_peak(shipped: dict[str, list[GpuSample]]) -> None:
    spec = lookup(vendor="amd", name="AMD Instinct MI300X")
    assert spec is not None
    peak = spec.peak_flops["bf16"] / 1e12
    assert peak == pytest.approx(1307.4)
    training = [s for s in shipped["mi300x"] if s.workload and s.workload.job == "mi300x-llama-70b"]
    assert len(training) == 4 * 300
    mfu = [s.workload.tokens_per_s * s.workload.flops_per_token / (s.workload.world_size * peak * 1e12) for s in training]
    assert 0.34 <= sum(mfu) / len(mfu) <= 0.36
    umc = [s.dram_active for s in training]
    assert 0.30 <= sum(umc) / len(umc) <= 0.32
    assert all(s.label == "compute_bound" for s in training)


def test_the_moe_jobs_step_times_jitter_like_published_all_to_all(shipped: dict[str, list[GpuSample]]) -> None:
    for job, ranks in (("moe-a100", 16), ("moe-h100", 16)):
        reports = [s.workload for s in shipped["moe_multinode"] if s.workload and s.workload.job == job]
        assert {r.rank for r in reports} == set(range(ranks))
        steps = {r.step: r.step_time_s for r in reports}
        times = list(steps.values())
        mean = sum(times) / len(times)
        cv = math.sqrt(sum((t - mean) ** 2 for t in times) / len(times)) / mean
        assert 0.12 <= cv <= 0.32, (job, cv)


def _table(ev: Evaluation) -> str:
    return "\n" + ev.table()


@pytest.mark.parametrize("name", CLASSIFIED)
def test_every_class_a_gpu_shows_is_recalled_at_least_90_percent(
        name: str, evaluations: dict[str, tuple[Evaluation, list[Verdict]]]) -> None:
    ev, _ = evaluations[name]
    labelled = {p["label"] for group in TABLE["phases"].values() for p in group.values()}
    present = [c for c in WORKLOAD_CLASSES if ev.support(c)]
    assert set(present) <= labelled and present, name
    failing = {c: round(ev.recall(c), 3) for c in present if ev.recall(c) < 0.9}
    assert failing == {}, f"{name}: recall below 0.9 {failing}{_table(ev)}"


def test_each_class_has_at_least_100_windows_across_the_traces(evaluations: dict[str, tuple[Evaluation, list[Verdict]]]) -> None:
    support = Counter()
    for ev, _ in evaluations.values():
        for cls in WORKLOAD_CLASSES:
            support[cls] += ev.support(cls)
    for cls in WORKLOAD_CLASSES:
        if cls != "unknown":
            assert support[cls] >= 100, (cls, support)


def test_no_compute_bound_window_is_called_memory_bound(evaluations: dict[str, tuple[Evaluation, list[Verdict]]]) -> None:
    wrong = {name: ev.matrix["compute_bound"]["memory_bound"] for name, (ev, _) in evaluations.items()}
    assert sum(wrong.values()) == 0, wrong
