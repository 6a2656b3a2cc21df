"""Colours and short names per workload class, and the MFU bands, shared by every view.

The hex values are Grafana's named colours that ``dashboards/common.py`` uses for the same
classes, so the terminal, the status page, the report and the dashboards agree.
"""

from __future__ import annotations

from agent.model import WORKLOAD_CLASSES

CLASS_COLOURS: dict[str, str] = {
    "idle": "#8e8e8e",
    "compute_bound": "#73bf69",           # Grafana "green"
    "memory_bound": "#5794f2",            # Grafana "blue"
    "input_starved": "#ff9830",           # Grafana "orange"
    "communication_jittered": "#b877d9",  # Grafana "purple"
    "latency_bound": "#fade2a",           # Grafana "yellow"
    "unknown": "#4a4a4a",
}
DOWN_COLOUR = "#f2495c"  # Grafana "red": a GPU that does not answer

CLASS_LABELS: dict[str, str] = {
    "idle": "idle",
    "compute_bound": "compute-bound",
    "memory_bound": "memory-bound",
    "input_starved": "input-starved",
    "communication_jittered": "comm-jittered",
    "latency_bound": "latency-bound",
    "unknown": "unknown",
}

WASTED_CLASSES = ("idle", "input_starved", "communication_jittered")
"""A held GPU in these classes waits on something other than its own math or memory."""

MFU_POOR = 0.2
MFU_TARGET = 0.4
"""Below 20% MFU is poor; 40% is the practical target for training (docs/classification.md)."""

_MFU_COLOURS = ((MFU_TARGET, "#73bf69"), (MFU_POOR, "#ff9830"), (float("-inf"), "#f2495c"))

assert set(CLASS_COLOURS) == set(WORKLOAD_CLASSES) == set(CLASS_LABELS), "every class needs a colour and a label"


def class_colour(cls: str | None) -> str:
    return CLASS_COLOURS.get(cls or "unknown", CLASS_COLOURS["unknown"])


def class_label(cls: str | None) -> str:
    return CLASS_LABELS.get(cls or "unknown", cls or "unknown")


def mfu_colour(mfu: float | None) -> str:
    """Red below the poor line, orange below the target, green at or above it; grey when unknown."""
    if mfu is None:
        return CLASS_COLOURS["unknown"]
    return next(colour for floor, colour in _MFU_COLOURS if mfu >= floor)
