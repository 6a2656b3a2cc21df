"""Every reason of every verdict, on every built-in scenario and every labelled trace, checked against the
threshold it was compared with (issue 43, item 3); and no detail that changes faster than its class may
(item 5).

A reason's structured form (``Verdict.supporting``, ``Verdict.opposing``: text, figure, threshold,
direction) is checked from outside (tests/reason_checks.py): each comparison of a reason holds, each entry
against has one that does not, a percentage a reason quotes is the figure it compared, a window feature it
names is the verdict's own, and a threshold that names a setting is that setting's value. Classifying
every scenario for ten minutes and the labelled traces takes tens of seconds, so this is the slow tier.
"""

from __future__ import annotations

from collections import Counter

import pytest

from agent.classifier.engine import classify_samples
from agent.classifier.thresholds import DEFAULT_THRESHOLDS as T
from agent.model import Verdict
from agent.trace import read_trace
from agent.virtual.engine import VirtualEngine
from agent.virtual.labelled import LABELLED_DIR
from agent.virtual.scenario import BUILTIN_SCENARIOS, builtin_scenario
from tests.reason_checks import all_problems, detail_flaps

pytestmark = pytest.mark.slow

SCENARIO_S = 600.0
"""Ten minutes of each scenario: every phase of the built-in ones, and the DME fine-tune's restart."""


def _labelled() -> list[Verdict]:
    return list(classify_samples([s for path in sorted(LABELLED_DIR.glob("*.jsonl.gz")) for s in read_trace(path)]))


def _scenario(name: str) -> list[Verdict]:
    return list(classify_samples(list(VirtualEngine(builtin_scenario(name)).iter_trace(SCENARIO_S))))


@pytest.fixture(scope="module")
def classified() -> dict[str, list[Verdict]]:
    return {"labelled traces": _labelled(), **{f"scenario {name}": _scenario(name) for name in BUILTIN_SCENARIOS}}


def test_every_scenario_and_the_labelled_traces_are_classified(classified: dict[str, list[Verdict]]) -> None:
    assert len(classified) == len(BUILTIN_SCENARIOS) + 1 and all(classified.values())
    classes = Counter(v.cls for verdicts in classified.values() for v in verdicts)
    assert set(classes) >= {"idle", "compute_bound", "memory_bound", "input_starved", "communication_jittered",
                            "latency_bound", "unknown"}, classes


@pytest.mark.parametrize("source", ["labelled traces", *(f"scenario {name}" for name in BUILTIN_SCENARIOS)])
def test_every_reason_holds_against_its_threshold_and_evidence_against_points_away(
        source: str, classified: dict[str, list[Verdict]]) -> None:
    verdicts = classified[source]
    problems = all_problems(verdicts, T)
    assert problems == [], f"{len(problems)} problems, first: {problems[:5]}"
    compared = [c for v in verdicts for r in v.supporting for c in r.checks]
    assert compared, "no reason carried a comparison: the property would hold vacuously"


def test_jittered_verdicts_keep_their_counter_evidence_apart(classified: dict[str, list[Verdict]]) -> None:
    """The issue's symptom, over everything: a jittered GPU's idle kernels or steady steps below their
    thresholds appear only as evidence against, and there are such GPUs to check."""
    jittered = [v for verdicts in classified.values() for v in verdicts if v.cls == "communication_jittered"]
    against = [a for v in jittered for a in v.against if a.startswith(("against: kernels resident but idle",
                                                                      "against: step time varies"))]
    assert against, "no jittered verdict had weak wait or step evidence: the check proves nothing"
    for v in jittered:
        for r in v.supporting:
            if r.text.startswith(("kernels resident but idle", "step time varies")):
                assert all(c.value >= c.threshold for c in r.checks), (v.gpu, v.window_end, r)


@pytest.mark.parametrize("source", ["labelled traces", *(f"scenario {name}" for name in BUILTIN_SCENARIOS)])
def test_no_detail_changes_faster_than_its_class_may(source: str, classified: dict[str, list[Verdict]]) -> None:
    assert detail_flaps(classified[source], T) == []
