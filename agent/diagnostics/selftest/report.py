"""The selftest's outcome: the printed report, ``summary.json``, one labelled trace per phase, the exit status.

Exit status: 0 when every expectation holds, 3 when some do not (each named, as
``phase: check (got value)``), so a script can tell "this node's semantics differ" from "the
selftest could not run" (1, raised before any report exists) and a usage error (2).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from agent import __version__
from agent.classifier.thresholds import DEFAULT_THRESHOLDS, Thresholds
from agent.diagnostics.findings import Finding
from agent.diagnostics.selftest.expectations import Check
from agent.diagnostics.selftest.judge import PhaseResult
from agent.model import DeviceInfo
from agent.trace import TraceWriter

EXIT_HOLDS, EXIT_DIFFERS = 0, 3
SUMMARY = "summary.json"
CLASSIFIER_CONFIG = "classifier.yaml"
SUMMARY_FORMAT = "roofwatch-selftest"

_MARKS = {"ok": "ok  ", "fail": "FAIL", "unknown": "??  "}


@dataclass
class Summary:
    """One selftest run, ready to print and write."""

    node: str
    device: DeviceInfo
    backend: str
    runner: str
    runner_detail: str
    virtual: bool
    phase_seconds: float
    interval_s: float
    thresholds: Thresholds
    started_at: float
    results: list[PhaseResult] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    """Run-level checks (``phase="all"``)."""
    findings: list[Finding] = field(default_factory=list)
    sample_errors: list[str] = field(default_factory=list)

    @property
    def failed(self) -> list[Check]:
        return [c for r in self.results for c in r.failed] + [c for c in self.checks if c.status != "ok"]

    @property
    def exit_code(self) -> int:
        return EXIT_DIFFERS if self.failed else EXIT_HOLDS

    # ------------------------------------------------------------------ files

    def write(self, out: Path) -> list[str]:
        """One trace per phase that ran, ``classifier.yaml`` and ``summary.json`` into ``out``; the names written."""
        written = []
        for number, result in enumerate(self.results, start=1):
            if not result.samples:
                continue
            result.trace = f"{number:02d}-{result.phase.name}.jsonl.gz"
            note = (f"roofwatch selftest phase {result.phase.name} (label {result.phase.label}) on GPU "
                    f"{self.device.gpu}, {self.device.model}; {'virtual' if self.virtual else 'hardware'} run by "
                    f"{self.runner}")
            with TraceWriter(out / result.trace, node=self.node, agent_version=__version__, note=note,
                             started_at=self.started_at) as writer:
                writer.write_many(result.samples)
            written.append(result.trace)
        changed = {k: v for k, v in self.thresholds.model_dump().items() if v != getattr(DEFAULT_THRESHOLDS, k)}
        (out / CLASSIFIER_CONFIG).write_text(
            "# The classifier window the selftest judged its phases with (roofwatch classify --config FILE).\n"
            + yaml.safe_dump({"classifier": changed}, sort_keys=True), encoding="utf-8")
        (out / SUMMARY).write_text(json.dumps(self.to_json(), indent=2) + "\n", encoding="utf-8")
        return written + [CLASSIFIER_CONFIG, SUMMARY]

    def to_json(self) -> dict[str, Any]:
        d = self.device
        costs = [c for r in self.results for c in r.costs]
        calls = [s.driver_calls for r in self.results for s in r.samples if s.driver_calls is not None]
        return {
            "format": SUMMARY_FORMAT, "version": 1, "agent_version": __version__,
            "exit_code": self.exit_code, "ok": self.exit_code == EXIT_HOLDS,
            "failed": [c.describe() for c in self.failed],
            "started_at": self.started_at, "node": self.node, "virtual": self.virtual,
            "gpu": d.gpu, "uuid": d.uuid, "model": d.model, "pci_bus_id": d.pci_bus_id,
            "spec": d.spec.key if d.spec else None, "capabilities": list(d.capabilities),
            "backend": self.backend, "runner": self.runner, "runner_detail": self.runner_detail,
            "phase_seconds": self.phase_seconds, "interval_s": self.interval_s,
            "thresholds": {k: getattr(self.thresholds, k) for k in ("window_s", "evaluate_every_s", "min_dwell_s")},
            "driver": {"samples": len(costs), "calls_per_sample": _r(_mean(calls)),
                       "ms_per_sample": _r(_ms(_mean(costs))), "max_ms_per_sample": _r(_ms(max(costs, default=None))),
                       "read_errors": len(self.sample_errors)},
            "checks": [c.to_json() for c in self.checks],
            "findings": [asdict(f) for f in self.findings],
            "phases": [_phase_json(r) for r in self.results],
        }

    # ------------------------------------------------------------------ text

    def text(self) -> str:
        d = self.device
        lines = [f"roofwatch selftest: GPU {d.gpu}, {d.model} (spec {d.spec.key if d.spec else 'unknown'}), "
                 f"backend {self.backend}",
                 f"runner: {self.runner_detail}",
                 f"phases of {self.phase_seconds:g} s, sampled every {self.interval_s:g} s; verdicts over a "
                 f"{self.thresholds.window_s:g} s window"]
        for f in self.findings:
            if f.status in ("warn", "fail"):
                lines.append(f"{f.status.upper():4} {f.check}: {f.detail}")
                if f.fix:
                    lines.append(f"       fix: {f.fix}")
        if self.sample_errors:
            lines.append(f"WARN {len(self.sample_errors)} reads failed; first: {self.sample_errors[0]}")
        total = len(self.results)
        for number, r in enumerate(self.results, start=1):
            lines.append("")
            lines += _phase_text(number, total, r)
        lines.append("")
        lines += [f"{_MARKS[c.status]} all phases: {c.check}: {_shown(c.value)}   ({c.reason})" for c in self.checks]
        failed = self.failed
        if failed:
            lines.append(f"result: {len(failed)} expectation(s) do not hold (exit {EXIT_DIFFERS}):")
            lines += [f"  {c.describe()}" for c in failed]
            unknown = sum(c.status == "unknown" for c in failed)
            if unknown:
                lines.append(f"  ({unknown} of them could not be checked: the counter is unknown on this node; "
                             "see the findings at the top)")
        else:
            lines.append(f"result: every expectation holds (exit {EXIT_HOLDS})")
        return "\n".join(lines)


def _phase_text(number: int, total: int, r: PhaseResult) -> list[str]:
    head = f"[{number}/{total}] {r.phase.name}: expect {r.phase.label}"
    if r.status != "ran":
        return [f"{head}: {r.status.upper()}: {r.reason}"]
    c = r.counters
    lines = [head, f"  counters  GR {_shown(c['gr_active'])}  SM {_shown(c['sm_active'])}  tensor "
                   f"{_shown(c['tensor_active'])}  DRAM {_shown(c['dram_active'])}  power {_unit(c['power_w'], 'W')}  "
                   f"clock {_unit(c['sm_clock_mhz'], 'MHz')}  ({len(r.samples)} samples)"]
    windows = sum(r.verdicts.values())
    verdict = r.verdict or "none"
    others = ", ".join(f"{cls} {n}" for cls, n in r.verdicts.most_common() if cls != verdict)
    lines.append(f"  verdict   {verdict} ({r.verdicts.get(verdict, 0)} of {windows} windows{'; ' + others if others else ''})")
    lines.append(f"  measured  {_measured(r)}")
    calls = r.observed.get("driver_calls")
    lines.append(f"  driver    {_shown(calls, 1)} NVML calls and {_shown(_ms(_mean(r.costs)), 2)} ms per sample")
    lines += [f"  {_MARKS[k.status]} {k.check}: {_shown(k.value)}" for k in r.checks]
    return lines


def _measured(r: PhaseResult) -> str:
    m, e = r.measured, r.estimate
    if m is None:
        return "n/a"
    parts = []
    if m.flops:
        parts.append(f"{_tera(m.rate(m.flops))}FLOP/s ({m.source}: {m.detail}); counters "
                     f"{_tera(e.get('tensor_flops_per_s'))}FLOP/s (tensor x clock ratio x {e.get('dtype')} peak "
                     f"{_tera(e.get('peak_flops'))}FLOP/s), MFU {_shown(e.get('mfu_counters'))}")
    if m.bytes:
        parts.append(f"{_tera(m.rate(m.bytes))}B/s ({m.source}: {m.detail}); counters {_tera(e.get('bytes_per_s'))}B/s "
                     f"(DRAM x peak {_tera(e.get('peak_bytes_per_s'))}B/s)")
    if m.kernels:
        parts.append(f"{m.rate(float(m.kernels)) or 0:,.0f} kernels/s ({m.detail})")
    if m.duty is not None:
        parts.append(f"duty {m.duty:.2f} (busy GPU time / wall time)")
    if m.steps:
        mean = sum(m.steps) / len(m.steps)
        cv = math.sqrt(sum((s - mean) ** 2 for s in m.steps) / len(m.steps)) / mean if mean else 0.0
        parts.append(f"{len(m.steps)} steps, mean {mean:.2f} s, CV {cv:.2f}")
    return "; ".join(parts) or m.detail or "n/a"


def _phase_json(r: PhaseResult) -> dict[str, Any]:
    return {"name": r.phase.name, "label": r.phase.label, "what": r.phase.what, "status": r.status,
            "reason": r.reason, "trace": r.trace, "samples": len(r.samples),
            "counters": {k: _r(v) for k, v in r.counters.items()}, "verdict": r.verdict,
            "verdicts": dict(r.verdicts), "measured": r.measured.to_json() if r.measured else None,
            "counter_estimate": {k: _r(v) if isinstance(v, float) else v for k, v in r.estimate.items()},
            "driver": {"calls_per_sample": _r(r.observed.get("driver_calls")), "ms_per_sample": _r(_ms(_mean(r.costs)))},
            "checks": [c.to_json() for c in r.checks]}


def _mean(values: list[Any]) -> float | None:
    return sum(values) / len(values) if values else None


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def _r(x: Any) -> Any:
    return float(f"{x:.6g}") if isinstance(x, float) else x


def _shown(x: Any, digits: int = 2) -> str:
    if x is None:
        return "n/a"
    return f"{x:.{digits}f}" if isinstance(x, float) else str(x)


def _unit(x: float | None, unit: str) -> str:
    return "n/a" if x is None else f"{x:.0f} {unit}"


def _tera(x: float | None) -> str:
    return "n/a " if x is None else f"{x / 1e12:.1f} T"
