"""The agent's own metrics: build, collector health, how many GPUs it sees, what reading them costs.

They answer "is the agent itself working, and at what cost?" before any GPU figure is trusted:
a stalled cycle, a missing GPU or a driver that needs ever more calls shows up here first.
"""

from __future__ import annotations

from exporters.metrics.definition import MetricDef
from exporters.metrics.labels import GPU_LABELS, NODE_LABELS

BUILD_INFO = MetricDef(
    "roofwatch_build_info", "info", "", "Agent version and runtime.", ("version", "python_version"),
    nvidia="agent", amd="agent", virtual="agent",
)
GPUS_EXPECTED = MetricDef(
    "roofwatch_gpus_expected", "gauge", "gpus", "GPUs this node should have (configured, else discovered at start).",
    NODE_LABELS, nvidia="collector", amd="collector", virtual="collector",
)
GPUS_VISIBLE = MetricDef(
    "roofwatch_gpus_visible", "gauge", "gpus", "GPUs whose last read succeeded; below expected means a GPU is missing.",
    NODE_LABELS, nvidia="collector", amd="collector", virtual="collector",
)
COLLECTOR_CYCLES = MetricDef(
    "roofwatch_collector_cycles_total", "counter", "cycles", "Collection cycles run since start.",
    NODE_LABELS + ("backend",), nvidia="collector", amd="collector", virtual="collector",
)
COLLECTOR_DURATION = MetricDef(
    "roofwatch_collector_last_cycle_duration_seconds", "gauge", "seconds", "Wall time the last collection cycle took.",
    NODE_LABELS + ("backend",), nvidia="collector", amd="collector", virtual="collector",
)
COLLECTOR_SUCCESS = MetricDef(
    "roofwatch_collector_last_cycle_success", "gauge", "boolean", "1 if every GPU was read in the last cycle.",
    NODE_LABELS + ("backend",), nvidia="collector", amd="collector", virtual="collector",
)
COLLECTOR_INTERVAL = MetricDef(
    "roofwatch_collector_interval_seconds", "gauge", "seconds", "Configured seconds between collection cycles.",
    NODE_LABELS + ("backend",), nvidia="collector", amd="collector", virtual="collector",
)
SOURCE_UP = MetricDef(
    "roofwatch_source_up", "gauge", "boolean",
    "1 while a source read beside the driver answers and is fresh (state=up), 0 while it is stale or down: "
    "source=dcgm-exporter, dcgm (the host engine), or 'inference <url>' per endpoint; so an alert can fire on "
    "a dead source, not only on the figures it leaves unknown.",
    NODE_LABELS + ("source", "state"), nvidia="dcgm-exporter reader, DCGM join, inference scraper",
    amd="inference scraper", virtual="—",
)
SOURCE_REJECTED = MetricDef(
    "roofwatch_source_rejected_values_total", "counter", "values",
    "Readings dropped since the agent started as physically impossible (outside agent/model/bounds.py's table: "
    "1e308 W, -1e308 degrees C, a 1e308 MHz clock), by the source that gave them and the sample field; the value is "
    "then unknown, never 0. field=energy_j_step counts energy-counter steps larger than the board's power can "
    "deliver over the time they cover (a reset or a unit change), never added to roofwatch_gpu_energy_joules_total. "
    "Absent until a first refusal; doctor names the GPU, the value and the bound.",
    NODE_LABELS + ("source", "field"), nvidia="collector", amd="collector", virtual="collector",
)
SNAPSHOT_TS = MetricDef(
    "roofwatch_snapshot_timestamp_seconds", "gauge", "seconds", "Unix time the served snapshot was taken.",
    NODE_LABELS, nvidia="collector", amd="collector", virtual="collector",
)
DRIVER_CALLS = MetricDef(
    "roofwatch_gpu_driver_calls_total", "counter", "calls",
    "Vendor-library calls the agent made to read this GPU since it started.", GPU_LABELS,
    nvidia="counted around every pynvml call", amd="counted around every amdsmi call", virtual="—",
)
