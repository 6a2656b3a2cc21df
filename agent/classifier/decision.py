"""Step 3 of an evaluation: the class, picked from the rules' scores by one documented precedence.

The classes are not a contest of scores. A window whose counters cannot be read or contradict each
other is ``unknown`` whatever the scores say; ``idle``, then ``input_starved``, then
``communication_jittered`` win as soon as their score reaches even odds, in that order; only then do
the three roofline classes compete, the highest score winning. So a lower score can win: an idle
GPU's window may score input-starved higher, and idle still comes first. :data:`PRECEDENCE` is that
order and :func:`decide` applies it; the explanation (agent.classifier.explain) says in the verdict which
step took precedence over a higher score (docs/classification.md §2 shows the same table, generated
from this one).
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.classifier.evidence import Evidence
from agent.classifier.proxies import STAND_INS
from agent.classifier.rules import PRIORITY_TIER, ROOFLINE_TIER, SCORED_CLASSES, counters_disagree
from agent.classifier.scoring import Rule
from agent.classifier.thresholds import Thresholds
from agent.classifier.throttle import Throttle, throttle

EVEN_ODDS = 0.5
"""The score a class of the priority tier needs to win."""


@dataclass(frozen=True, slots=True)
class Step:
    """One step of the precedence: the rule, the class it gives, and when it applies."""

    rule: str
    gives: str
    when: str
    why: str
    """How the verdict's ``precedence`` words this step when it overrules a higher score."""


PRECEDENCE: tuple[Step, ...] = (
    Step("unreadable", "unknown", "the duty counter is unreadable in more than `1 - min_valid_fraction` of the "
         "window's samples (detail `no_counters`)", "the utilisation counters are unreadable"),
    Step("warming_up", "unknown", "the window holds fewer valid samples than `min_valid_fraction` of those it "
         "expects, while it fills (detail `warming_up`)", "the window holds too few samples yet"),
    Step("counters_disagree", "unknown", "the utilisation counter reads at least `counters_disagree_gap` busier than "
         "the profiling duty and power does not side with the profiling one (detail `counters_disagree`)",
         "the counters disagree"),
    Step("idle", "idle", "its score is at least 0.5", "no kernel ran"),
    Step("input_starved", "input_starved", "its score is at least 0.5", "the process waited for input"),
    Step("communication_jittered", "communication_jittered", "its score is at least 0.5", "kernels waited on peers"),
    Step("no_roofline_counters", "unknown", "no roofline class can be scored: no compute, memory or power counter "
         "(detail `no_counters`, or `no_compute_counter` where a duty cycle is read)",
         "no counter places the GPU on the roofline"),
    Step("roofline", "compute_bound, memory_bound or latency_bound", "its score is the highest of the three",
         "the roofline decides once no class ahead of it reaches even odds"),
    Step("no_compute_counter", "unknown", "the GPU has no compute counter and the winner's stand-in evidence (the "
         "duty cycle aside) scores below `proxy_min_score` (detail `no_compute_counter`)",
         "the stand-ins for a compute counter cannot tell the roofline classes apart"),
)
"""The order a window's class is decided in, first applicable step wins; then hysteresis (§3) decides
what is published."""
STEPS: dict[str, Step] = {s.rule: s for s in PRECEDENCE}

AT_ONCE: tuple[str, ...] = ("unknown", "idle")
"""Classes a window publishes at once, without hysteresis (docs/classification.md §3). ``unknown``: nothing to
defend. ``idle``: a window in which no kernel ran, or whose burst ended in a quiet stretch nothing on the host
asks to end, rules out every other class by its own evidence: the roofline classes need a kernel resident,
starvation a pipeline feeding the GPU, jitter a collective waiting (a spinning kernel is resident). Holding
the class it replaces for two more evaluations would publish a verdict that its own reasons contradict."""


@dataclass(frozen=True, slots=True)
class Decision:
    """The unstabilised outcome of one evaluation: the class, the step of :data:`PRECEDENCE` that gave it,
    and what its confidence is made of."""

    cls: str
    rule: str
    """The :data:`PRECEDENCE` step that decided (for a roofline class, ``roofline``)."""
    scores: dict[str, float]
    rival: float
    """The best score of a class that could have taken the verdict instead (higher tiers that fell short
    and, on the roofline, the other roofs)."""
    valid: float
    throttle: Throttle
    stand_in: float | None = None
    """For ``no_compute_counter``: the winner's stand-in score held against ``proxy_min_score``."""

    @property
    def gate(self) -> bool:
        """Whether the window was judged unknown before any class could win."""
        return self.cls == "unknown"


def decide(e: Evidence, rules: dict[str, Rule], t: Thresholds) -> Decision:
    """The class :data:`PRECEDENCE` gives this window's scores."""
    f = e.features
    flag = throttle(f, t)
    scores = {c: (0.0 if rules[c].score is None else rules[c].score) for c in SCORED_CLASSES}

    def unknown(rule: str, stand_in: float | None = None, keeps_likely: bool = False) -> Decision:
        # A gate keeps the flag but says nothing of it (only counters_disagree keeps a likely power cap).
        kept = Throttle(flag.throttled, flag.severe, flag.likely and keeps_likely)
        return Decision("unknown", rule, scores, 0.0, e.valid, kept, stand_in)

    if e.expected == 0 or e.valid < t.min_valid_fraction:
        return unknown("unreadable" if f.samples and f.valid_fraction < t.min_valid_fraction else "warming_up")
    if counters_disagree(f, t):
        return unknown("counters_disagree", keeps_likely=True)

    cls = next((c for c in PRIORITY_TIER if (rules[c].score or 0.0) >= EVEN_ODDS), None)
    rule = cls
    if cls is None:
        tier = {c: rules[c].score for c in ROOFLINE_TIER if rules[c].score is not None}
        if not tier:
            return unknown("no_roofline_counters")
        cls, rule = max(tier, key=lambda c: tier[c]), "roofline"  # type: ignore[arg-type, return-value]
        stand_in = rules[cls].find(STAND_INS[cls]) if f.u_compute is None else None
        if stand_in is not None and stand_in.score is not None and stand_in.score < t.proxy_min_score:
            # Indirect evidence below even odds is a guess: say what is missing instead.
            return unknown("no_compute_counter", stand_in.score)

    # The rival is whatever could have taken the verdict instead: higher tiers that fell short
    # and, on the roofline, the other roofs.
    if cls in PRIORITY_TIER:
        rivals = PRIORITY_TIER[:PRIORITY_TIER.index(cls)]
    else:
        rivals = PRIORITY_TIER + tuple(c for c in ROOFLINE_TIER if c != cls)
    return Decision(cls, rule, scores, max((scores[c] for c in rivals), default=0.0), e.valid, flag)
