"""Every number the classifier decides with, in one place, each with where it comes from.

The values start from the rule set in ../shared/reference/classification.md §7 and were then
calibrated on the labelled virtual traces (``traces/labelled``). None of them is validated on
real hardware yet, which is why they are all configurable (``classifier:`` in the YAML config,
or ``roofwatch classify --config``) and why ``docs/classification.md`` prints each one with its
source: users are expected to recalibrate them on their own golden traces.

``SOURCES`` maps each field to ``(kind, source)``; a test keeps it complete, and the docs table
is generated from it, so a new threshold cannot ship without saying where it came from.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Thresholds(BaseModel):
    """Classifier thresholds and windows. Ratios are 0..1; times are seconds.

    Every number is bounded on both sides (a test walks them): ``evaluate_every_s: 1e-6`` was
    accepted and hung the agent, since a replay (the demo's head start, ``classify``) evaluates
    every step of the grid. The lower bounds on the windows keep a replay to at most one
    evaluation per half second of trace; the upper ones are far past any real value."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # -- windows and switching ------------------------------------------------------------------
    window_s: float = Field(20.0, ge=1.0, le=600.0, description="Short window the roofline and duty features average over.")
    long_window_s: float = Field(300.0, ge=1.0, le=3600.0, description="Long window for step-time statistics (jitter).")
    evaluate_every_s: float = Field(5.0, ge=0.5, le=600.0, description="How often a verdict is produced per GPU.")
    min_valid_fraction: float = Field(0.5, ge=0.0, le=1.0, description="Below this share of usable samples in the window the verdict is unknown; above it, confidence scales with the share.")
    confirm_evaluations: int = Field(2, ge=1, le=20, description="Consecutive wins a challenger needs before the published class changes.")
    phase_change_jump: float = Field(0.3, gt=0.0, le=1.0, description="Change in duty, tensor or DRAM activity between the window's halves that means a new phase.")
    min_dwell_s: float = Field(15.0, ge=0.0, le=3600.0, description="Least time a published class is held before a challenger may replace it.")

    # -- roofline ----------------------------------------------------------------------------------
    tensor_saturation: float = Field(0.93, gt=0.0, le=1.0, description="Tensor activity that counts as the compute roof (T_sat).")
    fp_pipe_saturation: float = Field(0.9, gt=0.0, le=1.0, description="Non-tensor pipe activity that counts as the compute roof.")
    dram_saturation: float = Field(0.8, gt=0.0, le=1.0, description="DRAM activity that counts as the memory roof (D_sat).")
    busy_duty: float = Field(0.8, ge=0.0, le=1.0, description="Duty cycle above which a kernel is resident enough to read the roofline.")
    dominant_roof: float = Field(0.35, ge=0.0, le=1.0, description="Normalised compute utilisation that makes the compute roof dominant (entry).")
    dominant_roof_exit: float = Field(0.28, ge=0.0, le=1.0, description="Level the incumbent compute roof must fall below to lose the class (exit).")
    dominant_memory_roof: float = Field(0.45, ge=0.0, le=1.0, description="Normalised DRAM utilisation that makes the memory roof dominant (entry).")
    dominant_memory_roof_exit: float = Field(0.38, ge=0.0, le=1.0, description="Level the incumbent memory roof must fall below to lose the class (exit).")
    roof_margin: float = Field(0.10, ge=0.0, le=1.0, description="Lead one roof needs over the other.")
    at_roof: float = Field(0.75, ge=0.0, le=1.0, description="Normalised utilisation reported as 'at the roof'.")

    # -- idle ----------------------------------------------------------------------------------------
    idle_duty: float = Field(0.05, ge=0.0, le=1.0, description="Duty cycle below which a GPU is idle.")
    idle_dram: float = Field(0.05, ge=0.0, le=1.0, description="DRAM activity below which a GPU is idle.")
    idle_link: float = Field(0.02, ge=0.0, le=1.0, description="Fabric utilisation below which a GPU is idle.")
    idle_held_bytes: float = Field(2**30, ge=0.0, le=2.0**50, description="Memory a process must hold for an idle GPU to count as held.")
    quiet_tail_s: float = Field(3.0, ge=0.0, le=3600.0, description="Seconds without a kernel (and with memory quiet) that end the window after which a GPU that nothing on the host feeds is idle, though a burst ran earlier in the window.")
    pcie_active_bytes: float = Field(1e8, ge=0.0, le=1e13, description="PCIe bytes per second, while no kernel runs, above which the host moves data to or from the GPU (feeds it, or copies a checkpoint off it).")

    # -- input starvation -----------------------------------------------------------------------------
    starved_idle_share: float = Field(0.20, ge=0.0, le=1.0, description="Share of time with no kernel (1 - duty) that means starvation (entry).")
    starved_idle_share_exit: float = Field(0.12, ge=0.0, le=1.0, description="Idle share the incumbent starvation verdict must fall below (exit).")
    starved_idle_share_at_roof: float = Field(0.30, ge=0.0, le=1.0, description="Idle share that means starvation when the GPU works at a roof while busy (the roof costs more than the gaps).")
    starved_max_comm_wait: float = Field(0.15, ge=0.0, le=1.0, description="Above this comm-wait fraction the lost time is resident (not starvation).")
    dataloader_cores: float = Field(2.0, ge=0.0, le=4096.0, description="Process CPU (cores, with children) that means loader workers are busy.")
    launch_cores: float = Field(0.9, ge=0.0, le=4096.0, description="Process CPU around one core, workers idle: the main thread is the bottleneck.")
    io_wait: float = Field(0.10, ge=0.0, le=1.0, description="Host iowait ratio that means data fetching is slow.")
    io_pressure: float = Field(0.20, ge=0.0, le=1.0, description="Host I/O pressure (PSI some) that means data fetching is slow.")
    loader_saturation: float = Field(0.9, ge=0.0, le=1.0, description="Worker CPU / the cores the workers may use (fewer of their count and the allotted cores) that means the loader is saturated.")
    cpu_pressure: float = Field(0.20, ge=0.0, le=1.0, description="Host CPU pressure (PSI some) that, with busy workers, means they wait for cores.")
    stall_count: int = Field(3, ge=2, le=1000, description="Stops (no kernel in an otherwise busy job) the long window must hold before stops that recur at a regular period count as a periodic stall.")
    stall_period_cv: float = Field(0.25, ge=0.0, le=100.0, description="CV of the intervals between the starts of stops at or below which they recur at a regular period.")
    stall_max_share: float = Field(0.3, ge=0.0, le=1.0, description="Largest share of its period a recurring stop may take and still be a stall inside a working job.")

    # -- communication jitter ---------------------------------------------------------------------------
    comm_wait_gr: float = Field(0.8, ge=0.0, le=1.0, description="A comm-wait sample has a kernel resident at least this much ...")
    comm_wait_sm: float = Field(0.3, ge=0.0, le=1.0, description="... SM activity at most this ...")
    comm_wait_tensor: float = Field(0.05, ge=0.0, le=1.0, description="... tensor activity at most this ...")
    comm_wait_dram: float = Field(0.15, ge=0.0, le=1.0, description="... DRAM activity at most this ...")
    comm_wait_link: float = Field(0.2, ge=0.0, le=1.0, description="... and fabric utilisation at most this.")
    comm_wait_fraction: float = Field(0.10, ge=0.0, le=1.0, description="Share of comm-wait samples that, with step variation or skew, means jitter.")
    step_cv: float = Field(0.10, ge=0.0, le=100.0, description="Step-time coefficient of variation that means jitter (with comm wait).")
    step_cv_alone: float = Field(0.15, ge=0.0, le=100.0, description="Step-time CV that means jitter on its own.")
    rank_skew: float = Field(0.10, ge=0.0, le=1.0, description="Compute-share deficit against the job's busiest rank that means a straggler.")
    rank_skew_high: float = Field(0.30, ge=0.0, le=1.0, description="Skew reported as high severity (NVRx score below 0.7).")
    activity_cv: float = Field(0.20, ge=0.0, le=100.0, description="Without step reports: CV of 5 s tensor-activity blocks that suggests jitter.")
    steps_for_cv: int = Field(10, ge=2, le=10_000, description="Most recent reported steps the step-time CV is taken over.")
    steps_for_cv_exit: int = Field(30, ge=2, le=10_000, description="Steps the CV is taken over while jitter is already the verdict (a quiet half minute is not the end of jitter).")
    min_steps: int = Field(5, ge=2, le=1000, description="Steps needed before a step-time CV is trusted.")
    wait_power_drop: float = Field(0.15, ge=0.0, le=1.0, description="Without SM and tensor counters: a sample waits on the fabric when power sits at least this share below the GPU's working level (90th percentile of its power in the window) while fabric bytes are above the window's median.")
    fabric_active_bytes: float = Field(1e8, ge=0.0, le=1e13, description="Fabric (NVLink/XGMI plus NIC) bytes per second below which the fabric counts as quiet.")
    fabric_anticorrelation: float = Field(0.5, ge=0.0, le=1.0, description="Power must correlate with fabric bytes at or below minus this for its drops to count as waits on the fabric.")
    spin_fabric_share: float = Field(0.25, ge=0.0, le=1.0, description="A sample in which a kernel stays resident while power and memory activity sit below their working level waits on peers when its fabric bytes are at most this share of the window's busiest (90th percentile), or unread: the collective is waiting, not transferring.")
    power_cv: float = Field(0.03, ge=0.0, le=100.0, description="Without step reports or compute counters: CV of 5 s power blocks that means the waits come unevenly.")
    comm_bandwidth_link: float = Field(0.6, ge=0.0, le=1.0, description="Fabric utilisation reported as bandwidth-bound communication.")
    net_congestion_per_s: float = Field(1000.0, ge=0.0, le=1e12, description="ECN marks + CNPs per second on the GPU's NIC port that mean fabric congestion.")
    net_retransmits_per_s: float = Field(10.0, ge=0.0, le=1e12, description="Retransmit and sequence-error events per second that mean a lossy fabric.")

    # -- throttling -------------------------------------------------------------------------------------------
    throttle_fraction: float = Field(0.5, ge=0.0, le=1.0, description="Share of busy samples with a throttle reason that sets the flag.")
    throttle_clock: float = Field(0.90, gt=0.0, le=2.0, description="SM clock / reference clock below which throttling costs performance.")
    throttle_severe_clock: float = Field(0.75, gt=0.0, le=2.0, description="Clock ratio below which throttling is severe.")
    throttle_duty: float = Field(0.5, ge=0.0, le=1.0, description="Duty cycle a GPU needs for its clock drops to matter.")
    counters_disagree_gap: float = Field(0.4, gt=0.0, le=1.0, description="Utilisation-counter duty minus profiling duty at or above which the profiling counters are not trusted.")
    power_capped_ratio: float = Field(0.95, gt=0.0, le=1.5, description="Power / enforced limit at or above which a busy GPU with a low clock and no clock-event reasons is likely power-capped.")

    # -- scores and confidence --------------------------------------------------------------------------------
    score_width: float = Field(0.05, gt=0.0, le=1.0, description="Softness of the score around a ratio threshold.")
    score_width_cv: float = Field(0.03, gt=0.0, le=1.0, description="Softness of the score around a CV threshold.")
    power_proxy_compute: float = Field(0.6, ge=0.0, le=1.0, description="Without compute counters: power / limit that suggests compute-bound.")
    power_proxy_latency: float = Field(0.45, ge=0.0, le=1.0, description="Without compute counters: power / limit below which a busy GPU looks latency-bound.")
    power_near_limit: float = Field(0.85, ge=0.0, le=1.5, description="Without compute counters: power / limit at which a busy GPU is doing heavy math even when its memory is busy too (GEMMs stream their tiles).")
    mem_busy_memory: float = Field(0.6, ge=0.0, le=1.0, description="Without a DRAM bandwidth counter: memory busy time (NVML utilization.memory) while kernels run that means memory-bound (entry).")
    mem_busy_memory_exit: float = Field(0.5, ge=0.0, le=1.0, description="Memory busy time the incumbent memory-bound verdict must fall below (exit).")
    proxy_min_score: float = Field(0.5, ge=0.0, le=1.0, description="Without compute counters: the score the evidence for a roofline class needs (duty aside); below it the verdict is unknown rather than a guess.")
    confidence_reported_mfu: float = Field(0.75, ge=0.0, le=1.0, description="Confidence factor when compute vs memory rests on the MFU the job reported instead of a counter.")
    confidence_mig: float = Field(0.8, ge=0.0, le=1.0, description="Confidence factor for MIG instances and partitions.")
    confidence_inferred: float = Field(0.6, ge=0.0, le=1.0, description="Confidence factor for unattributed starvation or jitter without step reports.")
    confidence_no_compute_counter: float = Field(0.5, ge=0.0, le=1.0, description="Confidence factor when compute-vs-latency rests on the power proxy.")

    # -- serving (agent.classifier.serving; docs/serving.md) ------------------------------------------------------
    serving_at_floor_ratio: float = Field(1.5, ge=1.0, le=100.0, description="Time per output token / the decode floor at or below which a server is at the floor (MBU of at least 1/ratio).")
    serving_far_ratio: float = Field(2.5, ge=1.0, le=100.0, description="Ratio above which a server is far above its floor: time goes somewhere other than reading weights and KV cache.")
    serving_under_batched: float = Field(0.25, ge=0.0, le=1.0, description="Running batch / the batch the KV cache could hold below which a memory-bound server is under-batched.")
    serving_prefill_share: float = Field(0.4, ge=0.0, le=1.0, description="Share of GPU time in prefill that, with decode above the floor, means prefill stalls decode.")
    serving_kv_full: float = Field(0.9, ge=0.0, le=1.0, description="KV-cache usage that counts as full.")
    serving_queue: float = Field(1.0, ge=0.0, le=1e9, description="Waiting requests that count as a queue.")

    @model_validator(mode="after")
    def _ordered(self) -> "Thresholds":
        """Exit levels must sit below entry levels, or hysteresis turns into flapping."""
        pairs = (("dominant_roof_exit", "dominant_roof"), ("dominant_memory_roof_exit", "dominant_memory_roof"), ("starved_idle_share_exit", "starved_idle_share"), ("starved_idle_share", "starved_idle_share_at_roof"),
                 ("throttle_severe_clock", "throttle_clock"), ("power_proxy_latency", "power_proxy_compute"),
                 ("power_proxy_compute", "power_near_limit"), ("mem_busy_memory_exit", "mem_busy_memory"),
                 ("serving_at_floor_ratio", "serving_far_ratio"))
        for low, high in pairs:
            if getattr(self, low) > getattr(self, high):
                raise ValueError(f"{low} ({getattr(self, low)}) must not exceed {high} ({getattr(self, high)})")
        if self.evaluate_every_s > self.window_s:
            raise ValueError(f"evaluate_every_s ({self.evaluate_every_s}) must not exceed window_s ({self.window_s})")
        if self.window_s > self.long_window_s:
            raise ValueError(f"window_s ({self.window_s}) must not exceed long_window_s ({self.long_window_s})")
        return self


DEFAULT_THRESHOLDS = Thresholds()

_NCU = "Nsight Compute SOL rule 80/60/10 [NCU-SOL], lowered for 1 Hz kernel mixes"
_CAL = "calibrated on the labelled virtual traces"

SOURCES: dict[str, tuple[str, str]] = {
    "window_s": ("engineering band", "30 s proposed (§7.2); shortened to 20 s so a phase change is reported within 30 s"),
    "long_window_s": ("engineering band", "matches the NVRx 300 s report interval [NVRx]"),
    "evaluate_every_s": ("engineering band", "10 s proposed (§7.2); 5 s halves detection latency at negligible cost"),
    "min_valid_fraction": ("engineering band", "classification.md §7.1 proposes 80%; lowered to half so a 1 s collector missing 15-30% of its reads still gets verdicts (confidence scales with coverage), and the first verdict comes within one window"),
    "confirm_evaluations": ("engineering band", "§7.4 proposes 3 x 10 s; 2 x 5 s keeps the 30 s detection promise"),
    "phase_change_jump": ("engineering band", _CAL + "; stalls and loader gaps move the halves far less"),
    "min_dwell_s": ("engineering band", "§7.4 proposes 60 s; " + _CAL + " (60 s breaks the 30 s detection promise)"),
    "tensor_saturation": ("sourced", "cuBLAS/dcgmproftester reach 0.90-0.95 tensor activity [DCGM-FO][DCGM#40]"),
    "fp_pipe_saturation": ("engineering band", "classification.md §7.2"),
    "dram_saturation": ("sourced", "NVIDIA: ~0.8 DRAM_ACTIVE is the practical maximum [DCGM-FO]"),
    "busy_duty": ("sourced", "NVIDIA: SM activity 0.8 or more is needed for effective use [DCGM-FO]"),
    "dominant_roof": ("sourced, adapted", _NCU + "; §7.3 proposes 0.45, lowered so that training at 40% MFU (TC ~0.4, §5) is compute-leaning"),
    "dominant_roof_exit": ("engineering band", "about 20% below entry (§7.3 hysteresis)"),
    "dominant_memory_roof": ("sourced, adapted", _NCU + " (§7.3: 0.45, i.e. DRAM ~0.36; KempnerPulse calls DRAM >= 0.40 memory-active)"),
    "dominant_memory_roof_exit": ("engineering band", "about 15% below entry (§7.3 hysteresis)"),
    "roof_margin": ("sourced", "Nsight Compute's 10-point margin [NCU-SOL]"),
    "at_roof": ("sourced, adapted", "NCU's 80% 'bound' level less 5 points for DCGM-vs-NCU normalisation [NCU-SOL]"),
    "idle_duty": ("sourced", "KempnerPulse idle floor of 5% [Kempner]"),
    "idle_dram": ("sourced", "KempnerPulse idle floor of 5% [Kempner]"),
    "idle_link": ("engineering band", "classification.md §7.3"),
    "idle_held_bytes": ("engineering band", "classification.md §7.3 (idle_held above 1 GiB)"),
    "quiet_tail_s": ("engineering band", "three 1 s reads (18 at NVML's 1/6 s sample period [NVML-UTIL]) without a kernel: longer than a starved loop's gaps, which come every step with its loader busy, shorter than a notebook's silence between cells (roofwatch issue 44; traces/published/families)"),
    "pcie_active_bytes": ("engineering band", "100 MB/s, the fabric_active_bytes level: a loader feeding a GPU moves hundreds of MB/s to GB/s, a checkpoint's copy to the host tens of GB/s (25 GB/s on A100 PCIe Gen4 [A100-D2H]), an idle GPU next to nothing"),
    "stall_count": ("engineering band", "three stops make two intervals to compare; at the issue's 30 s checkpoint period a 300 s long window holds about ten (roofwatch issue 44)"),
    "stall_period_cv": ("engineering band", "a checkpoint every N steps recurs within a step's length; a notebook's cells or a starved loader's long gaps come at random, far more irregularly"),
    "stall_max_share": ("engineering band", "a checkpoint of 3-5 s every 30 s costs 10-17% (roofwatch issue 44); a stop that takes more than about a third of its period is the job's own state, not a pause inside it"),
    "starved_idle_share": ("sourced, adapted", "TB plugin's 5% DataLoader rule made robust to 1 Hz noise [TB-plugin]"),
    "starved_idle_share_exit": ("engineering band", "1-2% DVFS drift plus sampling noise [Llama3]"),
    "starved_idle_share_at_roof": ("engineering band", "published MI300X vLLM decode runs 79% busy at its memory roof [InferenceX#828]: host gaps of a fifth are the serving loop, not a starved input"),
    "starved_max_comm_wait": ("engineering band", "classification.md §7.3"),
    "dataloader_cores": ("engineering band", _CAL + "; §7.3 proposes 90% of the workers' allotted cores, which a trace does not carry"),
    "launch_cores": ("engineering band", "HTA 'host wait': main thread pinned near one core [HTA]"),
    "loader_saturation": ("sourced, adapted", "§7.3: worker CPU at 90% of the allotted cores; allotted = fewer of the worker count and the process's affinity/cgroup quota"),
    "cpu_pressure": ("engineering band", "PSI some avg10 of 20%, the io_pressure level; not yet calibrated on real nodes"),
    "io_wait": ("engineering band", _CAL),
    "io_pressure": ("engineering band", _CAL),
    "comm_wait_gr": ("engineering band", "classification.md §7.2 comm_wait_frac"),
    "comm_wait_sm": ("engineering band", "classification.md §7.2; NCCL-heavy nodes show SM 0.1-0.2 [packet]"),
    "comm_wait_tensor": ("engineering band", "classification.md §7.2"),
    "comm_wait_dram": ("engineering band", "classification.md §7.2"),
    "comm_wait_link": ("engineering band", "classification.md §7.2 (20% of link peak)"),
    "comm_wait_fraction": ("engineering band", "§7.3 proposes 0.25; " + _CAL + " (stalls rarely fill whole 1 s samples)"),
    "step_cv": ("sourced", "~10% stragglers in MegaScale and What-if [MegaScale][WhatIf]"),
    "step_cv_alone": ("engineering band", "classification.md §7.3 rule (b)"),
    "rank_skew": ("sourced", "~10% slow ranks [MegaScale][WhatIf]"),
    "rank_skew_high": ("sourced", "NVRx score 0.7 = a rank 1.43x slower [NVRx]"),
    "activity_cv": ("engineering band", _CAL),
    "steps_for_cv": ("engineering band", _CAL + "; recent steps follow a phase change quickly"),
    "steps_for_cv_exit": ("engineering band", _CAL + "; exit hysteresis for jitter, whose stalls come at random"),
    "min_steps": ("engineering band", "a CV of fewer steps is noise"),
    "wait_power_drop": ("engineering band", "Llama 3 saw power swing by tens of MW when all GPUs waited on collectives [Llama3]; 15% below the working level is well past the 1-2% of DVFS drift [Llama3] and catches a second spent mostly in the collective; checked on traces/published/jitter_*"),
    "fabric_active_bytes": ("engineering band", "100 MB/s: well above heartbeat and metadata traffic, well below one collective on a 200 Gb/s port"),
    "fabric_anticorrelation": ("engineering band", "compute and communication taking turns within the window (at -0.5 a quarter of power's variance goes with the fabric's); steady MoE traffic interleaved with every layer correlated above -0.5 on traces/published/jitter_*, jittering jobs below -0.6"),
    "spin_fabric_share": ("engineering band", "a waiting collective's kernel spins (GPU-Util ~100% [packet]) while power, memory activity and fabric bytes fall (issue 44: XGMI trickles while ranks wait on a hot expert); a quarter of the window's busiest fabric rate separates a trickle from a transfer; checked on traces/published/families"),
    "power_cv": ("engineering band", "steady training drifts 1-2% [Llama3]: above 3% between 5 s blocks the waits come unevenly; checked on traces/published/jitter_* (steady dense training 1-2%, jittering jobs 4-11%); used only where fabric waits are seen, since steady MoE power also varies 7%"),
    "comm_bandwidth_link": ("engineering band", "classification.md §7.3 comm_bandwidth_bound"),
    "net_congestion_per_s": ("engineering band", "DCQCN sends some CNPs under normal load; thousands per second mean sustained congestion; not calibrated on real fabrics"),
    "net_retransmits_per_s": ("engineering band", "a healthy lossless fabric retransmits almost never; not calibrated on real fabrics"),
    "throttle_fraction": ("engineering band", "classification.md §7.3"),
    "throttle_clock": ("engineering band", "classification.md §7.3; SW power cap at >= 0.9 clock is normal under GEMM"),
    "throttle_severe_clock": ("sourced", "HW slowdown / power brake roughly halve clocks [DCGM-H]; §7.3"),
    "throttle_duty": ("engineering band", "classification.md §7.3"),
    "counters_disagree_gap": ("engineering band", "classification.md §2.1: utilization.gpu and GR_ENGINE_ACTIVE both measure the time a kernel ran and track within a few points; NVIDIA/dcgm-exporter#662 shows 91% against 16% on a loaded T4"),
    "power_capped_ratio": ("engineering band", "classification.md §7.3: NVML's power capping holds board power at the limit; within 5% of it, measurement noise"),
    "score_width": ("engineering band", "classification.md §7.4"),
    "score_width_cv": ("engineering band", "classification.md §7.4"),
    "power_proxy_compute": ("engineering band", _CAL + "; tensor work draws the most power; A100 training at 78-85% of its cap [DCGM#83]"),
    "power_proxy_latency": ("engineering band", _CAL),
    "power_near_limit": ("engineering band", "A100 training draws 313-339 W of 400 W [DCGM#83], LLM serving 262-278 W [InternLM#248]; large GEMMs sit at the power cap (SW power cap events); checked on the published-counter traces (traces/published)"),
    "mem_busy_memory": ("engineering band", "NVML defines utilization.memory as the share of time memory was read or written [NVML-UTIL], so bandwidth-bound kernels keep it near 100% and GEMMs well below; few utilization.memory values are published (traces/published/sources.yaml says which), so this level is not calibrated on real GPUs"),
    "mem_busy_memory_exit": ("engineering band", "about 15% below entry (§7.3 hysteresis)"),
    "proxy_min_score": ("engineering band", "a class below even odds on indirect evidence is a guess; unknown names the missing counter instead"),
    "confidence_reported_mfu": ("engineering band", "the job's own FLOP count is direct evidence but unit errors happen (roofline.MAX_UTILISATION)"),
    "confidence_mig": ("engineering band", "classification.md §7.4"),
    "confidence_inferred": ("engineering band", "classification.md §7.4"),
    "confidence_no_compute_counter": ("engineering band", "no tensor counter: compute vs latency rests on power"),
    "serving_at_floor_ratio": ("sourced, adapted", "well-tuned decode reaches 55-60% MBU [Databricks]; 1.5 = MBU 67%, so a server this close has no software headroom left"),
    "serving_far_ratio": ("engineering band", "MBU below 40%, under the 55-60% good servers reach [Databricks]; not calibrated on real servers"),
    "serving_under_batched": ("engineering band", "decode throughput grows almost linearly with batch while memory-bound [MemGap]; a quarter of the KV-cache capacity leaves 4x on the table"),
    "serving_prefill_share": ("engineering band", "prefill interference with decode is what chunked prefill and disaggregation exist for [Sarathi][DistServe]; not calibrated on real servers"),
    "serving_kv_full": ("engineering band", "vLLM preempts when no KV block is free; 90% leaves no room for the next request's prompt"),
    "serving_queue": ("engineering band", "any waiting request means admission, not the GPU, holds it back"),
}
