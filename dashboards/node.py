"""Node / GPU: why is this GPU slow? The verdict, its roofline position, and the raw signals.

For ML engineers and on-call. The verdict rows come first (what is wrong), the roofline next (how
far from the roofs), then the counters that explain the verdict.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import bargauge, statetimeline, table, timeseries, xychart
from grafana_foundation_sdk.builders.dashboard import Dashboard, Row
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models import xychart as xy

from agent.model.judging import MBU_POOR, MBU_TARGET
from dashboards.common import (
    BAD_HIGH_STEPS,
    DATASOURCE,
    MFU_STEPS,
    class_code_expr,
    class_mappings,
    cluster_variable,
    column_link,
    dashed_series,
    datasource_variable,
    gpu_variable,
    link_to,
    merged,
    new_dashboard,
    node_variable,
    organize,
    prom,
    steps,
    timeseries_panel,
    unit_override,
)
from dashboards.node_tables import HOLDERS, SEL, holders_panel, jitter_evidence_panel

UID = "roofwatch-node"
NODE = 'cluster=~"$cluster", node=~"$node"'

# The roofline's corner points: far left on the memory roof, the ridge, far right on the compute
# roof. On log-log axes the memory roof is a straight line, so three points draw both roofs exactly.
ROOF_LOW_INTENSITY = 0.1
ROOF_HIGH_INTENSITY = 10000


def roof_queries() -> tuple[str, str]:
    """PromQL for the roof's x values (FLOP/byte) and y values (FLOP/s), point by point.

    The roof is the selected GPUs' best: the highest peak bandwidth and the highest peak FLOP/s
    among the precisions they are running (one model per node is the norm). Each point is a
    series labelled ``point=p1|p2|p3``; the panel merges the two queries on that label.
    """
    bandwidth = f"max(roofwatch_gpu_peak_memory_bandwidth_bytes_per_second{{{SEL}}})"
    peak = (f"max(roofwatch_gpu_peak_flops{{{SEL}}}"
            f" and on (node, gpu, uuid, dtype) roofwatch_gpu_achieved_flops{{{SEL}}})")
    x = (f'label_replace(vector({ROOF_LOW_INTENSITY}), "point", "p1", "", "")\n'
         f'or label_replace({peak} / {bandwidth}, "point", "p2", "", "")\n'
         f'or label_replace(vector({ROOF_HIGH_INTENSITY}), "point", "p3", "", "")')
    y = (f'label_replace({bandwidth} * {ROOF_LOW_INTENSITY}, "point", "p1", "", "")\n'
         f'or label_replace({peak}, "point", "p2", "", "")\n'
         f'or label_replace({peak}, "point", "p3", "", "")')
    return x, y


def _display(name: str) -> model.DynamicConfigValue:
    return model.DynamicConfigValue(id_val="displayName", value=name)


def roofline_panel() -> xychart.Panel:
    roof_x, roof_y = roof_queries()
    log_axes = model.DynamicConfigValue(id_val="custom.scaleDistribution", value={"type": "log", "log": 10})
    return (
        xychart.Panel().title("Roofline").datasource(DATASOURCE).span(16).height(12)
        .description(
            "Each GPU as a point: arithmetic intensity (FLOP per DRAM byte, x) against achieved FLOP/s (y), "
            "under the roofs of its model for the precision it runs: the sloped memory roof (peak bandwidth x "
            "intensity) and the flat compute roof, meeting at the ridge point. A point near the sloped roof "
            "is memory-bound: raise intensity (bigger batches, fused kernels, FlashAttention, quantised "
            "weights). Near the flat roof it is compute-bound: only lower precision or less work helps. Far "
            "below both roofs the GPU is waiting (input, communication, launches): see its verdict.")
        .with_target(prom(f"roofwatch_gpu_arithmetic_intensity_flops_per_byte{{{SEL}}}", instant=True, table=True, ref="A"))
        .with_target(prom(f"roofwatch_gpu_achieved_flops{{{SEL}}}", instant=True, table=True, ref="B"))
        .with_target(prom(roof_x, instant=True, table=True, ref="C"))
        .with_target(prom(roof_y, instant=True, table=True, ref="D"))
        # GPU points: intensity and FLOP/s of the same GPU in one row; roof: x and y of one corner per row.
        .transformations(merged("A|B", "C|D"))
        # Auto mapping: in each frame the first number column is x and the next is y, so the chart
        # does not depend on the order in which the two merges leave the frames.
        .mapping(xy.SeriesMapping.AUTO)
        .show(xy.XYShowMode.POINTS)
        .point_size(xychart.XychartFieldConfigPointSize().fixed(10))
        .unit("flops")
        .override_by_name("Value #A", [log_axes, unit_override("none"),
                                       model.DynamicConfigValue(id_val="custom.axisLabel", value="FLOP per byte")])
        .override_by_name("Value #B", [log_axes, _display("GPUs"),
                                       model.DynamicConfigValue(id_val="custom.axisLabel", value="FLOP/s")])
        .override_by_name("Value #C", [log_axes, unit_override("none")])
        .override_by_name("Value #D", [log_axes, _display("Roof"), model.DynamicConfigValue(id_val="custom.show", value="lines"),
                                       model.DynamicConfigValue(id_val="color",
                                                                value={"mode": "fixed", "fixedColor": "red"})])
    )


def _ts(title: str, description: str, unit: str, *targets, w: int = 8, h: int = 8) -> timeseries.Panel:
    """Node panels sit three to a row."""
    return timeseries_panel(title, description, unit, *targets, w=w, h=h)


def _binary_timeline(title: str, description: str, metric: str,
                     zero: tuple[str, str], one: tuple[str, str]) -> statetimeline.Panel:
    """A 0/1 metric per GPU over time, each state named and coloured: ``(text, colour)``."""
    return (
        statetimeline.Panel().title(title).description(description).datasource(DATASOURCE).span(12).height(8)
        .mappings([model.ValueMap(options={
            "0": model.ValueMappingResult(text=zero[0], color=zero[1], index=0),
            "1": model.ValueMappingResult(text=one[0], color=one[1], index=1)})])
        .show_value(cm.VisibilityMode.NEVER)
        .with_target(prom(f"{metric}{{{SEL}}}", "GPU {{gpu}}"))
    )


def _ratio(title: str, description: str, metric: str, *, w: int = 8) -> timeseries.Panel:
    return _ts(title, description, "percentunit", prom(f"{metric}{{{SEL}}}", "GPU {{gpu}}"), w=w).min(0).max(1)


MBU_STEPS = steps((None, "red"), (MBU_POOR, "orange"), (MBU_TARGET, "green"))
"""MBU colours (agent.model.judging): below 40% poor, from 55% as good as well-tuned decode gets."""
NOT_JUDGED = model.DynamicConfigValue(id_val="color", value={"mode": "fixed", "fixedColor": "#6e6e6e"})
"""A figure that does not judge its GPU's class: grey, as on the status page and in ``top``."""


def _figure(metric: str, judged_class: str, judged: bool) -> str:
    """A GPU's counter MFU or MBU, for the GPUs of ``judged_class`` (``judged``) or for the others."""
    figure = f'max without (source, dtype) ({metric}{{{SEL}, source="counters"}})'
    keep = "and" if judged else "unless"
    return f'{figure} {keep} on (node, gpu, uuid) (roofwatch_gpu_workload_class{{{SEL}, class="{judged_class}"}} == 1)'


def figures_panel() -> bargauge.Panel:
    """MFU and MBU per GPU, each coloured only where it judges the GPU's class (agent.model.judging): MFU for a
    compute-bound GPU, MBU for a memory-bound one; grey otherwise, so a decode at its floor is not red for its MFU."""
    return (
        bargauge.Panel().title("MFU and MBU now").datasource(DATASOURCE).span(8).height(12)
        .description(
            "Share of peak FLOP/s (MFU, from tensor activity) and of peak memory bandwidth (MBU, from DRAM "
            "activity) each GPU uses. Each is coloured only where it judges the GPU's verdict: MFU for a "
            "compute-bound GPU (red below 20%, green from the practical target of 40%), MBU for a memory-bound "
            "one such as a decode server (red below 40%, green from 55%, where well-tuned decode gets); grey "
            "otherwise: a memory-bound GPU's low MFU is what memory-bound work looks like, and a latency-bound, "
            "starved, jittered or idle GPU is judged by its time lost, not by either. Both low: the GPU is waiting.")
        .unit("percentunit").min(0).max(1).display_mode(cm.BarGaugeDisplayMode.GRADIENT)
        .orientation(cm.VizOrientation.HORIZONTAL).thresholds(MFU_STEPS)
        .with_target(prom(_figure("roofwatch_gpu_mfu_ratio", "compute_bound", True),
                          "GPU {{gpu}} MFU (judges compute-bound)", instant=True, ref="A"))
        .with_target(prom(_figure("roofwatch_gpu_mbu_ratio", "memory_bound", True),
                          "GPU {{gpu}} MBU (judges memory-bound)", instant=True, ref="B"))
        .with_target(prom(_figure("roofwatch_gpu_mfu_ratio", "compute_bound", False), "GPU {{gpu}} MFU",
                          instant=True, ref="C"))
        .with_target(prom(_figure("roofwatch_gpu_mbu_ratio", "memory_bound", False), "GPU {{gpu}} MBU",
                          instant=True, ref="D"))
        .override_by_query("B", [model.DynamicConfigValue(id_val="thresholds", value=MBU_STEPS.build())])
        .override_by_query("C", [NOT_JUDGED])
        .override_by_query("D", [NOT_JUDGED])
    )


def build() -> Dashboard:
    return (
        new_dashboard(
            UID, "roofwatch / Node and GPU",
            "One node's GPUs: the verdict over time, the roofline, and the counters behind the verdict "
            "(activity, power, clocks, throttling, interconnect, processes).",
            time_from="now-1h")
        .with_variable(datasource_variable())
        .with_variable(cluster_variable())
        .with_variable(node_variable(multi=False))
        .with_variable(gpu_variable())

        .with_row(Row("Verdict"))
        .with_panel(
            statetimeline.Panel().title("Workload class").datasource(DATASOURCE).span(24).height(8)
            .description(
                "What bounds each GPU over time. compute_bound and memory_bound are productive (at or heading "
                "for a roof); idle means nothing runs (release it if it is held); input_starved means the "
                "GPU waits on the data pipeline (more loader workers, faster storage, prefetch); "
                "communication_jittered means it waits on peers (check the straggler and network); "
                "latency_bound means kernels are too small (larger batches, CUDA graphs); unknown means the "
                "counters cannot tell. docs/classification.md has the rules.")
            .mappings(class_mappings()).show_value(cm.VisibilityMode.NEVER).merge_values(True)
            .with_target(prom(class_code_expr(SEL), "GPU {{gpu}}")))
        .with_panel(column_link(
            table.Panel().title("Verdict now").datasource(DATASOURCE).span(24).height(8)
            .description(
                "Each GPU's class, the reason code behind it (dataloader, straggler, at_roof, small_kernels, "
                "...), throttling, what the verdict rests on (Evidence: counters = compute and DRAM counters; "
                "power_and_mem_busy = an NVML-only GPU before Hopper, judged by power and memory busy time; "
                "reported_mfu = the job's own MFU; for communication_jittered what the jitter was seen in, with its "
                "figures in the Jitter evidence panel; docs/classification.md), where those counters were read "
                "(Counters from: gpm, dcgm, dcgm-exporter, amd-exporter = AMD's Device Metrics Exporter, nvml, amdsmi; "
                "none when the basis reads no counter), whether it is wasted (Waste: held but "
                "idle, input-starved or communication-jittered; spare = idle and nobody holds it, capacity rather "
                "than waste; agent/model/waste.py) and the share of its time lost (0 when not wasted, blank while "
                "unknown), confidence, MFU from counters and "
                "from the workload, and the job. Low confidence means the window was mixed or counters are missing; "
                "wait a window before acting.")
            .with_target(prom(f"roofwatch_gpu_workload_reason_info{{{SEL}}}", instant=True, table=True, ref="A"))
            .with_target(prom(f"roofwatch_gpu_workload_confidence_ratio{{{SEL}}}", instant=True, table=True, ref="B"))
            .with_target(prom(f'max without (source, dtype) (roofwatch_gpu_mfu_ratio{{{SEL}, source="counters"}})',
                              instant=True, table=True, ref="C"))
            .with_target(prom(f'max without (source, dtype) (roofwatch_gpu_mfu_ratio{{{SEL}, source="workload"}})',
                              instant=True, table=True, ref="D"))
            .with_target(prom(f'max without (source) (roofwatch_gpu_mbu_ratio{{{SEL}}})',
                              instant=True, table=True, ref="E"))
            .with_target(prom(f"roofwatch_gpu_job_info{{{SEL}}}", instant=True, table=True, ref="F"))
            .with_target(prom(f"max without (waste) (roofwatch_gpu_waste_lost_ratio{{{SEL}}})\n"
                              f"or on (node, gpu, uuid) max without (class, detail, throttle, basis, basis_source, waste) "
                              f'(roofwatch_gpu_workload_reason_info{{{SEL}, waste=~"none|spare"}}) * 0',
                              instant=True, table=True, ref="G"))
            .transformations(merged())
            .with_transformation(organize(
                {"gpu": "GPU", "class": "Class", "detail": "Reason", "throttle": "Throttle", "basis": "Evidence",
                 "basis_source": "Counters from", "waste": "Waste", "Value #G": "Time lost", "Value #B": "Confidence",
                 "Value #C": "MFU (counters)", "Value #D": "MFU (workload)", "Value #E": "MBU", "job_id": "Job"},
                hide=("Time", "Value #A", "Value #F", "uuid", "node", "cluster", "job", "instance", "__name__")))
            .override_by_name("Time lost", [unit_override("percentunit")])
            .override_by_name("Confidence", [unit_override("percentunit")])
            .override_by_name("MFU (counters)", [unit_override("percentunit")])
            .override_by_name("MFU (workload)", [unit_override("percentunit")])
            .override_by_name("MBU", [unit_override("percentunit")]),
            "Job", link_to("roofwatch-job", "Open job", "job")))

        .with_row(Row("Roofline and utilisation"))
        .with_panel(roofline_panel())
        .with_panel(figures_panel())

        .with_row(Row("Activity"))
        .with_panel(_ratio(
            "SM active", "Share of SMs with work resident. Low while the GPU is busy means too few blocks "
            "per kernel (small batches): larger batches or CUDA graphs help.", "roofwatch_gpu_sm_active_ratio"))
        .with_panel(_ratio(
            "Tensor pipes active", "Share of cycles the tensor cores work: the numerator of counter MFU. Low "
            "on a training job means math is not the bottleneck; look at DRAM and the verdict.",
            "roofwatch_gpu_tensor_active_ratio"))
        .with_panel(_ratio(
            "DRAM bandwidth used", "Share of peak HBM bandwidth in use (AMD: memory-controller activity, a "
            "proxy). Near 100% with low tensor activity is memory-bound: raise arithmetic intensity.",
            "roofwatch_gpu_dram_active_ratio"))
        .with_panel(_ratio(
            "SM occupancy", "Resident warps against the maximum. Low occupancy with high SM activity limits "
            "latency hiding: check registers and shared memory per block.", "roofwatch_gpu_sm_occupancy_ratio"))
        .with_panel(_ratio(
            "Kernel duty cycle", "Share of time any kernel runs (what nvidia-smi calls utilisation). It says "
            "nothing about how well the GPU is used: 100% here with low tensor activity is common.",
            "roofwatch_gpu_engine_active_ratio"))
        .with_panel(
            _ts("Memory used", "Device memory in use against its size. Near 100% risks out-of-memory and "
                "blocks larger batches; near 0% on a held GPU means nothing is loaded.", "percentunit",
                prom(f"roofwatch_gpu_memory_used_bytes{{{SEL}}} / roofwatch_gpu_memory_total_bytes{{{SEL}}}",
                     "GPU {{gpu}}")).min(0).max(1))

        .with_row(Row("Power, clocks and throttling"))
        .with_panel(dashed_series(
            _ts("Power", "Board power against the enforced limit (dashed). Power at the limit with falling "
                "clocks is power capping: expected under heavy math, a problem if the limit was lowered.",
                "watt",
                prom(f"roofwatch_gpu_power_watts{{{SEL}}}", "GPU {{gpu}}", ref="A"),
                prom(f"max(roofwatch_gpu_power_limit_watts{{{SEL}}})", "limit", ref="B")).min(0),
            "limit"))
        .with_panel(dashed_series(
            _ts("SM clock", "Current SM clock against the maximum (dashed). Clocks well below the maximum "
                "while busy mean throttling: the next panels say why.", "hertz",
                prom(f"roofwatch_gpu_sm_clock_hertz{{{SEL}}}", "GPU {{gpu}}", ref="A"),
                prom(f"max(roofwatch_gpu_sm_clock_max_hertz{{{SEL}}})", "max", ref="B")).min(0),
            "max"))
        .with_panel(
            _ts("Temperature", "GPU die and HBM temperature. HBM throttles on its own limit (about 95 C on "
                "H100); rising temperatures with throttling point at cooling.", "celsius",
                prom(f"roofwatch_gpu_temperature_celsius{{{SEL}}}", "GPU {{gpu}} die", ref="A"),
                prom(f"roofwatch_gpu_memory_temperature_celsius{{{SEL}}}", "GPU {{gpu}} HBM", ref="B")))
        .with_panel(
            _binary_timeline(
                "Throttled", "When a throttle reason held a busy GPU's clock below 90% of its reference clock. "
                "Sustained throttling lowers the compute roof: check power limits, cooling and the reasons panel.",
                "roofwatch_gpu_throttled", ("ok", "green"), ("throttled", "red")))
        .with_panel(
            _ts("Throttle reasons", "Share of time each clock-event reason held the clock down (from the "
                "driver's exact counters). sw_power_cap/hw_power_brake: power; *_thermal: cooling; "
                "gpu_idle is harmless.", "percentunit",
                prom(f"sum by (gpu, reason) (rate(roofwatch_gpu_clock_event_seconds_total{{{SEL}}}[$__rate_interval]))",
                     "GPU {{gpu}} {{reason}}"), w=12).min(0))

        .with_row(Row("Interconnect"))
        .with_panel(
            _ts("PCIe traffic", "Bytes per second over the host link. Heavy host-to-device traffic during "
                "training means data or weights are copied every step: pin memory, prefetch, keep tensors on "
                "the GPU.", "Bps",
                prom(f"rate(roofwatch_gpu_pcie_bytes_total{{{SEL}}}[$__rate_interval])", "GPU {{gpu}} {{direction}}")))
        .with_panel(
            _ts("NVLink / XGMI traffic", "Bytes per second over GPU-to-GPU links (all links). Bursts with "
                "idle gaps are collectives; flat zero on a multi-GPU job means traffic goes over PCIe or the "
                "network instead.", "Bps",
                prom(f"rate(roofwatch_gpu_link_bytes_total{{{SEL}}}[$__rate_interval])", "GPU {{gpu}} {{direction}}")))
        .with_panel(
            _ts("Network (InfiniBand / RoCE)", "Bytes per second through the NIC nearest each GPU. Uneven "
                "traffic across ranks of one job or drops during steps point at a slow link or congestion.",
                "Bps",
                prom(f"rate(roofwatch_gpu_network_bytes_total{{{SEL}}}[$__rate_interval])", "GPU {{gpu}} {{direction}}")))
        .with_panel(
            _ts("Communication wait", "Share of samples spent waiting on peers, typically NCCL or RCCL: a "
                "kernel resident but its SM and tensor pipes idle where those counters exist; on a GPU "
                "without them (A100 or L40S through NVML alone, MI300X) power fallen below its working "
                "level while NVLink/XGMI and NIC bytes rise. Above ~30% the job is paced by its slowest "
                "rank or the network.",
                "percentunit", prom(f"roofwatch_gpu_comm_wait_ratio{{{SEL}}}", "GPU {{gpu}}"), w=12)
            .min(0).max(1).thresholds(BAD_HIGH_STEPS))
        .with_panel(jitter_evidence_panel())
        .with_panel(
            _ts("Host I/O wait and pressure", "Share of CPU time waiting for I/O and of time some task "
                "stalled on I/O (PSI). High values with input-starved GPUs mean storage feeds the "
                "data loader too slowly: cache the dataset locally or add readers.", "percentunit",
                prom(f"roofwatch_host_cpu_iowait_ratio{{{NODE}}}", "CPU iowait", ref="A"),
                prom(f"roofwatch_host_io_pressure_ratio{{{NODE}}}", "I/O pressure", ref="B"), w=24).min(0))

        .with_row(Row("Processes and health"))
        .with_panel(
            table.Panel().title("Processes on the GPUs").datasource(DATASOURCE).span(12).height(8)
            .description("Processes holding a context, with the device memory they use and their share of "
                         "SM time. A process with memory but no SM time on an idle GPU is holding it "
                         "for nothing.")
            .with_target(prom(f"roofwatch_gpu_process_memory_used_bytes{{{SEL}}}", instant=True, table=True, ref="A"))
            .with_target(prom(f"roofwatch_gpu_process_sm_utilization_ratio{{{SEL}}}", instant=True, table=True, ref="B"))
            .transformations(merged())
            .with_transformation(organize(
                {"gpu": "GPU", "pid": "PID", "process": "Process", "Value #A": "Memory", "Value #B": "SM share"},
                hide=("Time", "uuid", "node", "cluster", "job", "instance", "__name__")))
            .override_by_name("Memory", [unit_override("bytes")])
            .override_by_name("SM share", [unit_override("percentunit")]))
        .with_panel(
            table.Panel().title("Errors and repairs").datasource(DATASOURCE).span(12).height(8)
            .description("Per GPU over the dashboard range: XID critical errors, uncorrectable ECC errors, "
                         "and whether a row remap is pending (needs a GPU reset) or failed (needs service). "
                         "Anything non-zero: drain the node and follow docs/alerts.md.")
            .with_target(prom(f"sum by (node, gpu, uuid) (increase(roofwatch_gpu_xid_errors_total{{{SEL}}}[$__range]))"
                              f" or on (node, gpu, uuid) (roofwatch_gpu_up{{{SEL}}} * 0)",
                              instant=True, table=True, ref="A"))
            .with_target(prom(f'sum by (node, gpu, uuid) (increase(roofwatch_gpu_ecc_errors_total{{{SEL}, type="uncorrected"}}[$__range]))'
                              f" or on (node, gpu, uuid) (roofwatch_gpu_up{{{SEL}}} * 0)",
                              instant=True, table=True, ref="B"))
            .with_target(prom(f"max by (node, gpu, uuid) (roofwatch_gpu_remapped_rows_pending{{{SEL}}})"
                              f" or on (node, gpu, uuid) (roofwatch_gpu_up{{{SEL}}} * 0)",
                              instant=True, table=True, ref="C"))
            .with_target(prom(f"max by (node, gpu, uuid) (roofwatch_gpu_remapped_rows_failure{{{SEL}}})"
                              f" or on (node, gpu, uuid) (roofwatch_gpu_up{{{SEL}}} * 0)",
                              instant=True, table=True, ref="D"))
            .transformations(merged())
            .with_transformation(organize(
                {"gpu": "GPU", "Value #A": "XID events", "Value #B": "Uncorrectable ECC",
                 "Value #C": "Remap pending", "Value #D": "Remap failed"},
                hide=("Time", "uuid", "node", "cluster", "job", "instance", "__name__")))
            .thresholds(steps((None, "green"), (1, "red"))))
        .with_panel(holders_panel())
        .with_panel(
            _binary_timeline(
                "GPU up", "Whether the agent's last read of each GPU succeeded. Down means the GPU fell off "
                "the bus, the driver failed or a call hung: its other panels stop; see GpuLost.",
                "roofwatch_gpu_up", ("down", "red"), ("up", "green")))
        .with_panel(
            _ts("Agent cost", "Vendor-library calls per GPU per sample and the collector's cycle time: the "
                "agent's own overhead. Cycle time near the interval means the agent cannot keep up.",
                "none",
                prom(f"roofwatch_gpu_driver_calls_per_sample{{{SEL}}}", "GPU {{gpu}} calls", ref="A"),
                prom(f"roofwatch_collector_last_cycle_duration_seconds{{{NODE}}} * 1000", "cycle ms", ref="B"),
                w=12).min(0))
    )


MAY_BE_EMPTY: dict[str, str] = {
    HOLDERS: "no GPU of the demo node is shared; tests/test_dashboard_shared.py fills it from the shared scenario",
}
"""Panels allowed to show no data on a healthy node, with the reason."""
