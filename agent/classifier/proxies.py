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

from dataclasses import dataclass

from agent.classifier.fabric import fabric_waits
from agent.classifier.scoring import above as _above
from agent.classifier.scoring import all_of as _all
from agent.classifier.scoring import any_of as _max
from agent.classifier.scoring import below as _below
from agent.classifier.thresholds import Thresholds
from agent.model import WindowFeatures

_MIN_DUTY = 0.05


@dataclass(frozen=True, slots=True)
class ProxyScores:
    """Roofline-tier scores from indirect evidence (the duty cycle aside), and what they rest on."""

    compute: float | None
    memory: float | None
    latency: float | None
    compute_basis: str | None
    """``"reported_mfu"``, ``"power"`` or None: what stood in for the compute counter."""
    memory_basis: str | None
    """``"dram_active"``, ``"mem_busy"`` or None."""


def reported_compute(f: WindowFeatures, t: Thresholds) -> float | None:
    """The job's MFU as a busy-normalised share of the compute roof (comparable with ``u_compute``)."""
    if f.mfu_reported is None or f.duty is None:
        return None
    return f.mfu_reported / max(f.duty, _MIN_DUTY) / t.tensor_saturation


def memory_evidence(f: WindowFeatures, t: Thresholds, incumbent: str | None) -> tuple[float | None, str | None]:
    """Score that the memory side dominates, and the signal it rests on."""
    w = t.score_width
    if f.u_memory is not None:
        roof = t.dominant_memory_roof_exit if incumbent == "memory_bound" else t.dominant_memory_roof
        return _above(f.u_memory, roof + t.roof_margin, w), "dram_active"
    if f.mem_busy is not None:
        level = t.mem_busy_memory_exit if incumbent == "memory_bound" else t.mem_busy_memory
        return _above(f.mem_busy, level, w), "mem_busy"
    return None, None


def proxy_scores(f: WindowFeatures, t: Thresholds, incumbent: str | None, communicating: bool = False) -> ProxyScores:
    """compute / memory / latency scores for a GPU whose ``u_compute`` is unknown, on the evidence
    alone: the rules combine them with the duty cycle, and judge the evidence against
    ``proxy_min_score`` without it. ``communicating``: the GPU is a rank of a job whose fabric is busy
    throughout (see :func:`collective_share_hidden`)."""
    w = t.score_width
    memory_score, memory_basis = memory_evidence(f, t, incumbent)
    not_memory = None if memory_score is None else 1.0 - memory_score
    near_limit = _above(f.power_ratio, t.power_near_limit, w)

    reported = reported_compute(f, t)
    if reported is not None:
        roof = t.dominant_roof_exit if incumbent == "compute_bound" else t.dominant_roof
        heavy = _above(reported, roof, w)
        # Past the ridge: a reported MFU above the memory roof's share is compute-dominated.
        lead = None if f.u_memory is None else _above(reported - f.u_memory, -t.roof_margin, w)
        heavy = _all(heavy, lead)
        light = _below(reported, t.dominant_roof, w)
        if communicating and f.power_ratio is not None:
            # The whole step's MFU counts the collectives' time too; power says what the compute parts are.
            drawn = _above(f.working_power_ratio or f.power_ratio, t.power_proxy_compute, w)
            heavy, light = max(heavy, _all(drawn, not_memory)), _all(light, 1.0 - drawn)
        compute_basis: str | None = "reported_mfu"
    elif f.power_ratio is not None:
        # While the GPU waits on the fabric its power falls though a kernel spins: the spin is evidence
        # of neither math nor small kernels, so the power of the samples between the waits decides.
        power = f.working_power_ratio if fabric_waits(f, t) and f.working_power_ratio is not None else f.power_ratio
        heavy = _above(power, t.power_proxy_compute, w)
        light = _below(power, t.power_proxy_latency, w)
        compute_basis = "power"
    else:
        heavy = light = None
        compute_basis = None

    # A GPU at its power limit is doing heavy math even if its memory is busy too (GEMMs stream
    # their tiles through HBM): memory-bound needs power below that level, compute-bound needs
    # either quiet memory or power at the limit.
    compute = None if heavy is None else _all(heavy, _max(not_memory, near_limit))
    memory = None if memory_score is None else _all(memory_score, _below(f.power_ratio, t.power_near_limit, w),
                                                    None if reported is None else 1.0 - (heavy or 0.0))
    latency = None if light is None else _all(light, not_memory)
    return ProxyScores(compute, memory, latency, compute_basis, memory_basis)


def missing_compute_reason(f: WindowFeatures) -> str:
    """Why the roofline tier could not decide: the counters this GPU lacks, for the verdict's reasons."""
    missing = ["tensor or FP-pipe counter"]
    if f.dram_busy is None:
        missing.append("DRAM bandwidth counter" + (" (memory busy time only)" if f.mem_busy is not None else ""))
    if f.power_ratio is None:
        missing.append("power reading against a known limit or TDP")
    return ("this GPU has no " + ", no ".join(missing) + ": compute-, memory- and latency-bound cannot be told apart "
            "(DCGM or dcgm-exporter adds the counters: docs/nvidia.md, Pre-Hopper GPUs)")
