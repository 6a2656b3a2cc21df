"""A verdict and its evidence: the window features, the roofline position, the published class.

These are the classifier's outputs, but they are plain data that the snapshot, the exporters,
the views and trace replay all read, so they live in the vendor-neutral model; the classifier
computes them (agent.classifier.features, .roofline, .engine) and nothing here depends on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from agent.model.sample import WorkloadReport
from agent.model.serving import ServingView


@dataclass(frozen=True, slots=True)
class WindowFeatures:
    """One GPU over one short window (plus step statistics over the long window)."""

    samples: int
    valid_fraction: float
    duty: float | None
    idle_fraction: float | None
    tensor_busy: float | None
    fp_busy: float | None
    dram_busy: float | None
    sm_busy: float | None
    u_compute: float | None
    """Busy-normalised compute utilisation against its roof (tensor or FP pipes)."""
    u_memory: float | None
    comm_wait_fraction: float | None
    link_utilization: float | None
    link_active: bool
    clock_ratio: float | None
    """Mean SM clock / the clock the peaks are quoted at (busy samples)."""
    throttle_fraction: float
    throttle_bits: int
    power_ratio: float | None
    """Mean power / enforced limit over busy samples (a compute proxy when pipes are unreadable);
    against the catalogue TDP where the samples carry no limit (``power_basis``)."""
    process_alive: bool | None
    memory_held_bytes: int | None
    process_cpu_cores: float | None
    main_cpu_cores: float | None
    """The busiest GPU process's own CPU (None unless the host splits it from its workers')."""
    loader_cpu_cores: float | None
    """Its child processes' CPU: data-loader workers."""
    loader_workers: int | None
    cpu_limit_cores: float | None
    iowait: float | None
    io_pressure: float | None
    cpu_pressure: float | None
    net_congestion_per_s: float | None
    """Mean congestion notifications per second on the GPU's nearest NIC port over the window."""
    net_retransmits_per_s: float | None
    net_link_downs: int | None
    """Link-down events of that port within the window."""
    tensor_mean: float | None
    """Duty-inclusive, clock-scaled tensor activity (the counter MFU before the dtype peak)."""
    dram_mean: float | None
    pipe_means: dict[str, float]
    """Duty-inclusive, clock-scaled FP64/FP32/FP16 pipe activity (keys only for readable pipes)."""
    step_cv: float | None
    steps: int
    step_cv_long: float | None
    """The same over more steps (``steps_for_cv_exit``): what keeps a jitter verdict."""
    steps_long: int
    activity_cv: float | None
    workload: WorkloadReport | None
    dtype: str | None
    mig: bool
    mem_busy: float | None = None
    """Busy-normalised memory busy time (NVML utilization.memory, DCGM MEM_COPY_UTIL): a duty
    cycle of the memory interface, not a share of peak bandwidth; used only without ``dram_busy``."""
    power_basis: str | None = None
    """What ``power_ratio`` divides by: ``"limit"`` (the enforced limit) or ``"tdp"`` (the catalogue)."""
    mfu_reported: float | None = None
    """The job's own MFU over the window (tokens/s x FLOPs/token against the dtype peak), when it reports."""
    duty_check: tuple[float, float] | None = None
    """(profiling duty, utilisation-counter duty): window means of ``gr_active`` and ``util_gpu`` over
    samples that carry both, when both are read; the cross-check of the duty the verdict rests on."""
    throttle_known: bool = True
    """Whether any sample of the window carried clock-event reasons: without them the throttled flag
    is unknown (dcgm-exporter's default CSV exports none), never a confident no."""
    allocated_to: str | None = None
    """Who the scheduler gave the GPU to at the window's end (``pod namespace/name``, ``job ID``), from
    its attribution: a GPU allocated to someone cannot be handed out, whether or not a process shows."""
    fabric_wait_fraction: float | None = None
    """Share of samples spent waiting on the fabric by power and fabric bytes alone: a kernel resident,
    power well below the GPU's working level, fabric busy, in a window where power falls as fabric
    bytes rise (else 0; agent.classifier.fabric). Known on any GPU with power and a fabric counter,
    SM and tensor counters or not."""
    step_level_shift: float | None = None
    """|median of the recent steps - median of the older ones| / the older median, over the steps the
    exit hysteresis looks at: a job that changed what it runs, not one that stalls at random."""
    step_time_mean: float | None = None
    """Mean of the step times the job reported over its recent steps (seconds)."""
    power_fabric_r: float | None = None
    """Correlation of power with fabric bytes over the window: negative when compute and communication
    take turns."""
    memory_fabric_r: float | None = None
    """The same for memory activity (DRAM or utilization.memory)."""
    working_power_ratio: float | None = None
    """Mean power / limit over the samples that were not fabric waits: what the GPU's compute draws."""
    power_cv: float | None = None
    """CV of 5 s power blocks over the long window: how unevenly the waits come, without step reports."""
    steps_inferred: bool = False
    """Step times came from reports without step ids (a change of the reported time is a new step)."""
    spin_wait_fraction: float | None = None
    """Share of samples waiting on peers with a kernel resident, seen without SM or tensor counters: power and
    memory activity well below their working levels while the fabric is quiet or unread (a collective
    spinning while its peers are late; agent.classifier.fabric). None without power and a memory counter."""
    memory_gap: float | None = None
    """1 - mean / 90th percentile of memory activity while a kernel is resident: about the share of the window
    a rank spent waiting (a spinning collective touches no memory), whatever the counter's sample period;
    what ranks without SM or tensor counters are compared on (agent.classifier.jobs)."""


EVIDENCE_BASES: dict[str, str] = {
    "counters": "compute-pipe and DRAM bandwidth counters",
    "compute_counter": "compute-pipe counters, no DRAM bandwidth counter",
    "reported_mfu": "the MFU the job reports, with memory activity; no compute counter",
    "power_and_dram": "power against its limit and a DRAM activity counter; no compute counter",
    "power_and_mem_busy": "power against its limit and memory busy time (utilization.memory); no compute or DRAM bandwidth counter",
    "power": "power against its limit only; no compute or memory counter",
    "memory_only": "a memory counter only; no compute counter and no power",
    "duty": "kernel duty cycle only (utilization.gpu)",
    "none": "no utilisation counter",
    "step_reports": "communication jitter seen in the step times the job reports (with or without step ids)",
    "comm_counters": "communication jitter seen by SM and tensor counters: kernels resident but idle, waiting on peers",
    "fabric_and_power": "communication jitter seen by power and memory activity falling as fabric bytes rise; no step "
                        "reports, no SM or tensor counter",
    "resident_waits": "communication jitter seen by a kernel staying resident while power and memory activity fall (and the "
                      "fabric, where read, is quiet); no step reports, no SM or tensor counter",
    "rank_spread": "communication jitter seen in the spread between the job's ranks (a straggler and those waiting for it)",
    "network_counters": "communication jitter seen by the NIC port's congestion, retransmit or link-down counters",
}
"""What a verdict rests on, strongest first: a bounded label set (``basis`` of the reason info
metric) so doctor, the status page and dashboards can say how much a GPU's verdict can be trusted.
Where those counters were read (GPM, DCGM, dcgm-exporter, DME, NVML, amdsmi) is said beside the words, per GPU,
by agent.model.counter_source."""


def jitter_basis(f: WindowFeatures, detail: str = "none") -> str:
    """What a communication-jittered verdict rests on: the evidence its detail names (a straggler: the
    ranks' spread; congestion or a flap: the NIC counters), else the strongest of the job's step times,
    the comm-wait counters, and power and memory against fabric bytes."""
    if detail in ("straggler", "straggler_victim"):
        return "rank_spread"
    if detail in ("network_congestion", "link_flap"):
        return "network_counters"
    if f.step_cv is not None and f.steps >= 2:
        return "step_reports"
    if f.comm_wait_fraction:
        return "comm_counters"
    if f.fabric_wait_fraction:
        return "fabric_and_power"
    if f.spin_wait_fraction:
        return "resident_waits"
    return "rank_spread"


def evidence_basis(f: WindowFeatures) -> str:
    """The :data:`EVIDENCE_BASES` key for the signals these features carry."""
    if f.duty is None:
        return "none"
    if f.u_compute is not None:
        return "counters" if f.dram_busy is not None else "compute_counter"
    memory = f.dram_busy is not None or f.mem_busy is not None
    if f.mfu_reported is not None:
        return "reported_mfu"
    if f.power_ratio is not None:
        return "power_and_dram" if f.dram_busy is not None else "power_and_mem_busy" if f.mem_busy is not None else "power"
    return "memory_only" if memory else "duty"


@dataclass(frozen=True, slots=True)
class Roofline:
    """Where the GPU sits on its roofline, and how much of its peaks it uses."""

    dtype: str
    dtype_assumed: bool
    """True when neither the workload nor the configuration said which precision runs."""
    peak_flops: float | None
    peak_bytes_per_s: float | None
    achieved_flops: float | None
    achieved_bytes_per_s: float | None
    intensity: float | None
    """Estimated arithmetic intensity, FLOP per DRAM byte."""
    ridge_point: float | None
    compute_headroom: float | None
    """1 - achieved / peak FLOP/s: 0 at the compute roof."""
    memory_headroom: float | None
    """1 - achieved / peak bytes/s: 0 at the memory roof."""
    mfu_counters: float | None
    mfu_workload: float | None
    mbu_counters: float | None
    mbu_workload: float | None

    @property
    def mfu(self) -> float | None:
        """The best MFU available: what the workload reported, else the counter estimate."""
        return _preferred(self.mfu_workload, self.mfu_counters)[0]

    @property
    def mfu_source(self) -> str | None:
        return _preferred(self.mfu_workload, self.mfu_counters)[1]

    @property
    def mbu(self) -> float | None:
        return _preferred(self.mbu_workload, self.mbu_counters)[0]

    @property
    def mbu_source(self) -> str | None:
        return _preferred(self.mbu_workload, self.mbu_counters)[1]


def _preferred(workload: float | None, counters: float | None) -> tuple[float | None, str | None]:
    """(value, source): the workload's own figure wins; the counter estimate stands in."""
    if workload is not None:
        return workload, "workload"
    return (counters, "counters") if counters is not None else (None, None)


Direction = Literal["above", "below"]
"""Which side of its threshold makes a figure evidence: ``above`` is ``value >= threshold``, ``below`` is
``value < threshold``."""


@dataclass(frozen=True, slots=True)
class Check:
    """One comparison a reason rests on: the figure, the threshold it was compared with, and the side of it
    that makes the figure evidence for what the reason says.

    Carried beside the reason's words so a reader (a test, a view, a person) can see that the number a
    reason gives is the number the rule compared, with the threshold the rule used (an exit level while the
    class is held, the at-roof level where it applies), and which way it points."""

    quantity: str
    """What was compared: a window feature (``comm_wait_fraction``, ``step_cv``), a job figure (``rank_skew``)
    or a derived one (``idle_share``, ``waiting``)."""
    value: float
    threshold: float
    direction: Direction
    setting: str | None = None
    """The classifier setting the threshold comes from (docs/classification.md §5), when one does."""

    @property
    def holds(self) -> bool:
        """Whether the value lies on the side of the threshold the reason claims."""
        return self.value >= self.threshold if self.direction == "above" else self.value < self.threshold


@dataclass(frozen=True, slots=True)
class Reason:
    """A sentence of a verdict's explanation and the comparisons behind its figures.

    A reason without checks carries no figure compared with anything (a note: "host signals do not say
    why", the counters a GPU lacks). A reason whose checks all hold is evidence for the verdict; one whose
    checks do not is evidence against it, and is listed apart (``Verdict.against``)."""

    text: str
    checks: tuple[Check, ...] = ()

    @property
    def supports(self) -> bool:
        return all(c.holds for c in self.checks)


AGAINST = "against: "
"""How an entry of ``Verdict.against`` begins, so no reader takes it for a reason."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """What bounds one GPU now: the published (stabilised) class and the evidence behind it."""

    node: str
    gpu: str
    uuid: str | None
    window_start: float
    window_end: float
    cls: str
    detail: str
    confidence: float
    throttled: bool
    throttle_severe: bool
    reasons: tuple[str, ...]
    scores: dict[str, float]
    raw_class: str
    """This window's own decision before hysteresis (what a flapping classifier would say)."""
    roofline: Roofline
    features: WindowFeatures
    job: str | None = None
    rank_skew: float | None = None
    truth: str | None = None
    """The labelled class of the window's last sample (labelled traces only)."""
    serving: ServingView | None = None
    """For a GPU serving inference: its distance from the decode latency floor, and the knob to turn."""
    throttle_likely: bool = False
    """No clock-event reasons, but power at its limit with the clock held low while busy: likely power-capped."""
    counters_suspect: bool = False
    """This window's profiling duty contradicts the utilisation counter (detail ``counters_disagree``)."""
    supporting: tuple[Reason, ...] = ()
    """``reasons`` with the comparisons behind them (same order), where the classifier built them."""
    opposing: tuple[Reason, ...] = ()
    """Evidence this window holds that points away from the published class: shown apart as ``against``."""
    precedence: str | None = None
    """Why the published class stands although another class scores higher: the rule that took precedence
    (``idle: no kernel ran; takes precedence over input_starved (score 0.953)``), or the
    hysteresis that holds the class. None when the published class has the highest score."""

    @property
    def against(self) -> tuple[str, ...]:
        """The evidence against the published class, each worded ``against: ...``."""
        return tuple(AGAINST + r.text for r in self.opposing)

    @property
    def throttle(self) -> str:
        """The throttle label: ``severe``, ``moderate``, ``none``; without reasons to read, ``unknown`` or
        ``likely_power_capped`` (a bounded set: the ``throttle`` label of the reason info metric)."""
        if not self.features.throttle_known:
            return "likely_power_capped" if self.throttle_likely else "unknown"
        return "severe" if self.throttle_severe else "moderate" if self.throttled else "none"

    @property
    def basis(self) -> str:
        """What this verdict rests on (:data:`EVIDENCE_BASES`)."""
        return jitter_basis(self.features, self.detail) if self.cls == "communication_jittered" else evidence_basis(self.features)

    def to_json(self) -> dict[str, object]:
        """The verdict line of docs/trace-format.md, plus optional fields readers may ignore."""
        r = self.roofline
        return {
            "node": self.node, "gpu": self.gpu, "window_start": self.window_start, "window_end": self.window_end,
            "class": self.cls, "confidence": self.confidence, "throttled": self.throttled,
            "mfu": _round(r.mfu), "mbu": _round(r.mbu), "reasons": list(self.reasons),
            "scores": {k: round(v, 3) for k, v in self.scores.items()},
            "detail": self.detail, "raw_class": self.raw_class, "throttle_severe": self.throttle_severe,
            "throttle": self.throttle,
            "mfu_source": r.mfu_source, "mfu_counters": _round(r.mfu_counters), "mfu_workload": _round(r.mfu_workload),
            "mbu_source": r.mbu_source, "mbu_counters": _round(r.mbu_counters), "mbu_workload": _round(r.mbu_workload),
            "dtype": r.dtype, "dtype_assumed": r.dtype_assumed,
            "roofline": {
                "achieved_flops": _round(r.achieved_flops, 0), "achieved_bytes_per_s": _round(r.achieved_bytes_per_s, 0),
                "intensity": _round(r.intensity, 2), "ridge_point": _round(r.ridge_point, 2),
                "compute_headroom": _round(r.compute_headroom), "memory_headroom": _round(r.memory_headroom),
            },
            "job": self.job, "rank_skew": _round(self.rank_skew), "label": self.truth, "basis": self.basis,
            **({"serving": self.serving.to_json()} if self.serving is not None else {}),
            **({"against": list(self.against)} if self.opposing else {}),
            **({"precedence": self.precedence} if self.precedence is not None else {}),
        }


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)
