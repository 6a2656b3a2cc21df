"""Replaying a ``roofwatch selftest`` output directory: the hardware fixtures' check.

A fixture directory is what ``roofwatch selftest --out tests/fixtures/hardware/<spec>/`` wrote on
a real GPU: one labelled trace per phase and ``summary.json``. Replaying it checks roofwatch's
semantics against that GPU: every trace reads, ``roofwatch classify --evaluate`` (the same
``classify_samples`` and ``evaluate``) recalls each phase's class, and each phase's counters are
re-judged against the expectations table. A malformed directory raises :class:`FixtureError`
naming what is wrong, so a broken fixture can never pass by having nothing checked.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from agent.classifier.engine import classify_samples
from agent.classifier.evaluate import evaluate
from agent.classifier.peaks import spec_for_sample
from agent.classifier.thresholds import DEFAULT_THRESHOLDS
from agent.diagnostics.selftest.judge import fit_thresholds, judge_phase
from agent.diagnostics.selftest.phases import PHASE_NAMES, phase
from agent.diagnostics.selftest.report import SUMMARY, SUMMARY_FORMAT
from agent.diagnostics.selftest.runner import Measured
from agent.trace import TraceFormatError, read_trace
from tests.agent_process import clean_env, roofwatch_cmd

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "hardware"
MIN_RECALL = 0.5
"""Share of a phase's scored verdicts that must name its class."""


class FixtureError(AssertionError):
    """A fixture directory that cannot be replayed as it is; the message says what to fix."""


def fixture_dirs(root: Path = FIXTURES) -> list[Path]:
    """Every directory under ``root`` (one per GPU model); anything else there is an error."""
    if not root.exists():
        return []
    strays = [p.name for p in root.iterdir() if not p.is_dir() and p.name != "README.md"]
    if strays:
        raise FixtureError(f"{root}: only one directory per GPU model belongs here, found {', '.join(sorted(strays))}")
    return sorted(p for p in root.iterdir() if p.is_dir())


def load_summary(directory: Path, *, allow_virtual: bool = False) -> dict[str, Any]:
    path = directory / SUMMARY
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FixtureError(f"{directory}: no {SUMMARY}; a fixture is a whole `roofwatch selftest --out` directory") from None
    except json.JSONDecodeError as exc:
        raise FixtureError(f"{path}: not JSON ({exc})") from None
    if not isinstance(summary, dict) or summary.get("format") != SUMMARY_FORMAT or summary.get("version") != 1:
        raise FixtureError(f"{path}: not a roofwatch selftest summary (format {SUMMARY_FORMAT!r}, version 1)")
    if summary.get("virtual") and not allow_virtual:
        raise FixtureError(f"{path}: a virtual run; hardware fixtures must come from a real GPU")
    spec = summary.get("spec")
    if not allow_virtual and (not spec or not directory.name.startswith(spec)):
        raise FixtureError(f"{directory}: name it after the GPU's spec key ({spec!r}, e.g. tests/fixtures/hardware/"
                           f"{spec}/), so fixtures are found by model")
    if not isinstance(summary.get("phases"), list) or not summary["phases"]:
        raise FixtureError(f"{path}: lists no phases")
    return summary


def replay(directory: Path, *, allow_virtual: bool = False) -> list[str]:
    """The semantic problems of one fixture (empty when every phase holds); FixtureError when malformed."""
    summary = load_summary(directory, allow_virtual=allow_virtual)
    problems: list[str] = []
    ran = 0
    for entry in summary["phases"]:
        name = entry.get("name")
        if name not in PHASE_NAMES:
            raise FixtureError(f"{directory}: unknown phase {name!r}")
        if entry.get("status") != "ran":
            continue
        ran += 1
        problems += _replay_phase(directory, summary, entry)
    if not ran:
        raise FixtureError(f"{directory}: no phase ran; nothing to replay")
    return problems


def classify_evaluate(directory: Path) -> dict[str, Any]:
    """``roofwatch classify DIR/*.jsonl.gz --evaluate --json -q`` as a process: its evaluation."""
    traces = sorted(str(p) for p in directory.glob("*.jsonl.gz"))
    result = subprocess.run(roofwatch_cmd("classify", *traces, "--evaluate", "--json", "-q"), capture_output=True,
                            text=True, timeout=300, env=clean_env())
    if result.returncode != 0:
        raise FixtureError(f"{directory}: roofwatch classify --evaluate failed: {result.stderr.strip()}")
    return json.loads(result.stdout)["evaluation"]


def _replay_phase(directory: Path, summary: dict[str, Any], entry: dict[str, Any]) -> list[str]:
    p = phase(entry["name"])
    trace = directory / str(entry.get("trace"))
    try:
        samples = list(read_trace(str(trace)))
    except (OSError, TraceFormatError) as exc:
        raise FixtureError(f"{trace}: cannot be read: {exc}") from None
    if not samples:
        raise FixtureError(f"{trace}: no samples")
    labels = {s.label for s in samples}
    if labels != {p.label}:
        raise FixtureError(f"{trace}: labelled {sorted(map(str, labels))}, phase {p.name} must be {p.label!r}")
    verdicts = list(classify_samples(samples))  # the agent's own thresholds, as `roofwatch classify` uses
    scored = evaluate(verdicts)
    if scored.scored == 0:
        raise FixtureError(f"{trace}: classify --evaluate scored no verdict (phases of {summary.get('phase_seconds')} s "
                           "end inside its 30 s settling time); record fixtures with --phase-seconds 45")
    problems = []
    recall = scored.recall(p.label) or 0.0
    if recall < MIN_RECALL:
        problems.append(f"{p.name}: classify --evaluate recalls {p.label} in {recall:.0%} of verdicts "
                        f"(got {dict((c, n) for c, n in scored.matrix[p.label].items() if n)})")
    measured = _measured(entry.get("measured"))
    thresholds = fit_thresholds(DEFAULT_THRESHOLDS, float(summary.get("phase_seconds") or 0.0))
    judged = judge_phase(p, samples, measured, spec_for_sample(samples[0]), thresholds)
    problems += [c.describe() for c in judged.failed]
    return problems


def _measured(data: Any) -> Measured | None:
    """What the phase measured, from the summary, as rates over one second (what the judge compares)."""
    if not isinstance(data, dict):
        return None
    return Measured(seconds=1.0, flops=data.get("flops_per_s"), bytes=data.get("bytes_per_s"),
                    kernels=None, duty=data.get("duty"), steps=tuple(data.get("step_times_s") or ()),
                    dtype=data.get("dtype"), detail=str(data.get("detail", "")), source=str(data.get("source", "")))
