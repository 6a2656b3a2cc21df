"""``python -m benchmarks.fleet``: what our rules and dashboards cost the central store at fleet size.

For each size (``--size NODESxHOURS``, 8 GPUs a node) and engine (``--engine``): the agent's own
exposition of the virtual node is replicated into that fleet's history (:mod:`benchmarks.fleet_data`).

- **prometheus**: backfilled with ``promtool tsdb create-blocks-from openmetrics``, the recording
  rules backfilled over it level by level, and a real Prometheus 2.42 opens the blocks. Where the
  backfill can outrun the fleet, the history is written to reach past now (``fleet_live``) and
  Prometheus evaluates the rule file live; else the rules run as instant queries at its end.
- **victoriametrics**: streamed into VictoriaMetrics 1.79's import API up to now, the recording
  rules replayed by vmalert, and a real vmalert evaluates the rule file live
  (:mod:`benchmarks.fleet_victoria`, :mod:`benchmarks.fleet_live`).

Then: series, engine RSS, each rule group's evaluation seconds (median of ``--evaluations``, as the
engine's own evaluator measured them), every panel query and variable of every dashboard over the
whole history (and 6 h where more was built) at Grafana's step, median of ``--repeat``. Each run
goes into docs/fleet-benchmark.json (``--out``; :mod:`benchmarks.fleet_table` makes the doc's table
from it), and a side-by-side table is printed.

Budgets (issue 25, 36): a dashboard query <= 1 s at 8,000 GPUs and <= 3 s at 32,000; a rule group
<= 10% of its recommended interval at 32,000 GPUs.
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

from benchmarks import fleet_data, fleet_live, fleet_queries, fleet_table
from benchmarks.figures import Figure, table
from benchmarks.fleet_prometheus import Server, backfill_openmetrics, backfill_rules, disk_bytes

GPUS_PER_NODE = 8
RULE_EVAL_S = 30
"""The evaluation interval of deploy/prometheus/prometheus.yml, used for the rule backfill too."""
QUERY_BUDGET_S = fleet_table.QUERY_BUDGET_S
RULE_SHARE_BUDGET = fleet_table.RULE_SHARE_BUDGET
ENGINES = ("prometheus", "victoriametrics")
RECOMMENDED_INTERVAL_S = {"roofwatch-thresholds": 60.0, "roofwatch-efficiency": 60.0, "roofwatch-jobs": 60.0,
                          "roofwatch-aggregates": 60.0, "roofwatch-hourly": 300.0, "roofwatch-serving": 60.0,
                          "roofwatch-alerts": 60.0, "roofwatch-health-alerts": 60.0}
"""Each group's evaluation interval as the docs recommend it on a large fleet (the rules file's
comments, docs/deploy.md "Large fleets": evaluation_interval 1m, Prometheus's default, and 5m for
the hourly group): what a group's measured seconds are reported against. A group not named here
runs at its own ``interval:`` in the file, else the global 30 s. Edit this table when the
recommendation changes; the measurement itself evaluates every group at ``--eval-interval``."""
PROM_BACKFILL_RATE = 150_000.0
"""promtool's backfill on the 2-core machine, samples/s: sizes the Prometheus history's lead."""


def recommended_interval(group: str, file_interval_s: float) -> float:
    return RECOMMENDED_INTERVAL_S.get(group, file_interval_s)


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
    template = fleet_data.node_template(shape.scenario)
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
            dashboards: list[Path] | None = None, live_eval_s: float | None = None, evaluations: int = 3,
            log=print) -> dict:
    """Every figure of one fleet, from a Prometheus that has opened (and compacted) its blocks.

    ``dashboards``: the generated dashboard JSON files to time (default: dashboards/roofwatch-*.json).
    ``live_eval_s``: evaluate the rule file live at that interval (the history must reach past now);
    else, or where now has already passed the history's end, the rules run as instant queries."""
    boards = dashboards or fleet_queries.DASHBOARDS
    window = fleet_live.evaluation_window_s(live_eval_s or 30, evaluations)
    rules_live = fleet_queries.measurement_rules(fleet.rules, workdir / "rules-measured.yml", live_eval_s) if live_eval_s else None
    server = Server(workdir, fleet.data, rules=rules_live, eval_s=live_eval_s or 30)
    notes: list[str] = []
    try:
        server.settle(settle_s)
        out: dict = {"engine": "prometheus", "nodes": fleet.shape.nodes, "gpus": fleet.gpus,
                     "samples": fleet.samples, "build_s": fleet.build_s,
                     "series_per_node": fleet.series_per_node,
                     "series_per_gpu": fleet.series_per_node / GPUS_PER_NODE,
                     "rules": str(fleet.rules), "dashboards": sorted(str(b) for b in boards)}
        groups: dict[str, dict] = {}
        live = bool(live_eval_s) and time.time() + window <= fleet.end
        if live_eval_s and not live:
            notes.append("the history's lead ran out before the rules could be evaluated live")
        if live:
            log(f"  rule manager: every group every {live_eval_s:g} s, {evaluations} evaluations after the first")
            timings = server.group_timings(evaluations, timeout_s=window + 30 * live_eval_s)
            errors = server.rule_errors()
            if errors:
                notes.append(f"{len(errors)} rules reported errors, first: {errors[0][:300]}")
            server.drop_rules()
            end = int(time.time()) // fleet.shape.step_s * fleet.shape.step_s
            for rule in fleet_queries.rules(fleet.rules):
                runs = timings.get(rule.group, [])
                groups[rule.group] = {"interval_s": recommended_interval(rule.group, rule.interval_s),
                                      "seconds": statistics.median(runs) if runs else float("nan"), "evaluations": runs}
            out["rule_timing"] = f"Prometheus rule manager live, every {live_eval_s:g} s, median of {evaluations}"
        else:
            end = fleet.end
            for rule in fleet_queries.rules(fleet.rules):
                seconds, result = median_time(server, repeat, "query", query=rule.expr, time=end)
                g = groups.setdefault(rule.group, {"interval_s": recommended_interval(rule.group, rule.interval_s),
                                                   "seconds": 0.0, "rules": {}})
                g["seconds"] += seconds
                g["rules"][rule.name + ("" if rule.recording else " (alert)")] = seconds
                if rule.recording and not result["result"] and rule.group != "roofwatch-serving":
                    log(f"  note: {rule.name} is empty at the end of the history")
            out["rule_timing"] = f"instant queries in turn at the history's end, median of {repeat}"
        out["groups"] = groups
        history_s = end - fleet.start + fleet.shape.step_s
        out["hours"] = out["history_h"] = history_s / 3600
        out["series_raw"] = int(server.api("query", query="count({job=\"roofwatch\", __name__!~\".*:.*|ALERTS.*\"})", time=end)["result"][0]["value"][1])
        out["series_recorded"] = int(server.api(
            "query", query='count({__name__=~"roofwatch(_[a-z]+)?:.+"})', time=end)["result"][0]["value"][1])
        out["queries"] = fleet_queries.time_dashboards(server, boards, fleet_live.variable_values(fleet.shape), end,
                                                       fleet_queries.spans_for(history_s), repeat)
        out["rss_bytes"] = server.rss_bytes()
    finally:
        server.stop()
    out["disk_bytes"] = disk_bytes(fleet.data)
    out["note"] = "; ".join(notes)
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
                Figure(g, "engine RSS", run["rss_bytes"] / 2**20, "MiB", baseline=None if smallest else base["rss_bytes"] / 2**20, baseline_name=name),
                Figure(g, "store on disk", run["disk_bytes"] / 2**20, "MiB", baseline=None if smallest else base["disk_bytes"] / 2**20, baseline_name=name)]
        for group, info in run["groups"].items():
            out.append(Figure(g, f"rule group {group}", info["seconds"], "s",
                              budget=RULE_SHARE_BUDGET * info["interval_s"] if run["gpus"] >= 32_000 else None,
                              baseline=None if smallest else base["groups"].get(group, {}).get("seconds"), baseline_name=name,
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
        return max(0.0, get(big) + slope * (gpus - big["gpus"]))

    g = f"{gpus:,} GPUs (extrapolated from {', '.join(format(r['gpus'], ',') for r in ordered[-2:])})"
    out = [Figure(g, "raw series", at(lambda r: r["series_raw"]), "series"),
           Figure(g, "engine RSS", at(lambda r: r["rss_bytes"]) / 2**20, "MiB")]
    for group, info in big["groups"].items():
        value = at(lambda r: r["groups"].get(group, info)["seconds"])
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
    parser.add_argument("--engine", action="append", choices=ENGINES,
                        help="the store to measure (repeatable; default prometheus)")
    parser.add_argument("--clusters", type=int, default=2, help="clusters the nodes are split into (default 2)")
    parser.add_argument("--rules-per-cluster", action="store_true",
                        help="victoriametrics: time the rules as one cluster's own vmalert evaluates them (every "
                             "query limited to its cluster), the setup docs/deploy.md recommends for large fleets")
    parser.add_argument("--scenario", default="demo", choices=sorted(fleet_data.TEMPLATE_NODES) + ["demo"],
                        help="the built-in scenario whose node every fleet node copies (default demo: whole GPUs; "
                             "shared: time-sliced, MPS, DRA and MIG GPUs, so the holder rules read real series)")
    parser.add_argument("--job-nodes", type=int, default=16, help="nodes per job (default 16: 128-GPU jobs)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per query; the median is reported")
    parser.add_argument("--eval-interval", type=float, default=30.0, metavar="S",
                        help="every group's interval while it is timed live (default 30; reported against"
                             " RECOMMENDED_INTERVAL_S)")
    parser.add_argument("--evaluations", type=int, default=3, help="live evaluations per group; the median is reported")
    parser.add_argument("--no-replay", action="store_true",
                        help="victoriametrics: skip vmalert's replay of the recording rules over the history")
    parser.add_argument("--memory-percent", type=float, default=40.0,
                        help="victoriametrics: -memory.allowedPercent (its caches; the machine is shared)")
    parser.add_argument("--rules", type=Path, default=fleet_queries.RULES, metavar="FILE",
                        help="the rule file to backfill and time (default: the shipped deploy/prometheus/roofwatch-rules.yml;"
                             " e.g. an older version from git show, to compare designs)")
    parser.add_argument("--dashboards", type=Path, metavar="DIR",
                        help="a folder of generated roofwatch-*.json dashboards to time (default: dashboards/)")
    parser.add_argument("--workdir", help="where the stores go (default: a temporary directory, removed)")
    parser.add_argument("--out", type=Path, default=fleet_table.JSON_PATH, metavar="FILE",
                        help="merge the runs into this JSON (default docs/fleet-benchmark.json; 'none' to skip)")
    parser.add_argument("--json", metavar="FILE", help="also write every figure and every query's time as JSON")
    parser.add_argument("--combine", nargs="+", metavar="JSON",
                        help="run nothing: print one table over the runs of earlier --json files")
    args = parser.parse_args(argv)
    if args.combine:
        runs = sorted((r for f in args.combine for r in json.loads(Path(f).read_text())["runs"]), key=lambda r: r["gpus"])
        return _report(runs, args.json)
    sizes = [tuple(float(x) for x in s.lower().split("x")) for s in (args.size or ["125x6", "1000x1"])]
    engines = args.engine or ["prometheus"]
    from benchmarks.__main__ import machine

    boards = sorted(args.dashboards.glob("roofwatch-*.json")) if args.dashboards else fleet_queries.DASHBOARDS
    if args.dashboards and not boards:
        parser.error(f"--dashboards: no roofwatch-*.json in {args.dashboards}")
    if not args.rules.is_file():
        parser.error(f"--rules: no such file {args.rules}")
    print(f"# roofwatch fleet benchmark: {machine()}\n# rules {args.rules}, dashboards {args.dashboards or 'dashboards/'}\n",
          flush=True)
    root = Path(args.workdir or tempfile.mkdtemp(prefix="roofwatch-fleet-"))
    log = (lambda m: print(m, flush=True))
    runs, records = [], []
    try:
        for nodes, hours in sizes:
            for engine in engines:
                work = root / f"{engine}-{int(nodes)}x{hours:g}"
                shutil.rmtree(work, ignore_errors=True)
                work.mkdir(parents=True)
                print(f"{engine}: fleet of {int(nodes) * GPUS_PER_NODE:,} GPUs, {hours:g} h of history every 15 s", flush=True)
                raw = run_one(engine, int(nodes), hours, work, args, boards, log)
                runs.append(raw)
                records.append(fleet_table.record(raw, hours))
                shutil.rmtree(work, ignore_errors=True)
                if str(args.out) != "none":  # after every run: a long session keeps what it measured
                    _merge_out(args.out, records, machine())
    finally:
        if not args.workdir:
            shutil.rmtree(root, ignore_errors=True)
    return _report(runs, args.json)


def run_one(engine: str, nodes: int, hours: float, work: Path, args: argparse.Namespace, boards: list[Path], log) -> dict:
    """One size on one engine, from an empty store to every figure."""
    if engine == "victoriametrics":
        return fleet_live.measure_victoria(
            nodes, hours, work, rules=args.rules, boards=boards, repeat=args.repeat, eval_s=args.eval_interval,
            evaluations=args.evaluations, replay=not args.no_replay, intervals=recommended_interval,
            clusters=args.clusters, job_nodes=args.job_nodes, memory_percent=args.memory_percent,
            per_cluster=args.rules_per_cluster, scenario=args.scenario, log=log)
    per_node = len(fleet_data.node_template(args.scenario))
    lead = fleet_live.prometheus_lead_s(nodes, per_node, hours, args.eval_interval, args.evaluations, PROM_BACKFILL_RATE)
    t0 = int(time.time()) // 15 * 15
    if lead is None:
        log("  the backfill cannot outrun this fleet: the history ends now, the rules run as instant queries")
        hist_h, end = hours, t0
    else:
        log(f"  the history reaches {lead / 60:.0f} min past now, for the live evaluation")
        hist_h, end = hours + lead / 3600, t0 + int(lead) // 15 * 15
    shape = fleet_data.FleetShape(nodes=nodes, hours=hist_h, clusters=args.clusters, job_nodes=args.job_nodes, end=end,
                                  scenario=args.scenario)
    fleet = build(shape, work, rules=args.rules, log=log)
    raw = measure(fleet, work, args.repeat, dashboards=boards, live_eval_s=args.eval_interval if lead else None,
                  evaluations=args.evaluations, log=log)
    shutil.rmtree(fleet.data, ignore_errors=True)
    return raw


def _merge_out(path: Path, records: list[dict], machine: str) -> None:
    old = json.loads(path.read_text())["runs"] if path.exists() else []
    doc = {"machine": machine, "runs": fleet_table.merge(old, records)}
    path.write_text(json.dumps(doc, indent=1) + "\n")


def _report(runs: list[dict], json_path: str | None) -> int:
    from benchmarks.__main__ import machine

    figs: list[Figure] = []
    for engine in sorted({r.get("engine", "prometheus") for r in runs}):
        mine = sorted((r for r in runs if r.get("engine", "prometheus") == engine), key=lambda r: r["gpus"])
        figs += [dataclasses.replace(f, group=f"{engine}, {f.group}") for f in figures(mine)]
        figs += [dataclasses.replace(f, group=f"{engine}, {f.group}") for gpus in (8_000, 32_000)
                 if max(r["gpus"] for r in mine) < gpus for f in extrapolated(mine, gpus)]
    print(table(figs))
    if json_path:
        Path(json_path).write_text(json.dumps({"machine": machine(), "runs": runs,
                                               "figures": [f.to_json() for f in figs]}, indent=1))
    return 1 if any(f.verdict == "MISSED" for f in figs) else 0


if __name__ == "__main__":
    sys.exit(main())
