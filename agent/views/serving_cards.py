"""The status page's serving cards, and each server's decode step on its roofline chart.

One card per inference server (one model replica): the GPUs whose verdict carries a ``serving``
object (agent.classifier.serving), grouped by the server's name, else each GPU on its own. The
figures are the replica's, repeated on each of its GPUs, so a card reads them from its first GPU.

The decode point places one decode step per GPU: the FLOPs of the batch (batch x FLOPs per token)
over the bytes the step reads (weights + KV cache), at the rate TPOT implies. The roof above that
point is what a step at the floor would reach, so the gap between them is TPOT / the floor, the
same multiple the card shows. Without FLOPs per token there is no honest intensity to place it at;
the note under the chart then gives the step's bandwidth against the HBM's instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agent.views.html_parts import bar, pct
from agent.views.palette import SERVING_COLOURS, serving_colour, serving_label
from agent.views.roofline_chart import DecodePoint
from agent.views.svg import esc, si

EMPTY = "—"


@dataclass(frozen=True)
class ServingGroup:
    """One server on this node: its serving figures and the GPUs that serve it."""

    key: str
    """The server's name, or ``GPU <id>`` for a server that has none."""
    view: dict[str, Any]
    """``verdict["serving"]`` of its first GPU (ServingView.to_json form)."""
    gpus: tuple[str, ...]
    device: dict[str, Any]
    """Its first GPU's device entry (spec, latest sample)."""
    verdict: dict[str, Any]


def serving_groups(devices: list[dict[str, Any]], verdicts: dict[str, dict[str, Any]]) -> list[ServingGroup]:
    """The servers of a snapshot, in the order of their first GPU; down GPUs serve nothing."""
    groups: dict[str, ServingGroup] = {}
    for device in devices:
        gpu = device["info"]["gpu"]
        verdict = verdicts.get(gpu)
        view = (verdict or {}).get("serving")
        if not device.get("up") or not isinstance(view, dict):
            continue
        key = view.get("server") or f"GPU {gpu}"
        found = groups.get(key)
        groups[key] = (ServingGroup(key, found.view, (*found.gpus, gpu), found.device, found.verdict) if found
                       else ServingGroup(key, view, (gpu,), device, verdict or {}))
    return list(groups.values())


# -- numbers --------------------------------------------------------------------------------


def ms(seconds: float | None) -> str:
    if seconds is None:
        return EMPTY
    return f"{seconds:.3g} s" if seconds >= 1 else f"{seconds * 1e3:.3g} ms"


def multiple(ratio: float | None) -> str:
    if ratio is None:
        return EMPTY
    return f"{ratio:.1f}x" if ratio < 10 else f"{ratio:.0f}x"


def gb(n: float | None) -> str:
    return EMPTY if n is None else f"{n / 1e9:.3g} GB"


def count(n: float | None) -> str:
    return EMPTY if n is None else f"{n:.3g}"


def floor_sentence(view: dict[str, Any]) -> str:
    """``TPOT 7.5 ms = 1.3x the floor of 5.6 ms``, or what is missing (plain text, unescaped)."""
    tpot, floor, ratio = view.get("tpot_s"), view.get("floor_s"), view.get("floor_ratio")
    if tpot is None:
        return "no TPOT reported" + (f"; the floor is {ms(floor)}" if floor is not None else "")
    if floor is None or ratio is None:
        return f"TPOT {ms(tpot)}; no floor to compare it with"
    return f"TPOT {ms(tpot)} = {multiple(ratio)} the floor of {ms(floor)}"


def step_bytes(view: dict[str, Any]) -> float | None:
    """Bytes one decode step reads across the replica: weights + the KV cache of the batch."""
    weights = view.get("weight_bytes")
    return None if weights is None else weights + (view.get("kv_bytes_read") or 0.0)


def _bandwidth(group: ServingGroup) -> float | None:
    return ((group.device.get("info") or {}).get("spec") or {}).get("mem_bandwidth_bytes_per_s")


def _peak(group: ServingGroup) -> float | None:
    spec = (group.device.get("info") or {}).get("spec") or {}
    return (spec.get("peak_flops") or {}).get(group.verdict.get("dtype") or "bf16")


def _flops_per_token(group: ServingGroup) -> float | None:
    return ((group.device.get("sample") or {}).get("workload") or {}).get("flops_per_token")


def step_rate(group: ServingGroup) -> float | None:
    """HBM bytes per second per GPU that decode achieves: step bytes / TPOT / GPUs of the replica."""
    view, read = group.view, step_bytes(group.view)
    if read is None or not view.get("tpot_s"):
        return None
    return read / view["tpot_s"] / (view.get("gpus") or 1)


# -- the card -------------------------------------------------------------------------------


def serving_badge(state: str | None) -> str:
    colour = serving_colour(state)
    dark = " dark" if colour == SERVING_COLOURS["unknown"] else ""
    return (f'<span class="badge{dark}" style="background:{colour}" data-state="{esc(state or "unknown")}">'
            f'{esc(serving_label(state))}</span>')


def _floor_parts(group: ServingGroup) -> str:
    """Where the floor comes from: the bytes a step reads, the bandwidth decode achieves, the compute roof."""
    view = group.view
    parts = []
    if view.get("floor_memory_s") is not None:
        kv = view.get("kv_bytes_read")
        kv_text = EMPTY if kv is None else gb(kv) + (" estimated" if view.get("kv_bytes_estimated") else "")
        parts.append(f"memory {ms(view['floor_memory_s'])}: weights {gb(view.get('weight_bytes'))} + KV cache "
                     f"{kv_text} read per step")
    if view.get("floor_compute_s") is not None:
        parts.append(f"compute {ms(view['floor_compute_s'])}")
    rate, bandwidth = step_rate(group), _bandwidth(group)
    if rate is not None:
        share = f" = {pct(rate / bandwidth)} of HBM bandwidth" if bandwidth else ""
        parts.append(f"decode reads {si(rate, 'B/s')} per GPU{share}")
    return " · ".join(parts)


def _facts(view: dict[str, Any]) -> str:
    batch, possible = view.get("batch"), view.get("possible_batch")
    batch_text = count(batch) + (f" of ~{possible:.0f} possible" if possible is not None else "")
    tokens = view.get("tokens_per_s_per_gpu")
    facts = (("tokens", "tokens/s per GPU", EMPTY if tokens is None else f"{tokens:,.0f}"),
             ("batch", "batch", batch_text), ("waiting", "waiting", count(view.get("waiting"))),
             ("preemptions", "preempted/s", count(view.get("preemptions_per_s"))))
    return "".join(f'<span data-fact="{key}">{esc(name)} <b>{esc(value)}</b></span> ' for key, name, value in facts)


def _gpus_line(group: ServingGroup) -> str:
    gpus, spans = group.gpus, group.view.get("gpus") or len(group.gpus)
    where = f"GPU {', '.join(gpus)}" if len(gpus) == 1 else f"GPUs {', '.join(gpus)}"
    if spans > len(gpus):
        where += f" (the replica spans {spans} GPUs)"
    return esc(where)


def serving_card(group: ServingGroup) -> str:
    view = group.view
    state = view.get("state")
    reasons = "".join(f"<li>{esc(r)}</li>" for r in view.get("reasons") or [])
    parts = _floor_parts(group)
    return (
        f'<div class="card serving" data-server="{esc(group.key)}" data-state="{esc(state or "unknown")}" '
        f'data-gpus="{esc(",".join(group.gpus))}" style="border-top-color:{serving_colour(state)}">'
        f'<div class="head"><b>{esc(group.key)}</b> <span class="muted small">{esc(view.get("model") or "")}</span></div>'
        f'<div class="verdict">{serving_badge(state)} <span class="muted small">advice: '
        f'{esc(view.get("advice_code") or EMPTY)}</span></div>'
        f'<p class="advice small">{esc(view.get("advice") or "")}</p>'
        f'<div class="floor" data-fact="floor">{esc(floor_sentence(view))}</div>'
        + (f'<div class="muted small" data-fact="floor-parts">{esc(parts)}</div>' if parts else "")
        + bar("KV cache", view.get("kv_usage"), "#5794f2") + bar("prefill", view.get("prefill_share"), "#b877d9")
        + f'<div class="facts small">{_facts(view)}</div>'
        + (f'<ul class="reasons small">{reasons}</ul>' if reasons else "")
        + f'<div class="owner small" data-fact="gpus">{_gpus_line(group)}</div></div>'
    )


def serving_section(groups: list[ServingGroup]) -> str:
    """The "Serving" heading and one card per server; nothing on a node that serves nothing."""
    if not groups:
        return ""
    return ('<h2>Serving</h2><div class="cards serving-cards" id="serving">'
            + "".join(serving_card(g) for g in groups) + "</div>")


# -- the decode point -----------------------------------------------------------------------


def decode_point(group: ServingGroup) -> tuple[DecodePoint | None, str | None]:
    """(the server's decode step on the chart, None) or (None, why it is not on the chart)."""
    view, read = group.view, step_bytes(group.view)
    tpot, batch, fpt = view.get("tpot_s"), view.get("batch"), _flops_per_token(group)
    if read is None or not tpot:
        missing = "weight bytes (model_bytes)" if read is None else "time per output token"
        return None, f"{group.key}: no {missing}"
    rate, bandwidth = step_rate(group), _bandwidth(group)
    if not fpt or not batch:
        mbu = f" = {pct(rate / bandwidth)} of HBM bandwidth" if rate and bandwidth else ""
        return None, (f"{group.key}: {'no FLOPs per token reported' if not fpt else 'no running batch'}, so no "
                      f"intensity to place decode at; it reads {gb(read)} per step, {si(rate or 0, 'B/s')} per GPU{mbu}")
    gpus = view.get("gpus") or 1
    intensity = batch * fpt / read
    flops = batch * fpt / tpot / gpus
    peak = _peak(group)
    roofs = [r for r in (peak, bandwidth * intensity if bandwidth else None) if r]
    roof = min(roofs) if roofs else None
    title = (f"{group.key} decode ({view.get('model') or 'model unknown'}): batch {count(batch)} x {si(fpt, 'FLOP')} "
             f"per token over {gb(read)} read per step = {intensity:.3g} FLOP/B; {si(flops, 'FLOP/s')} per GPU at "
             f"TPOT {ms(tpot)}. The roof above is {multiple(view.get('floor_ratio'))} higher: TPOT / the floor")
    return DecodePoint(intensity, flops, roof, serving_colour(view.get("state")), "decode " + ",".join(group.gpus),
                       title, group.key), None


def decode_points(groups: list[ServingGroup]) -> tuple[list[DecodePoint], str]:
    """The decode points of ``groups`` and the notes under the chart (a legend, and the servers left off)."""
    points, missing = [], []
    for group in groups:
        point, why = decode_point(group)
        if point is not None:
            points.append(point)
        elif why:
            missing.append(why)
    note = ""
    if points:
        note += ('<p class="muted small" id="decode-note">Diamonds: each server\'s decode step per GPU, the batch\'s '
                 'FLOPs over the weight and KV-cache bytes a step reads, at its time per output token; the dotted '
                 'line up to the roof is TPOT / the floor.</p>')
    if missing:
        note += f'<p class="muted small" id="decode-unplotted">Decode not on the chart: {esc("; ".join(missing))}.</p>'
    return points, note


SERVING_CSS = """
.card.serving .advice{margin:4px 0 6px;color:#333}
.card.serving .floor{font-size:15px;font-weight:600;margin:4px 0 2px}
.card.serving .facts{margin-top:4px}
"""
