"""The status page's waste figures and its "Needs attention" list, from the snapshot's verdicts.

Both read what ``/api/v1/snapshot`` carries per verdict: ``waste`` (agent.model.waste: the GPU's waste
kind, ``spare`` or ``none``, and the share of its window it lost) and ``attention`` (agent.model.attention:
every reason it needs a person). Nothing is decided here: the page counts and lists what the model
decided, so it says what ``top``, the exported series, the rules and the dashboards say.

Every figure names its measure (agent.model.waste.MEASURES): GPUs wasted count whole verdict windows,
time lost is the share of the GPUs' time actually lost. Spare GPUs (idle, nobody holds them) are
capacity, shown apart, never as waste and never under "Needs attention".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agent.model.attention import ATTENTION_KINDS
from agent.model.indexes import gpu_order
from agent.model.waste import MEASURES, SPARE
from agent.views.html_parts import class_badge, pct
from agent.views.palette import DOWN_COLOUR, serving_colour, serving_label
from agent.views.svg import esc


@dataclass
class WasteCounts:
    """The node's waste figures, from the up GPUs' verdicts."""

    devices: int = 0
    """Every GPU of the node, down ones too: what the wasted count is out of (as in ``top``)."""
    gpus: int = 0
    """GPUs up with a verdict: what the time lost is a share of."""
    wasted: list[str] = field(default_factory=list)
    spare: list[str] = field(default_factory=list)
    lost: float = 0.0
    """GPU-windows lost: the sum of the known lost shares."""
    unmeasured: list[str] = field(default_factory=list)
    """Wasted GPUs whose lost share is unknown."""
    attention: list[str] = field(default_factory=list)
    """GPUs with at least one reason for attention."""


def _up_verdicts(devices: list[dict[str, Any]], verdicts: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [verdicts[d["info"]["gpu"]] for d in devices if d.get("up") and d["info"]["gpu"] in verdicts]


def waste_counts(devices: list[dict[str, Any]], verdicts: dict[str, dict[str, Any]]) -> WasteCounts:
    counts = WasteCounts(devices=len(devices))
    for verdict in _up_verdicts(devices, verdicts):
        gpu, waste = verdict["gpu"], verdict.get("waste") or {}
        counts.gpus += 1
        if waste.get("wasted"):
            counts.wasted.append(gpu)
            if waste.get("lost_fraction") is None:
                counts.unmeasured.append(gpu)
        elif waste.get("label") == SPARE:
            counts.spare.append(gpu)
        counts.lost += waste.get("lost_fraction") or 0.0
        if verdict.get("attention"):
            counts.attention.append(gpu)
    return counts


def waste_chips(counts: WasteCounts) -> str:
    """Chips for the summary line: GPUs wasted (whole windows), time lost, spare, needing attention."""
    lost = pct(counts.lost / counts.gpus) if counts.gpus else "—"
    if counts.unmeasured:
        lost = f"≥ {lost}"
    chips = [
        f'<span class="chip" style="background:#eee" id="wasted" data-count="{len(counts.wasted)}" '
        f'title="{esc(MEASURES["windows"])}">{len(counts.wasted)} of {counts.devices} GPUs wasted</span>',
        f'<span class="chip" style="background:#eee" id="lost" data-lost="{counts.lost:.4f}" '
        f'title="{esc(MEASURES["lost"])}">time lost {lost}</span>',
    ]
    if counts.spare:
        chips.append(f'<span class="chip" style="background:#eee" id="spare" data-count="{len(counts.spare)}">'
                     f'{len(counts.spare)} spare</span>')
    chips.append(f'<span class="chip" style="background:#eee" id="attention-count" data-count="{len(counts.attention)}">'
                 f'{len(counts.attention)} need attention</span>')
    return "".join(chips)


def measures_note(counts: WasteCounts) -> str:
    """What each figure counts, under the summary (the words of agent.model.waste.MEASURES)."""
    unmeasured = (f" Not measured for GPU {', '.join(counts.unmeasured)}: no wait counter and no rank spread, so time "
                  "lost is at least the figure shown." if counts.unmeasured else "")
    return (f'<p class="muted small" id="measures">GPUs wasted: {esc(MEASURES["windows"])}. Time lost: '
            f'{esc(MEASURES["lost"])}, over the node\'s GPUs.{esc(unmeasured)} One definition for every view, '
            'rule and dashboard: agent/model/waste.py.</p>')


# -- the list -------------------------------------------------------------------------------


def _rank(kind: str) -> int:
    return ATTENTION_KINDS.index(kind) + 1 if kind in ATTENTION_KINDS else len(ATTENTION_KINDS) + 1


def _serving_badge(state: str) -> str:
    return (f'<span class="badge" style="background:{serving_colour(state)}" data-state="{esc(state)}">'
            f"{esc(serving_label(state))}</span>")


def _gpu_item(gpu: str, verdict: dict[str, Any], reason: dict[str, Any]) -> str:
    kind = reason["kind"]
    if kind == "waste":
        badge = class_badge(verdict["class"])
    elif kind == "low_mfu":
        badge = class_badge("compute_bound", f" at {pct(verdict.get('mfu'))} MFU")
    else:
        badge = '<span class="pill">throttled</span>'
    why = (verdict.get("reasons") or [""])[0] if kind in ("waste", "low_mfu") else ""
    detail = f'<br><span class="small">{esc(why)}</span>' if why else ""
    return (f'<li data-gpu="{esc(gpu)}" data-kind="{esc(kind)}" data-code="{esc(reason["code"])}"><b>GPU {esc(gpu)}</b> '
            f'{badge} <span class="figure">{esc(reason["figure"])}</span>{detail}</li>')


def _server_item(server: str, gpus: list[str], reason: dict[str, Any]) -> str:
    where = f"GPU {gpus[0]}" if len(gpus) == 1 else f"GPUs {', '.join(gpus)}"
    return (f'<li data-server="{esc(server)}" data-gpus="{esc(",".join(gpus))}" data-kind="serving" '
            f'data-code="{esc(reason["code"])}"><b>{esc(server)}</b> <span class="muted small">{esc(where)}</span> '
            f'{_serving_badge(reason["code"])} <span class="figure">{esc(reason["figure"])}</span><br>'
            f'<span class="small advice">what to do: {esc(reason.get("advice") or "")}</span></li>')


def attention_panel(devices: list[dict[str, Any]], verdicts: dict[str, dict[str, Any]]) -> str:
    """The GPUs and servers a person should look at first, each with the figure that says why (and, for a server,
    what to do); down GPUs first, then by :data:`agent.model.attention.ATTENTION_KINDS`; spare GPUs apart."""
    items: list[tuple[int, tuple, str]] = []
    servers: dict[str, tuple[list[str], dict[str, Any]]] = {}
    spare: list[str] = []
    for device in devices:
        gpu = device["info"]["gpu"]
        if not device.get("up"):
            items.append((0, gpu_order(gpu), f'<li data-gpu="{esc(gpu)}" data-kind="down"><b>GPU {esc(gpu)}</b> '
                                             f'<span class="badge dark" style="background:{DOWN_COLOUR}">DOWN</span><br>'
                                             f'<span class="small">{esc(device.get("error") or "no answer")}</span></li>'))
            continue
        verdict = verdicts.get(gpu)
        if verdict is None:
            continue
        if (verdict.get("waste") or {}).get("label") == SPARE:
            spare.append(gpu)
        for reason in verdict.get("attention") or []:
            if reason["kind"] == "serving":
                name = reason.get("server") or f"GPU {gpu}"
                servers.setdefault(name, ([], reason))[0].append(gpu)
            else:
                items.append((_rank(reason["kind"]), gpu_order(gpu), _gpu_item(gpu, verdict, reason)))
    for name, (gpus, reason) in servers.items():
        items.append((_rank("serving"), gpu_order(gpus[0]), _server_item(name, gpus, reason)))
    if items:
        body = "<ul>" + "".join(html for _, _, html in sorted(items, key=lambda i: (i[0], i[1]))) + "</ul>"
    else:
        body = ('<p class="muted" id="nothing">Nothing needs attention: no GPU is wasted, and no inference server has a '
                "knob to turn.</p>")
    if spare:
        body += (f'<p class="muted small" id="spare-gpus">Spare capacity, not waste: GPU {esc(", ".join(spare))} '
                 "(idle, nobody holds it).</p>")
    return f'<div class="attention" id="attention"><h2>Needs attention</h2>{body}</div>'
