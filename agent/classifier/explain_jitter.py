"""The explanation of a communication-jittered class: which rank or link is to blame, and the waits and
variation behind it, each with the comparison its rule made (agent.classifier.explain has the rest).

The waits and the step variation the window shows are worded for or against: a rank that waited on its
peers in 0% of samples, or whose steps vary by 1%, shows that as evidence against the class, apart from
the reasons that carried it (a straggler's skew, a held step CV).
"""

from __future__ import annotations

from agent.classifier.evidence import Evidence
from agent.classifier.scoring import Rule, Term
from agent.classifier.thresholds import Thresholds
from agent.classifier.wording import at_or_above, pct
from agent.model import THROTTLE_REASON_MASK
from agent.model.verdict import Check, Reason


def jitter_explanation(e: Evidence, rule: Rule, t: Thresholds) -> tuple[str, tuple[Reason, ...], float]:
    """(detail, reasons, confidence factor) of a communication-jittered class."""
    job = e.job
    reasons = _waits(e, t) + _variation(e, rule, t)
    if job.step_spread is not None and job.step_spread >= t.rank_skew:  # synchronous ranks' steps match: no news
        reasons.append(Reason(f"the ranks of job {job.job} report step times {pct(job.step_spread)} apart",
                              (Check("step_spread", job.step_spread, t.rank_skew, "above", "rank_skew"),)))
    if job.lockstep > 1 and job.ranks_seen <= 1:
        reasons.append(Reason(f"{job.lockstep} GPUs of this node rise and fall together: the ranks of one synchronous job",
                              (Check("lockstep", float(job.lockstep), 2.0, "above"),)))
    detail, lead = _detail(e, t)
    # The culprit leads; a fabric busy with volume rather than stalls is said last, after the waits.
    said = (*reasons, *lead) if detail == "bandwidth_bound" else (*lead, *reasons)
    return detail, said, _quality(e, t)


def _quality(e: Evidence, t: Thresholds) -> float:
    """Lower when the variation is inferred from activity or power blocks rather than reported steps (judged
    on the recent steps, as the confidence always was)."""
    f = e.features
    if f.step_cv is not None and f.steps >= t.min_steps:
        return 1.0
    if (f.tensor_busy is None and f.power_cv is not None) or f.activity_cv is not None:
        return t.confidence_inferred
    return 1.0


def _waits(e: Evidence, t: Thresholds) -> list[Reason]:
    """Waiting on peers: resident idle kernels (SM and tensor counters), and power falling as fabric bytes rise."""
    f = e.features
    out = []
    if f.comm_wait_fraction is not None:
        out.append(Reason(f"kernels resident but idle (waiting on peers) in {pct(f.comm_wait_fraction)} of samples",
                          (Check("comm_wait_fraction", f.comm_wait_fraction, t.comm_wait_fraction, "above",
                                 "comm_wait_fraction"),)))
    if f.spin_wait_fraction is not None and (f.comm_wait_fraction is None or f.spin_wait_fraction >= t.comm_wait_fraction):
        fabric = "the fabric quiet" if any(v is not None for v in (f.link_utilization, f.power_fabric_r)) or f.link_active \
            else "no fabric counter read"
        out.append(Reason(f"a kernel stays resident while power and memory activity fall below their working levels "
                          f"({fabric}): waiting on peers in {pct(f.spin_wait_fraction)} of samples",
                          (Check("spin_wait_fraction", f.spin_wait_fraction, t.comm_wait_fraction, "above",
                                 "comm_wait_fraction"),)))
    if f.fabric_wait_fraction and f.power_fabric_r is not None:
        memory = (f", memory activity with it (r {f.memory_fabric_r:+.2f})"
                  if f.memory_fabric_r is not None and f.memory_fabric_r <= -t.fabric_anticorrelation else "")
        out.append(Reason(f"power falls as fabric and NIC bytes rise (r {f.power_fabric_r:+.2f}){memory}: waiting on "
                          f"the fabric in {pct(f.fabric_wait_fraction)} of samples",
                          (Check("fabric_wait_fraction", f.fabric_wait_fraction, t.comm_wait_fraction, "above",
                                 "comm_wait_fraction"),)))
    return out


def _variation(e: Evidence, rule: Rule, t: Thresholds) -> list[Reason]:
    """How unevenly the steps run: the step-time CV the rules read (the longer history while jitter is held),
    else the activity or power blocks that stand in for steps."""
    f = e.features
    steps = _step_term(rule)
    if steps is not None and steps.value is not None:
        count = f.steps_long if steps.quantity == "step_cv_long" else f.steps
        how = " (no step ids: a change of the reported time counts as a step)" if f.steps_inferred else ""
        return [Reason(f"step time varies by {pct(steps.value)} (CV over {count} steps){how}", (steps.check(),))]  # type: ignore[arg-type]
    unreported = rule.find("unreported_variation")
    chosen = unreported.chosen() if unreported is not None else None
    if not isinstance(chosen, Term) or (check := chosen.check()) is None:
        return []
    what = "power" if chosen.quantity == "power_cv" else "compute activity"
    return [Reason(f"{what} varies by {pct(check.value)} between 5 s blocks (no step reports)", (check,))]


def _step_term(rule: Rule) -> Term | None:
    """The step-CV comparison of the jitter rule that decided: against ``step_cv_alone`` where the CV alone
    carried the class, else against ``step_cv`` as the variation beside waits or skew."""
    alone = rule.find("step_cv_alone")
    if alone is not None and rule.chosen() is alone:
        return next((p for p in alone.parts if isinstance(p, Term)), None)
    variation = rule.find("variation")
    for part in variation.parts if variation is not None else ():
        if isinstance(part, Term) and part.quantity in ("step_cv", "step_cv_long"):
            return part
    return None


def _detail(e: Evidence, t: Thresholds) -> tuple[str, tuple[Reason, ...]]:
    """Who or what is to blame, first match wins: the straggler, its victims, the NIC, the fabric's volume."""
    f, job = e.features, e.job
    if job.is_busiest and job.peer_skew is not None and job.peer_skew >= t.rank_skew:
        high = job.peer_skew >= t.rank_skew_high
        skew = (Check("peer_skew", job.peer_skew, t.rank_skew, "above", "rank_skew"),
                Check("peer_skew", job.peer_skew, t.rank_skew_high, "above" if high else "below", "rank_skew_high"))
        if job.skew_from_waits:
            return "straggler", (Reason(
                f"this rank is the straggler: peers of job {job.job} spend {pct(job.peer_skew)} more of the window "
                f"waiting with a kernel resident (power and memory activity down) while it computes "
                f"({'high' if high else 'moderate'})", skew), *_straggler_cause(e, t))
        return "straggler", (Reason(
            f"this rank is the straggler: peers of job {job.job} compute {pct(job.peer_skew)} less and wait for it "
            f"({'high' if high else 'moderate'})", skew),)
    if job.rank_skew is not None and job.rank_skew >= t.rank_skew:
        skew = (Check("rank_skew", job.rank_skew, t.rank_skew, "above", "rank_skew"),)
        if job.skew_from_waits:
            return "straggler_victim", (Reason(
                f"this rank waits with a kernel resident {pct(job.rank_skew)} more of the window than the busiest rank "
                f"of job {job.job}, whose clock is held down: it waits for a straggler", skew),)
        return "straggler_victim", (Reason(
            f"this rank computes {pct(job.rank_skew)} less than the busiest rank of job {job.job}: it waits for a "
            "straggler", skew),)
    if f.net_link_downs:
        return "link_flap", (Reason(
            f"the GPU's NIC port went down {f.net_link_downs} time(s) in the window: every flap stalls the job's "
            "collectives (check the cable, transceiver and switch port)",
            (Check("net_link_downs", float(f.net_link_downs), 1.0, "above"),)),)
    what, found = at_or_above(
        ("net_congestion_per_s", f.net_congestion_per_s, t.net_congestion_per_s, "net_congestion_per_s",
         lambda v: f"{v:.0f} congestion marks/s"),
        ("net_retransmits_per_s", f.net_retransmits_per_s, t.net_retransmits_per_s, "net_retransmits_per_s",
         lambda v: f"{v:.0f} retransmits/s"))
    if what:
        return "network_congestion", (Reason(f"the GPU's NIC port sees {' and '.join(what)}: the fabric, not this GPU, "
                                             "delays the collectives", found),)
    if f.link_utilization is not None and f.link_utilization >= t.comm_bandwidth_link:
        return "bandwidth_bound", (Reason(
            f"fabric {pct(f.link_utilization)} busy: communication is bandwidth-bound",
            (Check("link_utilization", f.link_utilization, t.comm_bandwidth_link, "above", "comm_bandwidth_link"),)),)
    return "unstable_steps", ()


def _straggler_cause(e: Evidence, t: Thresholds) -> tuple[Reason, ...]:
    """Why the straggler is slow, where NVML shows it: its clock against its peers', held down by a throttle
    reason (the throttled flag's own reason follows with the bits that hold it)."""
    f, job = e.features, e.job
    if job.clock_vs_job is None:
        return ()
    held = " and held down by a throttle reason" if f.throttle_bits & THROTTLE_REASON_MASK else ""
    return (Reason(f"its clock runs at {pct(job.clock_vs_job)} of its peers'{held}: the likely cause",
                   (Check("clock_vs_job", job.clock_vs_job, t.throttle_clock, "below", "throttle_clock"),)),)
