"""GPUs without a compute counter (NVML before Hopper, amdsmi): what stands in, and when to say unknown.

The inputs are small synthetic windows built here to exercise one rule each; the published-value
traces that check the whole classifier on such GPUs are in tests/test_published_traces.py.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from agent.classifier.engine import classify_samples
from agent.classifier.thresholds import DEFAULT_THRESHOLDS
from agent.diagnostics.verdict_basis import predicted_basis
from agent.model import EVIDENCE_BASES, GpuSample, ProcessSample, Verdict, WorkloadReport
from agent.model.specs import spec_by_key
from agent.trace import read_trace

A100 = "NVIDIA A100-SXM4-80GB"
MI300X = "AMD Instinct MI300X"
PROCESS = (ProcessSample(pid=10, used_memory_bytes=40 * 2**30, cpu_cores=1.0),)


def window(seconds: int = 90, *, vendor: str = "nvidia", model: str = A100, **fields: object) -> list[GpuSample]:
    """One GPU, 1 s samples, the same fields throughout (with a little alternation so nothing is constant)."""
    out = []
    for k in range(seconds):
        wobble = 0.01 if k % 2 else -0.01
        values = {name: (min(1.0, max(0.0, v + wobble)) if isinstance(v, float) and v <= 1.0 and name != "power_w" else v)
                  for name, v in fields.items()}
        out.append(GpuSample(ts=1_700_000_000.0 + k, gpu="0", vendor=vendor, model=model, interval_s=1.0,
                             processes=PROCESS, **values))  # type: ignore[arg-type]
    return out


def last(samples: list[GpuSample]) -> Verdict:
    return list(classify_samples(samples))[-1]


def test_a_gemm_on_an_nvml_only_a100_without_a_power_limit_is_compute_bound_by_its_tdp() -> None:
    """The issue's case: 95% of TDP, utilization.memory ~35%, no limit in the samples. It used to be
    memory_bound ("leaning") because the memory rule was the only score left."""
    v = last(window(gr_active=0.99, mem_busy=0.35, power_w=380.0))
    assert v.cls == "compute_bound" and v.basis == "power_and_mem_busy"
    assert v.features.power_basis == "tdp" and v.features.power_ratio == pytest.approx(380 / 400, abs=0.01)
    assert v.roofline.mfu is None  # no counter and no report: no MFU, never a guess
    assert 0 < v.confidence <= DEFAULT_THRESHOLDS.confidence_no_compute_counter
    assert any("no tensor or FP-pipe counter" in r and "TDP" in " ".join(v.reasons) for r in v.reasons)


def test_without_power_or_a_report_the_roofline_class_is_unknown_naming_what_is_missing() -> None:
    v = last(window(gr_active=0.99, mem_busy=0.35, model="NVIDIA Uncatalogued GPU"))
    assert v.cls == "unknown" and v.detail == "no_compute_counter" and v.confidence == 0.0
    assert "no a tensor" not in v.reasons[0]
    assert "tensor or FP-pipe counter" in v.reasons[0] and "power" in v.reasons[0] and "DCGM" in v.reasons[0]


def test_memory_busy_time_with_moderate_power_is_memory_bound() -> None:
    v = last(window(gr_active=0.99, mem_busy=0.92, power_w=260.0, power_limit_w=400.0))
    assert v.cls == "memory_bound" and v.basis == "power_and_mem_busy"
    assert any("utilization.memory" in r for r in v.reasons)


def test_busy_memory_at_the_power_limit_is_heavy_math_not_memory() -> None:
    """GEMMs stream their tiles through HBM: memory can be busy while the math bounds the GPU."""
    v = last(window(gr_active=0.99, mem_busy=0.75, power_w=395.0, power_limit_w=400.0))
    assert v.cls == "compute_bound"


def test_small_kernels_at_low_power_with_quiet_memory_are_latency_bound() -> None:
    v = last(window(gr_active=0.97, mem_busy=0.08, power_w=110.0, power_limit_w=400.0))
    assert v.cls == "latency_bound"


def test_a_reported_mfu_above_the_dram_share_is_compute_bound_on_amd() -> None:
    """The issue's MI300X: the job says MFU 35%, UMC ~31%, and no power limit was read."""
    peak = spec_by_key("mi300x").peak_flops["bf16"]
    report = WorkloadReport(job="train", world_size=8, tokens_per_s=8 * 0.35 * peak / 6.0e11, flops_per_token=6.0e11)
    v = last(window(vendor="amd", model=MI300X, gr_active=0.98, dram_active=0.31, workload=report, dtype="bf16"))
    assert v.cls == "compute_bound" and v.basis == "reported_mfu"
    assert v.features.mfu_reported == pytest.approx(0.35, abs=0.01)
    assert any("reports MFU 35%" in r for r in v.reasons)


def test_half_the_samples_of_a_window_give_a_verdict_with_confidence_scaled_by_coverage() -> None:
    full = window(gr_active=0.99, mem_busy=0.35, power_w=380.0)
    gappy = [s for k, s in enumerate(full) if k % 7 not in (1, 4)]  # ~29% of the reads missing
    first = next(v for v in classify_samples(gappy) if v.cls != "unknown")
    assert first.window_end - gappy[0].ts <= DEFAULT_THRESHOLDS.window_s + DEFAULT_THRESHOLDS.evaluate_every_s
    whole, holed = last(full), last(gappy)
    assert whole.cls == holed.cls == "compute_bound" and holed.confidence < whole.confidence


def test_a_null_field_drops_that_field_not_the_sample() -> None:
    samples = window(gr_active=0.99, mem_busy=0.35, power_w=380.0)
    holed = [s if k % 5 else GpuSample(**{**{f: getattr(s, f) for f in s.__dataclass_fields__}, "power_w": None})
             for k, s in enumerate(samples)]
    v = last(holed)
    assert v.cls == "compute_bound" and v.features.valid_fraction == 1.0


@pytest.mark.parametrize(("caps", "joined", "basis"), [
    (("gpm", "gr_active", "sm_active", "tensor_active", "dram_active", "power"), False, "counters"),
    (("gr_active", "mem_busy", "power"), False, "power_and_mem_busy"),
    (("gr_active", "mem_busy", "power"), True, "counters"),
    (("gr_active", "dram_active", "power"), False, "power_and_dram"),
    (("gr_active", "mem_busy"), False, "memory_only"),
    (("power", "clocks"), False, "none"),
])
def test_doctor_predicts_the_basis_from_capabilities(caps: tuple[str, ...], joined: bool, basis: str) -> None:
    assert predicted_basis(caps, joined) == basis and basis in EVIDENCE_BASES


def _trace(path: Path, header: dict[str, object] | None, line: dict[str, object]) -> Path:
    with gzip.open(path, "wt") as out:
        if header is not None:
            out.write(json.dumps(header) + "\n")
        out.write(json.dumps(line) + "\n")
    return path


@pytest.mark.parametrize(("header", "sample", "moved"), [
    # An older roofwatch wrote NVML utilization.memory into dram_active: read it as mem_busy.
    ({"format": "roofwatch-trace", "version": 1, "agent_version": "0.1.0"}, {"vendor": "nvidia", "dram_active": 0.4}, True),
    # Written knowing the difference, hand-written, an AMD UMC reading, or one beside GPM counters: kept.
    ({"format": "roofwatch-trace", "version": 1, "agent_version": "0.2.0", "mem_busy": True},
     {"vendor": "nvidia", "dram_active": 0.4}, False),
    ({"format": "roofwatch-trace", "version": 1}, {"vendor": "nvidia", "dram_active": 0.4}, False),
    ({"format": "roofwatch-trace", "version": 1, "agent_version": "0.1.0"}, {"vendor": "amd", "dram_active": 0.4}, False),
    ({"format": "roofwatch-trace", "version": 1, "agent_version": "0.1.0"},
     {"vendor": "nvidia", "dram_active": 0.4, "sm_active": 0.9}, False),
])
def test_older_nvml_only_traces_read_their_memory_busy_time_as_mem_busy(
        tmp_path: Path, header: dict[str, object], sample: dict[str, object], moved: bool) -> None:
    path = _trace(tmp_path / "t.jsonl.gz", header, {"ts": 1_700_000_000.0, "gpu": "0", **sample})
    (read,) = list(read_trace(path))
    assert (read.mem_busy, read.dram_active) == ((0.4, None) if moved else (None, 0.4))


def test_a_compute_counter_without_a_dram_counter_never_gives_memory_bound() -> None:
    """Hypothesis found it: with tensor activity but no DRAM counter, the memory score was the duty
    cycle alone, so an idle-pipe busy GPU could be called memory_bound (and the detail crashed)."""
    v = last(window(model="NVIDIA H100 80GB HBM3", gr_active=0.99, tensor_active=0.0))
    assert v.cls != "memory_bound" and v.scores["memory_bound"] == 0.0
    assert v.basis == "compute_counter"
