"""The ``--source dcgm`` and ``--source amd`` sections: roofwatch's verdict per GPU over an exporter's series."""

from __future__ import annotations

from typing import Any

from agent.model import WORKLOAD_CLASSES
from agent.views.fleet_report.render_tables import hours
from agent.views.html_parts import class_badge, pct
from agent.views.palette import class_label, mfu_colour
from agent.views.svg import esc


def dcgm_section(dcgm: dict[str, Any]) -> str:
    return _section(dcgm, "dcgm", "DCGM fields", "roofwatch verdicts from dcgm-exporter series",
                    f'DCGM_FI_PROF_* and DCGM_FI_DEV_* averaged over {dcgm.get("step_s")} s steps',
                    "MFU here is the counter estimate (tensor activity × clock), not a job's own figure.")


def amd_section(amd: dict[str, Any]) -> str:
    """The ``--source amd`` section: the same table over AMD Device Metrics Exporter series."""
    without = [g for g in amd.get("gpus") or [] if not g.get("profiler")]
    counterless = (f" {len(without)} GPU objects have no profiler series (gpu_prof_*): their verdicts rest on "
                   "activity, UMC activity and power, and they have no counter MFU.") if without else ""
    return _section(amd, "amd", "Device Metrics Exporter series", "roofwatch verdicts from AMD Device Metrics Exporter series",
                    f'gpu_* and gpu_prof_* averaged over {amd.get("step_s")} s steps, profiler counts over a '
                    f'{amd.get("profiler_window_us", 0):g} µs window (--amd-profiler-window-us)',
                    "MFU here is the counter estimate (MFMA busy × GUI-active, as the agent's), not a job's own figure."
                    + counterless)


def _section(data: dict[str, Any], table_id: str, exports: str, heading: str, read: str, mfu_note: str) -> str:
    gpus = data.get("gpus") or []
    note = ""
    if data.get("gpus_found", 0) > data.get("gpus_read", 0):
        note = (f'<div class="banner">{data["gpus_found"]} GPUs export {exports}; the first {data["gpus_read"]} '
                f"(by host and index) were read (--max-gpus {data['max_gpus']}).</div>")
    absent = data.get("absent_fields") or []
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
        f"<h2>{esc(heading)}</h2>" + note
        + f'<p class="muted small">{esc(read)}, classified '
        f'by roofwatch\'s engine with a {data.get("window_s", 0):g} s window ({data.get("samples", 0)} samples). '
        f"{esc(mfu_note)}</p>" + absent_note
        + f'<table id="{table_id}" class="wide"><tr><th>host</th><th>GPU</th><th>model</th><th>namespace</th><th>mostly</th>'
        f"<th>detail</th><th>MFU</th>{head}</tr>{rows}</table>")
