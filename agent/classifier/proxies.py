"""The roofline tier for a GPU without a compute counter: what stands in, and how much it is trusted.

NVIDIA GPUs before Hopper read through NVML alone (A100, A10, L4, L40S, V100, T4), and AMD GPUs
through amdsmi, have no tensor or FP-pipe activity. No counter must never read as "not
compute-bound": a large GEMM on such a GPU would then lose to the memory rule at a third of
the memory roof. What is there instead, strongest first:

* the job's own MFU (tokens/s x FLOPs/token against the dtype peak): direct evidence of math;
* power against the enforced limit (else the catalogue TDP): GEMMs draw at or near the limit,
  memory streaming and small kernels well below it;
* memory evidence: a DRAM bandwidth counter where one exists (DCGM DRAM_ACTIVE, AMD UMC
  activity), else NVML's ``utilization.memory`` (``mem_busy``), a busy-time duty cycle with its
  own thresholds (docs/classification.md §"GPUs without a compute counter").

Where this cannot separate the classes the verdict is ``unknown`` with a reason that names the
missing counter, never a confident guess.
"""

from __future__ import annotations

from agent.classifier.evidence import Evidence
from agent.classifier.scoring import Node, Rule, Term, above, all_of, any_of, below, negated, not_rule
from agent.classifier.thresholds import Thresholds

STAND_INS: dict[str, str] = {"compute_bound": "proxy_compute", "memory_bound": "proxy_memory",
                             "latency_bound": "proxy_latency"}
"""The name of each roofline class's stand-in rule: its score on the indirect evidence alone (the duty
cycle aside), which the decision holds against ``proxy_min_score``."""


def memory_evidence(e: Evidence, t: Thresholds, incumbent: str | None) -> Term | None:
    """That the memory side dominates, on the signal there is: a DRAM bandwidth counter, else memory busy time."""
    f, w = e.features, t.score_width
    held = incumbent == "memory_bound"
    if f.u_memory is not None:
        roof, setting = ((t.dominant_memory_roof_exit, "dominant_memory_roof_exit") if held
                         else (t.dominant_memory_roof, "dominant_memory_roof"))
        return above("u_memory", f.u_memory, roof + t.roof_margin, w, f"{setting} + roof_margin")
    if f.mem_busy is not None:
        level, setting = (t.mem_busy_memory_exit, "mem_busy_memory_exit") if held else (t.mem_busy_memory, "mem_busy_memory")
        return above("mem_busy", f.mem_busy, level, w, setting)
    return None


def proxy_rules(e: Evidence, t: Thresholds, incumbent: str | None) -> dict[str, Rule | None]:
    """compute / memory / latency stand-in rules for a GPU whose ``u_compute`` is unknown, on the evidence
    alone (None where there is none): the roofline rules combine them with the duty cycle, and the
    decision judges them against ``proxy_min_score`` without it."""
    f, w = e.features, t.score_width
    memory_score = memory_evidence(e, t, incumbent)
    not_memory = None if memory_score is None else negated(memory_score)
    near_limit = above("power_ratio", f.power_ratio, t.power_near_limit, w, "power_near_limit")

    reported = e.reported_compute
    heavy: Node | None
    light: Node | None
    if reported is not None:
        roof, setting = ((t.dominant_roof_exit, "dominant_roof_exit") if incumbent == "compute_bound"
                         else (t.dominant_roof, "dominant_roof"))
        # Past the ridge: a reported MFU above the memory roof's share is compute-dominated.
        lead = None if f.u_memory is None else above("reported_lead", reported - f.u_memory, -t.roof_margin, w, "-roof_margin")
        heavy = all_of("reported_heavy", above("reported_compute", reported, roof, w, setting), lead)
        light = below("reported_compute", reported, t.dominant_roof, w, "dominant_roof")
        if e.communicating and f.power_ratio is not None:
            # The whole step's MFU counts the collectives' time too; power says what the compute parts are.
            drawn = above("power_between_waits", e.power_between_waits, t.power_proxy_compute, w, "power_proxy_compute")
            heavy = any_of("heavy", heavy, all_of("drawn_heavy", drawn, not_memory))
            light = all_of("light", light, negated(drawn))
    elif f.power_ratio is not None:
        # While the GPU waits on the fabric its power falls though a kernel spins: the spin is evidence
        # of neither math nor small kernels, so the power of the samples between the waits decides.
        heavy = above("proxy_power", e.proxy_power, t.power_proxy_compute, w, "power_proxy_compute")
        light = below("proxy_power", e.proxy_power, t.power_proxy_latency, w, "power_proxy_latency")
    else:
        heavy = light = None

    # A GPU at its power limit is doing heavy math even if its memory is busy too (GEMMs stream their
    # tiles through HBM): memory-bound needs power below that level, compute-bound needs either quiet
    # memory or power at the limit.
    return {
        "compute_bound": None if heavy is None else all_of(
            "proxy_compute", heavy, any_of("quiet_memory_or_power_at_limit", not_memory, near_limit)),
        "memory_bound": None if memory_score is None else all_of(
            "proxy_memory", memory_score, below("power_ratio", f.power_ratio, t.power_near_limit, w, "power_near_limit"),
            None if reported is None or heavy is None else not_rule("not_heavy", heavy)),
        "latency_bound": None if light is None else all_of("proxy_latency", light, not_memory),
    }
