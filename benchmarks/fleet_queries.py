"""What the fleet benchmark asks Prometheus: the shipped rules and every dashboard panel query.

Rules come from deploy/prometheus/roofwatch-rules.yml as shipped; the panel queries from the
generated dashboards/roofwatch-*.json, with Grafana's template variables replaced by real values
of the synthesized fleet (the cluster variable at "All", the way a fleet view is opened).
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "deploy" / "prometheus" / "roofwatch-rules.yml"
GLOBAL_DASHBOARD = ROOT / "dashboards" / "roofwatch-global.json"
"""Reads the global store of many clusters' aggregates, not one cluster's store: timed by benchmarks/global_layer.py."""
DASHBOARDS = sorted(p for p in (ROOT / "dashboards").glob("roofwatch-*.json") if p != GLOBAL_DASHBOARD)
MAX_POINTS = 1100
"""Grafana's step is the range over the panel's width in pixels (about 1,100 on a wide screen),
never below the scrape interval."""


@dataclasses.dataclass(frozen=True)
class Rule:
    group: str
    interval_s: float
    name: str  # the recorded series or the alert
    expr: str
    recording: bool


def rules(path: Path = RULES, default_interval_s: float = 30.0) -> list[Rule]:
    """Every rule of the file in group order (Prometheus evaluates a group's rules in turn)."""
    out = []
    for group in yaml.safe_load(path.read_text())["groups"]:
        interval = _seconds(group.get("interval")) or default_interval_s
        for rule in group["rules"]:
            out.append(Rule(group["name"], interval, rule.get("record") or rule["alert"], rule["expr"],
                            "record" in rule))
    return out


def levels(all_rules: list[Rule]) -> list[list[Rule]]:
    """Recording rules by dependency depth: level k reads only raw series and levels below k.

    promtool's rule backfill queries a Prometheus that must already hold what a rule reads, so
    each level is backfilled (and loaded) before the next one.
    """
    recording = [r for r in all_rules if r.recording]
    names = {r.name for r in recording}
    depth: dict[str, int] = {}
    while len(depth) < len(recording):
        progressed = False
        for r in recording:
            if r.name in depth:
                continue
            reads = {n for n in names if re.search(rf"(?<![\w:]){re.escape(n)}(?![\w:])", r.expr)} - {r.name}
            if reads <= depth.keys():
                depth[r.name] = 1 + max((depth[n] for n in reads), default=-1)
                progressed = True
        if not progressed:
            raise ValueError(f"recording rules read each other in a cycle: {sorted(names - depth.keys())}")
    out: list[list[Rule]] = [[] for _ in range(max(depth.values(), default=-1) + 1)]
    seen: set[str] = set()
    for r in recording:
        if r.name not in seen:  # a name recorded twice is one series; backfill it once per level
            out[depth[r.name]].append(r)
        seen.add(r.name)
    return out


def rule_file(chosen: list[Rule], path: Path) -> Path:
    """A rule file holding only ``chosen`` (one group), for promtool's rule backfill."""
    body = {"groups": [{"name": "backfill", "rules": [{"record": r.name, "expr": r.expr} for r in chosen]}]}
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


@dataclasses.dataclass(frozen=True)
class PanelQuery:
    dashboard: str
    panel: str
    expr: str
    instant: bool


def panel_queries(paths: list[Path] = DASHBOARDS) -> list[PanelQuery]:
    """Every target of every panel (rows' nested panels included), as the JSON holds it."""
    out = []
    for path in paths:
        board = json.loads(path.read_text())
        for panel in _panels(board.get("panels", [])):
            for target in panel.get("targets", []):
                if target.get("expr"):
                    out.append(PanelQuery(path.stem.removeprefix("roofwatch-"), panel.get("title", "?"),
                                          target["expr"], bool(target.get("instant")) and not target.get("range")))
    return out


def variable_queries(paths: list[Path] = DASHBOARDS) -> list[tuple[str, str, str]]:
    """(dashboard, metric selector, label) of every ``label_values(selector, label)`` variable."""
    out = []
    for path in paths:
        for var in json.loads(path.read_text()).get("templating", {}).get("list", []):
            query = var.get("query")
            text = query.get("query", "") if isinstance(query, dict) else str(query or "")
            match = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", text.strip())
            if match:
                out.append((path.stem.removeprefix("roofwatch-"), match.group(1), match.group(2)))
    return out


def substitute(expr: str, values: dict[str, str], range_s: float, step_s: float) -> str:
    """Grafana's variables: the dashboard's own, then $__rate_interval, $__interval and $__range."""
    rate_interval = max(4 * 15, step_s + 15)  # Grafana: max(4 x scrape interval, interval + scrape)
    out = expr
    for key in sorted(values, key=len, reverse=True):
        out = out.replace("${" + key + "}", values[key]).replace("$" + key, values[key])
    out = out.replace("$__rate_interval", f"{int(rate_interval)}s").replace("$__interval", f"{int(step_s)}s")
    out = out.replace("$__range", f"{int(range_s)}s")
    if "$" in re.sub(r"\{\{.*?\}\}", "", out):
        raise ValueError(f"a template variable is left in {out!r}")
    return out


def step_for(range_s: float, scrape_s: float = 15.0) -> float:
    """Grafana's step for a range: range / MAX_POINTS, rounded up to whole seconds, >= the scrape interval."""
    return max(scrape_s, float(-(-range_s // MAX_POINTS)))


def _panels(panels: list[dict]) -> list[dict]:
    out = []
    for panel in panels:
        out.append(panel)
        out += _panels(panel.get("panels", []))
    return out


def _seconds(text: str | None) -> float | None:
    if not text:
        return None
    match = re.fullmatch(r"(\d+)(ms|s|m|h)", text)
    if not match:
        raise ValueError(f"rule group interval {text!r} not understood")
    return int(match.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[match.group(2)]


def measurement_rules(source: Path, dest: Path, interval_s: float, cluster: str | None = None) -> Path:
    """A copy of the rule file with every group evaluated every ``interval_s``: the engines time
    each group's evaluations live, and a group's recommended 5 minutes would make three of them take
    a quarter of an hour. An evaluation's cost does not depend on its interval (the rules' windows are
    written into their expressions), so the seconds measured are reported against the recommended one.

    ``cluster``: the rules as one cluster's own vmalert evaluates them (docs/deploy.md, "Large
    fleets": rules per cluster), every query limited to that cluster's series by VictoriaMetrics'
    ``extra_label`` (the group's ``params``); no rule joins or aggregates across clusters."""
    document = yaml.safe_load(source.read_text())
    for group in document["groups"]:
        group["interval"] = f"{int(interval_s)}s"
        if cluster is not None:
            group["params"] = {"extra_label": [f"cluster={cluster}"]}
    dest.write_text(yaml.safe_dump(document, sort_keys=False))
    return dest


def time_dashboards(server: object, boards: list[Path], values: dict[str, str], end: int, spans_s: list[int],
                    repeat: int) -> list[dict]:
    """Every panel query and ``label_values`` variable of ``boards`` over each span ending at ``end``,
    at Grafana's step, median of ``repeat``; ``server`` is either engine's client (``timed``).

    The same requests go to Prometheus and to VictoriaMetrics' Prometheus-compatible API, so the two
    engines' figures compare query for query."""
    import statistics

    def median(path: str, **params: object) -> tuple[float, object]:
        runs = [server.timed(path, **params) for _ in range(repeat)]  # type: ignore[attr-defined]
        return statistics.median(t for t, _ in runs), runs[-1][1]

    out = []
    for span in spans_s:
        step = step_for(span)
        for q in panel_queries(boards):
            expr = substitute(q.expr, values, span, step)
            if q.instant:
                seconds, data = median("query", query=expr, time=end)
            else:
                seconds, data = median("query_range", query=expr, start=end - span, end=end, step=step)
            out.append({"dashboard": q.dashboard, "panel": q.panel, "range_h": span / 3600, "instant": q.instant,
                        "seconds": seconds, "series": len(data["result"]), "expr": expr})  # type: ignore[index]
        for board, selector, label in variable_queries(boards):
            seconds, _ = median(f"label/{label}/values", **{"match[]": substitute(selector, values, span, step),
                                                             "start": end - span, "end": end})
            out.append({"dashboard": board, "panel": f"variable {label}", "range_h": span / 3600, "instant": True,
                        "seconds": seconds, "series": None, "expr": selector})
    return out


def spans_for(history_s: int) -> list[int]:
    """The whole history, and 6 h as well where more than 6 h was built (the budgets' range)."""
    return [history_s] + ([6 * 3600] if history_s > 6 * 3600 else [])
