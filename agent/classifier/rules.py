"""Step 2 of an evaluation: the class rules score one window's evidence, every class at once.

Each class has a score in 0..1: a logistic step ``σ((x - θ)/w)`` around its entry threshold θ
on the figure that governs it, and the minimum over components for classes with several
conditions (classification.md §7.4). The incumbent class is scored against its *exit*
thresholds, which is the hysteresis that keeps a steady workload from flapping.

The scores are :class:`~agent.classifier.scoring.Rule` trees, not bare numbers: which class wins is
the decision's business (agent.classifier.decision, by a documented precedence), and what is said
about it is the explanation's (agent.classifier.explain), which reads the figures and thresholds
these rules compared. A GPU without a compute counter is scored on the roofline by the stand-ins of
agent.classifier.proxies.
"""

from __future__ import annotations

from agent.classifier.evidence import Evidence
from agent.classifier.proxies import proxy_rules
from agent.classifier.scoring import Node, Rule, Term, above, all_of, any_of, below, fact, negated
from agent.classifier.thresholds import Thresholds
from agent.model import WindowFeatures

SCORED_CLASSES: tuple[str, ...] = (
    "idle", "compute_bound", "memory_bound", "input_starved", "communication_jittered", "latency_bound",
)
ROOFLINE_TIER: tuple[str, ...] = ("compute_bound", "memory_bound", "latency_bound")
PRIORITY_TIER: tuple[str, ...] = ("idle", "input_starved", "communication_jittered")


def score(e: Evidence, t: Thresholds, incumbent: str | None = None) -> dict[str, Rule]:
    """The rule of every class, scored on this window (a rule's score is None where the counters to judge
    it are missing); ``incumbent`` is the published class, judged against its exit thresholds."""
    rules = {"idle": idle_rule(e, t), "input_starved": starved_rule(e, t, incumbent),
             "communication_jittered": jitter_rule(e, t, incumbent), **roofline_rules(e, t, incumbent)}
    return {c: rules[c] for c in SCORED_CLASSES}


def idle_rule(e: Evidence, t: Thresholds) -> Rule:
    """No kernel ran in the window; or a burst ran and the window ends in a quiet stretch that nothing on the
    host asks to end (a notebook between cells, a server whose queue drained)."""
    f, w = e.features, t.score_width
    no_kernel = all_of("no_kernel", below("duty", f.duty, t.idle_duty, w, "idle_duty"),
                       below("dram_mean", f.dram_mean, t.idle_dram, w, "idle_dram"),
                       below("link_utilization", f.link_utilization, t.idle_link, w, "idle_link"))
    if not e.quiet.after_burst or f.duty is None:
        return Rule("idle", "any", (no_kernel,), no_kernel.score)
    q = e.quiet
    after_burst = all_of(
        "quiet_after_burst", above("quiet_tail_s", q.seconds, t.quiet_tail_s, _SECONDS_WIDTH, "quiet_tail_s"),
        *_host_idle(e, t), fact("no_periodic_stall", not e.stalls.periodic))
    return any_of("idle", no_kernel, after_burst)


_SECONDS_WIDTH = 0.5
"""Softness of a score around a threshold in seconds (half a 1 s read)."""


def _host_idle(e: Evidence, t: Thresholds) -> tuple[Term, ...]:
    """Nothing on the host asks the GPU for work during the quiet tail: the job's process idle, no iowait or
    I/O pressure, nothing crossing PCIe (each one unknown where the host signal is not read)."""
    q, w = e.quiet, t.score_width
    return (below("tail_cpu_cores", q.cpu_cores, t.launch_cores, w, "launch_cores"),
            below("tail_iowait", q.iowait, t.io_wait, w, "io_wait"),
            below("tail_io_pressure", q.io_pressure, t.io_pressure, w, "io_pressure"),
            below("tail_pcie_bytes", q.pcie_bytes, t.pcie_active_bytes, 0.1 * t.pcie_active_bytes or 1.0,
                  "pcie_active_bytes"))


def _feeding(e: Evidence, t: Thresholds) -> Rule:
    """Evidence of a pipeline trying to feed the GPU: kernels keep arriving (no quiet stretch ends the window),
    the host works for it during the quiet (CPU, iowait, I/O pressure, PCIe), or the gaps recur on a
    schedule. Starvation needs one of them; a flat 0% tail with none of them is idle."""
    q, w = e.quiet, t.score_width
    return any_of("feeding", below("quiet_tail_s", q.seconds, t.quiet_tail_s, _SECONDS_WIDTH, "quiet_tail_s"),
                  *(negated(term) for term in _host_idle(e, t)),
                  fact("periodic_stall", True) if e.stalls.periodic else None)


def starved_rule(e: Evidence, t: Thresholds, incumbent: str | None) -> Rule:
    """Duty lost while a process lives, the lost time not resident (comm waits) nor a straggler's victim's."""
    f, w = e.features, t.score_width
    held = incumbent == "input_starved"
    share, setting = (t.starved_idle_share_exit, "starved_idle_share_exit") if held else \
        (t.starved_idle_share, "starved_idle_share")
    roofs = [u for u in (f.u_compute, f.u_memory) if u is not None]
    if roofs and max(roofs) >= t.at_roof:
        # Busy at a roof: small gaps between kernels (a serving loop's scheduling, a decode step's
        # host work) cost less than the roof does, so starvation needs a larger idle share.
        share += t.starved_idle_share_at_roof - t.starved_idle_share
        setting = ("starved_idle_share_exit + starved_idle_share_at_roof - starved_idle_share" if held
                   else "starved_idle_share_at_roof")
    # A recognised stall (a checkpoint) is the job pausing, not the input failing it: the idle share is taken
    # over the reads outside it.
    duty = e.working_duty
    return all_of("input_starved", above("idle_share", None if duty is None else 1.0 - duty, share, w, setting),
                  fact("process_alive", f.process_alive),
                  below("comm_wait_fraction", f.comm_wait_fraction, t.starved_max_comm_wait, w, "starved_max_comm_wait"),
                  below("rank_skew", e.job.rank_skew, t.rank_skew, t.score_width_cv, "rank_skew"),
                  _feeding(e, t) if f.duty is not None else None)


def jitter_rule(e: Evidence, t: Thresholds, incumbent: str | None) -> Rule:
    """Resident time wasted waiting on peers, for a rank of a multi-GPU job: the best of five rules
    (classification.md §2.4)."""
    f, job, w, wcv = e.features, e.job, t.score_width, t.score_width_cv
    if not e.multi_gpu:
        return all_of("single_gpu", fact("multi_gpu", False)) if f.duty is not None else Rule("single_gpu", "all", (), None)
    steps = _step_variation(e, t, incumbent)
    variation = any_of("variation", steps if steps is None else above(steps.quantity, steps.value, t.step_cv, wcv, "step_cv"),
                       above("rank_skew", job.rank_skew, t.rank_skew, wcv, "rank_skew"),
                       above("step_spread", job.step_spread, t.rank_skew, wcv, "rank_skew"),
                       _unreported_variation(f, t) if steps is None else _resident_variation(f, t))
    network = _network_trouble(f, t)
    return any_of(
        "communication_jittered",
        all_of("waits_with_variation", above("waiting", e.waiting, t.comm_wait_fraction, w, "comm_wait_fraction"), variation),
        all_of("step_cv_alone", steps) if steps is not None else None,
        all_of("straggler", above("peer_skew", job.peer_skew, t.rank_skew, wcv, "rank_skew"), fact("is_busiest", job.is_busiest)),
        all_of("straggler_victim", above("rank_skew", job.rank_skew, t.rank_skew, wcv, "rank_skew")),
        all_of("network_with_variation", network, variation)
        if network.score is not None and variation.score is not None else None,
    )


def _step_variation(e: Evidence, t: Thresholds, incumbent: str | None) -> Term | None:
    """The step-time CV the jitter rules read, as a term against ``step_cv_alone`` (None without enough
    reported steps): the recent steps' CV, or while jitter is published the longer history's when that is
    larger (exit hysteresis)."""
    f = e.features
    cv: float | None = f.step_cv if f.steps >= t.min_steps else None
    quantity = "step_cv"
    no_waits = e.waiting is not None and e.waiting < t.comm_wait_fraction
    if (incumbent == "communication_jittered" and f.step_cv_long is not None and f.steps_long >= t.min_steps
            and not (cv is not None and cv < t.step_cv / 2.0
                     and ((f.step_level_shift or 0.0) >= t.step_cv / 2.0 or no_waits))):
        # Exit hysteresis: jitter stalls come at random, so a quiet spell keeps the verdict, unless
        # the job moved on: its recent steps clearly steady (half the jitter level) at another
        # typical length than before (random stalls leave the median step where it was), or with
        # no waiting on peers left in the window (a pause between stalls still waits each step).
        if cv is None or f.step_cv_long > cv:
            cv, quantity = f.step_cv_long, "step_cv_long"
    return None if cv is None else above(quantity, cv, t.step_cv_alone, t.score_width_cv, "step_cv_alone")


def _unreported_variation(f: WindowFeatures, t: Thresholds) -> Rule:
    """How unevenly the job runs when it reports no step times: tensor activity between 5 s blocks
    where there is a tensor counter, and power between blocks where the GPU is seen waiting on the
    fabric (a spinning collective keeps the duty cycle, and so gfx activity and utilization.gpu, flat)."""
    waits_seen = bool(f.fabric_wait_fraction) or (f.spin_wait_fraction or 0.0) >= t.comm_wait_fraction
    by_power = above("power_cv", f.power_cv, t.power_cv, t.score_width_cv, "power_cv") if waits_seen else None
    by_tensor = (above("activity_cv", f.activity_cv, t.activity_cv, t.score_width_cv, "activity_cv")
                 if f.tensor_busy is not None or by_power is None or by_power.score is None else None)
    return any_of("unreported_variation", by_power, by_tensor)


def _resident_variation(f: WindowFeatures, t: Thresholds) -> Term | None:
    """With step reports, how unevenly the waits come where they are resident waits (a kernel spinning while
    power, memory and the fabric are quiet): power between 5 s blocks. A step of many MoE layers averages its
    blocks' waits, so its CV can stay under ``step_cv`` while the ranks wait seconds at a time."""
    if (f.spin_wait_fraction or 0.0) < t.comm_wait_fraction:
        return None
    return above("power_cv", f.power_cv, t.power_cv, t.score_width_cv, "power_cv")


def _network_trouble(f: WindowFeatures, t: Thresholds) -> Rule:
    """How strongly the GPU's NIC port shows trouble: a link flap, congestion marks or retransmits."""
    downs = None if f.net_link_downs is None else Term("net_link_downs", float(f.net_link_downs), 1.0, "above",
                                                       1.0 if f.net_link_downs > 0 else 0.0)
    return any_of("network",
                  above("net_congestion_per_s", f.net_congestion_per_s, t.net_congestion_per_s,
                        max(0.1 * t.net_congestion_per_s, 1e-9), "net_congestion_per_s"),
                  above("net_retransmits_per_s", f.net_retransmits_per_s, t.net_retransmits_per_s,
                        max(0.1 * t.net_retransmits_per_s, 1e-9), "net_retransmits_per_s"),
                  downs)


def roofline_rules(e: Evidence, t: Thresholds, incumbent: str | None) -> dict[str, Rule]:
    """compute-, memory- and latency-bound: busy, and which roof the busy-normalised utilisation nears."""
    f, w = e.features, t.score_width
    busy = _busy(e, t)
    u_c, u_m = f.u_compute, f.u_memory
    if u_c is None:  # no tensor or pipe counter: reported MFU, power and memory evidence stand in
        stand_ins = proxy_rules(e, t, incumbent)
        return {c: all_of(c, busy, stand_ins[c]) if stand_ins[c] is not None else Rule(c, "all", (), None)
                for c in ROOFLINE_TIER}
    c_roof, c_setting = ((t.dominant_roof_exit, "dominant_roof_exit") if incumbent == "compute_bound"
                         else (t.dominant_roof, "dominant_roof"))
    m_roof, m_setting = ((t.dominant_memory_roof_exit, "dominant_memory_roof_exit") if incumbent == "memory_bound"
                         else (t.dominant_memory_roof, "dominant_memory_roof"))
    compute: Node = all_of("compute_counters", busy, above("u_compute", u_c, c_roof, w, c_setting),
                           above("compute_lead", None if u_m is None else u_c - u_m, t.roof_margin, w, "roof_margin"))
    # Without a DRAM counter memory-bound is unknown, not as likely as the duty cycle.
    memory = Rule("memory_bound", "all", (), None) if u_m is None else \
        all_of("memory_bound", busy, above("u_memory", u_m, m_roof, w, m_setting),
               above("memory_lead", u_m - u_c, t.roof_margin, w, "roof_margin"))
    latency: Node = all_of("latency_counters", busy, below("u_compute", u_c, t.dominant_roof, w, "dominant_roof"),
                           below("u_memory", u_m, t.dominant_memory_roof, w, "dominant_memory_roof"))
    if e.communicating and f.power_ratio is not None:
        # Collectives interleaved with the compute dilute a 1 Hz tensor reading without making the
        # kernels small: a rank drawing heavy power with tensor pipes past the exit level computes.
        drawn = above("power_between_waits", e.power_between_waits, t.power_proxy_compute, w, "power_proxy_compute")
        compute = any_of("compute_bound", compute, all_of(
            "communicating_compute", busy, drawn, above("u_compute", u_c, t.dominant_roof_exit, w, "dominant_roof_exit"),
            above("compute_lead", None if u_m is None else u_c - u_m, -t.roof_margin, w, "-roof_margin")))
        latency = all_of("latency_bound", latency, negated(drawn))
    return {"compute_bound": _named("compute_bound", compute), "memory_bound": memory,
            "latency_bound": _named("latency_bound", latency)}


def _busy(e: Evidence, t: Thresholds) -> Term:
    """A kernel resident enough to read the roofline: over the reads outside a recognised stall (a checkpoint
    pauses the job; it does not change what bounds it while it runs), else over the window."""
    if e.stalls.working_duty is not None:
        return above("working_duty", e.stalls.working_duty, t.busy_duty, t.score_width, "busy_duty")
    return above("duty", e.features.duty, t.busy_duty, t.score_width, "busy_duty")


def _named(name: str, node: Node) -> Rule:
    """``node`` as the class's rule (the same score under the class's name)."""
    if isinstance(node, Rule) and node.name == name:
        return node
    return Rule(name, "all", (node,), node.score)


# ------------------------------------------------------------------------------ gates


def duty_readings_contradict(profiling: float, utilisation: float, power_ratio: float | None, t: Thresholds) -> bool:
    """The rule behind ``counters_disagree``, on any pair of duty readings (a window's means, or doctor's
    one read): the utilisation counter at least ``counters_disagree_gap`` busier than the profiling one,
    and power not siding with the profiling counter (below half its limit it would)."""
    return utilisation - profiling >= t.counters_disagree_gap and (power_ratio is None or power_ratio >= 0.5)


def counters_disagree(f: WindowFeatures, t: Thresholds) -> bool:
    """Whether the profiling counters cannot be trusted in this window.

    The profiling duty (GPM, DCGM ``PROF_GR_ENGINE_ACTIVE``) and the driver's utilisation counter
    (``utilization.gpu``, ``GPU_UTIL``) both measure the time a kernel ran. When the utilisation
    counter reads far busier and power does not say it is idle, the profiling counters are not
    counting (a paused profiler blanks them; NVIDIA/dcgm-exporter#662 shows them near zero under
    full load), and every class built on them (input-starved first) would be wrong."""
    return f.duty_check is not None and duty_readings_contradict(*f.duty_check, f.power_ratio, t)
