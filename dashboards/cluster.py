"""Cluster efficiency: how much of the fleet's paid-for compute turns into model FLOPs.

For capacity planners and platform engineers. It reads the recording rules of
deploy/prometheus/roofwatch-rules.yml, which do the cross-agent joins once per evaluation
instead of once per panel refresh.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import bargauge, table, timeseries
from grafana_foundation_sdk.builders.dashboard import Dashboard, Row
from grafana_foundation_sdk.models import common as cm

from dashboards.common import (
    DATASOURCE,
    MFU_STEPS,
    WASTED,
    class_colour_overrides,
    cluster_variable,
    column_link,
    dashed_series,
    datasource_variable,
    link_to,
    merged,
    new_dashboard,
    organize,
    prom,
    sort_desc,
    stacked,
    stat_panel,
    steps,
    timeseries_panel,
    unit_override,
)

UID = "roofwatch-cluster"
C = 'cluster=~"$cluster"'


def build() -> Dashboard:
    wasted_by_job = f'sum by (cluster, job_id) (roofwatch_job:gpu_waste_hours:sum_1h{{{C}, waste=~"{WASTED}"}})'
    lost_by_job = f"sum by (cluster, job_id) (roofwatch_job:gpu_lost_hours:sum_1h{{{C}}})"
    top_jobs = f"topk(10, {wasted_by_job})"

    return (
        new_dashboard(
            UID, "roofwatch / Cluster efficiency",
            "Fleet MFU, where the GPU-hours go, idle but allocated GPUs, the most wasteful jobs and "
            "energy. Needs roofwatch's recording rules (deploy/prometheus/roofwatch-rules.yml).",
            time_from="now-6h")
        .with_variable(datasource_variable())
        .with_variable(cluster_variable())

        .with_row(Row("Efficiency now"))
        .with_panel(
            stat_panel("Fleet MFU",
                  "Model FLOPs utilisation over every GPU, idle ones counted as 0: the share of the fleet's "
                  "peak math that becomes model FLOPs. Fleets commonly sit near 11% against a practical "
                  "target of 40%. Low? Look at the class breakdown below: idle and input-starved GPUs pull "
                  "it down most; reclaim idle allocations before tuning kernels.",
                  f"avg(roofwatch:gpu_mfu:ratio{{{C}}})", "percentunit")
            .thresholds(MFU_STEPS).color_mode(cm.BigValueColorMode.BACKGROUND))
        .with_panel(
            stat_panel("MFU of busy GPUs",
                  "MFU over GPUs that are not idle: how well the running work uses the GPUs it has. "
                  "Fleet MFU far below this means idle capacity; this one low means the jobs themselves "
                  "are inefficient (open the Job dashboard of the worst jobs below).",
                  f'avg(roofwatch:gpu_mfu:ratio{{{C}}} unless on (node, gpu, uuid) '
                  f'(roofwatch_gpu_workload_class{{{C}, class="idle"}} == 1))', "percentunit")
            .thresholds(MFU_STEPS).color_mode(cm.BigValueColorMode.BACKGROUND))
        .with_panel(
            stat_panel("GPUs",
                  "GPUs reporting to Prometheus. Fewer than you own means agents are down or GPUs fell off "
                  "the bus (see GPUs missing).",
                  f"count(roofwatch_gpu_info{{{C}}})", "none")
            .thresholds(steps((None, "text"))))
        .with_panel(
            stat_panel("GPUs missing or down",
                  "GPUs an agent expects but cannot read (fell off the bus, driver error, hung call). Any "
                  "non-zero value is a hardware or driver incident: check the GpuLost alert and dmesg/XID "
                  "on that node, then drain it.",
                  f"sum(clamp_min(roofwatch_gpus_expected{{{C}}} - roofwatch_gpus_visible{{{C}}}, 0))", "none")
            .thresholds(steps((None, "green"), (1, "red"))).color_mode(cm.BigValueColorMode.BACKGROUND))
        .with_panel(
            stat_panel("Idle but allocated",
                  "GPUs that run nothing while a job or process holds them (the agent's waste label idle_held; "
                  "an idle GPU nobody holds is spare, not counted): paid for, producing nothing. "
                  "Ask the owners (table below) to release them, or set scheduler idle timeouts.",
                  f"sum(roofwatch_cluster:gpu_idle_allocated:sum{{{C}}})", "none")
            .thresholds(steps((None, "green"), (1, "orange"), (4, "red"))).color_mode(cm.BigValueColorMode.BACKGROUND))
        .with_panel(
            stat_panel("GPU power now",
                  "Power drawn by all GPUs (from the energy counters, 5 min rate). High power with low MFU "
                  "means energy spent on memory traffic, waiting or spinning rather than model math.",
                  f"sum(roofwatch_node:gpu_power_watts:sum_rate5m{{{C}}})", "watt")
            .thresholds(steps((None, "text"))))

        .with_row(Row("MFU"))
        .with_panel(
            dashed_series(
                timeseries_panel(
                    "Fleet MFU over time",
                    "Fleet MFU (every GPU, idle as 0) and busy-GPU MFU per cluster, against the LowMFU alert "
                    "threshold (dashed). A drop in both means the jobs changed; a drop in fleet MFU only "
                    "means GPUs went idle.",
                    "percentunit", w=12, h=8).min(0)
                .with_target(prom(f"roofwatch_cluster:gpu_mfu:avg{{{C}}}", "{{cluster}} all GPUs", ref="A"))
                .with_target(prom(f"roofwatch_cluster:gpu_mfu_busy:avg{{{C}}}", "{{cluster}} busy GPUs", ref="B"))
                .with_target(prom("roofwatch:alert_threshold:low_mfu_ratio", "target", ref="C")),
                "target"))
        .with_panel(
            timeseries_panel(
                "MFU by node",
                "Average MFU of each node's GPUs (idle as 0). A node far below its peers usually hosts "
                "idle or starved GPUs, or a straggler: open it in the Node / GPU dashboard.",
                "percentunit", w=12, h=8).min(0)
            .with_target(prom(f"roofwatch_node:gpu_mfu:avg{{{C}}}", "{{node}}")))

        .with_row(Row("Where the GPU-hours go"))
        .with_panel(gpus_by_class())
        .with_panel(gpu_hours_by_class())

        .with_row(Row("Waste"))
        .with_panel(
            timeseries_panel(
                "GPUs wasted, by kind",
                "GPUs wasted now by the agent's one definition (agent/model/waste.py, the waste label): held but "
                "idle, input-starved, communication-jittered, each counted for its whole verdict window; spare "
                "GPUs (idle, nobody holds them) apart, as capacity rather than waste. The status page, roofwatch "
                "top and the fleet report count the same GPUs.",
                "none", w=12, h=8).min(0).stacking(stacked()).fill_opacity(60).line_width(1)
            .with_target(prom(f'sum by (waste) (roofwatch_cluster:gpus_by_waste:sum{{{C}, waste=~"{WASTED}|spare"}})',
                              "{{waste}}")))
        .with_panel(
            timeseries_panel(
                "GPU-hours wasted and lost, trailing hour",
                "Two measures of the same waste over the hour before each point: whole windows (every wasted GPU "
                "counted for the whole window it was classified in, an upper bound) and the time actually lost "
                "(the share no kernel ran, or kernels waited on peers). A big gap means GPUs that are wasted only "
                "part of the time: starved or waiting, not idle.",
                "h", w=12, h=8).min(0)
            .with_target(prom(f'sum(roofwatch_cluster:gpu_waste_hours:sum_1h{{{C}, waste=~"{WASTED}"}})',
                              "whole windows", ref="A"))
            .with_target(prom(f"sum(roofwatch_cluster:gpu_lost_hours:sum_1h{{{C}}})", "time lost", ref="B")))
        .with_panel(
            timeseries_panel(
                "Idle but allocated GPUs",
                "GPUs held by a job or process while running nothing. A plateau means forgotten "
                "notebooks or jobs stuck before their first step; each GPU here costs its full hourly "
                "price.",
                "none", w=12, h=8).min(0)
            .with_target(prom(f"roofwatch_cluster:gpu_idle_allocated:sum{{{C}}}", "{{cluster}}")))
        .with_panel(
            column_link(
                table.Panel().title("Idle but allocated now").datasource(DATASOURCE).span(12).height(8)
                .description("Which GPUs are idle but held, and by which job. Contact the owner or reclaim "
                             "the allocation; the GpuIdleAllocated alert fires after 30 minutes.")
                .with_target(prom(
                    f"(roofwatch:gpu_idle_allocated:bool{{{C}}} == 1)\n"
                    f"* on (node, gpu, uuid) group_left (job_id) roofwatch_gpu_job_info{{{C}}}\n"
                    f"or on (node, gpu, uuid) (roofwatch:gpu_idle_allocated:bool{{{C}}} == 1)", instant=True, table=True))
                .with_transformation(organize(
                    {"cluster": "Cluster", "node": "Node", "gpu": "GPU", "job_id": "Job"},
                    hide=("Time", "Value", "uuid", "__name__", "job", "instance", "basis_source"))),
                "Node", link_to("roofwatch-node", "Open node", "node")))
        .with_panel(
            column_link(
                table.Panel().title("Top jobs by wasted GPU-hours").datasource(DATASOURCE).span(24).height(9)
                .description("Jobs ranked by GPU-hours wasted in the last hour (held idle, input-starved or "
                             "communication-jittered, by the agent's waste label: whole windows), with the hours "
                             "actually lost, their GPU count, MFU and energy. Start at the top: a job wasting "
                             "many GPU-hours at low MFU is the cheapest win. Click a job to open it.")
                .with_target(prom(top_jobs, instant=True, table=True, ref="A"))
                .with_target(prom(f"{lost_by_job} and on (cluster, job_id) {top_jobs}", instant=True, table=True,
                                  ref="E"))
                .with_target(prom(f"roofwatch_job:gpus:count{{{C}}} and on (cluster, job_id) {top_jobs}",
                                  instant=True, table=True, ref="B"))
                .with_target(prom(f"roofwatch_job:gpu_mfu:avg{{{C}}} and on (cluster, job_id) {top_jobs}",
                                  instant=True, table=True, ref="C"))
                .with_target(prom(f"roofwatch_job:gpu_energy_kwh:sum_1h{{{C}}} and on (cluster, job_id) {top_jobs}",
                                  instant=True, table=True, ref="D"))
                .transformations(merged())
                .with_transformation(organize(
                    {"cluster": "Cluster", "job_id": "Job", "Value #A": "Wasted GPU-hours (1h)",
                     "Value #E": "Lost GPU-hours (1h)", "Value #B": "GPUs", "Value #C": "MFU",
                     "Value #D": "Energy (1h)"}))
                .sort_by([sort_desc("Wasted GPU-hours (1h)")])
                .override_by_name("Lost GPU-hours (1h)", [unit_override("h")])
                .override_by_name("MFU", [unit_override("percentunit")])
                .override_by_name("Energy (1h)", [unit_override("kwatth")])
                .override_by_name("Wasted GPU-hours (1h)", [unit_override("h")]),
                "Job", link_to("roofwatch-job", "Open job", "job")))

        .with_panel(namespace_bill_panel())

        .with_row(Row("Energy"))
        .with_panel(
            timeseries_panel(
                "GPU power by node",
                "Power of each node's GPUs, stacked, from the energy counters. Compare with MFU: power "
                "that does not rise with MFU is spent on memory traffic or spinning kernels.",
                "watt", w=12, h=8).min(0).stacking(stacked()).fill_opacity(30)
            .with_target(prom(f"roofwatch_node:gpu_power_watts:sum_rate5m{{{C}}}", "{{node}}")))
        .with_panel(
            stat_panel("GPU energy, trailing hour",
                  "Energy all GPUs used in the last hour. Divide by delivered work (tokens, steps) for "
                  "energy per unit of work; rising energy at flat MFU is waste.",
                  f"sum(roofwatch_cluster:gpu_energy_kwh:sum_1h{{{C}}})", "kwatth", w=4)
            .height(8).thresholds(steps((None, "text"))))
        .with_panel(
            bargauge.Panel().title("Energy by job, trailing hour").datasource(DATASOURCE).span(8).height(8)
            .description("The ten jobs that used the most GPU energy in the last hour. A big consumer with "
                         "low MFU (table above) is where efficiency work pays twice.")
            .unit("kwatth").min(0).display_mode(cm.BarGaugeDisplayMode.GRADIENT)
            .orientation(cm.VizOrientation.HORIZONTAL)
            .with_target(prom(f"topk(10, roofwatch_job:gpu_energy_kwh:sum_1h{{{C}}})", "{{job_id}}", instant=True)))

        .with_row(Row("Agents"))
        .with_panel(
            timeseries_panel(
                "Snapshot age by node",
                "Seconds since each agent's served snapshot was taken. It should stay near the "
                "collection interval; a climbing line means the agent's collector is stuck "
                "(RoofwatchAgentStale fires), and every panel above shows old numbers for that node.",
                "s", w=12, h=7).min(0)
            .with_target(prom(f"time() - roofwatch_snapshot_timestamp_seconds{{{C}}}", "{{node}}")))
        .with_panel(
            timeseries_panel(
                "Failed GPU reads",
                "Failed or timed-out GPU reads per second, by node. Persistent errors mean a failing GPU "
                "or driver: the GPU is marked down and its panels go blank.",
                "reqps", w=12, h=7).min(0)
            .with_target(prom(f"sum by (node) (roofwatch_node:gpu_sample_errors:sum_rate5m{{{C}}})", "{{node}}")))
    )


def gpus_by_class(title: str = "GPUs by class") -> timeseries.Panel:
    """GPUs per workload class from the per-cluster recording: the same panel here and on the global dashboard."""
    return class_colour_overrides(
        timeseries_panel(
            title,
            "How many GPUs are in each workload class; the stacked area is GPU-hours. Compute- and "
            "memory-bound are productive; idle, input-starved and communication-jittered are GPUs "
            "waiting on something else. A growing non-productive band is the first thing to fix.",
            "none", w=12, h=8).min(0).stacking(stacked())
        .fill_opacity(60).line_width(1)
        .with_target(prom(f"sum by (class) (roofwatch_cluster:gpus:sum{{{C}}})", "{{class}}")))


def gpu_hours_by_class() -> timeseries.Panel:
    """GPU-hours per class over the trailing hour, from the per-cluster hourly recording."""
    return class_colour_overrides(
        timeseries_panel(
            "GPU-hours by class, trailing hour",
            "GPU-hours spent in each class over the hour before each point (stacked). At a steady "
            "state the total equals the GPU count. Which of them were wasted (an idle GPU nobody "
            "holds is spare, not waste) is in the Waste row below, by the agent's waste label.",
            "h", w=12, h=8).min(0).stacking(stacked())
        .fill_opacity(60).line_width(1)
        .with_target(prom(f"sum by (class) (roofwatch_cluster:gpu_hours:sum_1h{{{C}}})", "{{class}}")))


NAMESPACE_BILL = "GPU-hours, energy and waste by namespace, trailing hour"


def namespace_bill_panel() -> table.Panel:
    """Each Kubernetes namespace's share of the trailing hour: whole GPUs whole, shared GPUs by holder share
    (the roofwatch_namespace: recordings; docs/attribution.md, "The bill")."""
    ns = f"sum by (cluster, namespace) ({{metric}}{{{{{C}{{extra}}}}}})"
    return (
        table.Panel().title(NAMESPACE_BILL).datasource(DATASOURCE).span(24).height(8)
        .description("What each Kubernetes namespace held over the last hour. A whole GPU counts whole for its "
                     "pod's namespace; a shared GPU (time-sliced, a shared DRA claim) counts an equal share for "
                     "each holder the agent names on it, its energy the agent's estimate per holder, and a holder "
                     "that holds memory and runs nothing wastes its share (idle-allocated) even while the others "
                     "keep the GPU busy. GPUs and holders with no pod (MPS clients, plain processes) are in no "
                     "namespace. The fleet report bills the same shares over any period.")
        .with_target(prom(ns.format(metric="roofwatch_namespace:gpu_hours:sum_1h", extra=""),
                          instant=True, table=True, ref="A"))
        .with_target(prom(ns.format(metric="roofwatch_namespace:gpu_waste_hours:sum_1h", extra=f', waste=~"{WASTED}"'),
                          instant=True, table=True, ref="B"))
        .with_target(prom(ns.format(metric="roofwatch_namespace:gpu_energy_kwh:sum_1h", extra=""),
                          instant=True, table=True, ref="C"))
        .with_target(prom(ns.format(metric="roofwatch_namespace:gpus_by_waste:sum", extra=""),
                          instant=True, table=True, ref="D"))
        .transformations(merged())
        .with_transformation(organize(
            {"cluster": "Cluster", "namespace": "Namespace", "Value #A": "GPU-hours (1h)",
             "Value #B": "Wasted GPU-hours (1h)", "Value #C": "Energy (1h)", "Value #D": "GPUs now"}))
        .sort_by([sort_desc("GPU-hours (1h)")])
        .override_by_name("GPU-hours (1h)", [unit_override("h")])
        .override_by_name("Wasted GPU-hours (1h)", [unit_override("h")])
        .override_by_name("Energy (1h)", [unit_override("kwatth")]))


MAY_BE_EMPTY: dict[str, str] = {
    NAMESPACE_BILL: "no pod holds a GPU outside Kubernetes (the test fleet); tests/test_dashboard_shared.py fills it",
}
"""Panels allowed to show no data on a healthy fleet, with the reason."""
