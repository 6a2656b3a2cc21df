"""Window features: what a GPU did over the last few seconds, reduced to a handful of numbers.

Pure functions over :class:`~agent.model.GpuSample` sequences. Missing counters stay ``None``
all the way through: a GPU without a tensor counter has ``tensor_busy=None``, never 0, so the
rules can lower their confidence instead of reading "tensor pipes idle".

Busy-normalised values (``tensor_busy``, ``dram_busy``) divide by the duty cycle: they say what
bounds the GPU *while a kernel is resident*, which keeps duty-cycle loss (starvation) apart from
the roofline position (classification.md §7.2).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from typing import Sequence

from agent.classifier.fabric import FabricEvidence, fabric_evidence
from agent.classifier.thresholds import Thresholds
from agent.model import THROTTLE_REASON_MASK, Attribution, GpuSample, GpuSpec, WindowFeatures, specs

_MIN_DUTY = 0.05
"""Floor of the duty cycle when normalising by it (classification.md §7.2: max(d, 0.05))."""
BLOCK_S = 5.0
"""Block length for the activity-variation fallback when the job reports no steps."""


def _mean(values: Sequence[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


def _values(samples: Sequence[GpuSample], name: str) -> list[float]:
    return [v for s in samples if (v := getattr(s, name)) is not None]


def _ref_clock(sample: GpuSample, spec: GpuSpec | None) -> float | None:
    """The clock the peaks are quoted at; without a spec, the GPU's own maximum clock."""
    return spec.ref_clock_mhz if spec and spec.ref_clock_mhz else sample.sm_clock_max_mhz


def clock_factor(sample: GpuSample, spec: GpuSpec | None) -> float:
    """The sample's share of the peak clock, as :func:`agent.model.specs.clock_factor` credits it."""
    return specs.clock_factor(sample.sm_clock_mhz, _ref_clock(sample, spec))


def _clock_ratio(sample: GpuSample, spec: GpuSpec | None) -> float | None:
    """Uncapped clock / reference clock, for the throttle rule (None when unknown)."""
    ref = _ref_clock(sample, spec)
    if sample.sm_clock_mhz is None or not ref:
        return None
    return sample.sm_clock_mhz / ref


def _link_util(sample: GpuSample, spec: GpuSpec | None) -> float | None:
    peak = spec.link_bandwidth_bytes_per_s if spec else None
    rates = [r for r in (sample.link_tx_bytes_per_s, sample.link_rx_bytes_per_s) if r is not None]
    if not peak or not rates:
        return None
    return min(1.0, max(rates) / peak)


def power_ratios(samples: Sequence[GpuSample], spec: GpuSpec | None) -> tuple[list[float], str | None]:
    """Power as a share of what the GPU may draw, and what that share is of.

    The enforced limit where the sample carries it (a power-capped GPU at its cap is as loaded
    as an uncapped one at TDP); else the catalogue TDP, so a trace or a backend without the
    limit still has its power evidence instead of none (issue: compute-heavy A100 traces without
    a limit lost their only compute signal and fell to memory_bound). A MIG slice's power is the
    whole GPU's, so it is not compared with a slice's share of the TDP.
    """
    limited = [s.power_w / s.power_limit_w for s in samples if s.power_w is not None and s.power_limit_w]
    if limited:
        return limited, "limit"
    tdp = spec.tdp_w if spec is not None and spec.tdp_w and not any("/" in s.gpu for s in samples[:1]) else None
    if tdp:
        by_tdp = [min(1.5, s.power_w / tdp) for s in samples if s.power_w is not None]
        if by_tdp:
            return by_tdp, "tdp"
    return [], None


def is_comm_wait(sample: GpuSample, spec: GpuSpec | None, t: Thresholds) -> bool | None:
    """A kernel resident but doing nothing: NCCL spinning while peers catch up (§7.2)."""
    gr, sm, tc = sample.gr_active, sample.sm_active, sample.tensor_active
    if gr is None or sm is None or tc is None:
        return None
    link = _link_util(sample, spec)
    return (gr >= t.comm_wait_gr and sm <= t.comm_wait_sm and tc <= t.comm_wait_tensor
            and (sample.dram_active is None or sample.dram_active <= t.comm_wait_dram)
            and (link is None or link <= t.comm_wait_link))


def step_times(samples: Sequence[GpuSample]) -> tuple[list[float], bool]:
    """Reported step times, one per step, oldest first, and whether steps had to be inferred.

    Steps are told apart by their ids; a job whose reports carry a step time but no step id (some
    frameworks report only the time of the last step) still gives its sequence: a change of the
    reported time is a new step, so a step as long as the one before is not counted twice."""
    times: dict[int, float] = {}
    unnumbered: list[float] = []
    for s in samples:
        w = s.workload
        if w is None or not w.step_time_s:
            continue
        if w.step is not None:
            times[w.step] = w.step_time_s
        elif not unnumbered or unnumbered[-1] != w.step_time_s:
            unnumbered.append(w.step_time_s)
    if times or not unnumbered:
        return [times[k] for k in sorted(times)], False
    return unnumbered, True


def _pstdev(values: Sequence[float]) -> float:
    """Population standard deviation in floats: ``statistics.pstdev`` computes it in exact
    fractions, which made it the classifier's largest cost, for precision a CV does not need."""
    mean = math.fsum(values) / len(values)
    return math.sqrt(math.fsum((v - mean) ** 2 for v in values) / len(values))


def step_statistics(times: Sequence[float], last: int, recent: int) -> tuple[float | None, int]:
    """CV of the step times the job reported (:func:`step_times`) over its ``last`` distinct steps.

    If the median of the ``recent`` newest steps differs from the median of the older ones by
    more than a third, the job changed phase (a level shift, not jitter): only the newest
    steps count, so a phase change is not mistaken for step-time variation.
    """
    values = list(times[-last:])
    if len(values) > recent:
        old, new = statistics.median(values[:-recent]), statistics.median(values[-recent:])
        if old > 0 and abs(new - old) / old > 1.0 / 3.0:
            values = values[-recent:]
    if len(values) < 2:
        return None, len(values)
    mean = statistics.fmean(values)
    return (_pstdev(values) / mean if mean > 0 else None), len(values)


def level_shift(times: Sequence[float], recent: int, least: int) -> float | None:
    """How far the median of the ``recent`` newest steps moved from the median of the older ones."""
    older, newer = times[:-recent], times[-recent:]
    if len(older) < least or len(newer) < least:
        return None
    before = statistics.median(older)
    return abs(statistics.median(newer) - before) / before if before > 0 else None


def activity_variation(samples: Sequence[GpuSample]) -> float | None:
    """CV of tensor activity (else duty) over consecutive 5 s blocks: stalls make whole blocks drop.

    A fallback for jobs that report no steps; steady work (even with periodic communication
    shorter than a block) varies little between blocks.
    """
    if not samples:
        return None
    t0 = samples[0].ts
    sums: dict[int, float] = {}
    counts: dict[int, int] = {}
    # Without a tensor counter (NVML before Hopper, amdsmi) the duty cycle stands in: a stalled
    # collective shows as blocks with less kernel time, if less sharply than as idle tensor pipes.
    name = "tensor_active" if any(s.tensor_active is not None for s in samples) else "gr_active"
    for s in samples:  # runs over the whole long window per evaluation: kept to plain arithmetic
        if (v := getattr(s, name)) is not None:
            block = int((s.ts - t0) // BLOCK_S)
            sums[block] = sums.get(block, 0.0) + v
            counts[block] = counts.get(block, 0) + 1
    means = [total / counts[b] for b, total in sums.items() if counts[b] >= BLOCK_S / 2]
    if len(means) < 4:
        return None
    mean = statistics.fmean(means)
    return _pstdev(means) / mean if mean > 0.02 else None


def _pipe_means(window: Sequence[GpuSample], factors: Sequence[float]) -> dict[str, float]:
    """Clock-scaled mean activity per non-tensor pipe; ``factors`` are the window's clock factors."""
    means = {}
    for pipe in ("fp64", "fp32", "fp16"):
        name = f"{pipe}_active"
        scaled = [v * f for s, f in zip(window, factors) if (v := getattr(s, name)) is not None]
        if scaled:
            means[pipe] = math.fsum(scaled) / len(scaled)
    return means


def _duty_check(window: Sequence[GpuSample]) -> tuple[float, float] | None:
    """Mean profiling duty and utilisation-counter duty over the samples that carry both (backends set
    ``util_gpu`` only beside a profiling duty, so the two are distinct readings)."""
    pairs = [(s.gr_active, s.util_gpu) for s in window if s.gr_active is not None and s.util_gpu is not None]
    if not pairs:
        return None
    return sum(p for p, _ in pairs) / len(pairs), sum(u for _, u in pairs) / len(pairs)


def allocation(attribution: Attribution | None) -> str | None:
    """Who the scheduler gave the GPU to, for a verdict's words: its pod, else its job."""
    if attribution is None:
        return None
    if attribution.pod:
        return f"pod {attribution.namespace}/{attribution.pod}" if attribution.namespace else f"pod {attribution.pod}"
    return f"job {attribution.job_id}" if attribution.job_id else None


def window_features(window: Sequence[GpuSample], long_window: Sequence[GpuSample], spec: GpuSpec | None,
                    t: Thresholds) -> WindowFeatures:
    """Reduce one GPU's samples to features, its fabric evidence included. ``window`` must be a suffix of
    ``long_window``. For callers outside an evaluation (selftest, tools); the classifier's evaluation
    gathers the fabric evidence itself (agent.classifier.evidence) and calls :func:`features_with`."""
    return features_with(window, long_window, spec, t, fabric_evidence(window, long_window, spec, t))


def features_with(window: Sequence[GpuSample], long_window: Sequence[GpuSample], spec: GpuSpec | None,
                  t: Thresholds, fabric: FabricEvidence) -> WindowFeatures:
    """Reduce one GPU's samples to features, given the window's communication evidence."""
    n = len(window)
    valid = [s for s in window if s.gr_active is not None]
    duty = _mean([s.gr_active for s in valid])  # type: ignore[misc]
    idle_fraction = _mean([1.0 if s.gr_active < 0.10 else 0.0 for s in valid]) if valid else None  # type: ignore[operator]
    norm = max(duty, _MIN_DUTY) if duty is not None else None

    def busy(name: str) -> float | None:
        mean = _mean(_values(window, name))
        return None if mean is None or norm is None else min(1.0, mean / norm)

    tensor_busy, dram_busy, sm_busy = busy("tensor_active"), busy("dram_active"), busy("sm_active")
    mem_busy = busy("mem_busy")
    pipes = [v for v in (busy("fp64_active"), busy("fp32_active"), busy("fp16_active")) if v is not None]
    fp_busy = max(pipes) if pipes else None
    parts = []
    if tensor_busy is not None:
        parts.append(tensor_busy / t.tensor_saturation)
    if fp_busy is not None:
        parts.append(fp_busy / t.fp_pipe_saturation)
    u_compute = max(parts) if parts else None
    u_memory = dram_busy / t.dram_saturation if dram_busy is not None else None

    waits = [w for s in window if (w := is_comm_wait(s, spec, t)) is not None]
    links = [u for s in window if (u := _link_util(s, spec)) is not None]
    link_active = any((s.link_tx_bytes_per_s or 0) + (s.link_rx_bytes_per_s or 0)
                      + (s.net_tx_bytes_per_s or 0) + (s.net_rx_bytes_per_s or 0) > 1e8 for s in window)

    busy_samples = [s for s in valid if s.gr_active >= 0.5]  # type: ignore[operator]
    clocks = [c for s in busy_samples if (c := _clock_ratio(s, spec)) is not None]
    throttled = [s for s in busy_samples if s.clock_event_reasons is not None and s.clock_event_reasons & THROTTLE_REASON_MASK]
    bits = 0
    for s in window:
        bits |= (s.clock_event_reasons or 0) & THROTTLE_REASON_MASK
    powers, power_basis = power_ratios(busy_samples or valid or window, spec)

    latest = window[-1] if window else None
    procs = latest.processes if latest is not None else None
    cpu = [p.cpu_cores for p in procs if p.cpu_cores is not None] if procs else []
    busiest = max((p for p in procs or () if p.cpu_cores is not None), key=lambda p: p.cpu_cores or 0.0, default=None)
    split = busiest is not None and busiest.cpu_main_cores is not None and busiest.cpu_workers_cores is not None
    held = sum(p.used_memory_bytes or 0 for p in procs) if procs is not None else None
    if held == 0 and latest is not None and procs and latest.mem_used_bytes is not None:
        held = latest.mem_used_bytes
    hosts = [s.host for s in window if s.host is not None]
    factors = [clock_factor(s, spec) for s in window]
    tensor_scaled = [s.tensor_active * f for s, f in zip(window, factors) if s.tensor_active is not None]
    reports = [s.workload for s in window if s.workload is not None]
    times, steps_inferred = step_times(long_window)
    step_cv, steps = step_statistics(times, t.steps_for_cv, t.min_steps)
    step_cv_long, steps_long = step_statistics(times, t.steps_for_cv_exit, t.min_steps)
    dtypes = [s.dtype for s in window if s.dtype is not None]

    return WindowFeatures(
        samples=n,
        valid_fraction=len(valid) / n if n else 0.0,
        duty=duty,
        idle_fraction=idle_fraction,
        tensor_busy=tensor_busy,
        fp_busy=fp_busy,
        dram_busy=dram_busy,
        sm_busy=sm_busy,
        u_compute=u_compute,
        u_memory=u_memory,
        comm_wait_fraction=_mean([1.0 if w else 0.0 for w in waits]) if waits else None,
        link_utilization=_mean(links),
        link_active=link_active,
        clock_ratio=_mean(clocks),
        throttle_fraction=len(throttled) / len(busy_samples) if busy_samples else 0.0,
        throttle_bits=bits,
        power_ratio=_mean(powers),
        process_alive=(len(procs) > 0) if procs is not None else None,
        memory_held_bytes=held,
        allocated_to=allocation(latest.attribution if latest is not None else None),
        throttle_known=any(s.clock_event_reasons is not None for s in window),
        duty_check=_duty_check(window),
        process_cpu_cores=max(cpu) if cpu else None,
        main_cpu_cores=busiest.cpu_main_cores if split and busiest else None,
        loader_cpu_cores=busiest.cpu_workers_cores if split and busiest else None,
        loader_workers=busiest.workers if split and busiest else None,
        cpu_limit_cores=busiest.cpu_limit_cores if busiest else None,
        iowait=_mean([h.cpu_iowait_ratio for h in hosts if h.cpu_iowait_ratio is not None]),
        io_pressure=_mean([h.io_pressure_ratio for h in hosts if h.io_pressure_ratio is not None]),
        cpu_pressure=_mean([h.cpu_pressure_ratio for h in hosts if h.cpu_pressure_ratio is not None]),
        net_congestion_per_s=_mean(_values(window, "net_congestion_per_s")),
        net_retransmits_per_s=_mean(_values(window, "net_retransmits_per_s")),
        net_link_downs=int(sum(downs)) if (downs := _values(window, "net_link_downs")) else None,
        tensor_mean=_mean(tensor_scaled),
        dram_mean=_mean(_values(window, "dram_active")),
        pipe_means=_pipe_means(window, factors),
        step_cv=step_cv,
        steps=steps,
        step_cv_long=step_cv_long,
        steps_long=steps_long,
        activity_cv=activity_variation(long_window),
        workload=reports[-1] if reports else None,
        dtype=Counter(dtypes).most_common(1)[0][0] if dtypes else None,
        mig=bool(latest is not None and "/" in latest.gpu),
        mem_busy=mem_busy,
        power_basis=power_basis,
        fabric_wait_fraction=fabric.wait_fraction,
        power_fabric_r=fabric.power_r,
        memory_fabric_r=fabric.memory_r,
        working_power_ratio=fabric.working_power_ratio,
        power_cv=fabric.power_cv,
        spin_wait_fraction=fabric.spin_fraction,
        memory_gap=fabric.memory_gap,
        steps_inferred=steps_inferred,
        step_time_mean=_mean(times[-t.steps_for_cv:]),
        step_level_shift=level_shift(times[-t.steps_for_cv_exit:], t.steps_for_cv, t.min_steps),
    )
