"""``roofwatch top``'s jitter evidence: under the GPU table, one line per communication-jittered GPU.

The class column says a GPU waits on its peers; this says what that rests on (the reason info's
``basis``: step times, SM/tensor counters, power against fabric bytes, the ranks' spread, the NIC's
counters) and the figures behind it: the share of samples spent waiting, the correlation of power
with fabric bytes, the step-time CV and the mean step. A GPU without SM or tensor counters (A100 or
L40S through NVML alone, MI300X through amdsmi) is judged by power against fabric bytes, and these
figures are how a person checks that. Absent series are left out, never shown as 0; a line never
wraps: the figures that do not fit are left out, last first.
"""

from __future__ import annotations

from typing import Sequence

from rich.text import Text

from agent.views import palette
from agent.views.jitter_evidence import BASIS_SHORT, JITTERED, evidence_parts
from agent.model.text import printable
from agent.views.top_source import GpuRow

TITLE = "JITTER EVIDENCE"
MAX_NAME = 20
"""Widest a node name or GPU id may be on a line (longer ones end in an ellipsis)."""


def jittered(rows: Sequence[GpuRow]) -> list[GpuRow]:
    """The GPUs that answer and are communication-jittered, in the table's order."""
    return [r for r in rows if r.up is not False and r.cls == JITTERED]


def evidence_line(row: GpuRow, width: int, with_node: bool = False) -> Text:
    """``GPU 4  power vs fabric: wait 30% · power~fabric r -0.93 · step CV 18% · 1.2 s steps``,
    at most ``width`` cells: figures that do not fit are left out, the basis is cut last."""
    who = f"GPU {printable(row.gpu, MAX_NAME)}"
    if with_node:
        who = f"{printable(row.node, MAX_NAME)} {who}"
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(who, style="bold")
    basis = BASIS_SHORT.get(row.basis or "", printable(row.basis, MAX_NAME) if row.basis else "basis unknown")
    text.append(f"  {basis}", style=palette.class_colour(JITTERED))
    parts = evidence_parts(wait=row.comm_wait, power_r=row.power_fabric_r, step_cv=row.step_cv,
                           step_time_s=row.step_time_s, short=True)
    for i, part in enumerate(parts):
        piece = (": " if i == 0 else " · ") + part
        if text.cell_len + len(piece) > width:
            break
        text.append(piece)
    if text.cell_len > width:
        text.truncate(width, overflow="ellipsis")
    return text


def render_jitter(rows: Sequence[GpuRow], width: int = 200) -> Text | None:
    """The section, or None when no GPU is communication-jittered."""
    shown = jittered(rows)
    if not shown:
        return None
    with_node = len({r.node for r in rows}) > 1
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(TITLE[:width], style="bold")
    for row in shown:
        text.append("\n")
        text.append_text(evidence_line(row, width, with_node))
    return text
