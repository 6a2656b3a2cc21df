"""docs/fleet-benchmark.json and the table in docs/performance.md that is generated from it.

``python -m benchmarks.fleet`` merges each measured run into the JSON (one run per size, engine and
requested history; a new measurement replaces the old one) and recomputes the extrapolated rows:
only where a size of the issue (8,000 and 32,000 GPUs) has no measured run on an engine, and
marked ``"measured": false`` with what they were extrapolated from. ``python -m benchmarks.fleet_table
--write`` puts the table between the markers in docs/performance.md; a quick test holds the two equal,
so the doc cannot show figures the JSON does not have.

Schema of a run: ``{"gpus", "engine", "measured", "history_h", "rule_groups": {NAME: {"seconds",
"interval_s"}}, "dashboards": {"slowest_query_s", "range_h", "query"}, "series", "engine_rss_bytes"}``,
plus ``requested_h``, ``rule_timing``, ``series_recorded``, ``slowest_panel``, ``dashboards_by_range``
(the slowest query of each range timed) and ``note``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
JSON_PATH = ROOT / "docs" / "fleet-benchmark.json"
DOC_PATH = ROOT / "docs" / "performance.md"
BEGIN, END = "<!-- fleet-benchmark:begin -->", "<!-- fleet-benchmark:end -->"
SIZES = (8_000, 32_000)
"""The issue's sizes: each gets a row per engine run, measured or extrapolated."""
QUERY_BUDGET_S = {8_000: 1.0, 32_000: 3.0}
RULE_SHARE_BUDGET = 0.10
REQUIRED = {"gpus": int, "engine": str, "measured": bool, "history_h": (int, float), "rule_groups": dict,
            "dashboards": dict, "series": int, "engine_rss_bytes": int}
GLOBAL = "global"
"""``"layer": "global"``: a run of the global store of many clusters' aggregates (benchmarks/global_layer.py),
in a table of its own; runs without a layer are one store's (the per-cluster layer)."""
GLOBAL_REQUIRED = {"layer": str, "gpus": int, "clusters": int, "gpus_per_cluster": int, "engine": str, "measured": bool,
                   "history_h": (int, float), "fine_history_h": (int, float), "dashboards": dict, "series": int,
                   "series_per_cluster": int, "samples_per_s_per_cluster": (int, float), "engine_rss_bytes": int,
                   "fleet_report": dict, "empty_panels": list}
GLOBAL_BUDGETS = {"query_s": 3.0, "query_range_h": 24.0, "report_s": 60.0, "report_range_h": 168.0,
                  "store_bytes": 8 * 2**30}
"""Issue 48: every global dashboard query <= 3 s over 24 h, the fleet report <= 60 s over 7 days, the store <= 8 GiB."""


def record(raw: dict, requested_h: float) -> dict:
    """One measured run (``benchmarks.fleet.measure`` or ``fleet_live.measure_victoria``) in the schema."""
    worst = max(raw["queries"], key=lambda q: q["seconds"])
    by_range: dict[str, dict] = {}
    for q in raw["queries"]:
        key = f"{q['range_h']:g}"
        if key not in by_range or q["seconds"] > by_range[key]["slowest_query_s"]:
            by_range[key] = dict(_query(q), panel=f"{q['dashboard']} / {q['panel']}")
    return {"gpus": raw["gpus"], "engine": raw.get("engine", "prometheus"), "measured": True,
            "history_h": round(raw.get("history_h", raw["hours"]), 3), "requested_h": requested_h,
            "rule_groups": {name: {"seconds": round(g["seconds"], 4), "interval_s": g["interval_s"]}
                            for name, g in sorted(raw["groups"].items())},
            "dashboards": _query(worst), "slowest_panel": f"{worst['dashboard']} / {worst['panel']}",
            "dashboards_by_range": by_range,
            "series": int(raw["series_raw"]), "series_recorded": int(raw["series_recorded"]),
            "engine_rss_bytes": int(raw["rss_bytes"]), "rule_timing": raw.get("rule_timing", ""),
            "note": raw.get("note", "")}


def _query(q: dict) -> dict:
    return {"slowest_query_s": round(q["seconds"], 4), "range_h": round(q["range_h"], 3), "query": q["expr"]}


def merge(old: list[dict], new: list[dict]) -> list[dict]:
    """Measured runs of ``old`` not replaced by ``new`` (same GPUs, engine and requested history),
    then ``new``, then extrapolated rows where a size has no measured run on an engine."""
    key = (lambda r: (r.get("layer", ""), r["gpus"], r["engine"], r.get("requested_h")))
    fresh = {key(r) for r in new}
    runs = [r for r in old if r["measured"] and key(r) not in fresh] + new
    for engine in sorted({r["engine"] for r in runs}):
        mine = sorted((r for r in runs if r["engine"] == engine and r["measured"] and r.get("layer") != GLOBAL),
                      key=lambda r: r["gpus"])
        for gpus in SIZES:
            if mine and not any(r["gpus"] == gpus for r in mine):
                runs.append(extrapolate(mine, gpus))
    return sorted(runs, key=lambda r: (r.get("layer", ""), r["gpus"], r["engine"], not r["measured"], r["history_h"]))


def extrapolate(measured: list[dict], gpus: int) -> dict:
    """Linear in GPUs through the two largest measured runs of one engine (through the origin with
    one): an estimate, ``"measured": false``, saying what it came from."""
    by_size: dict[int, dict] = {}
    for r in measured:  # per size, the longest history
        if r["gpus"] not in by_size or r["history_h"] > by_size[r["gpus"]]["history_h"]:
            by_size[r["gpus"]] = r
    sizes = sorted(by_size)
    big = by_size[sizes[-1]]
    small = by_size[sizes[-2]] if len(sizes) > 1 else None

    def at(get) -> float:
        if small is None:
            return get(big) * gpus / big["gpus"]
        slope = (get(big) - get(small)) / (big["gpus"] - small["gpus"])
        return max(0.0, get(big) + slope * (gpus - big["gpus"]))

    both = [small, big] if small else [big]
    groups = {name: {"seconds": round(at(lambda r, n=name: r["rule_groups"].get(n, g)["seconds"]), 4),
                     "interval_s": g["interval_s"]} for name, g in big["rule_groups"].items()}
    dash = dict(big["dashboards"], slowest_query_s=round(at(lambda r: r["dashboards"]["slowest_query_s"]), 4))
    return {"gpus": gpus, "engine": big["engine"], "measured": False, "history_h": big["history_h"],
            "requested_h": big.get("requested_h"), "rule_groups": groups, "dashboards": dash,
            "slowest_panel": big.get("slowest_panel", ""),
            "series": int(at(lambda r: r["series"])), "engine_rss_bytes": int(at(lambda r: r["engine_rss_bytes"])),
            "rule_timing": big.get("rule_timing", ""),
            "note": "extrapolated linearly in GPUs from the measured "
                    + " and ".join(f"{r['gpus']:,} GPUs ({r['history_h']:g} h)" for r in both)}


def validate(doc: dict) -> list[str]:
    """What in ``doc`` breaks the schema (empty when it holds)."""
    problems = []
    for i, run in enumerate(doc.get("runs", [])):
        if run.get("layer") == GLOBAL:
            problems += [f"run {i}: {field} missing or not {kind}" for field, kind in GLOBAL_REQUIRED.items()
                         if not isinstance(run.get(field), kind) or (kind is int and isinstance(run.get(field), bool))]
            continue
        for field, kind in REQUIRED.items():
            if not isinstance(run.get(field), kind) or (kind is int and isinstance(run.get(field), bool)):
                problems.append(f"run {i}: {field} missing or not {kind}")
        for name, g in run.get("rule_groups", {}).items():
            if set(g) != {"seconds", "interval_s"} or not all(isinstance(v, (int, float)) for v in g.values()):
                problems.append(f"run {i}: rule group {name} is {g}")
        if set(run.get("dashboards", {})) != {"slowest_query_s", "range_h", "query"}:
            problems.append(f"run {i}: dashboards is {run.get('dashboards')}")
        if not run.get("measured") and "extrapolated" not in run.get("note", ""):
            problems.append(f"run {i}: not measured, and its note does not say it is extrapolated")
    return problems


def budget(run: dict) -> str:
    """The issue's budgets at this size: groups <= 10% of their interval at 32,000 GPUs and more,
    the slowest dashboard query <= 1 s at 8,000 and <= 3 s at 32,000."""
    limit = next((b for size, b in sorted(QUERY_BUDGET_S.items(), reverse=True) if run["gpus"] >= size), None)
    if limit is None:
        return "—"
    missed = []
    if run["gpus"] >= 32_000:
        missed += [f"{n.removeprefix('roofwatch-')} {100 * g['seconds'] / g['interval_s']:.0f}%"
                   for n, g in run["rule_groups"].items()
                   if not g["seconds"] <= RULE_SHARE_BUDGET * g["interval_s"]]
    if not run["dashboards"]["slowest_query_s"] <= limit:
        missed.append(f"query {run['dashboards']['slowest_query_s']:.2f} s > {limit:g} s")
    return "met" if not missed else "missed: " + ", ".join(missed)


def render(doc: dict) -> str:
    """The markdown table of every run, groups as columns (seconds per evaluation and the share of
    the recommended interval), estimates marked as such in every cell."""
    runs = [r for r in doc["runs"] if r.get("layer") != GLOBAL]
    groups = sorted({n for r in runs for n in r["rule_groups"]})
    head = (["GPUs", "engine", "measured", "history"] + [n.removeprefix("roofwatch-") for n in groups]
            + ["slowest dashboard query", "series", "engine RSS", "budget", "note"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in runs:
        mark = "" if r["measured"] else "~"
        cells = [f"{r['gpus']:,}", r["engine"], "yes" if r["measured"] else "no (extrapolated)", f"{r['history_h']:g} h"]
        for name in groups:
            g = r["rule_groups"].get(name)
            cells.append("" if g is None or math.isnan(g["seconds"]) else
                         f"{mark}{g['seconds']:.3g} s ({100 * g['seconds'] / g['interval_s']:.1f}% of {g['interval_s']:g} s)")
        d = r["dashboards"]
        cells += [f"{mark}{d['slowest_query_s']:.3g} s over {d['range_h']:g} h ({r.get('slowest_panel', '')})",
                  f"{mark}{r['series']:,}", f"{mark}{r['engine_rss_bytes'] / 2**20:,.0f} MiB", budget(r),
                  " ".join(filter(None, [r.get("rule_timing", ""), r.get("note", "")])).replace("|", "\\|")]
        lines.append("| " + " | ".join(cells) + " |")
    global_runs = [r for r in doc["runs"] if r.get("layer") == GLOBAL]
    if global_runs:
        lines += ["", render_global(global_runs)]
    return "\n".join(lines)


def global_budget(run: dict) -> str:
    """Issue 48's budgets, each where this run measured over the range it is set for."""
    b, missed = GLOBAL_BUDGETS, []
    d, report = run["dashboards"], run["fleet_report"]
    if run["fine_history_h"] >= b["query_range_h"] and not d["slowest_query_s"] <= b["query_s"]:
        missed.append(f"query {d['slowest_query_s']:.2f} s > {b['query_s']:g} s")
    if run["history_h"] >= b["report_range_h"] and not report["seconds"] <= b["report_s"]:
        missed.append(f"report {report['seconds']:.0f} s > {b['report_s']:g} s")
    if not run["engine_rss_bytes"] <= b["store_bytes"]:
        missed.append(f"store {run['engine_rss_bytes'] / 2**30:.1f} GiB > 8 GiB")
    if run["empty_panels"]:
        missed.append("panels without data: " + ", ".join(run["empty_panels"]))
    partial = run["fine_history_h"] < b["query_range_h"] or run["history_h"] < b["report_range_h"]
    return ("met" if not missed else "missed: " + ", ".join(missed)) + (" (over a shorter range)" if partial else "")


def render_global(runs: list[dict]) -> str:
    """The global layer's runs: the fleet, what each cluster sends, the store, the slowest dashboard query and
    the fleet report."""
    head = ["GPUs (layer: global)", "clusters x GPUs", "engine", "history", "series in the store",
            "each cluster sends", "store RSS", "store on disk", "slowest global dashboard query", "fleet report",
            "budget"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in runs:
        d, report = r["dashboards"], r["fleet_report"]
        cells = [f"{r['gpus']:,}", f"{r['clusters']} x {r['gpus_per_cluster']:,} ({r.get('jobs', 0):,} jobs)", r["engine"],
                 f"{r['history_h']:g} h ({r['fine_history_h']:g} h every minute)", f"{r['series']:,}",
                 f"{r['series_per_cluster']:,} series, {r['samples_per_s_per_cluster']:g} samples/s",
                 f"{r['engine_rss_bytes'] / 2**20:,.0f} MiB", f"{r.get('disk_bytes', 0) / 2**20:,.0f} MiB",
                 f"{d['slowest_query_s']:.3g} s over {d['range_h']:g} h ({r.get('slowest_panel', '')}; "
                 f"{r.get('queries_timed', 0)} queries)",
                 f"{report['seconds']:.3g} s over {report['range']} ({report['queries']} queries)", global_budget(r)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def block(doc: dict) -> str:
    return f"{BEGIN}\n{render(doc)}\n{END}"


def doc_block(text: str) -> str | None:
    """The generated block as it stands in the doc, markers included (None if there is none)."""
    if BEGIN not in text or END not in text:
        return None
    return text[text.index(BEGIN):text.index(END) + len(END)]


def write_doc(doc: dict, path: Path = DOC_PATH) -> None:
    """Replace the block between the markers (it must be there: where it goes is the doc's choice)."""
    text = path.read_text()
    current = doc_block(text)
    if current is None:
        raise SystemExit(f"{path}: no {BEGIN} ... {END} block to replace")
    path.write_text(text.replace(current, block(doc)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fleet_table", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, default=JSON_PATH)
    parser.add_argument("--write", action="store_true", help=f"replace the table in {DOC_PATH.relative_to(ROOT)}")
    args = parser.parse_args(argv)
    doc = json.loads(args.json.read_text())
    problems = validate(doc)
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 1
    if args.write:
        write_doc(doc)
    else:
        print(render(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
