"""The class rules: window features in, per-class scores, a class, a detail and reasons out.

Each class has a score in 0..1: a logistic step ``σ((x - θ)/w)`` around its entry threshold θ
on the feature that governs it, and the minimum over components for classes with several
conditions (classification.md §7.4). The incumbent class is scored against its *exit*
thresholds, which is the hysteresis that keeps a steady workload from flapping.

Classes are decided in tiers, first match wins (§7.3): ``idle``, then ``input_starved`` (duty
lost while a process lives), then ``communication_jittered`` (resident time wasted waiting on
peers), then the roofline tier, where ``compute_bound``, ``memory_bound`` and
``latency_bound`` compete on busy-normalised utilisation.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.classifier.fabric import fabric_waits
from agent.classifier.proxies import ProxyScores, missing_compute_reason, proxy_scores, reported_compute
from agent.classifier.scoring import above as _above
from agent.classifier.scoring import all_of as _all
from agent.classifier.scoring import below as _below
from agent.classifier.scoring import sigmoid
from agent.classifier.thresholds import Thresholds
from agent.model import CLOCK_EVENT_REASONS, THROTTLE_REASON_MASK, WindowFeatures

_HARD_THROTTLE = (CLOCK_EVENT_REASONS["hw_slowdown"] | CLOCK_EVENT_REASONS["hw_thermal_slowdown"]
                  | CLOCK_EVENT_REASONS["hw_power_brake_slowdown"])
"""Reasons that cut clocks hard (roughly halve them), making a throttle severe at any ratio."""

SCORED_CLASSES: tuple[str, ...] = (
    "idle", "compute_bound", "memory_bound", "input_starved", "communication_jittered", "latency_bound",
)
ROOFLINE_TIER: tuple[str, ...] = ("compute_bound", "memory_bound", "latency_bound")
PRIORITY_TIER: tuple[str, ...] = ("idle", "input_starved", "communication_jittered")

DETAILS: tuple[str, ...] = (
    "none", "warming_up", "gpu_down", "no_counters", "no_compute_counter", "idle_held", "idle_free", "dataloader", "io", "host_launch",
    "unattributed", "straggler", "straggler_victim", "link_flap", "network_congestion", "unstable_steps",
    "bandwidth_bound", "at_roof",
    "leaning", "balanced", "power_proxy", "small_kernels", "counters_disagree",
)
"""Every value the ``detail`` of a verdict can take: a bounded label set for the info metric."""


@dataclass(frozen=True, slots=True)
class JobContext:
    """Where this GPU stands among the ranks of its job (from peers visible in the same window)."""

    job: str | None = None
    ranks_seen: int = 1
    rank_skew: float | None = None
    """1 - this rank's compute share / the busiest rank's share."""
    peer_skew: float | None = None
    """Largest skew among the *other* ranks: high when this rank is the one they wait for."""
    is_busiest: bool = False
    step_spread: float | None = None
    """(slowest - fastest) / mean of the job's ranks' mean reported step times in the window."""
    lockstep: int = 1
    """GPUs of this node (itself included) whose power rises and falls with this one's: one synchronous
    job's ranks, even when none of them reports."""


@dataclass(frozen=True, slots=True)
class Decision:
    """The unstabilised outcome of one evaluation."""

    cls: str
    detail: str
    scores: dict[str, float]
    confidence: float
    reasons: tuple[str, ...]
    throttled: bool
    throttle_severe: bool
    throttle_likely: bool = False


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100.0 * x:.0f}%"


# ------------------------------------------------------------------------------ scores


def score_classes(f: WindowFeatures, job: JobContext, t: Thresholds, incumbent: str | None = None,
                  proxies: ProxyScores | None = None) -> dict[str, float | None]:
    """Score of every class (``None`` where the counters to judge it are missing); ``proxies`` are
    the stand-in scores of a GPU without a compute counter, when the caller has them already."""
    w, wcv = t.score_width, t.score_width_cv
    c_roof = t.dominant_roof_exit if incumbent == "compute_bound" else t.dominant_roof
    m_roof = t.dominant_memory_roof_exit if incumbent == "memory_bound" else t.dominant_memory_roof
    starved_share = t.starved_idle_share_exit if incumbent == "input_starved" else t.starved_idle_share
    roofs = [u for u in (f.u_compute, f.u_memory) if u is not None]
    if roofs and max(roofs) >= t.at_roof:
        # Busy at a roof: small gaps between kernels (a serving loop's scheduling, a decode step's
        # host work) cost less than the roof does, so starvation needs a larger idle share.
        starved_share += t.starved_idle_share_at_roof - t.starved_idle_share
    idle_share = None if f.duty is None else 1.0 - f.duty

    idle = _all(_below(f.duty, t.idle_duty, w), _below(f.dram_mean, t.idle_dram, w),
                _below(f.link_utilization, t.idle_link, w))

    alive = None if f.process_alive is None else (1.0 if f.process_alive else 0.0)
    starved = _all(_above(idle_share, starved_share, w), alive,
                   _below(f.comm_wait_fraction, t.starved_max_comm_wait, w),
                   _below(job.rank_skew, t.rank_skew, wcv))

    multi = (job.ranks_seen > 1 or job.lockstep > 1 or (f.workload is not None and (f.workload.world_size or 1) > 1)
             or f.link_active)
    jitter: float | None = None
    if multi:
        steady_steps = f.step_cv if f.steps >= t.min_steps else None
        known_waits = [x for x in (f.comm_wait_fraction, fabric_waits(f, t)) if x is not None]
        no_waits = bool(known_waits) and max(known_waits) < t.comm_wait_fraction
        if (incumbent == "communication_jittered" and f.step_cv_long is not None and f.steps_long >= t.min_steps
                and not (steady_steps is not None and steady_steps < t.step_cv / 2.0
                         and ((f.step_level_shift or 0.0) >= t.step_cv / 2.0 or no_waits))):
            # Exit hysteresis: jitter stalls come at random, so a quiet spell keeps the verdict, unless
            # the job moved on: its recent steps clearly steady (half the jitter level) at another
            # typical length than before (random stalls leave the median step where it was), or with
            # no waiting on peers left in the window (a pause between stalls still waits each step).
            steady_steps = max(steady_steps or 0.0, f.step_cv_long)
        variation = [v for v in (_above(steady_steps, t.step_cv, wcv), _above(job.rank_skew, t.rank_skew, wcv),
                                 _above(job.step_spread, t.rank_skew, wcv),
                                 _unreported_variation(f, t) if steady_steps is None else None)
                     if v is not None]
        waits = [x for x in (f.comm_wait_fraction, fabric_waits(f, t)) if x is not None]
        wait_rule = _all(_above(max(waits) if waits else None, t.comm_wait_fraction, w), max(variation) if variation else None)
        steps_rule = _above(steady_steps, t.step_cv_alone, wcv)
        culprit = _all(_above(job.peer_skew, t.rank_skew, wcv), 1.0 if job.is_busiest else 0.0)
        victim = _above(job.rank_skew, t.rank_skew, wcv)
        network = _network_trouble(f, t)
        net_rule = _all(network, max(variation)) if network is not None and variation else None
        rules = [r for r in (wait_rule, steps_rule, culprit, victim, net_rule) if r is not None]
        jitter = max(rules) if rules else None
    elif f.duty is not None:
        jitter = 0.0

    busy = _above(f.duty, t.busy_duty, w)
    u_c, u_m = f.u_compute, f.u_memory
    if u_c is not None:
        compute = _all(busy, _above(u_c, c_roof, w), _above(None if u_m is None else u_c - u_m, t.roof_margin, w))
        # Without a DRAM counter memory-bound is unknown, not as likely as the duty cycle.
        memory = None if u_m is None else _all(busy, _above(u_m, m_roof, w), _above(u_m - u_c, t.roof_margin, w))
        latency = _all(busy, _below(u_c, t.dominant_roof, w), _below(u_m, t.dominant_memory_roof, w))
        if communicating(f) and f.power_ratio is not None:
            # Collectives interleaved with the compute dilute a 1 Hz tensor reading without making the
            # kernels small: a rank drawing heavy power with tensor pipes past the exit level computes.
            drawn = _above(f.working_power_ratio or f.power_ratio, t.power_proxy_compute, w)
            compute = max(compute, _all(busy, drawn, _above(u_c, t.dominant_roof_exit, w),
                                        _above(None if u_m is None else u_c - u_m, -t.roof_margin, w)))
            latency = _all(latency, 1.0 - drawn)
    else:  # no tensor or pipe counter: reported MFU, power and memory evidence stand in
        proxies = proxies or proxy_scores(f, t, incumbent)
        compute, memory, latency = (None if p is None else _all(busy, p)
                                    for p in (proxies.compute, proxies.memory, proxies.latency))
    return {"idle": idle, "input_starved": starved, "communication_jittered": jitter,
            "compute_bound": compute, "memory_bound": memory, "latency_bound": latency}


def communicating(f: WindowFeatures) -> bool:
    """The GPU's fabric (NVLink/XGMI, its NIC) carries collectives in this window, as a rank of a
    multi-GPU job does (the jitter tier counts it as one too): its time-averaged tensor activity and
    whole-step MFU include the time spent in collectives (MoE all-to-alls run between every layer's
    experts), so neither alone says its kernels are small."""
    return f.link_active


def _unreported_variation(f: WindowFeatures, t: Thresholds) -> float | None:
    """How unevenly the job runs when it reports no step times: tensor activity between 5 s blocks
    where there is a tensor counter, and power between blocks where the GPU is seen waiting on the
    fabric (a spinning collective keeps the duty cycle, and so gfx activity and utilization.gpu, flat)."""
    by_power = _above(f.power_cv, t.power_cv, t.score_width_cv) if fabric_waits(f, t) else None
    by_tensor = _above(f.activity_cv, t.activity_cv, t.score_width_cv) if f.tensor_busy is not None or by_power is None else None
    known = [v for v in (by_power, by_tensor) if v is not None]
    return max(known) if known else None


def _network_trouble(f: WindowFeatures, t: Thresholds) -> float | None:
    """How strongly the GPU's NIC port shows trouble: a link flap, congestion marks or retransmits."""
    parts = [_above(f.net_congestion_per_s, t.net_congestion_per_s, max(0.1 * t.net_congestion_per_s, 1e-9)),
             _above(f.net_retransmits_per_s, t.net_retransmits_per_s, max(0.1 * t.net_retransmits_per_s, 1e-9))]
    if f.net_link_downs is not None:
        parts.append(1.0 if f.net_link_downs > 0 else 0.0)
    known = [p for p in parts if p is not None]
    return max(known) if known else None


# ------------------------------------------------------------------------------ decision


def decide(f: WindowFeatures, job: JobContext, t: Thresholds, incumbent: str | None = None,
           expected_samples: int | None = None) -> Decision:
    """Class, detail, confidence and reasons for one window."""
    throttled, severe, throttle_reasons = _throttle(f, t)
    likely = bool(throttle_reasons) and not f.throttle_known
    expected = max(f.samples, expected_samples or 0)
    valid = f.valid_fraction * f.samples / expected if expected else 0.0
    proxies = proxy_scores(f, t, incumbent, communicating(f)) if f.u_compute is None else None
    raw = score_classes(f, job, t, incumbent, proxies)
    scores = {c: (0.0 if raw[c] is None else raw[c]) for c in SCORED_CLASSES}  # type: ignore[misc]

    if expected == 0 or valid < t.min_valid_fraction:
        if f.samples and f.valid_fraction < t.min_valid_fraction:
            why = (f"utilisation counters unreadable in {_pct(1 - f.valid_fraction)} of {f.samples} samples; "
                   "this GPU cannot be classified")
            detail = "no_counters"
        else:
            why = f"only {f.samples} of {expected} samples in the window so far"
            detail = "warming_up"
        return Decision("unknown", detail, scores, 0.0, (why,), throttled, severe)

    disagreement = counters_disagree(f, t)
    if disagreement is not None:
        return Decision("unknown", "counters_disagree", scores, 0.0, (disagreement,), throttled, severe, likely)

    cls = next((c for c in PRIORITY_TIER if (raw[c] or 0.0) >= 0.5), None)
    if cls is None:
        tier = {c: raw[c] for c in ROOFLINE_TIER if raw[c] is not None}
        if not tier:
            why = ("no compute, memory or power counters to place this GPU on the roofline" if f.u_compute is not None
                   or f.duty is None else missing_compute_reason(f))
            detail = "no_compute_counter" if f.u_compute is None and f.duty is not None else "no_counters"
            return Decision("unknown", detail, scores, 0.0, (why,), throttled, severe)
        cls = max(tier, key=lambda c: tier[c])  # type: ignore[arg-type, return-value]
        evidence = getattr(proxies, cls.removesuffix("_bound")) if proxies is not None else None
        if evidence is not None and evidence < t.proxy_min_score:
            # Indirect evidence below even odds is a guess: say what is missing instead.
            return Decision("unknown", "no_compute_counter", scores, 0.0, (missing_compute_reason(f),), throttled, severe)

    # The rival is whatever could have taken the verdict instead: higher tiers that fell short
    # and, on the roofline, the other roofs.
    if cls in PRIORITY_TIER:
        rivals = PRIORITY_TIER[:PRIORITY_TIER.index(cls)]
    else:
        rivals = PRIORITY_TIER + tuple(c for c in ROOFLINE_TIER if c != cls)
    rival = max((scores[c] for c in rivals), default=0.0)
    detail, reasons, quality = _explain(cls, f, job, t)
    if f.mig:
        quality *= t.confidence_mig
    confidence = max(0.0, min(1.0, scores[cls] * (1.0 - rival) * valid * quality))
    return Decision(cls, detail, scores, round(confidence, 3), reasons + throttle_reasons, throttled, severe, likely)


def _throttle(f: WindowFeatures, t: Thresholds) -> tuple[bool, bool, tuple[str, ...]]:
    """The throttled flag (§7.3): clocks held down by a throttle reason while the GPU is busy."""
    if f.duty is None or f.duty < t.throttle_duty or f.clock_ratio is None:
        return False, False, ()
    if not f.throttle_known:
        return False, False, _likely_power_capped(f, t)
    hard = bool(f.throttle_bits & _HARD_THROTTLE)
    if f.throttle_fraction < t.throttle_fraction or f.clock_ratio >= t.throttle_clock:
        return False, False, ()
    severe = f.clock_ratio < t.throttle_severe_clock or hard
    names = [name.replace("_", " ") for name, bit in CLOCK_EVENT_REASONS.items()
             if bit & THROTTLE_REASON_MASK and f.throttle_bits & bit]
    why = (f"clock at {_pct(f.clock_ratio)} of the peak's reference clock, held down by "
           f"{' and '.join(names) or 'a throttle reason'} in {_pct(f.throttle_fraction)} of busy samples")
    return True, severe, (why,)


def duty_readings_contradict(profiling: float, utilisation: float, power_ratio: float | None, t: Thresholds) -> bool:
    """The rule behind ``counters_disagree``, on any pair of duty readings (a window's means, or doctor's
    one read): the utilisation counter at least ``counters_disagree_gap`` busier than the profiling one,
    and power not siding with the profiling counter (below half its limit it would)."""
    return utilisation - profiling >= t.counters_disagree_gap and (power_ratio is None or power_ratio >= 0.5)


def counters_disagree(f: WindowFeatures, t: Thresholds) -> str | None:
    """Why the profiling counters cannot be trusted in this window, or None when they can.

    The profiling duty (GPM, DCGM ``PROF_GR_ENGINE_ACTIVE``) and the driver's utilisation counter
    (``utilization.gpu``, ``GPU_UTIL``) both measure the time a kernel ran. When the utilisation
    counter reads far busier and power does not say it is idle, the profiling counters are not
    counting (a paused profiler blanks them; NVIDIA/dcgm-exporter#662 shows them near zero under
    full load), and every class built on them (input-starved first) would be wrong."""
    if f.duty_check is None:
        return None
    profiling, utilisation = f.duty_check
    if not duty_readings_contradict(profiling, utilisation, f.power_ratio, t):
        return None
    power = f", power at {_pct(f.power_ratio)} of its {f.power_basis or 'limit'}" if f.power_ratio is not None else ""
    return (f"counters disagree: the utilisation counter reads {_pct(utilisation)} busy{power}, but the profiling "
            f"engine activity reads {_pct(profiling)}; profiling counters paused or not updating (dcgmi profile "
            "--resume; NVIDIA/dcgm-exporter#662), so no class is given until they agree")


def _likely_power_capped(f: WindowFeatures, t: Thresholds) -> tuple[str, ...]:
    """Without clock-event reasons the flag is unknown; the one cap the other counters show is power:
    board power at its enforced limit while the busy GPU's clock sits well below the peaks' clock."""
    if f.power_basis != "limit" or f.power_ratio is None or f.power_ratio < t.power_capped_ratio \
            or f.clock_ratio is None or f.clock_ratio >= t.throttle_clock:
        return ()
    return (f"likely power-capped: power at {_pct(f.power_ratio)} of its limit and the clock at "
            f"{_pct(f.clock_ratio)} of the peaks' reference clock while busy; the source exports no clock-event "
            "reasons to confirm it",)


def _explain(cls: str, f: WindowFeatures, job: JobContext, t: Thresholds) -> tuple[str, tuple[str, ...], float]:
    """(detail, reasons, confidence factor) for the chosen class."""
    if cls == "idle":
        held = f.memory_held_bytes or 0
        if f.process_alive and held >= t.idle_held_bytes:
            return "idle_held", (f"no kernel ran ({_pct(f.duty)} duty) but a process holds "
                                 f"{held / 2**30:.1f} GiB of device memory",), 1.0
        if f.allocated_to is not None:  # a scheduler allocation holds it, a process or not
            return "idle_held", (f"no kernel ran ({_pct(f.duty)} duty) but the GPU is allocated to "
                                 f"{f.allocated_to[:160]}: the scheduler cannot hand it out",), 1.0
        return "idle_free", (f"no kernel ran ({_pct(f.duty)} duty)",), 1.0
    if cls == "input_starved":
        return _starved_detail(f, t)
    if cls == "communication_jittered":
        return _jitter_detail(f, job, t)
    return _roofline_detail(cls, f, t)


def _starved_detail(f: WindowFeatures, t: Thresholds) -> tuple[str, tuple[str, ...], float]:
    lost = 1.0 - (f.duty or 0.0)
    base = f"no kernel ran in {_pct(lost)} of the time while the process stayed alive"
    io = (f.iowait is not None and f.iowait >= t.io_wait) or (f.io_pressure is not None and f.io_pressure >= t.io_pressure)
    if io:
        return "io", (base, f"host iowait {_pct(f.iowait)}, I/O pressure {_pct(f.io_pressure)}: reading the data is the bottleneck"), 1.0
    if f.loader_cpu_cores is not None and f.main_cpu_cores is not None:
        return _starved_by_tree(f, t, base)
    cpu = f.process_cpu_cores  # no per-worker split (traces, virtual fleet): judge the whole tree
    if cpu is not None and cpu >= t.dataloader_cores:
        return "dataloader", (base, f"the job burns {cpu:.1f} CPU cores: loader workers cannot keep up (more workers or cheaper transforms)"), 1.0
    if cpu is not None and t.launch_cores <= cpu < t.dataloader_cores:
        return "host_launch", (base, f"the job uses {cpu:.1f} cores, about one busy thread: the main loop cannot launch work fast enough"), 1.0
    return "unattributed", (base, "host signals do not say why (no CPU or I/O evidence)"), t.confidence_inferred


def _starved_by_tree(f: WindowFeatures, t: Thresholds, base: str) -> tuple[str, tuple[str, ...], float]:
    """Sub-reason from the process tree: saturated workers, workers short of cores, or a busy main thread."""
    loader, main, workers = f.loader_cpu_cores or 0.0, f.main_cpu_cores or 0.0, f.loader_workers or 0
    capacity = min(workers, f.cpu_limit_cores) if f.cpu_limit_cores else float(workers)
    if workers and capacity > 0 and loader >= t.loader_saturation * capacity:
        return "dataloader", (base, f"{workers} loader workers use {loader:.1f} of the {capacity:.1f} cores they can have: "
                                    "preprocessing cannot keep up (more workers or cores, or cheaper transforms)"), 1.0
    if workers and f.cpu_pressure is not None and f.cpu_pressure >= t.cpu_pressure and loader >= 0.5:
        return "dataloader", (base, f"loader workers use {loader:.1f} cores while tasks wait for a CPU "
                                    f"{_pct(f.cpu_pressure)} of the time (CPU pressure): the node has too few free cores"), 1.0
    if main >= t.launch_cores:
        idle = f"its {workers} workers use {loader:.1f} cores" if workers else "it has no loader workers"
        return "host_launch", (base, f"the main process uses {main:.1f} cores, about one busy thread, while {idle}: "
                                     "the Python loop cannot launch work (or load data in-process) fast enough"), 1.0
    return "unattributed", (base, f"main process {main:.1f} cores, {workers} workers {loader:.1f} cores, no I/O "
                                  "pressure: host signals do not say why"), t.confidence_inferred


def _jitter_detail(f: WindowFeatures, job: JobContext, t: Thresholds) -> tuple[str, tuple[str, ...], float]:
    reasons = []
    quality = 1.0
    if f.comm_wait_fraction is not None:
        reasons.append(f"kernels resident but idle (waiting on peers) in {_pct(f.comm_wait_fraction)} of samples")
    fabric = fabric_waits(f, t)
    if fabric:
        memory = (f", memory activity with it (r {f.memory_fabric_r:+.2f})"
                  if f.memory_fabric_r is not None and f.memory_fabric_r <= -t.fabric_anticorrelation else "")
        reasons.append(f"power falls as fabric and NIC bytes rise (r {f.power_fabric_r:+.2f}){memory}: waiting on the "
                       f"fabric in {_pct(fabric)} of samples")
    if f.step_cv is not None and f.steps >= t.min_steps:
        how = " (no step ids: a change of the reported time counts as a step)" if f.steps_inferred else ""
        reasons.append(f"step time varies by {_pct(f.step_cv)} (CV over {f.steps} steps){how}")
    elif f.tensor_busy is None and f.power_cv is not None:
        reasons.append(f"power varies by {_pct(f.power_cv)} between 5 s blocks (no step reports)")
        quality = t.confidence_inferred
    elif f.activity_cv is not None:
        reasons.append(f"compute activity varies by {_pct(f.activity_cv)} between 5 s blocks (no step reports)")
        quality = t.confidence_inferred
    if job.step_spread is not None and job.step_spread >= t.rank_skew:
        reasons.append(f"the ranks of job {job.job} report step times {_pct(job.step_spread)} apart")
    if job.lockstep > 1 and job.ranks_seen <= 1:
        reasons.append(f"{job.lockstep} GPUs of this node rise and fall together: the ranks of one synchronous job")
    if job.is_busiest and job.peer_skew is not None and job.peer_skew >= t.rank_skew:
        severity = "high" if job.peer_skew >= t.rank_skew_high else "moderate"
        reasons.insert(0, f"this rank is the straggler: peers of job {job.job} compute {_pct(job.peer_skew)} less "
                          f"and wait for it ({severity})")
        return "straggler", tuple(reasons), quality
    if job.rank_skew is not None and job.rank_skew >= t.rank_skew:
        reasons.insert(0, f"this rank computes {_pct(job.rank_skew)} less than the busiest rank of job {job.job}: "
                          "it waits for a straggler")
        return "straggler_victim", tuple(reasons), quality
    if f.net_link_downs:
        reasons.insert(0, f"the GPU's NIC port went down {f.net_link_downs} time(s) in the window: every flap "
                          "stalls the job's collectives (check the cable, transceiver and switch port)")
        return "link_flap", tuple(reasons), quality
    congested = f.net_congestion_per_s is not None and f.net_congestion_per_s >= t.net_congestion_per_s
    lossy = f.net_retransmits_per_s is not None and f.net_retransmits_per_s >= t.net_retransmits_per_s
    if congested or lossy:
        what = []
        if congested:
            what.append(f"{f.net_congestion_per_s:.0f} congestion marks/s")
        if lossy:
            what.append(f"{f.net_retransmits_per_s:.0f} retransmits/s")
        reasons.insert(0, f"the GPU's NIC port sees {' and '.join(what)}: the fabric, not this GPU, delays the collectives")
        return "network_congestion", tuple(reasons), quality
    if f.link_utilization is not None and f.link_utilization >= t.comm_bandwidth_link:
        reasons.append(f"fabric {_pct(f.link_utilization)} busy: communication is bandwidth-bound")
        return "bandwidth_bound", tuple(reasons), quality
    return "unstable_steps", tuple(reasons), quality


def _roofline_detail(cls: str, f: WindowFeatures, t: Thresholds) -> tuple[str, tuple[str, ...], float]:
    u_c, u_m = f.u_compute, f.u_memory
    if u_c is None:
        return _proxy_detail(cls, f, t)
    pipes = f"tensor pipes {_pct(f.tensor_busy)} busy" if f.tensor_busy is not None else f"FP pipes {_pct(f.fp_busy)} busy"
    dram = f"DRAM {_pct(f.dram_busy)} busy" if f.dram_busy is not None else "DRAM activity unknown"
    if cls == "latency_bound":
        return "small_kernels", (f"a kernel is resident {_pct(f.duty)} of the time, yet {pipes} and {dram}: "
                                 "neither roof is near (small kernels, launch gaps, under-filled grids)",), 1.0
    mine, other = (u_c, u_m) if cls == "compute_bound" else (u_m, u_c)
    if other is not None and abs(mine - other) < t.roof_margin:
        detail = "balanced"
    else:
        detail = "at_roof" if mine >= t.at_roof else "leaning"
    lead = (f"{pipes} while kernels run, {_pct(u_c)} of the compute roof; {dram}" if cls == "compute_bound"
            else f"{dram} while kernels run, {_pct(u_m)} of the memory roof; {pipes}")
    return detail, (lead,), 1.0


def _proxy_detail(cls: str, f: WindowFeatures, t: Thresholds) -> tuple[str, tuple[str, ...], float]:
    """Detail and reasons for a roofline verdict that rests on reported MFU, power and memory busy time."""
    lead = "no tensor or FP-pipe counter on this GPU"
    power = (f"power at {_pct(f.power_ratio)} of its {'limit' if f.power_basis == 'limit' else 'TDP (no limit read)'}"
             if f.power_ratio is not None else "power unknown")
    if f.dram_busy is not None:
        memory = f"DRAM {_pct(f.dram_busy)} busy while kernels run"
    elif f.mem_busy is not None:
        memory = f"memory busy {_pct(f.mem_busy)} of the time kernels run (utilization.memory: busy time, not bandwidth)"
    else:
        memory = "no memory counter"
    reported = reported_compute(f, t)
    quality = t.confidence_reported_mfu if reported is not None else t.confidence_no_compute_counter
    mfu = f"the job reports MFU {_pct(f.mfu_reported)}" if reported is not None else None
    if cls == "memory_bound":
        level = f.u_memory if f.u_memory is not None else (f.mem_busy or 0.0)
        detail = "at_roof" if level >= t.at_roof else "leaning"
        return detail, tuple(x for x in (f"{lead}; {memory}", power, mfu) if x), quality
    if cls == "compute_bound":
        basis = (f"{mfu}: heavy math" if mfu else f"{power} suggests heavy math")
        return ("power_proxy" if mfu is None else "leaning"), (f"{lead}; {basis}", memory), quality
    basis = f"{mfu}: little math" if mfu else f"{power} suggests small kernels"
    return "power_proxy" if mfu is None else "small_kernels", (f"{lead}; {basis}", memory), quality
