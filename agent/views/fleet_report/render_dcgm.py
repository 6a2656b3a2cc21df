"""The ``--source dcgm`` section: roofwatch's verdict per GPU over dcgm-exporter's series."""

from __future__ import annotations

from typing import Any

from agent.model import WORKLOAD_CLASSES
from agent.views.fleet_report.render_tables import hours
from agent.views.html_parts import class_badge, pct
from agent.views.palette import class_label, mfu_colour
from agent.views.svg import esc


def dcgm_section(dcgm: dict[str, Any]) -> str:
    gpus = dcgm.get("gpus") or []
    note = ""
    if dcgm.get("gpus_found", 0) > dcgm.get("gpus_read", 0):
        note = (f'<div class="banner">{dcgm["gpus_found"]} GPUs export DCGM fields; the first {dcgm["gpus_read"]} '
                f"(by host and index) were read (--max-gpus {dcgm['max_gpus']}).</div>")
    absent = dcgm.get("absent_fields") or []
    absent_note = (f'<p class="muted small">Fields absent from the store (their evidence is unknown to the classifier): '
                   f'{esc(", ".join(absent))}.</p>') if absent else ""
    head = "".join(f"<th>{esc(class_label(c))} h</th>" for c in WORKLOAD_CLASSES)
    rows = "".join(
        f'<tr data-uuid="{esc(g["uuid"])}" data-class="{esc(g.get("class") or "unknown")}"><td>{esc(g["node"])}</td>'
        f'<td>{esc(g["gpu"])}</td><td>{esc(g["model"])}</td><td>{esc(g.get("namespace") or "—")}</td>'
        f'<td>{class_badge(g.get("class"))}</td><td>{esc(g.get("detail") or "—")}</td>'
        f'<td class="num" style="color:{mfu_colour(g.get("mfu"))}">{pct(g.get("mfu"))}</td>'
        + "".join(f'<td class="num">{hours(g["hours"].get(c, 0.0))}</td>' for c in WORKLOAD_CLASSES) + "</tr>"
        for g in gpus)
    return (
        "<h2>roofwatch verdicts from dcgm-exporter series</h2>" + note
        + f'<p class="muted small">DCGM_FI_PROF_* and DCGM_FI_DEV_* averaged over {dcgm.get("step_s")} s steps, classified '
        f'by roofwatch\'s engine with a {dcgm.get("window_s", 0):g} s window ({dcgm.get("samples", 0)} samples). '
        "MFU here is the counter estimate (tensor activity × clock), not a job's own figure.</p>" + absent_note
        + '<table id="dcgm" class="wide"><tr><th>host</th><th>GPU</th><th>model</th><th>namespace</th><th>mostly</th>'
        f"<th>detail</th><th>MFU</th>{head}</tr>{rows}</table>")
