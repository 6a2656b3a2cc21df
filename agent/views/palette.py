"""Colours and short names per workload class, and the colours of the MFU and MBU bands, shared by every view.

The hex values are Grafana's named colours that ``dashboards/common.py`` uses for the same
classes, so the terminal, the status page, the report and the dashboards agree.
"""

from __future__ import annotations

from agent.model import SERVING_STATES, WORKLOAD_CLASSES
from agent.model.attention import MFU_POOR  # noqa: F401 - the views' MFU bands, with MFU_TARGET
from agent.model.judging import MFU_TARGET, Band, Figure, band, judged_band  # noqa: F401

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

BAND_COLOURS: dict[Band, str] = {"good": "#73bf69", "fair": "#ff9830", "poor": "#f2495c"}
"""Green, orange, red: a figure judged against its bands (agent.model.judging: MFU below 20% poor and from 40%
good; MBU below 40% poor and from 55% good). Which GPUs are wasted is agent.model.waste's to say."""
NOT_JUDGED = "#6e6e6e"
"""A figure shown but not judged (MFU of a memory-bound GPU, either figure of a latency-bound or idle one): grey,
never a band colour, so no view paints a decode at its floor red for its MFU."""

assert set(CLASS_COLOURS) == set(WORKLOAD_CLASSES) == set(CLASS_LABELS), "every class needs a colour and a label"


def class_colour(cls: str | None) -> str:
    return CLASS_COLOURS.get(cls or "unknown", CLASS_COLOURS["unknown"])


def class_label(cls: str | None) -> str:
    return CLASS_LABELS.get(cls or "unknown", cls or "unknown")


def mfu_colour(mfu: float | None) -> str:
    """MFU in its band colour as if it judged the GPU (red below the poor line, orange below the target, green at or
    above it; grey when unknown): for a figure that is not one GPU's verdict, such as a compute-bound GPU's MFU
    over a trace. A GPU's own figures take :func:`figure_colour`."""
    kind = band("mfu", mfu)
    return CLASS_COLOURS["unknown"] if kind is None else BAND_COLOURS[kind]


def figure_colour(cls: str | None, figure: Figure, value: float | None) -> str:
    """The colour of a GPU's MFU or MBU: its band where that figure judges the GPU's class (agent.model.judging),
    else :data:`NOT_JUDGED`."""
    kind = judged_band(cls, figure, value)
    return NOT_JUDGED if kind is None else BAND_COLOURS[kind]


SERVING_COLOURS: dict[str, str] = {
    "at_floor": "#73bf69",       # green: the hardware, not the software, sets the latency
    "near_floor": "#96d98d",     # light green: within reach of the floor
    "under_batched": "#ff9830",  # orange: memory-bound with KV room and requests to spare
    "prefill_heavy": "#b877d9",  # purple: prefill stalls decode
    "kv_saturated": "#f2495c",   # red: the replica holds no more requests
    "above_floor": "#fade2a",    # yellow: time goes outside the weight read
    "unknown": "#4a4a4a",
}
"""The serving states (agent.model.SERVING_STATES) in the same Grafana colours: green is fine, the
others name the knob that moves the server (docs/views.md, "Serving cards")."""

SERVING_LABELS: dict[str, str] = {
    "at_floor": "at the floor",
    "near_floor": "near the floor",
    "under_batched": "under-batched",
    "prefill_heavy": "prefill-heavy",
    "kv_saturated": "KV cache saturated",
    "above_floor": "far above the floor",
    "unknown": "unknown",
}
"""How the status page, ``top`` and ``roofwatch report`` (agent.views.report_serving) name them."""

assert set(SERVING_COLOURS) == set(SERVING_STATES) == set(SERVING_LABELS), "every serving state needs a colour and a label"


def serving_colour(state: str | None) -> str:
    return SERVING_COLOURS.get(state or "unknown", SERVING_COLOURS["unknown"])


def serving_label(state: str | None) -> str:
    return SERVING_LABELS.get(state or "unknown", state or "unknown")
