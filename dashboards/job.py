"""Job: is this job using its GPUs well, and if not, which rank holds it back?

For ML engineers. It joins every GPU series to ``roofwatch_gpu_job_info`` so one job spread over
many nodes (many agents) reads as one. Per-GPU series are first narrowed to the job's nodes (the
hidden ``job_node`` variable), so a panel reads the job's GPUs, not the fleet's.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import bargauge, stat, table, timeseries
from grafana_foundation_sdk.builders.dashboard import Dashboard, Row
from grafana_foundation_sdk.models import common as cm

from dashboards.common import (
    BAD_HIGH_STEPS,
    DATASOURCE,
    MFU_STEPS,
    by_job,
    class_colour_overrides,
    cluster_variable,
    column_link,
    dashed_series,
    datasource_variable,
    job_node_variable,
    job_variable,
    link_to,
    merged,
    new_dashboard,
    organize,
    prom,
    stacked,
    stat_panel,
    steps,
    timeseries_panel,
    unit_override,
)

UID = "roofwatch-job"
C = 'cluster=~"$cluster"'
J = 'cluster=~"$cluster", job_id=~"$job"'
G = 'cluster=~"$cluster", node=~"${job_node}"'
"""Per-GPU series on the job's nodes: the left-hand side of every join to the job."""
RANK = "{{node}} GPU {{gpu}}"


def _per_rank(title: str, description: str, metric: str, unit: str = "percentunit") -> timeseries.Panel:
    """One series per GPU of the job (a rank), from a per-GPU metric joined to the job."""
    return timeseries_panel(title, description, unit, prom(by_job(f"{metric}{{{G}}}", J), RANK))


def build() -> Dashboard:
    mfu_counters = by_job(f'max without (dtype) (roofwatch_gpu_mfu_ratio{{{G}, source="counters"}})', J)
    mfu_workload = by_job(f'max without (dtype) (roofwatch_gpu_mfu_ratio{{{G}, source="workload"}})', J)
    return (
        new_dashboard(
            UID, "roofwatch / Job",
            "One job across all its nodes: MFU measured by counters next to what the workload reports, "
            "step-time jitter, rank skew and the straggler. Needs roofwatch's recording rules.",
            time_from="now-1h")
        .with_variable(datasource_variable())
        .with_variable(cluster_variable())
        .with_variable(job_variable())
        .with_variable(job_node_variable())

        .with_row(Row("Job now"))
        .with_panel(
            stat_panel("Job MFU", "Average MFU over the job's GPUs (the workload's own figure where it reports "
                  "one, else the counter estimate). Below 40% for a training job is worth a profile: the "
                  "panels below say whether ranks wait on data, peers or memory.",
                  f"roofwatch_job:gpu_mfu:avg{{{J}}}", "percentunit")
            .thresholds(MFU_STEPS).color_mode(cm.BigValueColorMode.BACKGROUND))
        .with_panel(
            stat_panel("GPUs", "GPUs this job holds across all nodes. Fewer than requested means ranks died or "
                  "agents are down.", f"roofwatch_job:gpus:count{{{J}}}", "none")
            .thresholds(steps((None, "text"))))
        .with_panel(
            stat_panel("Straggler lead", "How much more the slowest rank computes per step than the job's median "
                  "(1 - median / slowest tensor activity). Above 15% one rank paces the whole job: see "
                  "the Straggler panel for which one, and check its clocks, thermals and neighbours.",
                  f"max(roofwatch:gpu_straggler_lead:ratio{{{J}}})", "percentunit")
            .thresholds(BAD_HIGH_STEPS).color_mode(cm.BigValueColorMode.BACKGROUND))
        .with_panel(
            stat_panel("Step-time jitter", "Coefficient of variation of recent step times (highest rank). Steady "
                  "training is under 5%; above 15% steps stall on data or collectives.",
                  f"max({by_job(f'roofwatch_gpu_step_time_cv{{{G}}}', J)})", "percentunit")
            .thresholds(BAD_HIGH_STEPS).color_mode(cm.BigValueColorMode.BACKGROUND))
        .with_panel(
            stat_panel("Idle GPU-hours, trailing hour", "GPU-hours the job held GPUs that ran nothing in the last "
                  "hour. Non-zero on a running job means some ranks have no work: check its launch layout.",
                  f"sum(roofwatch_job:gpu_idle_allocated_hours:sum_1h{{{J}}})", "h")
            .thresholds(steps((None, "green"), (0.5, "orange"), (2, "red"))))
        .with_panel(
            stat_panel("Energy, trailing hour", "GPU energy the job used in the last hour. With MFU it gives the "
                  "energy cost of useful work; it falls when waste falls.",
                  f"sum(roofwatch_job:gpu_energy_kwh:sum_1h{{{J}}})", "kwatth")
            .thresholds(steps((None, "text"))))

        .with_row(Row("MFU"))
        .with_panel(dashed_series(
            timeseries_panel("MFU: counters vs workload", "The job's MFU two ways: estimated from tensor-pipe activity "
                "(counters) and computed from the tokens/s and FLOPs per token the workload reports. "
                "Counters well above the workload's figure mean the GPUs do math the model does not count "
                "(recomputation, padding, redundant work); the reverse means the reported FLOPs per token "
                "are too high.", "percentunit",
                prom(f"avg by (job_id) ({mfu_counters})", "counters (tensor activity)", ref="A"),
                prom(f"avg by (job_id) ({mfu_workload})", "reported by the workload", ref="B"),
                prom("roofwatch:alert_threshold:low_mfu_ratio", "target", ref="C"))
            .min(0).max(1), "target"))
        .with_panel(
            timeseries_panel("MFU by rank", "MFU of each of the job's GPUs. Ranks of a synchronous job finish the same "
                "work in the same step time, so their MFU should match; one rank clearly above the others "
                "computes slower per FLOP (see Straggler).", "percentunit",
                prom(by_job(f"roofwatch:gpu_mfu:ratio{{{G}}}", J), RANK))
            .min(0).max(1))

        .with_row(Row("Jitter, skew and the straggler"))
        .with_panel(
            _per_rank("Step-time jitter by rank", "Coefficient of variation of step times as each rank sees "
                "them. Spikes mean stalled steps: data loading (input-starved GPUs), a checkpoint, or a "
                "collective waiting on a slow rank or link.", "roofwatch_gpu_step_time_cv")
            .min(0).thresholds(BAD_HIGH_STEPS))
        .with_panel(
            _per_rank("Communication wait by rank", "Share of time each rank's GPU has a kernel resident but idle "
                "(NCCL waiting on peers). The straggler waits least; everyone else waits for it. All ranks "
                "high means the network itself is slow.", "roofwatch_gpu_comm_wait_ratio")
            .min(0).max(1))
        .with_panel(dashed_series(
            timeseries_panel("Straggler lead by rank", "Per rank: 1 - the job's median tensor activity / this rank's, over "
                "5 minutes. The rank above the dashed alert threshold is the straggler (GpuJobStraggler "
                "fires): its GPU does the same work more slowly (throttling, a bad GPU, a noisy neighbour).",
                "percentunit",
                prom(f"roofwatch:gpu_straggler_lead:ratio{{{J}}}", RANK, ref="A"),
                prom("roofwatch:alert_threshold:straggler_lead_ratio", "threshold", ref="B")),
            "threshold"))
        .with_panel(
            _per_rank("Rank skew within a node", "1 - this rank's compute share / the busiest rank's, among the "
                "job's GPUs on the same node, as the agent sees it. High values on one node only point at "
                "that node's GPUs or topology.", "roofwatch_gpu_rank_skew_ratio")
            .min(0).thresholds(BAD_HIGH_STEPS))
        .with_panel(
            stat.Panel().title("Straggler").datasource(DATASOURCE).span(8).height(8)
            .description("The rank with the highest straggler lead now, and its lead. Below the alert "
                         "threshold (15% by default) the job is balanced and this is only the slowest rank. "
                         "Above it: open that node and check clocks, throttling and errors of that GPU.")
            .unit("percentunit").text_mode(cm.BigValueTextMode.VALUE_AND_NAME)
            .graph_mode(cm.BigValueGraphMode.NONE).thresholds(BAD_HIGH_STEPS)
            .color_mode(cm.BigValueColorMode.BACKGROUND)
            .with_target(prom(f"topk(1, roofwatch:gpu_straggler_lead:ratio{{{J}}})", RANK, instant=True)))
        .with_panel(
            bargauge.Panel().title("Tensor activity by rank").datasource(DATASOURCE).span(16).height(8)
            .description("Each rank's tensor-pipe activity over 5 minutes, the input to the straggler lead. "
                         "Equal bars mean balanced ranks; one long bar is the rank the others wait for.")
            .unit("percentunit").min(0).max(1).display_mode(cm.BarGaugeDisplayMode.GRADIENT)
            .orientation(cm.VizOrientation.HORIZONTAL)
            .with_target(prom(f"roofwatch:gpu_tensor_active_by_job:avg5m{{{J}}}", RANK, instant=True)))

        .with_row(Row("Classes and resources"))
        .with_panel(class_colour_overrides(
            timeseries_panel("Share of the job's GPUs by class", "How the job's GPUs are classified over time (1 = all of "
                "them). A healthy training job is compute-bound; a band of input_starved or "
                "communication_jittered says what to fix first.", "percentunit",
                prom(f"roofwatch_job:gpu_class:ratio{{{J}}}", "{{class}}"))
            .min(0).max(1).stacking(stacked()).fill_opacity(60)))
        .with_panel(column_link(
            table.Panel().title("The job's GPUs now").datasource(DATASOURCE).span(12).height(8)
            .description("Each GPU of the job with its class, reason, whether it is wasted (the agent's waste label: held "
                         "but idle, input-starved, communication-jittered; agent/model/waste.py) and MFU. Click a node "
                         "to see its GPUs.")
            .with_target(prom(by_job(f"roofwatch_gpu_workload_reason_info{{{G}}}", J), instant=True, table=True, ref="A"))
            .with_target(prom(by_job(f"roofwatch:gpu_mfu:ratio{{{G}}}", J), instant=True, table=True, ref="B"))
            .transformations(merged())
            .with_transformation(organize(
                {"node": "Node", "gpu": "GPU", "class": "Class", "detail": "Reason", "throttle": "Throttle",
                 "basis": "Evidence", "basis_source": "Counters from", "waste": "Waste", "Value #B": "MFU"},
                hide=("Time", "Value #A", "uuid", "cluster", "job", "job_id", "instance", "__name__")))
            .override_by_name("MFU", [unit_override("percentunit")]),
            "Node", link_to("roofwatch-node", "Open node", "node")))
        .with_panel(
            timeseries_panel("Network and NVLink traffic", "The job's bytes per second over InfiniBand/RoCE and over "
                "NVLink/XGMI, summed over its GPUs. Dips that line up with jitter spikes point at the "
                "fabric.", "Bps",
                prom(f"sum by (direction) ({by_job(f'rate(roofwatch_gpu_network_bytes_total{{{G}}}[$__rate_interval])', J)})",
                     "network {{direction}}", ref="A"),
                prom(f"sum by (direction) ({by_job(f'rate(roofwatch_gpu_link_bytes_total{{{G}}}[$__rate_interval])', J)})",
                     "nvlink {{direction}}", ref="B"))
            .min(0))
        .with_panel(
            _per_rank("Power by rank", "Board power of each of the job's GPUs. The straggler often draws the most "
                "(it computes longest) unless it is power-capped, which would explain its slowness.", "roofwatch_gpu_power_watts", "watt")
            .min(0))
    )


MAY_BE_EMPTY: dict[str, str] = {}
"""Panels allowed to show no data for a running multi-node job, with the reason (none here)."""
