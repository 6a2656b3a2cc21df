"""Global fleet: every cluster side by side, from the aggregates alone.

For whoever answers for a fleet of many clusters (25,000 to 200,000 GPUs). It runs against the global
store of docs/deploy.md, "The global layer", which holds only what each cluster's own rule evaluation
writes per cluster, per job and per namespace (the ``roofwatch_cluster:``, ``roofwatch_job:`` and
``roofwatch_namespace:`` families that deploy/prometheus/remote-write-global.yml lets through): every
query here reads only those, never a per-GPU, per-node or per-server series, so a panel reads a few
thousand series however many GPUs the fleet has (tests/test_global_dashboard.py holds both). Per-GPU
drill-down is each cluster's own store: the cluster column opens the Cluster efficiency dashboard on the
Grafana data source named after that cluster.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import bargauge, table
from grafana_foundation_sdk.builders.dashboard import Dashboard, Row, TextBoxVariable
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as model

from dashboards.common import (
    DATASOURCE,
    MFU_STEPS,
    WASTED,
    column_link,
    datasource_variable,
    label_variable,
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
from dashboards.cluster import gpu_hours_by_class, gpus_by_class
from dashboards.serving import state_colours

UID = "roofwatch-global"
C = 'cluster=~"$cluster"'
PRICE = "$price"
DEFAULT_PRICE = "2"
"""USD per GPU-hour until someone types theirs: the fleet report's assumed default
(agent/views/fleet_report/data.py, DEFAULT_COST_PER_GPU_HOUR), which the dashboards' layer cannot import."""
TOP = 25

GPUS = f"sum by (cluster) (roofwatch_cluster:gpus:sum{{{C}}})"
WASTED_NOW = f'sum by (cluster) (roofwatch_cluster:gpus_by_waste:sum{{{C}, waste=~"{WASTED}"}})'
JOB_WASTED = f'sum by (cluster, job_id) (roofwatch_job:gpu_waste_hours:sum_1h{{{C}, waste=~"{WASTED}"}})'
NS_WASTED = f'sum by (cluster, namespace) (roofwatch_namespace:gpu_waste_hours:sum_1h{{{C}, waste=~"{WASTED}"}})'


def drill_down() -> list[dict[str, object]]:
    """The cluster's own Cluster efficiency dashboard, on the data source named after the cluster."""
    return [{"title": "Open the cluster (its own store)",
             "url": "/d/roofwatch-cluster?var-datasource=${__value.raw}&var-cluster=${__value.raw}&${__url_time_range}"}]


def weighted_mfu(family: str) -> str:
    """The fleet's MFU from each cluster's mean, weighted by the cluster's GPUs (a mean of means would let a
    small cluster count as much as a big one)."""
    return (f"sum(roofwatch_cluster:{family}{{{C}}} * on (cluster) {GPUS})\n"
            f"/ sum({GPUS} and on (cluster) roofwatch_cluster:{family}{{{C}}})")


def build() -> Dashboard:
    top_jobs = f"topk({TOP}, {JOB_WASTED})"
    return (
        new_dashboard(
            UID, "roofwatch / Global fleet",
            "Every cluster side by side from the aggregates each cluster sends to the global store: fleet "
            "efficiency, the worst jobs anywhere, waste and its cost by namespace, the serving fleet. Point the "
            "data source at the global store (docs/deploy.md, \"The global layer\"); drill down per cluster.",
            time_from="now-24h")
        .with_variable(datasource_variable().description(
            "The global store holding every cluster's aggregates (docs/deploy.md, \"The global layer\")."))
        .with_variable(label_variable(
            "cluster", "Cluster", "roofwatch_cluster:gpus:sum", "cluster",
            description="The clusters whose aggregates reach the global store."))
        .with_variable(
            TextBoxVariable("price").label("USD per GPU-hour").default_value(DEFAULT_PRICE)
            .current(model.VariableOption(text=DEFAULT_PRICE, value=DEFAULT_PRICE))
            .description("What a GPU-hour costs you, for the cost columns (roofwatch fleet-report prices by model)."))

        .with_row(Row("Fleet now"))
        .with_panel(
            stat_panel("GPUs", "GPUs reporting in every selected cluster (each cluster's own count, sent as an "
                       "aggregate). Fewer than you own means a cluster's agents, its rules or its remote write "
                       "to the global store are down: see Clusters reporting.",
                       f"sum({GPUS})", "none")
            .thresholds(steps((None, "text"))))
        .with_panel(
            stat_panel("Clusters reporting", "Clusters whose aggregates reached the global store in the last five "
                       "minutes. One missing: its rule evaluation or its remote write stopped (check that "
                       "cluster's Prometheus or vmagent queue); its own store still has its data.",
                       f"count({GPUS})", "none")
            .thresholds(steps((None, "text"))))
        .with_panel(
            stat_panel("Fleet MFU", "Model FLOPs utilisation over every GPU of every cluster, idle ones as 0, "
                       "each cluster weighted by its GPUs. Against a practical target of 40%; the clusters "
                       "table below says which cluster pulls it down.",
                       weighted_mfu("gpu_mfu:avg"), "percentunit")
            .thresholds(MFU_STEPS).color_mode(cm.BigValueColorMode.BACKGROUND))
        .with_panel(
            stat_panel("MFU of busy GPUs", "MFU over GPUs that are not idle, each cluster weighted by its GPUs: "
                       "how well the running work uses its GPUs. Far above Fleet MFU means idle capacity; low "
                       "means the jobs themselves are inefficient (worst jobs below).",
                       weighted_mfu("gpu_mfu_busy:avg"), "percentunit")
            .thresholds(MFU_STEPS).color_mode(cm.BigValueColorMode.BACKGROUND))
        .with_panel(
            stat_panel("GPUs wasted now", "GPUs held idle, input-starved or communication-jittered now, by the "
                       "agent's one definition of waste, over every cluster. Which jobs and namespaces they "
                       "belong to is below.",
                       f"sum({WASTED_NOW})", "none")
            .thresholds(steps((None, "green"), (1, "orange"))).color_mode(cm.BigValueColorMode.BACKGROUND))
        .with_panel(
            stat_panel("Waste cost per hour", "What the wasted GPUs cost per hour at the price set above (USD "
                       "per GPU-hour): the money a fix of the worst jobs and namespaces would save.",
                       f"sum({WASTED_NOW}) * {PRICE}", "currencyUSD")
            .thresholds(steps((None, "text"))))

        .with_row(Row("Clusters side by side"))
        .with_panel(
            column_link(
                table.Panel().title("Clusters").datasource(DATASOURCE).span(24).height(8)
                .description("Each cluster now: GPUs, MFU (all GPUs and busy ones), GPUs wasted and held idle, "
                             "the wasted GPU-hours of the last hour and what they cost, and its energy. A cluster "
                             "far below the others is where to look first; click it to open its own store's "
                             "Cluster efficiency dashboard (per node and per GPU).")
                .with_target(prom(GPUS, instant=True, table=True, ref="A"))
                .with_target(prom(f"roofwatch_cluster:gpu_mfu:avg{{{C}}}", instant=True, table=True, ref="B"))
                .with_target(prom(f"roofwatch_cluster:gpu_mfu_busy:avg{{{C}}}", instant=True, table=True, ref="C"))
                .with_target(prom(WASTED_NOW, instant=True, table=True, ref="D"))
                .with_target(prom(f"sum by (cluster) (roofwatch_cluster:gpu_idle_allocated:sum{{{C}}})",
                                  instant=True, table=True, ref="E"))
                .with_target(prom(f'sum by (cluster) (roofwatch_cluster:gpu_waste_hours:sum_1h{{{C}, waste=~"{WASTED}"}})'
                                  f" * {PRICE}", instant=True, table=True, ref="F"))
                .with_target(prom(f"roofwatch_cluster:gpu_energy_kwh:sum_1h{{{C}}}", instant=True, table=True, ref="G"))
                .transformations(merged())
                .with_transformation(organize(
                    {"cluster": "Cluster", "Value #A": "GPUs", "Value #B": "MFU", "Value #C": "MFU (busy)",
                     "Value #D": "Wasted GPUs", "Value #E": "Idle but allocated", "Value #F": "Waste cost (1h)",
                     "Value #G": "Energy (1h)"}))
                .sort_by([sort_desc("Waste cost (1h)")])
                .override_by_name("MFU", [unit_override("percentunit")])
                .override_by_name("MFU (busy)", [unit_override("percentunit")])
                .override_by_name("Waste cost (1h)", [unit_override("currencyUSD")])
                .override_by_name("Energy (1h)", [unit_override("kwatth")]),
                "Cluster", drill_down()))
        .with_panel(
            timeseries_panel(
                "MFU of busy GPUs by cluster",
                "Each cluster's MFU over its busy GPUs through the period. A cluster that drops while the others "
                "hold had a change of its own: a new job mix, a driver, a fabric problem.",
                "percentunit", w=12, h=8).min(0)
            .with_target(prom(f"roofwatch_cluster:gpu_mfu_busy:avg{{{C}}}", "{{cluster}}")))
        .with_panel(
            timeseries_panel(
                "Share of GPUs wasted by cluster",
                "Wasted GPUs over all GPUs, per cluster. A cluster wasting a larger share than its peers has idle "
                "allocations or starved jobs its scheduler or its storage could fix.",
                "percentunit", w=12, h=8).min(0)
            .with_target(prom(f"{WASTED_NOW} / {GPUS}", "{{cluster}}")))

        .with_row(Row("Where the GPU-hours go"))
        .with_panel(gpus_by_class("GPUs by class, whole fleet"))
        .with_panel(gpu_hours_by_class())

        .with_row(Row("Worst jobs across clusters"))
        .with_panel(
            table.Panel().title("Worst jobs anywhere").datasource(DATASOURCE).span(24).height(10)
            .description(f"The {TOP} jobs of any cluster that wasted the most GPU-hours in the last hour (held idle, "
                         "input-starved or communication-jittered, whole windows), with the hours actually lost, "
                         "their GPUs, MFU and the waste's cost. A job wasting many GPU-hours at low MFU is the "
                         "cheapest win; open it in its cluster's Job dashboard.")
            .with_target(prom(top_jobs, instant=True, table=True, ref="A"))
            .with_target(prom(f"sum by (cluster, job_id) (roofwatch_job:gpu_lost_hours:sum_1h{{{C}}})"
                              f" and on (cluster, job_id) {top_jobs}", instant=True, table=True, ref="B"))
            .with_target(prom(f"roofwatch_job:gpus:count{{{C}}} and on (cluster, job_id) {top_jobs}",
                              instant=True, table=True, ref="C"))
            .with_target(prom(f"roofwatch_job:gpu_mfu:avg{{{C}}} and on (cluster, job_id) {top_jobs}",
                              instant=True, table=True, ref="D"))
            .with_target(prom(f"{top_jobs} * {PRICE}", instant=True, table=True, ref="E"))
            .transformations(merged())
            .with_transformation(organize(
                {"cluster": "Cluster", "job_id": "Job", "Value #A": "Wasted GPU-hours (1h)",
                 "Value #B": "Lost GPU-hours (1h)", "Value #C": "GPUs", "Value #D": "MFU",
                 "Value #E": "Waste cost (1h)"}))
            .sort_by([sort_desc("Wasted GPU-hours (1h)")])
            .override_by_name("Wasted GPU-hours (1h)", [unit_override("h")])
            .override_by_name("Lost GPU-hours (1h)", [unit_override("h")])
            .override_by_name("MFU", [unit_override("percentunit")])
            .override_by_name("Waste cost (1h)", [unit_override("currencyUSD")]))
        .with_panel(
            bargauge.Panel().title("Peak unused by the biggest jobs").datasource(DATASOURCE).span(24).height(8)
            .description("GPUs' worth of peak compute each job leaves unused now: its GPUs x (1 - its MFU), the ten "
                         "largest anywhere. A big job at low MFU wastes more here than a small idle one; its "
                         "owners are who to talk to about kernels, batch size and overlap.")
            .unit("none").min(0).display_mode(cm.BarGaugeDisplayMode.GRADIENT)
            .orientation(cm.VizOrientation.HORIZONTAL)
            .with_target(prom(f"topk(10, roofwatch_job:gpus:count{{{C}}} * on (cluster, job_id) "
                              f"(1 - roofwatch_job:gpu_mfu:avg{{{C}}}))", "{{cluster}} / {{job_id}}", instant=True)))

        .with_row(Row("Waste and its cost by namespace"))
        .with_panel(
            table.Panel().title("Waste by namespace").datasource(DATASOURCE).span(14).height(9)
            .description("Per Kubernetes namespace in each cluster: GPUs its pods hold, those wasted now, the wasted "
                         "GPU-hours of the last hour and their cost at the price above. The namespace is the team "
                         "to ask; GPUs outside Kubernetes are counted per cluster and per job, not here.")
            .with_target(prom(f"sum by (cluster, namespace) (roofwatch_namespace:gpus_by_waste:sum{{{C}}})",
                              instant=True, table=True, ref="A"))
            .with_target(prom(f'sum by (cluster, namespace) (roofwatch_namespace:gpus_by_waste:sum{{{C}, '
                              f'waste=~"{WASTED}"}})', instant=True, table=True, ref="B"))
            .with_target(prom(NS_WASTED, instant=True, table=True, ref="C"))
            .with_target(prom(f"{NS_WASTED} * {PRICE}", instant=True, table=True, ref="D"))
            .transformations(merged())
            .with_transformation(organize(
                {"cluster": "Cluster", "namespace": "Namespace", "Value #A": "GPUs", "Value #B": "Wasted GPUs",
                 "Value #C": "Wasted GPU-hours (1h)", "Value #D": "Waste cost (1h)"}))
            .sort_by([sort_desc("Waste cost (1h)")])
            .override_by_name("Wasted GPU-hours (1h)", [unit_override("h")])
            .override_by_name("Waste cost (1h)", [unit_override("currencyUSD")]))
        .with_panel(
            timeseries_panel(
                "Waste cost by namespace, trailing hour",
                "What each namespace's wasted GPU-hours of the last hour cost, the ten dearest over all clusters. "
                "A namespace that stays on top is a team whose jobs hold GPUs they do not use.",
                "currencyUSD", w=10, h=9).min(0)
            .with_target(prom(f"topk(10, sum by (namespace) ({NS_WASTED}) * {PRICE})", "{{namespace}}")))

        .with_row(Row("Serving fleet"))
        .with_panel(state_colours(
            timeseries_panel(
                "Serving replicas by state",
                "Inference replicas in each serving state over every cluster (stacked). A growing under_batched, "
                "kv_saturated, prefill_heavy or above_floor band is where the serving fleet loses tokens per GPU; "
                "the cluster's Inference serving dashboard names the replicas.",
                "none", w=8, h=8).min(0).stacking(stacked()).fill_opacity(60).line_width(1)
            .with_target(prom(f"sum by (state) (roofwatch_cluster:serving_servers:count{{{C}}})", "{{state}}"))))
        .with_panel(
            timeseries_panel(
                "Output tokens/s by model",
                "Tokens per second generated by every replica of each model, over all clusters. A drop at steady "
                "traffic means replicas slowed down (see the states beside).",
                "short", w=8, h=8).min(0)
            .with_target(prom(f"sum by (model) (roofwatch_cluster:serving_output_tokens_per_second:sum{{{C}}})",
                              "{{model}}")))
        .with_panel(
            timeseries_panel(
                "Tokens/s per serving GPU by cluster",
                "Output tokens per second over the GPUs serving them, per cluster: the number serving cost "
                "follows. A cluster below its peers on the same models batches less or runs slower GPUs.",
                "short", w=8, h=8).min(0)
            .with_target(prom(f"sum by (cluster) (roofwatch_cluster:serving_output_tokens_per_second:sum{{{C}}})\n"
                              f"/ sum by (cluster) (roofwatch_cluster:serving_gpus:count{{{C}}})", "{{cluster}}")))

        .with_row(Row("Energy"))
        .with_panel(
            timeseries_panel(
                "GPU energy by cluster, trailing hour",
                "Energy each cluster's GPUs used in the hour before each point. Rising energy at flat MFU is "
                "power spent on memory traffic, waiting or spinning.",
                "kwatth", w=24, h=7).min(0).stacking(stacked()).fill_opacity(30)
            .with_target(prom(f"roofwatch_cluster:gpu_energy_kwh:sum_1h{{{C}}}", "{{cluster}}")))
    )


MAY_BE_EMPTY: dict[str, str] = {}
"""Panels allowed to show no data on a healthy fleet, with the reason (none here)."""
