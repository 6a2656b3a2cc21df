"""Rules timed as the engines evaluate them: a history that reaches "now", and the live evaluators.

A rule group's cost is only measured faithfully by the engine's own rule evaluator (Prometheus' rule
manager, vmalert), evaluating at wall-clock time; instant queries at the end of an old history leave
out the concurrency of groups, the append of results and the engine's own bookkeeping. So the
history must still be current when the evaluator runs:

- **VictoriaMetrics** imports faster than any fleet here produces samples, so the history is built
  up to the moment the import started, then caught up to now plus the evaluation window
  (:func:`catch_up`, a few rounds, each shorter).
- **Prometheus**' backfill runs at about 150,000 samples/s, so its history is written ahead:
  it ends ``lead`` seconds after the build starts (:func:`prometheus_lead_s`), long enough that the
  blocks still cover now when the rule manager starts. Where the backfill cannot outrun the fleet
  (32,000 GPUs produce more samples per second than promtool writes), there is no such lead and
  the rules are timed as instant queries at the end of the history, and the run says so.
"""

from __future__ import annotations

import shutil
import statistics
import time
from pathlib import Path
from typing import Callable

from benchmarks import fleet_data, fleet_queries
from benchmarks.fleet_victoria import VictoriaServer, VmAlert, import_span, replay_recordings, span

STEP_S = 15


def variable_values(shape: fleet_data.FleetShape) -> dict[str, str]:
    """Real values for every dashboard variable: the fleet view (cluster All), job 0 and its nodes
    (Grafana's regex form of a multi-value variable), node 0."""
    job_nodes = [shape.node_name(i) for i in range(shape.nodes) if shape.job(i) == 0]
    return {"cluster": ".*", "job": "job-00000", "node": shape.node_name(0), "gpu": ".*", "model": ".*",
            "server": ".*", "datasource": "prometheus", "job_node": "(" + "|".join(job_nodes) + ")"}


def evaluation_window_s(eval_s: float, evaluations: int) -> float:
    """How long the live evaluator runs: the evaluations kept, the one dropped, one of slack and a minute."""
    return (evaluations + 2) * eval_s + 60


def prometheus_lead_s(nodes: int, series_per_node: int, hours: float, eval_s: float, evaluations: int,
                      backfill_rate: float, overhead: float = 1.6, fixed_s: float = 240.0) -> float | None:
    """Seconds the Prometheus history must reach past the build's start so that it still covers
    the live evaluation, or None where the backfill cannot outrun the fleet.

    The build of H + L seconds of history takes ``overhead`` x its samples / ``backfill_rate`` (the
    recording rules' backfill and compaction on top of the raw backfill) plus ``fixed_s`` (start-ups,
    the compaction settle); the lead L must cover that and the evaluation window W:
    L = k (H + L) + fixed + W, k = overhead x fleet rate / backfill rate."""
    k = overhead * nodes * series_per_node / STEP_S / backfill_rate
    if k >= 0.8:
        return None
    return (k * hours * 3600 + fixed_s + evaluation_window_s(eval_s, evaluations)) / (1 - k)


def catch_up(vm: VictoriaServer, template: list[fleet_data.Series], shape: fleet_data.FleetShape, first: int,
             last: int, ahead_s: float, log: Callable[[str], None], rounds: int = 6) -> tuple[int, int]:
    """Import the fleet from ``last`` to now + ``ahead_s``, again and again until what was imported
    reaches at least half of ``ahead_s`` past now; returns (new last timestamp, samples imported)."""
    samples = 0
    for _ in range(rounds):
        target = int(time.time() + ahead_s) // STEP_S * STEP_S
        if target > last:
            count, _ = import_span(vm, template, shape, span(last, target, STEP_S), first, log=log)
            samples += count
            last = target
        if last >= time.time() + ahead_s / 2:
            break
    return last, samples


def measure_victoria(nodes: int, hours: float, workdir: Path, *, rules: Path, boards: list[Path], repeat: int,
                     eval_s: float, evaluations: int, replay: bool, intervals: Callable[[str, float], float],
                     clusters: int = 2, job_nodes: int = 16, memory_percent: float = 40.0,
                     per_cluster: bool = False, scenario: str = "demo", log: Callable[[str], None] = print) -> dict:
    """One fleet on VictoriaMetrics: import, replay the recordings, vmalert live, every dashboard query.

    Returns the same keys as :func:`benchmarks.fleet.measure` (Prometheus), plus the engine and
    what the rules and the hourly group read."""
    started = time.monotonic()
    template = fleet_data.node_template(scenario)
    t0 = int(time.time()) // STEP_S * STEP_S
    shape = fleet_data.FleetShape(nodes=nodes, hours=hours, clusters=clusters, job_nodes=job_nodes, end=t0,
                                  scenario=scenario)
    ts = shape.timestamps()
    first = ts[0]
    vm = VictoriaServer(workdir / "vm", memory_percent=memory_percent)
    notes: list[str] = []
    try:
        samples, seconds = import_span(vm, template, shape, ts, first, log=log)
        rates = {"import_samples_per_s": samples / seconds}
        last, more = catch_up(vm, template, shape, first, ts[-1], 0, log)
        samples += more
        query_end = last
        replay_s = None
        if replay:
            replay_s = replay_recordings(vm, rules, workdir, first, last, 30, log=log)
            rates["replay_s"] = replay_s
        else:
            notes.append("recording rules not replayed: the hourly group read only what vmalert wrote live")
        window = evaluation_window_s(eval_s, evaluations)
        last, more = catch_up(vm, template, shape, first, last, window, log)
        samples += more
        if last < time.time() + window / 2:
            notes.append("the import could not keep ahead of now: the live evaluations read a history that ended early")
        build_s = time.monotonic() - started
        log(f"  vmalert: every group every {eval_s:g} s, {evaluations} evaluations after the first")
        shard = shape.cluster(0) if per_cluster else None
        if shard:
            notes.append(f"rules evaluated per cluster: the vmalert of cluster {shard} "
                         f"({nodes * 8 // clusters:,} of {nodes * 8:,} GPUs, {clusters} clusters) timed")
        measured_rules = fleet_queries.measurement_rules(rules, workdir / "rules-measured.yml", eval_s, shard)
        alert = VmAlert(workdir, measured_rules, vm, eval_s)
        try:
            timings = alert.group_timings(evaluations, timeout_s=window + 30 * eval_s)
            errors = alert.rule_errors()
            vmalert_rss = alert.rss_bytes()
        finally:
            alert.stop()
        if errors:
            notes.append(f"{len(errors)} rules reported errors, first: {errors[0][:300]}")
        history_s = query_end - first + STEP_S
        log(f"  dashboards over {history_s / 3600:.2f} h ending {time.strftime('%H:%M:%S', time.localtime(query_end))}")
        queries = fleet_queries.time_dashboards(vm, boards, variable_values(shape), query_end,
                                                fleet_queries.spans_for(history_s), repeat)
        raw = int(vm.api("query", query='count({job="roofwatch", __name__!~".*:.*|ALERTS.*"})', time=query_end)["result"][0]["value"][1])
        recorded = vm.api("query", query='count({__name__=~"roofwatch(_[a-z]+)?:.+"})', time=query_end)["result"]
        rss = vm.rss_bytes()
        disk = sum(p.stat().st_size for p in vm.data.rglob("*") if p.is_file())
    finally:
        vm.stop()
        shutil.rmtree(workdir / "vm", ignore_errors=True)
    groups = {}
    for name, runs in timings.items():
        file_interval = next((r.interval_s for r in fleet_queries.rules(rules) if r.group == name), 30.0)
        groups[name] = {"interval_s": intervals(name, file_interval),
                        "seconds": statistics.median(runs) if runs else float("nan"), "evaluations": runs}
    return {"engine": "victoriametrics", "nodes": nodes, "gpus": nodes * 8, "hours": history_s / 3600,
            "history_h": history_s / 3600, "samples": samples, "build_s": build_s,
            "series_per_node": len(template), "series_per_gpu": len(template) / 8, "rules": str(rules),
            "dashboards": sorted(str(b) for b in boards), "series_raw": raw,
            "series_recorded": int(recorded[0]["value"][1]) if recorded else 0, "groups": groups,
            "rule_timing": f"vmalert live, every {eval_s:g} s, median of {evaluations}"
                           + (f", one cluster's vmalert ({nodes * 8 // clusters:,} GPUs)" if per_cluster else ""),
            "queries": queries,
            "rss_bytes": rss, "vmalert_rss_bytes": vmalert_rss, "disk_bytes": disk, "rates": rates,
            "note": "; ".join(notes)}
