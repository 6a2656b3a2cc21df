"""``python -m benchmarks [--quick] [--no-soak] [--json FILE]``: every cost figure, one table.

``python -m benchmarks --fleet [ARGS]`` runs the fleet benchmark instead (``benchmarks.fleet``: our
rules and dashboards in a real Prometheus at thousands of GPUs; ARGS are its own).

Exit status 1 when a budget is missed by more than ``figures.WIDE_MARGIN``; 0 otherwise, including
figures a little over budget (printed as "over"): a shared 2-core runner wobbles that much.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import psutil

from benchmarks import collector_cost, hostile, memory_soak, otlp_push, scrape, shared_cost
from benchmarks.figures import Figure, table


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor() or "unknown CPU")
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parent).stdout.strip() or "unknown"
    return (f"{datetime.date.today().isoformat()}, {platform.node()}: {cpu}, {psutil.cpu_count()} CPUs, "
            f"{psutil.virtual_memory().total / 2**30:.0f} GiB, Python {platform.python_version()}, "
            f"{platform.system()} {platform.release()}, roofwatch {rev}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--fleet" in argv:  # its own program (it reads this module's machine line: no import back)
        os.execv(sys.executable, [sys.executable, "-m", "benchmarks.fleet", *(a for a in argv if a != "--fleet")])
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="shorter windows and a 20 000-interval soak (about 3 minutes)")
    parser.add_argument("--no-soak", action="store_true", help="leave out the memory soak (the longest part)")
    parser.add_argument("--json", metavar="FILE", help="also write every figure as JSON")
    parser.add_argument("--no-listener-baseline", action="store_true",
                        help="measure the hostile-client load on this agent only, not on the old http.server too")
    args = parser.parse_args(argv)
    print(f"# roofwatch benchmarks: {machine()}\n", flush=True)
    figures: list[Figure] = []
    cost, runs = collector_cost.run(args.quick)
    figures += cost
    shared, shared_runs = shared_cost.run(args.quick)
    figures += shared
    figures += scrape.run(args.quick)
    figures += otlp_push.run(args.quick)
    figures += hostile.run(args.quick, baseline=not args.no_listener_baseline)
    figures += hostile.neighbours(args.quick)
    if not args.no_soak:
        figures += memory_soak.run(args.quick)
    print(table(figures))
    print()
    print(collector_cost.side_by_side(runs))
    print()
    print(shared_cost.side_by_side(shared_runs))
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine(), "figures": [f.to_json() for f in figures]}, indent=2))
    missed = [f for f in figures if f.verdict == "MISSED"]
    for f in missed:
        print(f"budget missed by more than the margin: {f.group} / {f.name}: {f.value:.3g} {f.unit} > {f.budget:g}",
              file=sys.stderr)
    sys.stdout.flush()
    os._exit(1 if missed else 0)  # the fake driver's daemon threads need not be joined


if __name__ == "__main__":
    sys.exit(main())
