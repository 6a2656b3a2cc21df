"""Step 5 of an evaluation: the explanation of the published class, from the evidence and the rule that
decided it.

It gives the detail code (what kind of idle, starvation, jitter or roof), the reasons, the confidence,
and the precedence where another class scores higher. Every reason that quotes a figure carries the
comparison behind it (:class:`~agent.model.verdict.Check`): the figure, the threshold the rule used
(read from the rule's own terms, so an exit or at-roof level is the one quoted), and the side that makes
it evidence. A reason whose comparison points away from the class is not a reason for it: it is kept
apart as evidence against (``Verdict.against``), so a communication-jittered GPU that waited on peers in
0% of samples says so there, not among its reasons.

The detail rules (which host signal starves a GPU, which rank is the straggler) live here, beside their
words; the class rules live in agent.classifier.rules, their order in agent.classifier.decision.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from agent.classifier.decision import EVEN_ODDS, STEPS, Decision
from agent.classifier.evidence import Evidence
from agent.classifier.explain_jitter import jitter_explanation
from agent.classifier.explain_pauses import STALL_DETAILS, feeding_reason, quiet_reason, stall_detail
from agent.classifier.rules import PRIORITY_TIER, ROOFLINE_TIER
from agent.classifier.scoring import Rule, Term
from agent.classifier.thresholds import Thresholds
from agent.classifier.wording import at_or_above, compute_roof_share, memory_roof_share, pct, practical_roof
from agent.classifier.wording import score as _score
from agent.model import WindowFeatures
from agent.model.verdict import Check, Reason

DETAILS: tuple[str, ...] = (
    "none", "warming_up", "gpu_down", "no_counters", "no_compute_counter", "idle_held", "idle_free", "dataloader", "io", "host_launch",
    "unattributed", "straggler", "straggler_victim", "link_flap", "network_congestion", "unstable_steps",
    "bandwidth_bound", "at_roof", *STALL_DETAILS,
    "leaning", "balanced", "power_proxy", "small_kernels", "counters_disagree",
)
"""Every value the ``detail`` of a verdict can take: a bounded label set for the info metric."""


@dataclass(frozen=True, slots=True)
class Explanation:
    """A class's detail and reasons in one window, how sure the verdict is, and what took precedence."""

    detail: str
    reasons: tuple[Reason, ...]
    """Every reason, in the order they are read (the one naming the detail first)."""
    confidence: float
    precedence: str | None = None
    """Why the class stands although another scores higher (None when none does)."""

    @property
    def supporting(self) -> tuple[Reason, ...]:
        return tuple(r for r in self.reasons if r.supports)

    @property
    def opposing(self) -> tuple[Reason, ...]:
        return tuple(r for r in self.reasons if not r.supports)


def checks(rule: Rule, *quantities: str) -> tuple[Check, ...]:
    """The comparisons ``rule`` made on ``quantities`` along the path that gave its score (first of each)."""
    found: dict[str, Check] = {}
    for term in rule.terms():
        if term.quantity in quantities and term.quantity not in found and (c := term.check()) is not None:
            found[term.quantity] = c
    return tuple(found[q] for q in quantities if q in found)


def claim(found: tuple[Check, ...], said: str, meaning: str) -> str:
    """``said`` and what it means for the class, the meaning only where the comparisons hold (the same figure
    listed against a class is a fact, not a claim)."""
    return said + meaning if all(c.holds for c in found) else said


def explain(cls: str, decision: Decision, e: Evidence, rules: dict[str, Rule], t: Thresholds,
            hold: str | None = None) -> Explanation:
    """Detail, reasons, confidence and precedence of ``cls``, the published class, on this window's evidence;
    ``hold`` words the hysteresis when ``cls`` is held against this window's own decision."""
    f = e.features
    if cls == "unknown":
        detail, reasons, quality = _gate_detail(decision, e), (_gate_reason(decision, e, t),), 1.0
    elif cls == "idle":
        # A burst, then a quiet tail nothing feeds: the tail and the host say it, not the window's duty.
        detail, reasons, quality = _idle(f, rules["idle"], t, quiet_reason(e, rules["idle"]))
    elif cls == "input_starved":
        detail, reasons, quality = _starved(f, rules["input_starved"], t)
        if (fed := feeding_reason(e, rules["input_starved"], t)) is not None:
            reasons = (*reasons, fed)
    elif cls == "communication_jittered":
        detail, reasons, quality = jitter_explanation(e, rules["communication_jittered"], t)
    else:
        detail, reasons, quality = (_proxy if f.u_compute is None else _roofline)(cls, e, rules[cls], t)
        if (stall := stall_detail(e, t)) is not None:  # the job pauses (a checkpoint): named, and its cost
            detail, reasons = stall[0], (stall[1], *reasons)
        busy = checks(rules[cls], "duty")
        if busy and not busy[0].holds:  # a kernel not resident enough to read the roofline: say so
            reasons = (*reasons, Reason(f"a kernel is resident {pct(f.duty)} of the time", busy))
        if cls == decision.cls and not any(r.checks and r.supports for r in reasons):
            reasons = (*reasons, _highest_of_tier(cls, decision))
    if hold is not None:
        # Held by hysteresis: score the published class as this window sees it.
        confidence = round(decision.scores.get(cls, 0.0) * f.valid_fraction * 0.5, 3)
    elif decision.gate:
        confidence = 0.0
    else:
        quality *= t.confidence_mig if f.mig else 1.0
        confidence = round(max(0.0, min(1.0, decision.scores[cls] * (1.0 - decision.rival) * decision.valid * quality)), 3)
    return Explanation(detail, reasons, confidence, precedence(cls, decision, hold))


def precedence(cls: str, decision: Decision, hold: str | None = None) -> str | None:
    """Why ``cls`` stands although another class scores higher in this window (None when none does): the
    step of the precedence that decided, or the hysteresis ``hold``."""
    mine = decision.scores.get(cls, 0.0) if cls != "unknown" else -1.0
    higher = {c: s for c, s in decision.scores.items() if c != cls and s > mine}
    if not higher:
        return None
    top = max(higher, key=lambda c: higher[c])
    over = f"{top} (score {_score(higher[top])})"
    if hold is not None:
        return f"{cls}: {hold}; takes precedence over {over}"
    step = STEPS[decision.rule]
    if decision.rule == "roofline" and top in PRIORITY_TIER:
        return (f"{cls}: {top} scores {_score(higher[top])}, short of the {EVEN_ODDS:g} a class ahead of the "
                f"roofline needs; {step.why}")
    return f"{cls}: {step.why}; takes precedence over {over}"


def _highest_of_tier(cls: str, decision: Decision) -> Reason:
    """What a roofline class won on when none of its comparisons held: the best score of a weak tier."""
    mine = decision.scores[cls]
    others = {c: decision.scores[c] for c in ROOFLINE_TIER if c != cls}
    runner = max(others, key=lambda c: others[c])
    return Reason(f"{cls} scores highest of the roofline classes ({_score(mine)}; {runner} {_score(others[runner])}), "
                  "though not every condition of it holds", (Check("score", mine, others[runner], "above"),))


# ------------------------------------------------------------------------------ unknown


def _gate_detail(decision: Decision, e: Evidence) -> str:
    """The detail code of a gate's ``unknown``."""
    if decision.rule == "unreadable":
        return "no_counters"
    if decision.rule == "no_roofline_counters":
        return "no_compute_counter" if e.features.u_compute is None and e.features.duty is not None else "no_counters"
    return decision.rule


def _gate_reason(decision: Decision, e: Evidence, t: Thresholds) -> Reason:
    f = e.features
    if decision.rule == "unreadable":
        return Reason(f"utilisation counters unreadable in {pct(1 - f.valid_fraction)} of {f.samples} samples; "
                      "this GPU cannot be classified",
                      (Check("valid_fraction", f.valid_fraction, t.min_valid_fraction, "below", "min_valid_fraction"),))
    if decision.rule == "warming_up":
        return Reason(f"only {f.samples} of {e.expected} samples in the window so far",
                      (Check("valid_share", e.valid, t.min_valid_fraction, "below", "min_valid_fraction"),))
    if decision.rule == "counters_disagree":
        return _disagreement(f, t)
    if decision.rule == "no_compute_counter" and decision.stand_in is not None:
        return Reason(missing_compute_reason(f),
                      (Check("stand_in_score", decision.stand_in, t.proxy_min_score, "below", "proxy_min_score"),))
    if f.u_compute is not None or f.duty is None:
        return Reason("no compute, memory or power counters to place this GPU on the roofline")
    return Reason(missing_compute_reason(f))


def _disagreement(f: WindowFeatures, t: Thresholds) -> Reason:
    """Why the profiling counters are not trusted: both duty readings and power (agent.classifier.rules)."""
    profiling, utilisation = f.duty_check or (0.0, 0.0)
    power = f", power at {pct(f.power_ratio)} of its {f.power_basis or 'limit'}" if f.power_ratio is not None else ""
    found = [Check("duty_gap", utilisation - profiling, t.counters_disagree_gap, "above", "counters_disagree_gap")]
    if f.power_ratio is not None:
        found.append(Check("power_ratio", f.power_ratio, 0.5, "above"))
    return Reason(f"counters disagree: the utilisation counter reads {pct(utilisation)} busy{power}, but the profiling "
                  f"engine activity reads {pct(profiling)}; profiling counters paused or not updating (dcgmi profile "
                  "--resume; NVIDIA/dcgm-exporter#662), so no class is given until they agree", tuple(found))


def missing_compute_reason(f: WindowFeatures) -> str:
    """Why the roofline tier could not decide: the counters this GPU lacks, for the verdict's reasons."""
    missing = ["tensor or FP-pipe counter"]
    if f.dram_busy is None:
        missing.append("DRAM bandwidth counter" + (" (memory busy time only)" if f.mem_busy is not None else ""))
    if f.power_ratio is None:
        missing.append("power reading against a known limit or TDP")
    return ("this GPU has no " + ", no ".join(missing) + ": compute-, memory- and latency-bound cannot be told apart "
            "(DCGM or dcgm-exporter adds the counters: docs/nvidia.md, Pre-Hopper GPUs)")


# ------------------------------------------------------------------------------ idle and starvation


def _idle(f: WindowFeatures, rule: Rule, t: Thresholds, quiet: Reason | None = None) -> tuple[str, tuple[Reason, ...], float]:
    duty = checks(rule, "duty")
    ran = "no kernel ran" if all(c.holds for c in duty) else "kernels ran"
    said, duty = (quiet.text, quiet.checks) if quiet is not None else (f"{ran} ({pct(f.duty)} duty)", duty)
    held = f.memory_held_bytes or 0
    if f.process_alive and held >= t.idle_held_bytes:
        memory = Check("memory_held_bytes", float(held), t.idle_held_bytes, "above", "idle_held_bytes")
        return "idle_held", (Reason(f"{said} but a process holds "
                                    f"{held / 2**30:.1f} GiB of device memory", duty + (memory,)),), 1.0
    if f.allocated_to is not None:  # a scheduler allocation holds it, a process or not
        return "idle_held", (Reason(f"{said} but the GPU is allocated to "
                                    f"{f.allocated_to[:160]}: the scheduler cannot hand it out", duty),), 1.0
    return "idle_free", (Reason(said, duty),), 1.0


def _starved(f: WindowFeatures, rule: Rule, t: Thresholds) -> tuple[str, tuple[Reason, ...], float]:
    found = checks(rule, "idle_share", "process_alive")
    # The idle share the rule compared: outside a recognised stall (a checkpoint) where there is one.
    idle = next((c.value for c in found if c.quantity == "idle_share"), 1.0 - (f.duty or 0.0))
    outside = " outside the job's stall" if abs(idle - (1.0 - (f.duty or 0.0))) > 1e-9 else ""
    base = Reason(f"no kernel ran in {pct(idle)} of the time{outside} while the process stayed alive", found)
    said, found = at_or_above(("iowait", f.iowait, t.io_wait, "io_wait", lambda v: f"host iowait {pct(v)}"),
                              ("io_pressure", f.io_pressure, t.io_pressure, "io_pressure", lambda v: f"I/O pressure {pct(v)}"))
    if said:
        return "io", (base, Reason(f"{', '.join(said)}: reading the data is the bottleneck", found)), 1.0
    if f.loader_cpu_cores is not None and f.main_cpu_cores is not None:
        return _starved_by_tree(f, t, base)
    cpu = f.process_cpu_cores  # no per-worker split (traces, virtual fleet): judge the whole tree
    if cpu is not None and cpu >= t.dataloader_cores:
        return "dataloader", (base, Reason(
            f"the job burns {cpu:.1f} CPU cores: loader workers cannot keep up (more workers or cheaper transforms)",
            (Check("process_cpu_cores", cpu, t.dataloader_cores, "above", "dataloader_cores"),))), 1.0
    if cpu is not None and t.launch_cores <= cpu < t.dataloader_cores:
        return "host_launch", (base, Reason(
            f"the job uses {cpu:.1f} cores, about one busy thread: the main loop cannot launch work fast enough",
            (Check("process_cpu_cores", cpu, t.launch_cores, "above", "launch_cores"),
             Check("process_cpu_cores", cpu, t.dataloader_cores, "below", "dataloader_cores")))), 1.0
    return "unattributed", (base, Reason("host signals do not say why (no CPU or I/O evidence)")), t.confidence_inferred


def _starved_by_tree(f: WindowFeatures, t: Thresholds, base: Reason) -> tuple[str, tuple[Reason, ...], float]:
    """Sub-reason from the process tree: saturated workers, workers short of cores, or a busy main thread."""
    loader, main, workers = f.loader_cpu_cores or 0.0, f.main_cpu_cores or 0.0, f.loader_workers or 0
    capacity = min(workers, f.cpu_limit_cores) if f.cpu_limit_cores else float(workers)
    if workers and capacity > 0 and loader >= t.loader_saturation * capacity:
        return "dataloader", (base, Reason(
            f"{workers} loader workers use {loader:.1f} of the {capacity:.1f} cores they can have: preprocessing "
            "cannot keep up (more workers or cores, or cheaper transforms)",
            (Check("loader_share", loader / capacity, t.loader_saturation, "above", "loader_saturation"),))), 1.0
    if workers and f.cpu_pressure is not None and f.cpu_pressure >= t.cpu_pressure and loader >= 0.5:
        return "dataloader", (base, Reason(
            f"loader workers use {loader:.1f} cores while tasks wait for a CPU {pct(f.cpu_pressure)} of the time "
            "(CPU pressure): the node has too few free cores",
            (Check("cpu_pressure", f.cpu_pressure, t.cpu_pressure, "above", "cpu_pressure"),
             Check("loader_cpu_cores", loader, 0.5, "above")))), 1.0
    if main >= t.launch_cores:
        idle = f"its {workers} workers use {loader:.1f} cores" if workers else "it has no loader workers"
        return "host_launch", (base, Reason(
            f"the main process uses {main:.1f} cores, about one busy thread, while {idle}: the Python loop cannot "
            "launch work (or load data in-process) fast enough",
            (Check("main_cpu_cores", main, t.launch_cores, "above", "launch_cores"),))), 1.0
    return "unattributed", (base, Reason(
        f"main process {main:.1f} cores, {workers} workers {loader:.1f} cores, no I/O pressure: host signals do not "
        "say why", (Check("main_cpu_cores", main, t.launch_cores, "below", "launch_cores"),))), t.confidence_inferred


# ------------------------------------------------------------------------------ the roofline


def _roofline(cls: str, e: Evidence, rule: Rule, t: Thresholds) -> tuple[str, tuple[Reason, ...], float]:
    f = e.features
    u_c, u_m = f.u_compute, f.u_memory
    assert u_c is not None
    pipes = f"tensor pipes {pct(f.tensor_busy)} busy" if f.tensor_busy is not None else f"FP pipes {pct(f.fp_busy)} busy"
    dram = f"DRAM {pct(f.dram_busy)} busy" if f.dram_busy is not None else "DRAM activity unknown"
    between = _power_between_waits(e, rule)
    if cls == "latency_bound":
        roofs = compute_roof_share(u_c, f, t) + (f", {memory_roof_share(u_m, t)}" if u_m is not None else "")
        found = checks(rule, "u_compute", "u_memory")
        return "small_kernels", (Reason(claim(
            found, f"a kernel is resident {pct(f.duty)} of the time, yet {pipes} and {dram} ({roofs})",
            ": neither roof is near (small kernels, launch gaps, under-filled grids)"), found), *between), 1.0
    mine, other = (u_c, u_m) if cls == "compute_bound" else (u_m, u_c)
    assert mine is not None
    if other is not None and abs(mine - other) < t.roof_margin:
        detail = "balanced"
    else:
        detail = "at_roof" if mine >= t.at_roof else "leaning"
    if cls == "compute_bound":
        lead = Reason(f"{pipes} while kernels run, {compute_roof_share(u_c, f, t)}; {dram}",
                      checks(rule, "u_compute", "compute_lead"))
    else:
        lead = Reason(f"{dram} while kernels run, {memory_roof_share(u_m, t)}; {pipes}",
                      checks(rule, "u_memory", "memory_lead"))
    return detail, (lead, *between), 1.0


def _power_between_waits(e: Evidence, rule: Rule) -> tuple[Reason, ...]:
    """The power a communicating rank's compute draws, where the rule that decided weighed it."""
    found = checks(rule, "power_between_waits")
    if not found:
        return ()
    (check,) = found
    side = "heavy math" if check.direction == "above" else "no heavy math"
    return (Reason(claim(found, f"power at {pct(check.value)} of its {_power_basis(e.features)} while not waiting on "
                         "the fabric", f": {side} between the collectives, which dilute a 1 Hz compute reading"), found),)


def _power_basis(f: WindowFeatures) -> str:
    return "limit" if f.power_basis == "limit" else "TDP (no limit read)"


def _proxy(cls: str, e: Evidence, rule: Rule, t: Thresholds) -> tuple[str, tuple[Reason, ...], float]:
    """Detail and reasons for a roofline verdict that rests on reported MFU, power and memory busy time."""
    f = e.features
    lead = "no tensor or FP-pipe counter on this GPU"
    if f.dram_busy is not None:
        roof = f", {memory_roof_share(f.u_memory, t)}" if f.u_memory is not None else ""
        memory = f"DRAM {pct(f.dram_busy)} busy while kernels run{roof}"
    elif f.mem_busy is not None:
        memory = f"memory busy {pct(f.mem_busy)} of the time kernels run (utilization.memory: busy time, not bandwidth)"
    else:
        memory = "no memory counter"
    reported = e.reported_compute
    quality = t.confidence_reported_mfu if reported is not None else t.confidence_no_compute_counter
    mfu = (f"the job reports MFU {pct(f.mfu_reported)} of peak ({pct(reported)} of the "
           f"{practical_roof('tensor', t.tensor_saturation)} while kernels run)"
           if reported is not None else None)
    if cls == "memory_bound":
        level = f.u_memory if f.u_memory is not None else (f.mem_busy or 0.0)
        detail = "at_roof" if level >= t.at_roof else "leaning"
        power = (Reason(f"power at {pct(f.power_ratio)} of its {_power_basis(f)}", checks(rule, "power_ratio"))
                 if f.power_ratio is not None else Reason("power unknown"))
        said = [Reason(f"{lead}; {memory}", checks(rule, "u_memory", "mem_busy")), power]
        if mfu is not None:  # memory-bound wants the job's MFU short of the compute roof (not heavy math)
            said.append(Reason(mfu, tuple(dataclasses.replace(c, direction="below") for c in _reported(rule)
                                          if c.quantity == "reported_compute")))
        return detail, tuple(said), quality
    between = _power_between_waits(e, rule)
    if reported is not None:
        stand_in = _reported(rule) if cls == "compute_bound" else checks(rule, "reported_compute")
        basis = claim(stand_in, f"{lead}; {mfu}", f": {'heavy' if cls == 'compute_bound' else 'little'} math")
    else:
        stand_in = checks(rule, "proxy_power")
        basis = claim(stand_in, f"{lead}; {_stand_in_power(e)}",
                      " suggests heavy math" if cls == "compute_bound" else " suggests small kernels")
    said = (Reason(basis, stand_in), *between, *_memory_side(memory, e, rule))
    if cls == "compute_bound":
        return ("power_proxy" if mfu is None else "leaning"), said, quality
    return ("power_proxy" if mfu is None else "small_kernels"), said, quality


def _reported(rule: Rule) -> tuple[Check, ...]:
    """The heavy-math rule's comparisons of the job's MFU: against the compute roof, and past the ridge
    against the memory roof."""
    heavy = rule.find("reported_heavy")
    return tuple(c for term in heavy.terms() if (c := term.check()) is not None) if heavy is not None else ()


def _stand_in_power(e: Evidence) -> str:
    """The power the stand-in rule read, worded (the power between fabric waits where that is what it read)."""
    if e.proxy_power is None:
        return "power unknown"
    between = " between fabric waits" if e.proxy_power_between_waits else ""
    return f"power at {pct(e.proxy_power)} of its {_power_basis(e.features)}{between}"


def _memory_side(memory: str, e: Evidence, rule: Rule) -> tuple[Reason, ...]:
    """The memory side of a compute- or latency-bound stand-in verdict: quiet memory, or power at the limit
    (GEMMs stream their tiles through HBM, so heavy math may keep memory busy)."""
    either = rule.find("quiet_memory_or_power_at_limit")
    parts = either.parts if either is not None else tuple(rule.terms())
    quiet = next((p for p in parts if isinstance(p, Term) and p.quantity in ("u_memory", "mem_busy")), None)
    said = [Reason(memory, (c,)) if quiet is not None and (c := quiet.check()) is not None else Reason(memory)]
    chosen = either.chosen() if either is not None else None
    if isinstance(chosen, Term) and chosen.quantity == "power_ratio" and (c := chosen.check()) is not None:
        said.append(Reason(claim((c,), f"power at {pct(c.value)} of its {_power_basis(e.features)}",
                                 ": the level heavy math draws, busy memory or not"), (c,)))
    return tuple(said)
