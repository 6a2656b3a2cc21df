"""One phase judged: its samples labelled, their counters averaged, roofwatch's verdicts, the
counters' throughput estimate against the workload's own measurement, and the expectations.

The verdicts come from the classifier the agent runs (``classify_samples``, as ``roofwatch
classify`` replays a trace), with the window shortened to fit a short phase (:func:`fit_thresholds`);
from 40 s phases on, the window is the agent's own.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Sequence

from agent.classifier.engine import classify_samples
from agent.classifier.features import window_features
from agent.classifier.roofline import roofline
from agent.classifier.thresholds import Thresholds
from agent.diagnostics.selftest.expectations import EXPECTATIONS, Check, Expectation, judge
from agent.diagnostics.selftest.phases import Phase
from agent.diagnostics.selftest.runner import Measured
from agent.model import GpuSample, GpuSpec

COUNTERS = ("gr_active", "sm_active", "sm_occupancy", "tensor_active", "dram_active", "fp32_active", "fp16_active",
            "fp64_active", "power_w", "sm_clock_mhz", "temperature_c")
"""The sample fields averaged over a phase and written to the summary."""

PhaseStatus = Literal["ran", "skipped", "error"]


def fit_thresholds(base: Thresholds, phase_seconds: float) -> Thresholds:
    """``base`` with its window fitted into a phase: half the phase, 2 s at least, the agent's window at most.

    Hysteresis (the least dwell time) shrinks with it, so one early window cannot hold the
    verdict for the whole phase; every other threshold stays as configured.
    """
    window = min(base.window_s, max(2.0, phase_seconds / 2.0))
    values = base.model_dump()
    values.update(window_s=window, evaluate_every_s=min(base.evaluate_every_s, window / 2.0),
                  min_dwell_s=min(base.min_dwell_s, window), long_window_s=max(base.long_window_s, window))
    return Thresholds(**values)


@dataclass
class PhaseResult:
    """Everything the report says about one phase."""

    phase: Phase
    status: PhaseStatus
    reason: str | None = None
    """Why it was skipped, or the error that stopped it."""
    samples: list[GpuSample] = field(default_factory=list)
    costs: list[float] = field(default_factory=list)
    measured: Measured | None = None
    counters: dict[str, float | None] = field(default_factory=dict)
    observed: dict[str, Any] = field(default_factory=dict)
    estimate: dict[str, Any] = field(default_factory=dict)
    verdicts: Counter[str] = field(default_factory=Counter)
    checks: list[Check] = field(default_factory=list)
    trace: str | None = None

    @property
    def verdict(self) -> str | None:
        return self.observed.get("verdict")

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status != "ok"]


def judge_phase(phase: Phase, samples: Sequence[GpuSample], measured: Measured | None, spec: GpuSpec | None,
                thresholds: Thresholds, *, costs: Sequence[float] = (),
                table: tuple[Expectation, ...] = EXPECTATIONS) -> PhaseResult:
    """Label ``samples`` with the phase's class (and the dtype it really ran), then judge them."""
    dtype = measured.dtype if measured is not None and measured.dtype else None
    labelled = [replace(s, label=phase.label, dtype=dtype or s.dtype) for s in samples]
    result = PhaseResult(phase, "ran", samples=labelled, costs=list(costs), measured=measured)
    result.counters = {name: _mean([getattr(s, name) for s in labelled]) for name in COUNTERS}
    observed: dict[str, Any] = {k: result.counters[k] for k in ("gr_active", "sm_active", "tensor_active", "dram_active")}
    if labelled:
        observed.update(_estimates(result, labelled, spec, thresholds, dtype))
        result.verdicts, observed["verdict"] = _verdicts(labelled, spec, thresholds, dtype)
    if measured is not None and measured.duty is not None and observed.get("gr_active") is not None:
        observed["duty_error"] = observed["gr_active"] - measured.duty
    observed["driver_calls"] = _mean([s.driver_calls for s in labelled])
    result.observed = observed
    result.checks = judge(phase.name, observed, table)
    return result


def skipped(phase: Phase, reason: str, status: PhaseStatus = "skipped") -> PhaseResult:
    """A phase that did not run (``skipped``) or broke off (``error``); an error fails the run."""
    result = PhaseResult(phase, status, reason=reason)
    if status == "error":
        result.checks = [Check(phase.name, "phase runs", reason, "fail", "the phase must run to be judged", "")]
    return result


def run_checks(results: Sequence[PhaseResult], table: tuple[Expectation, ...] = EXPECTATIONS) -> list[Check]:
    """The run-level expectations (``phase="all"``) over every sample of every phase."""
    calls = [s.driver_calls for r in results for s in r.samples]
    return judge("all", {"driver_calls": _mean(calls)}, table)


def _estimates(result: PhaseResult, samples: list[GpuSample], spec: GpuSpec | None, thresholds: Thresholds,
               dtype: str | None) -> dict[str, Any]:
    """The counters' throughput over the whole phase against the workload's measurement."""
    features = window_features(samples, samples, spec, thresholds)
    roof = roofline(features, spec, dtype)
    tensor_flops = features.tensor_mean * roof.peak_flops if features.tensor_mean is not None and roof.peak_flops else None
    result.estimate = {"dtype": roof.dtype, "peak_flops": roof.peak_flops, "tensor_flops_per_s": tensor_flops,
                       "mfu_counters": roof.mfu_counters, "peak_bytes_per_s": roof.peak_bytes_per_s,
                       "bytes_per_s": roof.achieved_bytes_per_s, "mbu_counters": roof.mbu_counters}
    out: dict[str, Any] = {"comm_wait_fraction": features.comm_wait_fraction}
    m = result.measured
    if m is not None:
        out["flops_ratio"] = _ratio(tensor_flops, m.rate(m.flops))
        out["bytes_ratio"] = _ratio(roof.achieved_bytes_per_s, m.rate(m.bytes))
    return out


def _verdicts(samples: list[GpuSample], spec: GpuSpec | None, thresholds: Thresholds,
              dtype: str | None) -> tuple[Counter[str], str | None]:
    """Verdicts over the phase (warm-up windows left out) and the most common one (the later on a tie)."""
    verdicts = [v for v in classify_samples(samples, thresholds, dtype=dtype, spec_resolver=lambda _s: spec)
                if v.detail != "warming_up"]
    counts = Counter(v.cls for v in verdicts)
    if not counts:
        return counts, None
    top = max(counts.values())
    return counts, next(v.cls for v in reversed(verdicts) if counts[v.cls] == top)


def _mean(values: Sequence[float | int | None]) -> float | None:
    known = [float(v) for v in values if v is not None]
    return math.fsum(known) / len(known) if known else None


def _ratio(estimate: float | None, truth: float | None) -> float | None:
    if estimate is None or not truth:
        return None
    return estimate / truth
