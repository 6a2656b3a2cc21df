"""``python -m benchmarks.global_layer``: what the global layer costs at 200,000 GPUs, measured.

Each cluster keeps its own store and rule evaluation (the per-cluster layer is the fleet benchmark's 8,000-GPU
figure: ``python -m benchmarks.fleet``); only its aggregates reach the global store. Here the global store is
real: the aggregates of ``--clusters`` x ``--gpus`` GPUs (:mod:`benchmarks.global_data`, in jobs of 128 GPUs) are
imported into a real VictoriaMetrics with ``--days`` of history (the last ``--hours`` at the rules' one-minute
interval, the rest at five minutes) and backfilled into a real Prometheus with ``--prom-hours``; then every
query of the global dashboard (dashboards/roofwatch-global.json, Grafana's step, median of ``--repeat``) and
``roofwatch fleet-report --source aggregates`` (the real command) are timed, and the store's memory read.

Each run goes into docs/fleet-benchmark.json with ``"layer": "global"`` (``--out``); benchmarks/fleet_table.py
makes the table in docs/performance.md from it. Budgets (issue 48): every global dashboard query <= 3 s over
24 h, the fleet report <= 60 s over 7 days, the global store <= 8 GiB.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import fleet_table, global_data
from benchmarks.fleet_prometheus import Server, backfill_openmetrics, disk_bytes
from benchmarks.fleet_queries import GLOBAL_DASHBOARD, time_dashboards
from benchmarks.fleet_victoria import CHUNK_BYTES, VictoriaServer, _chunked, post_chunks

ROOT = Path(__file__).resolve().parent.parent
VALUES = {"cluster": ".*", "price": "2"}
"""The dashboard's variables as a fleet view opens it: every cluster, the default price."""
ENGINES = ("victoriametrics", "prometheus")


def aligned_end(step_s: int = global_data.HOURLY_S) -> int:
    """A whole five minutes, a minute ago: past VictoriaMetrics' 30 s search latency offset."""
    return (int(time.time()) - 60) // step_s * step_s


def import_victoria(vm: VictoriaServer, shape: global_data.GlobalShape, end: int, days: float, hours: float,
                    log=print) -> int:
    """The history into ``vm``: ``days`` in all, the last ``hours`` every minute, before that every five; samples."""
    everything = global_data.series(shape)
    fine_start = end - int(hours * 3600)
    coarse_start = min(fine_start, end - int(days * 86400))
    count = [0]

    def counted(lines):
        for line in lines:
            count[0] += 1
            yield line

    for start, stop, step in ((coarse_start, fine_start, global_data.HOURLY_S), (fine_start, end + 1, global_data.EVAL_S)):
        if stop > start:
            log(f"  import {len(everything):,} series, {(stop - start) // step * step / 3600:g} h every {step} s")
            post_chunks(vm.url, "/api/v1/import/prometheus",
                        _chunked(counted(global_data.lines(everything, start, stop, step)), CHUNK_BYTES))
    vm.flush()
    return count[0]


def time_report(url: str, range_: str, end: int, workdir: Path) -> dict:
    """``roofwatch fleet-report --source aggregates`` as a child process, timed from start to exit."""
    out, data = workdir / "fleet.html", workdir / "fleet.json"
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "agent.app.cli", "fleet-report", "--prometheus", url, "--source",
                           "aggregates", "--range", range_, "--end", str(end), "--out", str(out), "--json", str(data),
                           "--deadline", "600"], capture_output=True, text=True, cwd=ROOT, timeout=900)
    seconds = time.monotonic() - started
    if done.returncode:
        raise RuntimeError(f"fleet-report failed: {done.stderr[-2000:]}")
    report = json.loads(data.read_text())
    return {"seconds": round(seconds, 3), "range": range_, "queries": report["queries"],
            "problems": [p["section"] for p in report["problems"]],
            "gpu_hours": report["totals"]["gpu_hours"], "jobs": len(report["jobs"])}


def timed_queries(server: object, end: int, span_s: int, repeat: int) -> list[dict]:
    return time_dashboards(server, [GLOBAL_DASHBOARD], VALUES, end, [span_s], repeat)


def summary(shape: global_data.GlobalShape, engine: str, queries: list[dict], report: dict, *, series: int,
            rss: int, disk: int, samples: int, import_s: float, history_h: float, fine_h: float) -> dict:
    """One run in docs/fleet-benchmark.json's global schema (benchmarks/fleet_table.py, GLOBAL_REQUIRED)."""
    worst = max(queries, key=lambda q: q["seconds"])
    empty = sorted({q["panel"] for q in queries if q["series"] == 0})
    sent = global_data.per_cluster(shape)
    return {"layer": "global", "gpus": shape.total_gpus, "clusters": shape.clusters, "gpus_per_cluster": shape.gpus,
            "jobs": shape.jobs * shape.clusters, "engine": engine, "measured": True, "history_h": round(history_h, 3),
            "fine_history_h": round(fine_h, 3), "series": series, "series_per_cluster": sent["series"],
            "samples_per_s_per_cluster": round(sent["samples_per_s"], 2), "samples_imported": samples,
            "import_s": round(import_s, 1), "engine_rss_bytes": rss, "disk_bytes": disk,
            "dashboards": {"slowest_query_s": round(worst["seconds"], 4), "range_h": round(worst["range_h"], 3),
                           "query": worst["expr"]},
            "slowest_panel": f"global / {worst['panel']}", "queries_timed": len(queries), "empty_panels": empty,
            "fleet_report": report}


def measure_victoria(shape: global_data.GlobalShape, workdir: Path, *, days: float, hours: float, repeat: int,
                     log=print) -> dict:
    vm = VictoriaServer(workdir / "vm", memory_percent=40.0)
    try:
        end = aligned_end()
        started = time.monotonic()
        samples = import_victoria(vm, shape, end, days, hours, log)
        import_s = time.monotonic() - started
        series = int(vm.api("query", query='count({__name__=~"roofwatch_.+"})', time=end)["result"][0]["value"][1])
        log(f"  {series:,} series, {samples:,} samples in {import_s:.0f} s; timing the dashboard over {hours:g} h")
        queries = timed_queries(vm, end, int(hours * 3600), repeat)
        log("  timing the fleet report")
        report = time_report(vm.url, f"{int(days * 24)}h", end, workdir)
        return summary(shape, "victoriametrics", queries, report, series=series, rss=vm.rss_bytes(),
                       disk=disk_bytes(vm.data), samples=samples, import_s=import_s, history_h=days * 24, fine_h=hours)
    finally:
        vm.stop()


def measure_prometheus(shape: global_data.GlobalShape, workdir: Path, *, hours: float, repeat: int, log=print) -> dict:
    end = aligned_end()
    start = end - int(hours * 3600)
    source, data = workdir / "global.om", workdir / "prom-data"
    started = time.monotonic()
    samples = 0
    with source.open("w") as out:
        for line in global_data.openmetrics(global_data.series(shape), start, end + 1, global_data.EVAL_S):
            out.write(line)
            samples += 1
    backfill_openmetrics(source, data)
    source.unlink()
    import_s = time.monotonic() - started
    server = Server(workdir, data)
    try:
        series = int(server.api("query", query='count({__name__=~"roofwatch_.+"})', time=end)["result"][0]["value"][1])
        log(f"  {series:,} series, {samples:,} samples backfilled in {import_s:.0f} s; timing the dashboard over {hours:g} h")
        queries = timed_queries(server, end, int(hours * 3600), repeat)
        log("  timing the fleet report")
        report = time_report(server.url, f"{int(hours)}h", end, workdir)
        return summary(shape, "prometheus", queries, report, series=series, rss=server.rss_bytes(),
                       disk=disk_bytes(data), samples=samples - 1, import_s=import_s, history_h=hours, fine_h=hours)
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.global_layer", description=__doc__.split("\n\n")[0])
    parser.add_argument("--clusters", type=int, default=25)
    parser.add_argument("--gpus", type=int, default=8000, help="GPUs per cluster (default 8000)")
    parser.add_argument("--days", type=float, default=7.0, help="victoriametrics: history in days (default 7)")
    parser.add_argument("--hours", type=float, default=24.0,
                        help="victoriametrics: the last HOURS at one-minute resolution, the dashboard's range (default 24)")
    parser.add_argument("--prom-hours", type=float, default=3.0, help="prometheus: history in hours (default 3)")
    parser.add_argument("--engine", action="append", choices=ENGINES, help="(repeatable; default both)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per query; the median is reported")
    parser.add_argument("--out", default=str(fleet_table.JSON_PATH),
                        help="merge the runs into this JSON (default docs/fleet-benchmark.json; 'none' to skip)")
    parser.add_argument("--workdir", help="where the stores go (default: a temporary directory, removed)")
    args = parser.parse_args(argv)
    shape = global_data.GlobalShape(args.clusters, args.gpus)
    records = []
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        for engine in args.engine or ENGINES:
            print(f"{shape.total_gpus:,} GPUs in {shape.clusters} clusters, {engine}:", flush=True)
            work = Path(tmp) / engine
            work.mkdir()
            if engine == "victoriametrics":
                run = measure_victoria(shape, work, days=args.days, hours=args.hours, repeat=args.repeat)
            else:
                run = measure_prometheus(shape, work, hours=args.prom_hours, repeat=args.repeat)
            print(json.dumps({k: v for k, v in run.items() if k != "dashboards"}, indent=1), flush=True)
            records.append(run)
    if args.out != "none":
        from benchmarks.__main__ import machine

        path = Path(args.out)
        old = json.loads(path.read_text()) if path.exists() else {"runs": []}
        for run in records:
            run["machine"] = machine()
        path.write_text(json.dumps({**old, "runs": fleet_table.merge(old["runs"], records)}, indent=1) + "\n")
        print(f"merged into {path}; now: python -m benchmarks.fleet_table --write")
    return 0


if __name__ == "__main__":
    sys.exit(main())
