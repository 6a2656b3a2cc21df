"""roofwatch selftest, in process: the expectations table, judging, the run over nvml-virtual and its findings."""

from __future__ import annotations

import re
import statistics
from pathlib import Path

import pytest

from agent.classifier.thresholds import DEFAULT_THRESHOLDS
from agent.diagnostics.selftest import virtual_runner
from agent.diagnostics.selftest.expectations import EXPECTATIONS, SOURCES, Expectation, expectations_for
from agent.diagnostics.selftest.judge import fit_thresholds, skipped
from agent.diagnostics.selftest.phases import PHASES, parse_phases, phase
from agent.diagnostics.selftest.report import EXIT_DIFFERS, EXIT_HOLDS
from agent.diagnostics.selftest.selftest import SelftestError
from tests.selftest_helpers import A100, NO_GPM, virtual_run


def test_every_phase_has_counter_checks_and_a_verdict_check_each_with_a_reason_and_a_source():
    for p in PHASES:
        rows = expectations_for(p.name)
        assert [e.equals for e in rows if e.metric == "verdict"] == [p.label]
        assert any(e.metric != "verdict" for e in rows), p.name
    for e in EXPECTATIONS:
        assert e.reason and e.source in SOURCES, e
        assert e.equals is not None or e.low is not None or e.high is not None, e


def test_an_expectation_holds_fails_or_cannot_be_checked():
    at_least = Expectation("gemm_bf16", "tensor_active", low=0.8)
    band = Expectation("copy", "bytes_ratio", low=0.8, high=1.25)
    assert [at_least.judge(v) for v in (0.9, 0.79, None)] == ["ok", "fail", "unknown"]
    assert [band.judge(v) for v in (1.0, 1.3, 0.7)] == ["ok", "fail", "fail"]
    assert Expectation("idle", "verdict", equals="idle").judge("latency_bound") == "fail"
    assert band.check == "0.80 <= bytes_ratio <= 1.25" and at_least.check == "tensor_active >= 0.80"


def test_a_phase_that_did_not_run_fails_only_when_it_broke_off():
    assert skipped(phase("gemm_fp8"), "no fp8 here").checks == []
    broken = skipped(phase("copy"), "RuntimeError: CUDA out of memory", "error")
    assert [c.status for c in broken.checks] == ["fail"] and "out of memory" in broken.checks[0].describe()


def test_the_classifier_window_is_fitted_into_short_phases_and_is_the_agents_own_from_40_s():
    short = fit_thresholds(DEFAULT_THRESHOLDS, 12.0)
    assert (short.window_s, short.evaluate_every_s, short.min_dwell_s) == (6.0, 3.0, 6.0)
    assert fit_thresholds(DEFAULT_THRESHOLDS, 2.0).window_s == 2.0
    assert fit_thresholds(DEFAULT_THRESHOLDS, 45.0) == DEFAULT_THRESHOLDS
    assert fit_thresholds(DEFAULT_THRESHOLDS, 12.0).tensor_saturation == DEFAULT_THRESHOLDS.tensor_saturation


def test_phases_are_chosen_by_name_and_kept_in_the_catalogues_order():
    assert [p.name for p in parse_phases("copy, idle")] == ["idle", "copy"]
    assert parse_phases(None) == PHASES
    with pytest.raises(ValueError, match="unknown phase nope"):
        parse_phases("idle,nope")


def test_every_virtual_phase_meets_its_expectations_and_gets_its_class():
    summary = virtual_run(",".join(p.name for p in PHASES), seconds=12.0)
    assert summary.exit_code == EXIT_HOLDS, summary.text()
    assert [r.phase.name for r in summary.results] == [p.name for p in PHASES]
    for result in summary.results:
        assert result.status == "ran" and result.verdict == result.phase.label
        assert len(result.samples) >= 40 and all(s.label == result.phase.label for s in result.samples)
        assert all(c.status == "ok" for c in result.checks) and result.checks
    gemm = next(r for r in summary.results if r.phase.name == "gemm_fp8")
    assert gemm.estimate["dtype"] == "fp8" and gemm.observed["flops_ratio"] == pytest.approx(1.0, abs=0.02)
    wait = next(r for r in summary.results if r.phase.name == "stream_wait")
    assert {s.workload.world_size for s in wait.samples if s.workload} == {2}  # the report reached the samples
    assert summary.checks[0].value == pytest.approx(10.0, abs=1.0)  # NVML calls per sample, counted by the backend (docs/nvidia.md Cost)


def test_a_gemm_that_keeps_the_tensor_pipe_half_idle_fails_and_is_named(monkeypatch):
    slow = dict(virtual_runner._KINDS, gemm_bf16={"kind": "compute", "mfu": 0.5})
    monkeypatch.setattr(virtual_runner, "_KINDS", slow)
    summary = virtual_run("idle,gemm_bf16")
    assert summary.exit_code == EXIT_DIFFERS
    assert [c.describe() for c in summary.failed] == ["gemm_bf16: tensor_active >= 0.80 (got 0.50)"]
    assert "result: 1 expectation(s) do not hold (exit 3):\n  gemm_bf16: tensor_active >= 0.80 (got 0.50)" \
        in summary.text()


def test_gpm_refused_is_a_finding_and_its_checks_unknown_not_a_crash():
    summary = virtual_run("idle,gemm_bf16", scenario=NO_GPM)
    gpm = [f for f in summary.findings if f.check == "GPM"]
    assert gpm and gpm[0].status == "warn" and "unavailable" in gpm[0].detail
    unknown = [c.describe() for c in summary.failed if c.status == "unknown"]
    assert "gemm_bf16: tensor_active >= 0.80 (got unknown)" in unknown
    assert summary.exit_code == EXIT_DIFFERS and "could not be checked" in summary.text()
    assert [r.verdict for r in summary.results] == ["idle", "compute_bound"]  # the power proxy still decides


def test_fp8_is_skipped_with_its_reason_where_the_gpu_has_no_fp8():
    summary = virtual_run("idle,gemm_fp8", scenario=A100)
    fp8 = summary.results[1]
    assert fp8.status == "skipped" and "no fp8 peak" in (fp8.reason or "")
    assert not [c for c in summary.failed if c.phase == "gemm_fp8"]


def test_a_gpu_the_node_does_not_have_is_a_usage_error_naming_the_gpus():
    with pytest.raises(SelftestError, match="--gpu 3: no such GPU; simulated node 'old-node' has GPUs 0-1") as caught:
        virtual_run("idle", gpu=3, scenario=A100)
    assert caught.value.code == 2


@pytest.mark.slow
def test_in_real_time_the_sampler_thread_reads_every_interval_inside_each_phase():
    summary = virtual_run("idle,copy", seconds=4.0, real_time=True)
    assert [r.verdict for r in summary.results] == ["idle", "memory_bound"], summary.text()
    for result in summary.results:
        stamps = [s.ts for s in result.samples]
        assert len(stamps) >= 8
        assert 0.2 <= statistics.median(b - a for a, b in zip(stamps, stamps[1:])) <= 0.35


def test_the_table_in_docs_nvidia_md_is_the_table_in_the_code():
    doc = (Path(__file__).resolve().parent.parent / "docs" / "nvidia.md").read_text(encoding="utf-8")
    section = doc[doc.index("### Expectations"):doc.index("### Report, files and exit status")]
    documented = set()
    for row in re.findall(r"^\| (.+?) \| `([^`]+)` \| .+ \| \[([^\]]+)\] \|$", section, re.M):
        phases, check, source = row
        for name in re.findall(r"`(\w+)`", phases) or [{"every phase": "*", "all phases": "all"}[phases]]:
            documented.add((name, check, source))
    in_code = {(e.phase, e.check, e.source) for e in EXPECTATIONS if e.metric != "verdict"}
    in_code |= {("*", "verdict = <its class>", "classifier")}
    assert documented == in_code
