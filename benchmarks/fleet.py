"""``python -m benchmarks.fleet``: what our rules and dashboards cost a Prometheus at fleet size.

For each size (``--size NODESxHOURS``, 8 GPUs a node): the agent's own exposition of the virtual
node is replicated into that fleet's history (:mod:`benchmarks.fleet_data`), backfilled with
``promtool tsdb create-blocks-from openmetrics``, the recording rules are backfilled over it level by
level (``create-blocks-from rules`` against a Prometheus serving the raw blocks), and a real
Prometheus opens the blocks. Then, at the end of the history: series per GPU, node and in total,
Prometheus RSS and disk, each rule group's evaluation (its rules as instant queries, in turn, as
Prometheus evaluates a group), and every panel query of every dashboard over 1 h and 6 h at
Grafana's step (median of ``--repeat``). One table, every size side by side, ratios to the smallest.

Budgets (issue 25): a dashboard query <= 1 s at 8,000 GPUs and <= 3 s at 32,000 over 6 h; a rule
group <= 10% of its interval at 32,000 GPUs. Where a size was not run, the figure is extrapolated
linearly in GPUs from the largest size run, and says so.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import fleet_data, fleet_queries
from benchmarks.figures import Figure, table
from benchmarks.fleet_prometheus import Server, backfill_openmetrics, backfill_rules, disk_bytes

GPUS_PER_NODE = 8
RULE_EVAL_S = 30
"""The evaluation interval of deploy/prometheus/prometheus.yml, used for the rule backfill too."""
QUERY_BUDGET_S = {8_000: 1.0, 32_000: 3.0}
RULE_SHARE_BUDGET = 0.10


@dataclasses.dataclass
class Fleet:
    """One backfilled fleet: where its blocks are and what it holds."""

    shape: fleet_data.FleetShape
    data: Path
    start: int
    end: int
    series_per_node: int
    samples: int
    build_s: float
    rules: Path = fleet_queries.RULES

    @property
    def gpus(self) -> int:
        return self.shape.nodes * GPUS_PER_NODE


def build(shape: fleet_data.FleetShape, workdir: Path, *, rules: Path = fleet_queries.RULES, log=print) -> Fleet:
    """Synthesize, backfill raw series, then backfill the recording rules of ``rules`` level by level."""
    started = time.monotonic()
    data = workdir / "data"
    data.mkdir(parents=True)
    template = fleet_data.parse_template(fleet_data.node_exposition())
    stamps = shape.timestamps()
    samples = 0
    for path, count in fleet_data.write_history(lambda i: workdir / f"window-{i}.om", template, shape):
        log(f"  {path.name}: {count:,} samples, {path.stat().st_size / 2**30:.1f} GiB; backfilling")
        backfill_openmetrics(path, data)
        path.unlink()
        samples += count
    for level, chosen in enumerate(fleet_queries.levels(fleet_queries.rules(rules))):
        log(f"  recording rules, level {level}: {len(chosen)} rules")
        server = Server(workdir, data)
        try:
            rule_file = fleet_queries.rule_file(chosen, workdir / f"rules-{level}.yml")
            backfill_rules(rule_file, server.url, stamps[0], stamps[-1], RULE_EVAL_S, data, workdir / "rule-blocks")
        finally:
            server.stop()
    return Fleet(shape, data, stamps[0], stamps[-1], len(template), samples, time.monotonic() - started, rules)


def median_time(server: Server, repeat: int, path: str, **params: object) -> tuple[float, object]:
    runs = [server.timed(path, **params) for _ in range(repeat)]
    return statistics.median(t for t, _ in runs), runs[-1][1]


def measure(fleet: Fleet, workdir: Path, repeat: int, *, settle_s: float = 75.0,
            dashboards: list[Path] | None = None, log=print) -> dict:
    """Every figure of one fleet, from a Prometheus that has opened (and compacted) its blocks.

    ``dashboards``: the generated dashboard JSON files to time (default: dashboards/roofwatch-*.json)."""
    boards = dashboards or fleet_queries.DASHBOARDS
    server = Server(workdir, fleet.data)
    try:
        server.settle(settle_s)
        out: dict = {"nodes": fleet.shape.nodes, "gpus": fleet.gpus, "hours": fleet.shape.hours,
                     "samples": fleet.samples, "build_s": fleet.build_s,
                     "series_per_node": fleet.series_per_node,
                     "series_per_gpu": fleet.series_per_node / GPUS_PER_NODE,
                     "rules": str(fleet.rules), "dashboards": sorted(str(b) for b in boards)}
        out["series_raw"] = int(server.api("query", query="count({job=\"roofwatch\", __name__!~\".*:.*\"})", time=fleet.end)["result"][0]["value"][1])
        out["series_recorded"] = int(server.api(
            "query", query='count({__name__=~"roofwatch(_[a-z]+)?:.+"})', time=fleet.end)["result"][0]["value"][1])
        groups: dict[str, dict] = {}
        for rule in fleet_queries.rules(fleet.rules):
            seconds, result = median_time(server, repeat, "query", query=rule.expr, time=fleet.end)
            g = groups.setdefault(rule.group, {"interval_s": rule.interval_s, "seconds": 0.0, "rules": {}})
            g["seconds"] += seconds
            g["rules"][rule.name + ("" if rule.recording else " (alert)")] = seconds
            if rule.recording and not result["result"] and rule.group != "roofwatch-serving":
                log(f"  note: {rule.name} is empty at the end of the history")
        out["groups"] = groups
        job_nodes = [fleet.shape.node_name(i) for i in range(fleet.shape.nodes) if fleet.shape.job(i) == 0]
        values = {"cluster": ".*", "job": "job-00000", "node": fleet.shape.node_name(0), "gpu": ".*",
                  "model": ".*", "server": ".*", "datasource": "prometheus",
                  "job_node": "(" + "|".join(job_nodes) + ")"}  # Grafana's regex form of a multi-value variable
        out["queries"] = []
        for hours in (1, 6):
            span = min(hours * 3600, fleet.end - fleet.start)
            step = fleet_queries.step_for(span)
            for q in fleet_queries.panel_queries(boards):
                expr = fleet_queries.substitute(q.expr, values, span, step)
                if q.instant:
                    seconds, data = median_time(server, repeat, "query", query=expr, time=fleet.end)
                else:
                    seconds, data = median_time(server, repeat, "query_range", query=expr,
                                                start=fleet.end - span, end=fleet.end, step=step)
                out["queries"].append({"dashboard": q.dashboard, "panel": q.panel, "range_h": span / 3600,
                                       "instant": q.instant, "seconds": seconds, "series": len(data["result"]),
                                       "expr": expr})
            for board, selector, label in fleet_queries.variable_queries(boards):
                seconds, _ = median_time(server, repeat, f"label/{label}/values",
                                         **{"match[]": fleet_queries.substitute(selector, values, span, step),
                                            "start": fleet.end - span, "end": fleet.end})
                out["queries"].append({"dashboard": board, "panel": f"variable {label}", "range_h": span / 3600,
                                       "instant": True, "seconds": seconds, "series": None, "expr": selector})
        out["rss_bytes"] = server.rss_bytes()
    finally:
        server.stop()
    out["disk_bytes"] = disk_bytes(fleet.data)
    return out


def figures(runs: list[dict]) -> list[Figure]:
    """The side-by-side table: each size's figures with budgets and the ratio to the smallest run."""
    base = runs[0]
    out: list[Figure] = []
    for run in runs:
        g = f"{run['gpus']:,} GPUs, {run['hours']:g} h"
        smallest = run is base
        ref = (lambda key: None if smallest else base[key])
        name = f"{base['gpus']:,} GPUs"
        out += [Figure(g, "series per GPU", run["series_per_gpu"], "series"),
                Figure(g, "raw series", run["series_raw"], "series", baseline=ref("series_raw"), baseline_name=name),
                Figure(g, "recorded series", run["series_recorded"], "series", baseline=ref("series_recorded"), baseline_name=name),
                Figure(g, "Prometheus RSS", run["rss_bytes"] / 2**20, "MiB", baseline=None if smallest else base["rss_bytes"] / 2**20, baseline_name=name),
                Figure(g, "TSDB disk", run["disk_bytes"] / 2**20, "MiB", baseline=None if smallest else base["disk_bytes"] / 2**20, baseline_name=name)]
        for group, info in run["groups"].items():
            out.append(Figure(g, f"rule group {group}", info["seconds"], "s",
                              budget=RULE_SHARE_BUDGET * info["interval_s"] if run["gpus"] >= 32_000 else None,
                              baseline=None if smallest else base["groups"][group]["seconds"], baseline_name=name,
                              note=f"{100 * info['seconds'] / info['interval_s']:.1f}% of {info['interval_s']:g} s"))
        budget = next((b for size, b in sorted(QUERY_BUDGET_S.items(), reverse=True) if run["gpus"] >= size), None)
        for span in sorted({q["range_h"] for q in run["queries"]}):
            chosen = [q for q in run["queries"] if q["range_h"] == span]
            for board in sorted({q["dashboard"] for q in chosen}):
                mine = [q for q in chosen if q["dashboard"] == board]
                worst = max(mine, key=lambda q: q["seconds"])
                prior = [q["seconds"] for q in base["queries"] if q["range_h"] == min(span, base["hours"])
                         and q["dashboard"] == board and q["panel"] == worst["panel"] and q["expr"] == worst["expr"]]
                out.append(Figure(g, f"{board} dashboard, slowest of {len(mine)} queries, {span:g} h", worst["seconds"], "s",
                                  budget=budget if span >= 6 else None, baseline=None if smallest or not prior else prior[0],
                                  baseline_name=name, note=worst["panel"]))
                out.append(Figure(g, f"{board} dashboard, all {len(mine)} queries, {span:g} h",
                                  sum(q["seconds"] for q in mine), "s"))
    return out


def extrapolated(runs: list[dict], gpus: int) -> list[Figure]:
    """Linear in GPUs through the two largest runs (through the origin with one run): labelled
    as extrapolation, never measured."""
    ordered = sorted(runs, key=lambda r: r["gpus"])
    big, small = ordered[-1], (ordered[-2] if len(ordered) > 1 else None)

    def at(get) -> float:
        if small is None:
            return get(big) * gpus / big["gpus"]
        slope = (get(big) - get(small)) / (big["gpus"] - small["gpus"])
        return get(big) + slope * (gpus - big["gpus"])

    g = f"{gpus:,} GPUs (extrapolated from {', '.join(format(r['gpus'], ',') for r in ordered[-2:])})"
    out = [Figure(g, "raw series", at(lambda r: r["series_raw"]), "series"),
           Figure(g, "Prometheus RSS", at(lambda r: r["rss_bytes"]) / 2**20, "MiB")]
    for group, info in big["groups"].items():
        value = at(lambda r: r["groups"][group]["seconds"])
        out.append(Figure(g, f"rule group {group}", value, "s", budget=RULE_SHARE_BUDGET * info["interval_s"],
                          note=f"{100 * value / info['interval_s']:.1f}% of {info['interval_s']:g} s"))
    top = max(q["range_h"] for q in big["queries"])
    for q in sorted((q for q in big["queries"] if q["range_h"] == top), key=lambda q: -q["seconds"])[:5]:
        same = [p for p in (small or big)["queries"] if p["expr"] == q["expr"] and p["dashboard"] == q["dashboard"]]
        value = at(lambda r: q["seconds"] if r is big else (same[-1]["seconds"] if same else 0.0))
        out.append(Figure(g, f"{q['dashboard']}: {q['panel']}, {top:g} h", value, "s", budget=QUERY_BUDGET_S.get(gpus)))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fleet", description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", action="append", metavar="NODESxHOURS",
                        help="a fleet of NODES 8-GPU nodes with HOURS of history (repeatable; default 125x6 and 1000x1)")
    parser.add_argument("--clusters", type=int, default=2, help="clusters the nodes are split into (default 2)")
    parser.add_argument("--job-nodes", type=int, default=16, help="nodes per job (default 16: 128-GPU jobs)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per query; the median is reported")
    parser.add_argument("--rules", type=Path, default=fleet_queries.RULES, metavar="FILE",
                        help="the rule file to backfill and time (default: the shipped deploy/prometheus/roofwatch-rules.yml;"
                             " e.g. an older version from git show, to compare designs)")
    parser.add_argument("--dashboards", type=Path, metavar="DIR",
                        help="a folder of generated roofwatch-*.json dashboards to time (default: dashboards/)")
    parser.add_argument("--workdir", help="where the blocks go (default: a temporary directory, removed)")
    parser.add_argument("--json", metavar="FILE", help="also write every figure and every query's time as JSON")
    parser.add_argument("--combine", nargs="+", metavar="JSON",
                        help="run nothing: print one table over the runs of earlier --json files")
    args = parser.parse_args(argv)
    if args.combine:
        runs = sorted((r for f in args.combine for r in json.loads(Path(f).read_text())["runs"]), key=lambda r: r["gpus"])
        return _report(runs, args.json)
    sizes = [tuple(float(x) for x in s.lower().split("x")) for s in (args.size or ["125x6", "1000x1"])]
    from benchmarks.__main__ import machine

    boards = sorted(args.dashboards.glob("roofwatch-*.json")) if args.dashboards else None
    if args.dashboards and not boards:
        parser.error(f"--dashboards: no roofwatch-*.json in {args.dashboards}")
    if not args.rules.is_file():
        parser.error(f"--rules: no such file {args.rules}")
    print(f"# roofwatch fleet benchmark: {machine()}\n# rules {args.rules}, dashboards {args.dashboards or 'dashboards/'}\n",
          flush=True)
    root = Path(args.workdir or tempfile.mkdtemp(prefix="roofwatch-fleet-"))
    runs = []
    try:
        for nodes, hours in sizes:
            shape = fleet_data.FleetShape(nodes=int(nodes), hours=hours, clusters=args.clusters, job_nodes=args.job_nodes)
            work = root / f"{int(nodes)}x{hours:g}"
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir(parents=True)
            print(f"fleet of {int(nodes) * GPUS_PER_NODE:,} GPUs, {hours:g} h of history every {shape.step_s} s", flush=True)
            fleet = build(shape, work, rules=args.rules, log=lambda m: print(m, flush=True))
            runs.append(measure(fleet, work, args.repeat, dashboards=boards, log=lambda m: print(m, flush=True)))
            shutil.rmtree(fleet.data, ignore_errors=True)
    finally:
        if not args.workdir:
            shutil.rmtree(root, ignore_errors=True)
    return _report(runs, args.json)


def _report(runs: list[dict], json_path: str | None) -> int:
    from benchmarks.__main__ import machine

    figs = figures(runs) + [f for gpus in (8_000, 32_000) if max(r["gpus"] for r in runs) < gpus
                            for f in extrapolated(runs, gpus)]
    print(table(figs))
    if json_path:
        Path(json_path).write_text(json.dumps({"machine": machine(), "runs": runs,
                                               "figures": [f.to_json() for f in figs]}, indent=1))
    return 1 if any(f.verdict == "MISSED" for f in figs) else 0


if __name__ == "__main__":
    sys.exit(main())
