"""The classifier's families: the workload class per GPU, why, and the roofline figures behind it.

Derived rather than read (agent/classifier, one verdict per GPU every ``evaluate_every_s``), so
they are kept apart from the driver's readings: a reader can tell an estimate from a counter.
"""

from __future__ import annotations

from exporters.metrics.definition import MetricDef
from exporters.metrics.labels import GPU_LABELS

_CLS = "classifier"
WORKLOAD_CLASS = MetricDef(
    "roofwatch_gpu_workload_class", "gauge", "boolean",
    "1 for the class that bounds this GPU now (every GPU has exactly one: unknown while it has no verdict); the "
    "other classes are absent unless optional_metrics lists one_hot_zeros (then 0).",
    GPU_LABELS + ("class",), nvidia=_CLS, amd=_CLS, virtual=_CLS,
)
WORKLOAD_CONFIDENCE = MetricDef(
    "roofwatch_gpu_workload_confidence_ratio", "gauge", "ratio",
    "Confidence in the published class: score margin x valid samples x evidence quality.",
    GPU_LABELS, nvidia=_CLS, amd=_CLS, virtual=_CLS,
)
WORKLOAD_SCORE = MetricDef(
    "roofwatch_gpu_workload_score_ratio", "gauge", "ratio",
    "How strongly this window matches each class (0..1), before hysteresis.",
    GPU_LABELS + ("class",), nvidia=_CLS, amd=_CLS, virtual=_CLS, optional="scores",
)
WORKLOAD_REASON = MetricDef(
    "roofwatch_gpu_workload_reason_info", "info", "",
    "Why: the class, a bounded detail code (e.g. dataloader, straggler, at_roof), throttle severity (none, moderate, "
    "severe; unknown or likely_power_capped where the source exports no clock-event reasons), the "
    "evidence the verdict rests on (basis: counters, power_and_mem_busy, reported_mfu, ...; docs/classification.md), "
    "where those counters were read (basis_source: gpm, gpm-totals, dcgm, dcgm-totals, dcgm-exporter, dcgm-exporter-totals "
    "(the -totals: cumulative counters over the window, NVML GPM's or DCGM's), amd-exporter, nvml, amdsmi, joined by + "
    "when the basis reads two, none when it reads no counter; agent/model/counter_source.py), "
    "and whether the GPU is wasted (waste: idle_held, input_starved, communication_jittered; spare for an idle GPU "
    "nobody holds; none), by the one definition in agent/model/waste.py that every view, rule and dashboard counts by.",
    GPU_LABELS + ("class", "detail", "throttle", "basis", "basis_source", "waste"), nvidia=_CLS, amd=_CLS, virtual=_CLS,
)
WASTE_LOST = MetricDef(
    "roofwatch_gpu_waste_lost_ratio", "gauge", "ratio",
    "Share of the verdict window's time a wasted GPU lost, by its waste kind (the waste label, as on the reason "
    "info): 1 held but idle, the share without a kernel when input-starved, the share spent waiting on peers when "
    "communication-jittered. Only wasted GPUs have it (a GPU whose reason info says waste none or spare lost "
    "nothing), and not while the loss is unknown (a jittered GPU with no wait counter and no rank spread). "
    "agent/model/waste.py, the lost-time measure.",
    GPU_LABELS + ("waste",), nvidia=_CLS, amd=_CLS, virtual=_CLS,
)
THROTTLED = MetricDef(
    "roofwatch_gpu_throttled", "gauge", "boolean",
    "1 while a throttle reason holds a busy GPU's clock below 90% of the peak's reference clock; absent where the "
    "source exports no clock-event reasons (dcgm-exporter's default CSV).",
    GPU_LABELS, nvidia=_CLS, amd=_CLS, virtual=_CLS,
)
COUNTERS_SUSPECT = MetricDef(
    "roofwatch_gpu_counters_suspect", "gauge", "boolean",
    "1 while the profiling duty (GPM, DCGM PROF_GR_ENGINE_ACTIVE) reads far below the utilisation counter "
    "(utilization.gpu, GPU_UTIL) and power does not side with it: a dead or paused profiling counter (verdict "
    "unknown, detail counters_disagree); 0 while they agree; absent where the GPU has only one of the two.",
    GPU_LABELS, nvidia=_CLS + " (GPM or DCGM against utilization.gpu)", amd="—", virtual=_CLS,
)
DUTY_CYCLE = MetricDef(
    "roofwatch_gpu_window_duty_cycle_ratio", "gauge", "ratio",
    "Share of the classification window in which a kernel ran.", GPU_LABELS, nvidia=_CLS, amd=_CLS, virtual=_CLS,
)
COMM_WAIT = MetricDef(
    "roofwatch_gpu_comm_wait_ratio", "gauge", "ratio",
    "Share of window samples spent waiting on peers: a kernel resident but its SM and tensor pipes idle where "
    "those counters exist, else power fallen below its working level while fabric bytes rise (NCCL/RCCL waiting).",
    GPU_LABELS, nvidia=_CLS + " (SM and tensor counters, else power against NVLink and NIC bytes)",
    amd=_CLS + " (power against XGMI and NIC bytes)", virtual=_CLS,
)
POWER_FABRIC_CORRELATION = MetricDef(
    "roofwatch_gpu_power_fabric_correlation", "gauge", "correlation (-1..1)",
    "Correlation of power with fabric (NVLink/XGMI plus NIC) bytes over the window: near -1 when compute and "
    "communication take turns, the evidence of waiting on collectives on GPUs without SM and tensor counters.",
    GPU_LABELS, nvidia=_CLS, amd=_CLS, virtual=_CLS,
)
STEP_TIME_CV = MetricDef(
    "roofwatch_gpu_step_time_cv", "gauge", "ratio",
    "Coefficient of variation of the job's recent step times (when the job reports step times, with or without step ids).",
    GPU_LABELS, nvidia=_CLS, amd=_CLS, virtual=_CLS,
)
STEP_TIME = MetricDef(
    "roofwatch_gpu_step_time_seconds", "gauge", "seconds",
    "Mean of the job's recent reported step times: the recording rules compare it across the job's ranks on all nodes.",
    GPU_LABELS, nvidia=_CLS, amd=_CLS, virtual=_CLS,
)
RANK_SKEW = MetricDef(
    "roofwatch_gpu_rank_skew_ratio", "gauge", "ratio",
    "1 - this rank's compute share / the busiest rank's, among its job's ranks on this node.",
    GPU_LABELS, nvidia=_CLS, amd=_CLS, virtual=_CLS,
)
ACHIEVED_FLOPS = MetricDef(
    "roofwatch_gpu_achieved_flops", "gauge", "flops",
    "Estimated FLOP/s: clock-scaled tensor and FP-pipe activity x the dtype's peaks.",
    GPU_LABELS + ("dtype",), nvidia="GPM tensor + pipe activity", amd="— (no tensor counter)", virtual=_CLS,
)
ACHIEVED_BANDWIDTH = MetricDef(
    "roofwatch_gpu_achieved_memory_bandwidth_bytes_per_second", "gauge", "bytes per second",
    "Estimated DRAM bytes/s: DRAM activity x peak bandwidth.", GPU_LABELS, nvidia=_CLS, amd=_CLS, virtual=_CLS,
)
INTENSITY = MetricDef(
    "roofwatch_gpu_arithmetic_intensity_flops_per_byte", "gauge", "FLOP per byte",
    "Estimated arithmetic intensity (achieved FLOP/s / achieved DRAM bytes/s); compare with the ridge point.",
    GPU_LABELS + ("dtype",), nvidia=_CLS, amd="— (no tensor counter)", virtual=_CLS,
)
RIDGE_POINT = MetricDef(
    "roofwatch_gpu_ridge_point_flops_per_byte", "gauge", "FLOP per byte",
    "Peak FLOP/s / peak bandwidth for the dtype: below it the memory roof binds first.",
    GPU_LABELS + ("dtype",), nvidia="spec catalogue", amd="spec catalogue", virtual="spec catalogue",
    optional="roofline_detail",
)
ROOF_HEADROOM = MetricDef(
    "roofwatch_gpu_roof_headroom_ratio", "gauge", "ratio",
    "1 - achieved / peak for each roof (compute for the dtype, memory): 0 means at the roof.",
    GPU_LABELS + ("roof",), nvidia=_CLS, amd=_CLS, virtual=_CLS, optional="roofline_detail",
)
MFU = MetricDef(
    "roofwatch_gpu_mfu_ratio", "gauge", "ratio",
    "Model FLOPs utilisation. source=counters: clock-scaled tensor activity (an estimate, needs a tensor "
    "counter); source=workload: tokens/s x FLOPs/token / (world size x peak), when the job reports it.",
    GPU_LABELS + ("source", "dtype"), nvidia="GPM ANY_TENSOR_UTIL x SM clock", amd="workload reports only",
    virtual=_CLS,
)
MBU = MetricDef(
    "roofwatch_gpu_mbu_ratio", "gauge", "ratio",
    "Memory-bandwidth utilisation. source=counters: DRAM activity; source=workload: model bytes per step "
    "(or per token) x rate / (world size x peak bandwidth).",
    GPU_LABELS + ("source",), nvidia=_CLS, amd="umc_activity (a proxy)", virtual=_CLS,
)
VERDICT_METRICS: tuple[MetricDef, ...] = (
    WORKLOAD_CLASS, WORKLOAD_CONFIDENCE, WORKLOAD_SCORE, WORKLOAD_REASON, WASTE_LOST, THROTTLED, COUNTERS_SUSPECT, DUTY_CYCLE, COMM_WAIT,
    POWER_FABRIC_CORRELATION, STEP_TIME_CV, STEP_TIME, RANK_SKEW, ACHIEVED_FLOPS, ACHIEVED_BANDWIDTH, INTENSITY, RIDGE_POINT, ROOF_HEADROOM, MFU, MBU,
)
