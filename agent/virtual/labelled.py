"""The shipped labelled traces: virtual scenarios in ``traces/labelled/*.yaml`` played into
``traces/labelled/*.jsonl.gz``, one line per GPU per second, each labelled with its true class.

They are what ``roofwatch classify --evaluate`` is calibrated and tested on, so they must be
reproducible byte for byte: a fixed start time, the scenario's seed, and the deterministic
engine. Regenerate after changing the engine or a scenario::

    python -m agent.virtual.labelled --write
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from agent import __version__
from agent.trace import TraceWriter
from agent.virtual.engine import VirtualEngine
from agent.virtual.scenario import load_scenario

LABELLED_DIR = Path(__file__).resolve().parents[2] / "traces" / "labelled"
START_TS = 1_800_000_000.0
"""2027-01-15: any fixed time works; a fixed one keeps the files identical run to run."""
INTERVAL_S = 1.0


def scenario_paths(directory: Path = LABELLED_DIR) -> list[Path]:
    return sorted(directory.glob("*.yaml"))


def trace_path(scenario_path: Path) -> Path:
    return scenario_path.with_suffix(".jsonl.gz")


def write_trace(scenario_path: Path, out: Path, duration_s: float | None = None) -> int:
    """Play one scenario for its longest workload cycle (or ``duration_s``) into ``out``."""
    scenario = load_scenario(scenario_path)
    if duration_s is None:
        duration_s = max(sum(p.duration_s for p in w.phases) for n in scenario.nodes for w in n.workloads)
    engine = VirtualEngine(scenario)
    count = 0
    with TraceWriter(out, agent_version=__version__, started_at=START_TS,
                     note=f"labelled virtual trace {scenario.name}: {scenario.description.strip()}") as writer:
        for sample in engine.iter_trace(duration_s, INTERVAL_S, start_ts=START_TS):
            writer.write(sample)
            count += 1
    return count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="regenerate every trace next to its scenario")
    args = parser.parse_args(argv)
    if not args.write:
        parser.print_help()
        return 0
    for path in scenario_paths():
        count = write_trace(path, trace_path(path))
        print(f"{trace_path(path).name}: {count} samples", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
