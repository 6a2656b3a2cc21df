"""Inference serving: how far each model replica runs from the latency floor its GPUs allow, and why.

For whoever runs vLLM, SGLang or TGI fleets. The agent exports a replica's figures on each of its
GPUs; every panel reads the per-replica series of the recording rules (``roofwatch_server:serving_*``,
one series per cluster, node, server and model) or their per-cluster sums, never the per-GPU series,
so a tensor-parallel replica counts once and a 30,000-GPU fleet is joined once per rule evaluation,
not on every refresh. Per-server panels draw at most ten servers: the worst by what the panel shows.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import table, timeseries
from grafana_foundation_sdk.builders.dashboard import Dashboard, Row
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as model

from agent.model.attention import SERVING_ATTENTION
from agent.model.serving import SERVING_ADVICE
from dashboards.common import (
    DATASOURCE,
    DASHED,
    cluster_variable,
    column_link,
    dashed_series,
    datasource_variable,
    label_variable,
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

UID = "roofwatch-serving"
S = 'cluster=~"$cluster", model=~"$model", server=~"$server"'
"""The selection on per-server series."""
F = 'cluster=~"$cluster", model=~"$model"'
"""The selection on per-cluster series (they have no server)."""
KEY = "cluster, node, server, model"
"""What identifies a replica: servers are named by their metrics URL, often the same on every node."""
SERVER = "{{server}} on {{node}}"
UNNAMED = "(model not named)"
"""Where a server names no single model (TGI, or several models), its model label is empty."""
TOP = 10

STATE_COLOURS: dict[str, str] = {
    "at_floor": "green",
    "near_floor": "#73bf69",
    "under_batched": "orange",
    "prefill_heavy": "purple",
    "kv_saturated": "red",
    "above_floor": "yellow",
    "unknown": "#8e8e8e",
}
"""One colour per serving state (agent.model.serving.SERVING_STATES)."""

TIMES = "suffix:x"
MULTIPLE_STEPS = steps((None, "green"), (1.5, "#73bf69"), (2.5, "orange"), (4, "red"))
"""TPOT / floor: at the floor up to 1.5, near it up to 2.5 (the classifier's serving_at_floor_ratio
and serving_far_ratio), far above beyond."""


def server(metric: str, selector: str = S) -> str:
    return f"roofwatch_server:serving_{metric}{{{selector}}}"


MULTIPLE = server("tpot_floor_multiple:max")
TOKENS = server("output_tokens_per_second_per_gpu:max")
GPUS = server("gpus:count")
FILL = server("batch_fill:ratio")
RUNNING = server("requests:max", f'{S}, state="running"')
WAITING = server("requests:max", f'{S}, state="waiting"')
SATURATED = server("info:max", f'{S}, state="kv_saturated"')
PREFILL_HEAVY = server("info:max", f'{S}, state="prefill_heavy"')
NEEDS_ATTENTION = server("info:max", f'{S}, state=~"{"|".join(SERVING_ATTENTION)}"')
"""The replicas in a state that needs attention (agent.model.attention: the status page and ``top`` list the same)."""


def state_colours(panel):
    """Series named after a state (legend ``{{state}}``) take that state's colour."""
    for name, colour in STATE_COLOURS.items():
        panel = panel.override_by_name(name, [model.DynamicConfigValue(
            id_val="color", value={"mode": "fixed", "fixedColor": colour})])
    return panel


def state_mappings() -> list[model.ValueMap]:
    return [model.ValueMap(options={
        name: model.ValueMappingResult(color=colour, index=i) for i, (name, colour) in enumerate(STATE_COLOURS.items())})]


def per_server(title: str, description: str, unit: str, expr: str, *, w: int = 8) -> timeseries.Panel:
    return timeseries_panel(title, description, unit, prom(expr, SERVER), w=w).min(0)


def of_worst(expr: str, ranking: str) -> str:
    """``expr`` restricted to the servers ``ranking`` (a topk/bottomk over per-server series) picks."""
    return f"{expr}\nand on ({KEY}) {ranking}"


def build() -> Dashboard:
    far = "roofwatch:alert_threshold:serving_far_ratio"
    under = "roofwatch:alert_threshold:serving_under_batched"
    under_batched = (f"{MULTIPLE} > on () group_left () {far}\n"
                     f"and on ({KEY}) {FILL} < on () group_left () {under}\n"
                     f"unless on ({KEY}) {PREFILL_HEAVY}")
    least_filled = f"bottomk(5, {FILL})"
    furthest = f"topk(5, {MULTIPLE})"
    return (
        new_dashboard(
            UID, "roofwatch / Inference serving",
            "Each model replica's time per output token against the decode floor its GPUs allow, the "
            "batch it runs against the batch its KV cache could hold, queues, KV-cache pressure and "
            "prefill, with the agent's verdict and advice. Needs roofwatch's recording rules.",
            time_from="now-3h")
        .with_variable(datasource_variable())
        .with_variable(cluster_variable())
        .with_variable(label_variable(
            "model", "Model", 'roofwatch_serving_info{cluster=~"$cluster"}', "model",
            description="The served model, as the server names it."))
        .with_variable(label_variable(
            "server", "Server", 'roofwatch_serving_info{cluster=~"$cluster", model=~"$model"}', "server",
            description="The inference server (kind and metrics address, or the job name a client reports)."))

        .with_row(Row("Fleet now"))
        .with_panel(
            stat_panel("Servers", "Model replicas serving the selection, each counted once however many GPUs "
                       "it spans. Fewer than you deploy means agents cannot scrape some servers: check "
                       "inference_endpoints and `roofwatch doctor` on their nodes.",
                       f"count({server('info:max')})", "none", w=3)
            .thresholds(steps((None, "text"))))
        .with_panel(
            stat_panel("Serving GPUs", "GPUs whose replicas export serving figures. Divide the output tokens "
                       "by these for the fleet's tokens per GPU, the number that decides serving cost.",
                       f"sum({GPUS})", "none", w=3)
            .thresholds(steps((None, "text"))))
        .with_panel(
            stat_panel("Output tokens/s", "Tokens per second generated (decode) by all selected replicas. A "
                       "drop with steady traffic means replicas slowed down; see the states below.",
                       f"sum({TOKENS} * {GPUS})", "short", w=3)
            .thresholds(steps((None, "text"))))
        .with_panel(
            stat_panel("Tokens/s per GPU", "Output tokens per second per serving GPU, weighted by GPUs. Low "
                       "against what the model reaches elsewhere means GPUs idle between small batches: "
                       "see the under-batched and running-vs-possible panels.",
                       f"sum({TOKENS} * {GPUS}) / sum({GPUS} and {TOKENS})", "short", w=3)
            .thresholds(steps((None, "text"))))
        .with_panel(
            stat_panel("Median TPOT / floor", "Median over replicas of time per output token divided by the "
                       "decode floor (weights and KV cache read once from HBM). Up to 1.5 is at the floor; "
                       "above 2.5 most of the hardware's speed is unused.",
                       f"quantile(0.5, {MULTIPLE})", TIMES, w=3)
            .thresholds(MULTIPLE_STEPS).color_mode(cm.BigValueColorMode.BACKGROUND))
        .with_panel(
            stat_panel("Under-batched, far from floor", "Replicas now more than serving_far_ratio times their "
                       "floor with a batch under serving_under_batched of what their KV cache holds, prefill-heavy "
                       "ones aside: the ServingUnderBatched condition. Raise the batch cap or consolidate "
                       "replicas.",
                       f"count(\n{under_batched}\n) or vector(0)", "none", w=3)
            .thresholds(steps((None, "green"), (1, "orange"))).color_mode(cm.BigValueColorMode.BACKGROUND))
        .with_panel(
            stat_panel("KV-saturated", "Replicas whose KV cache is full (or preempting) with requests waiting: "
                       "they cannot admit more, so latency grows with the queue. Scale out; see "
                       "ServingKvCacheSaturated in docs/alerts.md.",
                       f"count({SATURATED}) or vector(0)", "none", w=3)
            .thresholds(steps((None, "green"), (1, "red"))).color_mode(cm.BigValueColorMode.BACKGROUND))
        .with_panel(
            stat_panel("Requests waiting", "Requests queued for admission over all selected replicas. A "
                       "steady queue means too few replicas or batch caps too low; which one the "
                       "KV-cache panel says.",
                       f"sum({WAITING})", "none", w=3)
            .thresholds(steps((None, "green"), (1, "orange"))))

        .with_row(Row("Needs attention"))
        .with_panel(
            stat_panel("Servers needing attention", "Replicas in a state with a knob to turn: KV cache saturated "
                       "with a queue, under-batched, prefill-heavy or far above their decode floor (the agent's "
                       "one definition, agent/model/attention.py: the status page and roofwatch top list the "
                       "same servers). The table beside says what to do for each.",
                       f"count({NEEDS_ATTENTION}) or vector(0)", "none", w=4)
            .height(8).thresholds(steps((None, "green"), (1, "orange"))).color_mode(cm.BigValueColorMode.BACKGROUND))
        .with_panel(attention_table())

        .with_row(Row("Fleet over time"))
        .with_panel(state_colours(
            timeseries_panel("Servers by state", "Replicas in each serving state (stacked). at_floor and near_floor "
                "are as fast as their GPUs allow; a growing under_batched, kv_saturated, prefill_heavy or "
                "above_floor band is where to act, each with its own advice (table below).", "none",
                prom(f"sum by (state) (roofwatch_cluster:serving_servers:count{{{F}}})", "{{state}}"))
            .min(0).stacking(stacked()).fill_opacity(60).line_width(1)))
        .with_panel(state_colours(
            timeseries_panel("Serving GPUs by state", "GPUs in each serving state (stacked): the area is GPU-hours, "
                "so this is what each state costs. Big replicas in a bad state weigh more here than in "
                "the server count.", "none",
                prom(f"sum by (state) (roofwatch_cluster:serving_gpus:count{{{F}}})", "{{state}}"))
            .min(0).stacking(stacked()).fill_opacity(60).line_width(1)))
        .with_panel(dashed_series(
            timeseries_panel("TPOT / floor across servers", "The median, 90th percentile and worst replica's time "
                "per output token over its decode floor, against the ServingUnderBatched threshold "
                "(dashed). A rising median means a fleet-wide change (a release, a traffic shift).", TIMES,
                prom(f"quantile(0.5, {MULTIPLE})", "median", ref="A"),
                prom(f"quantile(0.9, {MULTIPLE})", "p90", ref="B"),
                prom(f"max({MULTIPLE})", "worst", ref="C"),
                prom(far, "far above the floor", ref="D"))
            .min(0), "far above the floor"))
        .with_panel(
            timeseries_panel("Output tokens/s per GPU by model", "Output tokens per second per serving GPU for "
                f"each model ({UNNAMED}: servers that name none, or several). Compare a model with itself over "
                "time, or with what its best replicas reach: the gap is what batching and the advice below "
                "recover.", "short",
                prom(f"label_replace(\n  sum by (model) (roofwatch_cluster:serving_output_tokens_per_second:sum{{{F}}})\n"
                     f"  / sum by (model) (roofwatch_cluster:serving_gpus:count{{{F}}}),\n"
                     f'  "model", "{UNNAMED}", "model", ""\n)', "{{model}}"))
            .min(0))

        .with_row(Row("Servers: the worst ten by each panel's figure, or those picked"))
        .with_panel(dashed_series(
            timeseries_panel("TPOT / floor by server", "The ten replicas furthest above their decode floor. A "
                "line above the dashed threshold with a small batch is under-batched; with a full batch, "
                "time goes outside the weight read (CUDA graphs, CPU scheduling, sampling).", TIMES,
                prom(f"topk({TOP}, {MULTIPLE})", SERVER, ref="A"),
                prom(far, "far above the floor", ref="B"))
            .min(0), "far above the floor"))
        .with_panel(
            timeseries_panel("TPOT and decode floor", "Time per output token (solid) and the decode floor (dashed) "
                "in seconds for the five replicas furthest above it: the floor is what their GPUs need "
                "to read the weights and KV cache once; the gap is what software can still recover.", "s",
                prom(of_worst(server("time_per_output_token_seconds:max"), furthest), SERVER + " TPOT", ref="A"),
                prom(of_worst(server("decode_floor_seconds:max"), furthest), SERVER + " floor", ref="B"))
            .min(0).override_by_regexp(".* floor$", [DASHED]))
        .with_panel(
            per_server("Tokens/s per GPU by server", "The ten replicas with the fewest output tokens per second per "
                       "GPU. Low throughput at a low floor multiple is thin traffic; at a high one, the "
                       "replica wastes its GPUs.", "short", f"bottomk({TOP}, {TOKENS})", w=12))
        .with_panel(dashed_series(
            timeseries_panel("Batch fill by server", "Running batch / the batch the KV cache could hold, the ten "
                "least filled, against the under-batched mark (dashed). Low fill at a high floor "
                "multiple is the ServingUnderBatched alert.", "percentunit",
                prom(f"bottomk({TOP}, {FILL})", SERVER, ref="A"),
                prom(under, "under-batched", ref="B"))
            .min(0), "under-batched"))
        .with_panel(
            timeseries_panel("Running vs possible batch", "Running requests (solid) and the batch the KV cache could "
                "hold at current context lengths (dashed) for the five least-filled replicas. Far apart with "
                "a queue: raise max_num_seqs (SGLang: max_running_requests); with no queue, traffic is "
                "too thin for this many replicas.", "none",
                prom(of_worst(RUNNING, least_filled), SERVER + " running", ref="A"),
                prom(of_worst(server("possible_batch_requests:max"), least_filled), SERVER + " possible", ref="B"),
                w=8)
            .min(0).override_by_regexp(".* possible$", [DASHED]))
        .with_panel(
            per_server("Waiting requests by server", "Requests queued for admission at the ten longest queues. A "
                       "queue with a full KV cache needs more replicas; a queue with KV room means the batch "
                       "cap is too low.", "none", f"topk({TOP}, {WAITING})"))
        .with_panel(dashed_series(
            timeseries_panel("KV-cache usage by server", "Share of each replica's KV-cache pool in use, the ten "
                "fullest, against the full mark (dashed). Above it with a queue the replica is "
                "kv_saturated; preemptions follow.", "percentunit",
                prom(f"topk({TOP}, {server('kv_cache_usage_ratio:max')})", SERVER, ref="A"),
                prom("roofwatch:alert_threshold:serving_kv_full", "full", ref="B"), w=8)
            .min(0).max(1), "full"))
        .with_panel(
            per_server("Preemptions by server", "Requests preempted (vLLM) or retracted (SGLang) per second for lack "
                       "of KV memory, the ten highest. Each one recomputes its prompt: GPU time spent twice. "
                       "Scale out, shorten contexts or lower max_num_seqs.", "reqps",
                       f"topk({TOP}, {server('preemptions_per_second:max')})", w=12))
        .with_panel(
            per_server("Prefill share by server", "Share of GPU time spent on prompts rather than decode, the ten "
                       "highest. Above about 40% with decode above its floor, prefill stalls decode: chunk "
                       "prefill or disaggregate prefill and decode.", "percentunit",
                       f"topk({TOP}, {server('prefill_time_ratio:max')})", w=12)
            .max(1))

        .with_row(Row("Every server"))
        .with_panel(servers_table())
    )


def advice_mappings() -> list[model.ValueMap]:
    """Advice code -> what to do, as agent.model.attention words it (docs/serving.md)."""
    return [model.ValueMap(options={
        SERVING_ADVICE[state]: model.ValueMappingResult(text=words, index=i)  # type: ignore[index]
        for i, (state, words) in enumerate(SERVING_ATTENTION.items())})]


def server_table(title: str, description: str, targets: dict[str, str], rename: dict[str, str],
                 units: dict[str, str], *, w: int = 24, h: int = 10) -> table.Panel:
    """A table of replicas, one row each (target A: their info series), furthest above the floor first: the state
    coloured, each figure in its unit, a click on a server showing only it."""
    panel = table.Panel().title(title).datasource(DATASOURCE).span(w).height(h).description(description)
    for ref, expr in targets.items():
        panel = panel.with_target(prom(expr, instant=True, table=True, ref=ref))
    panel = (panel.transformations(merged())
             .with_transformation(organize(
                 {"server": "Server", "node": "Node", "model": "Model", "state": "State", **rename, "cluster": "Cluster"},
                 hide=("Time", "Value #A", "__name__", "job", "instance")))
             .sort_by([sort_desc("TPOT / floor")])
             .override_by_name("State", [
                 model.DynamicConfigValue(id_val="mappings", value=state_mappings()),
                 model.DynamicConfigValue(id_val="custom.cellOptions", value={"type": "color-text"})]))
    for column, unit in units.items():
        panel = panel.override_by_name(column, [unit_override(unit)])
    return column_link(panel, "Server", link_to(UID, "Show only this server", "server"))


def attention_table() -> table.Panel:
    """The replicas that need attention, each with its state, the figures that decided it and what to do."""
    def of_needs(expr: str) -> str:
        return f"{expr}\nand on ({KEY}) {NEEDS_ATTENTION}"
    targets = {
        "A": NEEDS_ATTENTION, "B": of_needs(MULTIPLE),
        "C": of_needs(f"max by ({KEY}) ({WAITING})"),
        "D": of_needs(server("kv_cache_usage_ratio:max")), "E": of_needs(server("prefill_time_ratio:max")),
        "F": of_needs(FILL), "G": of_needs(GPUS),
    }
    panel = server_table(
        "Servers that need attention",
        "Each replica in a state that needs attention, with the figure that decided it: KV cache usage and waiting "
        "requests (kv_saturated: scale out), batch fill with requests waiting or the batch at its cap (under_batched: "
        "raise the batch cap), the prefill share (prefill_heavy: chunk or disaggregate prefill), the floor multiple "
        "(above_floor: profile a step). What to do is the advice of docs/serving.md. Click a server to show only it.",
        targets,
        {"advice": "What to do", "Value #B": "TPOT / floor", "Value #C": "Waiting", "Value #D": "KV cache",
         "Value #E": "Prefill", "Value #F": "Batch fill", "Value #G": "GPUs"},
        {"TPOT / floor": TIMES, "KV cache": "percentunit", "Prefill": "percentunit", "Batch fill": "percentunit"},
        w=20, h=8)
    return panel.override_by_name("What to do", [model.DynamicConfigValue(id_val="mappings", value=advice_mappings())])


def servers_table() -> table.Panel:
    """Every selected replica with its verdict, advice and figures, furthest above its floor first."""
    one = lambda metric, selector=S: f"max by ({KEY}) ({server(metric, selector)})"  # noqa: E731
    targets = {
        "A": server("info:max"), "B": GPUS, "C": MULTIPLE, "D": server("time_per_output_token_seconds:max"),
        "E": server("decode_floor_seconds:max"), "F": TOKENS,
        "G": one("requests:max", f'{S}, state="running"'), "H": server("possible_batch_requests:max"),
        "I": one("requests:max", f'{S}, state="waiting"'), "J": server("kv_cache_usage_ratio:max"),
        "K": server("prefill_time_ratio:max"), "L": server("preemptions_per_second:max"),
    }
    panel = server_table(
        "Servers now",
        "Every selected replica with the agent's verdict and advice code, furthest above its floor first. The "
        "advice: raise_batch (raise the batch cap), scale_out (more replicas), chunk_or_disaggregate_prefill, "
        "find_overhead (CUDA graphs, CPU), faster_memory_or_fewer_bytes (at the floor: quantise), report_model_bytes "
        "(the agent cannot compute a floor). Click a server to show only it, a node to open it.",
        targets,
        {"advice": "Advice", "Value #B": "GPUs", "Value #C": "TPOT / floor", "Value #D": "TPOT", "Value #E": "Floor",
         "Value #F": "Tokens/s per GPU", "Value #G": "Running", "Value #H": "Possible batch", "Value #I": "Waiting",
         "Value #J": "KV cache", "Value #K": "Prefill", "Value #L": "Preemptions/s"},
        {"TPOT / floor": TIMES, "TPOT": "s", "Floor": "s", "Tokens/s per GPU": "short", "KV cache": "percentunit",
         "Prefill": "percentunit", "Preemptions/s": "reqps"})
    return column_link(panel, "Node", link_to("roofwatch-node", "Open node", "node"))


MAY_BE_EMPTY: dict[str, str] = {}
"""Panels allowed to show no data for a fleet that serves, with the reason (none here)."""
