"""``roofwatch record --simulate``: a scenario's samples in virtual time, written to a trace at once.

It lives with the simulated fleet, above the trace writer it uses (docs/architecture.md, layers):
the trace package knows nothing of scenarios. The command passes the settings it needs as plain
values (agent.app.commands_node).
"""

from __future__ import annotations

import time
from pathlib import Path

from agent import __version__
from agent.trace import TraceWriter
from agent.virtual.engine import VirtualEngine
from agent.virtual.scenario import resolve_scenario


def record_simulation(scenario_name: str, path: Path, *, node: str | None, interval_s: float,
                      duration_s: float) -> int:
    """Write ``duration_s`` of virtual time of ``scenario_name`` (a built-in name or a YAML path; one ``node``
    of it, or all), labelled, sampled every ``interval_s``; the number of samples written."""
    scenario = resolve_scenario(scenario_name)
    engine = VirtualEngine(scenario)
    nodes = [node] if node else None
    count = 0
    with TraceWriter(path, node=node, agent_version=__version__, note=f"simulated scenario {scenario.name}") as writer:
        for sample in engine.iter_trace(duration_s, interval_s, start_ts=time.time(), nodes=nodes):
            writer.write(sample)
            count += 1
    return count
