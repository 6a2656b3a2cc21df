"""Building blocks shared by the roofwatch dashboards.

Every dashboard reads Prometheus through the ``datasource`` template variable (never a fixed
uid, so an import works against any Prometheus), filters with the same variables, and colours
the seven workload classes the same way. Keeping those here means a fix reaches every panel.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import stat, timeseries
from grafana_foundation_sdk.builders.dashboard import (
    Dashboard,
    DashboardLink,
    DatasourceVariable,
    QueryVariable,
    ThresholdsConfig,
)
from grafana_foundation_sdk.builders.prometheus import Dataquery
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from agent.model import WORKLOAD_CLASSES
from agent.model.waste import WASTE_KINDS

DATASOURCE = model.DataSourceRef(type_val="prometheus", uid="${datasource}")
TAGS = ["roofwatch", "gpu"]

CLASS_COLOURS: dict[str, str] = {
    "idle": "#8e8e8e",
    "compute_bound": "green",
    "memory_bound": "blue",
    "input_starved": "orange",
    "communication_jittered": "purple",
    "latency_bound": "yellow",
    "unknown": "#4a4a4a",
}
"""One colour per class on every panel, so a colour means the same thing everywhere."""

WASTED = "|".join(WASTE_KINDS)
"""The ``waste`` label values of a wasted GPU (agent.model.waste: the one definition every panel counts by)."""

CLASS_CODES: dict[str, int] = {name: code for code, name in enumerate(WORKLOAD_CLASSES, start=1)}
"""A state timeline needs a number per state: the class's position in the model's list."""


# What the regex-valued variables match when "All" is picked: every value, and series that lack
# the label altogether (a Prometheus without a cluster label still fills every panel).
ALL = ".*"


# --- queries -------------------------------------------------------------------------------

def prom(expr: str, legend: str = "", *, ref: str = "A", instant: bool = False, table: bool = False) -> Dataquery:
    """One PromQL target. ``table`` asks for Grafana's table format (one row per series)."""
    query = Dataquery().expr(expr).ref_id(ref).datasource(DATASOURCE)
    if legend:
        query = query.legend_format(legend)
    if instant:
        query = query.instant()
    else:
        query = query.range()
    if table:
        query = query.format(PromQueryFormat.TABLE)
    return query


def by_job(expr: str, job_selector: str) -> str:
    """Attach ``job_id`` to a per-GPU expression and keep only the selected jobs' GPUs."""
    return f"({expr})\n* on (node, gpu, uuid) group_left (job_id)\nroofwatch_gpu_job_info{{{job_selector}}}"


def class_code_expr(selector: str) -> str:
    """The code of each GPU's current class (see CLASS_CODES), one series per GPU.

    The class is a one-hot label set; weighting each class's series by its code and summing
    leaves exactly the active class's code, which a state timeline maps back to a name.
    """
    parts = [f'roofwatch_gpu_workload_class{{class="{name}", {selector}}} * {code}'
             for name, code in CLASS_CODES.items()]
    return "sum by (node, gpu) (\n  " + "\n  or ".join(parts) + "\n)"


# --- panels --------------------------------------------------------------------------------

def stat_panel(title: str, description: str, expr: str, unit: str, *, w: int = 4) -> stat.Panel:
    """A single number (instant query), no sparkline: the value now is the point."""
    return (stat.Panel().title(title).description(description).datasource(DATASOURCE)
            .span(w).height(4).unit(unit).graph_mode(cm.BigValueGraphMode.NONE)
            .with_target(prom(expr, instant=True)))


def timeseries_panel(title: str, description: str, unit: str, *targets: Dataquery,
                     w: int = 12, h: int = 8) -> timeseries.Panel:
    panel = (timeseries.Panel().title(title).description(description).datasource(DATASOURCE)
             .span(w).height(h).unit(unit))
    for target in targets:
        panel = panel.with_target(target)
    return panel


# --- field configuration -------------------------------------------------------------------

def class_mappings() -> list[model.ValueMap]:
    """State timeline mappings: class code -> class name in its colour."""
    return [model.ValueMap(options={
        str(code): model.ValueMappingResult(text=name, color=CLASS_COLOURS[name], index=code - 1)
        for name, code in CLASS_CODES.items()
    })]


def class_colour_overrides(panel: Any) -> Any:
    """Series named after a class (legend ``{{class}}``) take that class's colour."""
    for name, colour in CLASS_COLOURS.items():
        panel = panel.override_by_name(name, [model.DynamicConfigValue(
            id_val="color", value={"mode": "fixed", "fixedColor": colour})])
    return panel


def steps(*pairs: tuple[float | None, str]) -> ThresholdsConfig:
    """Absolute threshold steps: ``(None, base colour), (value, colour), ...``."""
    return ThresholdsConfig().mode(model.ThresholdsMode.ABSOLUTE).steps(
        [model.Threshold(value=value, color=colour) for value, colour in pairs])


MFU_STEPS = steps((None, "red"), (0.2, "orange"), (0.4, "green"))
"""MFU colours: below 20% is poor, the practical target is 40% (docs/classification.md)."""

BAD_HIGH_STEPS = steps((None, "green"), (0.15, "orange"), (0.3, "red"))
"""For ratios where more is worse (skew, straggler lead, jitter)."""

DASHED = model.DynamicConfigValue(id_val="custom.lineStyle", value={"fill": "dash", "dash": [10, 10]})


def stacked() -> cb.StackingConfig:
    return cb.StackingConfig().mode(cm.StackingMode.NORMAL)


def sort_desc(column: str) -> cb.TableSortByFieldState:
    return cb.TableSortByFieldState().display_name(column).desc(True)


def unit_override(unit: str) -> model.DynamicConfigValue:
    return model.DynamicConfigValue(id_val="unit", value=unit)


def dashed_series(panel: Any, name: str) -> Any:
    """Draw the series ``name`` dashed: a reference line (a limit, a target), not a measurement."""
    return panel.override_by_name(name, [DASHED, model.DynamicConfigValue(id_val="custom.fillOpacity", value=0)])


def link_to(dashboard_uid: str, title: str, variable: str) -> list[dict[str, object]]:
    """Links for a table column whose cells name a node or job: open that node's or job's dashboard.

    ``${__value.raw}`` is the clicked cell itself, so the link survives column renames.
    """
    return [{
        "title": title,
        "url": f"/d/{dashboard_uid}?${{datasource:queryparam}}&${{cluster:queryparam}}"
               f"&var-{variable}=${{__value.raw}}&${{__url_time_range}}",
    }]


def column_link(panel: Any, column: str, links: list[dict[str, object]]) -> Any:
    return panel.override_by_name(column, [model.DynamicConfigValue(id_val="links", value=links)])


def organize(rename: dict[str, str], hide: Iterable[str] = ("Time",)) -> model.DataTransformerConfig:
    """Rename the columns a table shows and hide the ones nobody needs."""
    order = {name: i for i, name in enumerate(rename)}
    return model.DataTransformerConfig(id_val="organize", options={
        "excludeByName": {name: True for name in hide},
        "indexByName": order,
        "renameByName": rename,
    })


def merged(*refs: str) -> list[model.DataTransformerConfig]:
    """Merge table results into one row per label set: all queries, or each group of ``refs``.

    Grafana's merge pairs rows on every column the frames share, and table-format results keep
    the ``__name__`` label, which differs between metrics: left in, it splits each GPU into one
    row per metric. So the metric name goes first (tests/test_dashboard_transforms.py runs these
    through Grafana's own transformation code).
    """
    drop_name = model.DataTransformerConfig(id_val="organize", options={
        "excludeByName": {"__name__": True}, "indexByName": {}, "renameByName": {}})
    merges = []
    for group in refs or (None,):
        config = model.DataTransformerConfig(id_val="merge", options={})
        if group:
            config.filter_val = model.MatcherConfig(id_val="byRefId", options=f"/^({group})$/")
        merges.append(config)
    return [drop_name, *merges]


# --- variables -----------------------------------------------------------------------------

def datasource_variable() -> DatasourceVariable:
    return (DatasourceVariable("datasource").label("Data source").type("prometheus")
            .description("The Prometheus that scrapes the roofwatch agents and loads roofwatch-rules.yml."))


def label_variable(name: str, label: str, metric: str, prom_label: str, *, description: str,
                   multi: bool = True, include_all: bool = True) -> QueryVariable:
    """A variable listing the values of ``prom_label`` on ``metric`` (Grafana's label_values)."""
    variable = (
        QueryVariable(name).label(label).description(description).datasource(DATASOURCE)
        .query({"qryType": 1, "query": f"label_values({metric}, {prom_label})",
                "refId": "PrometheusVariableQueryEditor-VariableQuery"})
        .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(model.VariableSort.ALPHABETICAL_ASC)
        .multi(multi).include_all(include_all)
    )
    if include_all:
        variable = variable.all_value(ALL)
    return variable


def cluster_variable() -> QueryVariable:
    return label_variable(
        "cluster", "Cluster", "roofwatch_gpu_info", "cluster",
        description="The cluster label your Prometheus adds (external or target label); "
                    "'All' also matches series without one.")


def node_variable(*, multi: bool) -> QueryVariable:
    return label_variable(
        "node", "Node", 'roofwatch_gpu_info{cluster=~"$cluster"}', "node",
        description="The node (the agent's node label).", multi=multi, include_all=multi)


def gpu_variable() -> QueryVariable:
    return label_variable(
        "gpu", "GPU", 'roofwatch_gpu_info{cluster=~"$cluster", node=~"$node"}', "gpu",
        description="GPU index on the node (MIG instances are listed as GPU/instance).")


def job_variable() -> QueryVariable:
    return label_variable(
        "job", "Job", 'roofwatch_gpu_job_info{cluster=~"$cluster"}', "job_id",
        description="The job holding the GPUs (Slurm job, pod, or what the workload reports).",
        multi=False, include_all=False)


def job_node_variable() -> QueryVariable:
    """The selected job's nodes, hidden, always All (expanded to ``(node-a|node-b)``, no catch-all).

    Per-GPU panels select ``node=~"$job_node"`` before joining ``roofwatch_gpu_job_info``:
    PromQL evaluates both sides of a join in full, so without it every GPU of the fleet is read
    (over the whole range) and joined, then all but the job's dropped.
    """
    return (
        QueryVariable("job_node").label("Job nodes")
        .description("The nodes the selected job runs on (hidden): narrows per-GPU queries before the join.")
        .datasource(DATASOURCE)
        .query({"qryType": 1, "query": 'label_values(roofwatch_gpu_job_info{cluster=~"$cluster", job_id=~"$job"}, node)',
                "refId": "PrometheusVariableQueryEditor-VariableQuery"})
        .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(model.VariableSort.ALPHABETICAL_ASC)
        .multi(True).include_all(True).hide(model.VariableHide.HIDE_VARIABLE)
    )


# --- dashboards ----------------------------------------------------------------------------

def new_dashboard(uid: str, title: str, description: str, *, time_from: str) -> Dashboard:
    """A roofwatch dashboard: tags, refresh, time range and links to its siblings."""
    return (
        Dashboard(title).uid(uid).description(description).tags(TAGS)
        .refresh("30s").time(time_from, "now").timezone("browser")
        .tooltip(model.DashboardCursorSync.CROSSHAIR)
        .editable()
        .link(DashboardLink("roofwatch").type(model.DashboardLinkType.DASHBOARDS).tags(["roofwatch"])
              .as_dropdown(True).include_vars(True).keep_time(True))
    )


def encode(dashboard: Dashboard) -> str:
    """The dashboard as committed JSON: stable key order, panel ids numbered in layout order."""
    built = dashboard.build()
    for number, panel in enumerate(built.panels or [], start=1):
        panel.id_val = number
    return JSONEncoder(sort_keys=True, indent=2).encode(built) + "\n"


def as_dict(dashboard: Dashboard) -> dict[str, Any]:
    return json.loads(encode(dashboard))
