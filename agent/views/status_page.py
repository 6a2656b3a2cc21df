"""The agent's ``/`` page: one card per GPU (verdict, reasons, MFU, the counters behind them) and
the roofline chart of the node, rendered from the snapshot the scrapes see.

Rendered on the server from the same JSON as ``/api/v1/snapshot`` so the page needs no
JavaScript renderer; a small inline script re-fetches the page and swaps the live section, so it
refreshes in place without flicker and keeps the last data on screen if the agent goes away.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from agent import __version__
from agent.model import EVIDENCE_BASES
from agent.model.counter_source import with_sources
from agent.model.waste import SPARE
from agent.views.attention_html import attention_panel, measures_note, waste_chips, waste_counts
from agent.views.html_parts import bar, class_badge, class_chip, figures_html, fmt, page, pct, script_hash
from agent.views.jitter_evidence import snapshot_evidence
from agent.views.palette import CLASS_LABELS, DOWN_COLOUR, class_colour, class_label
from agent.views.roofline_chart import ChartPoint, Roof, judged_figures, position, roof_for, roofline_svg
from agent.views.serving_cards import SERVING_CSS, ServingGroup, decode_points, serving_groups, serving_section
from agent.views.svg import esc, si

DEFAULT_REFRESH_S = 5.0

REFRESH_SCRIPT = """(function(){
var body=document.body,period=Number(body.dataset.refresh)*1000,count=0;
function note(text){var el=document.getElementById('conn');if(el){el.textContent=text;el.hidden=!text;}}
function refresh(){
  if(document.hidden){setTimeout(refresh,period);return;}
  fetch(location.href,{cache:'no-store'}).then(function(r){
    if(!r.ok){throw new Error('HTTP '+r.status);}
    return r.text();
  }).then(function(text){
    var fresh=new DOMParser().parseFromString(text,'text/html').getElementById('live');
    if(!fresh){throw new Error('not a roofwatch page');}
    document.getElementById('live').replaceWith(fresh);
    body.dataset.refreshes=String(++count);note('');
  }).catch(function(e){note('agent unreachable ('+e.message+'): showing the last data received');})
  .then(function(){setTimeout(refresh,period);});
}
if(period>0){setTimeout(refresh,period);}
})();"""

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src data:; connect-src 'self'; "
    f"script-src {script_hash(REFRESH_SCRIPT)}; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
"""Only the page's own script and styles, and fetches back to the agent: no CDN could load even if
a GPU name or a reason carried markup (everything is escaped anyway)."""


def status_page(data: dict[str, Any], *, refresh_s: float = DEFAULT_REFRESH_S, stale: str | None = None) -> str:
    """The whole page for one snapshot (``snapshot_to_dict`` form). ``stale`` explains why the
    snapshot should not be trusted (the collector stopped publishing), shown as a banner."""
    verdicts = {v["gpu"]: v for v in data.get("verdicts") or []}
    devices = data.get("devices") or []
    servers = serving_groups(devices, verdicts)
    live = (
        f'<div id="live" data-sequence="{esc(data.get("sequence", 0))}">'
        + _header(data, verdicts, stale)
        + '<div class="overview"><div class="chart-box"><h2>Roofline</h2>' + _chart(devices, verdicts, servers) + "</div>"
        + attention_panel(devices, verdicts) + "</div>"
        + serving_section(servers)
        + '<h2>GPUs</h2><div class="cards">' + "".join(_card(d, verdicts.get(d["info"]["gpu"])) for d in devices) + "</div>"
        + "</div>"
    )
    body = (
        f'<h1>roofwatch on {esc(data.get("node", "?"))}</h1>'
        '<div id="conn" class="banner" hidden></div>'
        + live
        + f'<footer>roofwatch {esc(__version__)} · <a href="metrics">/metrics</a> · <a href="healthz">/healthz</a> · '
        f'<a href="api/v1/snapshot">/api/v1/snapshot</a> · {_refresh_note(refresh_s)}</footer>'
    )
    return page(f"roofwatch · {data.get('node', '')}", body, script=REFRESH_SCRIPT if refresh_s > 0 else "",
                body_attrs=f' data-refresh="{refresh_s:g}"', extra_css=PAGE_CSS + SERVING_CSS)


def _refresh_note(refresh_s: float) -> str:
    """How the page refreshes: every N s with a link to stop, or (``?refresh=0``) that it does not, with a link back."""
    if refresh_s > 0:
        return f'refreshes every {refresh_s:g} s (<a href="?refresh=0">stop</a>)'
    return (f'<span id="no-refresh">does not refresh itself</span> (<a href="?refresh={DEFAULT_REFRESH_S:g}">refresh '
            f'every {DEFAULT_REFRESH_S:g} s</a>)')


def _header(data: dict[str, Any], verdicts: dict[str, dict[str, Any]], stale: str | None) -> str:
    health = data.get("health") or {}
    devices = data.get("devices") or []
    up = [d for d in devices if d.get("up")]
    counts = Counter(verdicts[d["info"]["gpu"]]["class"] for d in up if d["info"]["gpu"] in verdicts)
    waste = waste_counts(devices, verdicts)
    mfus = [v["mfu"] for gpu, v in verdicts.items() if v.get("mfu") is not None]
    chips = [class_chip(c, f"{n} {CLASS_LABELS[c]}") for c, n in sorted(counts.items(), key=lambda kv: -kv[1])]
    down = len(data.get("devices") or []) - len(up)
    if down:
        chips.append(f'<span class="chip" style="background:{DOWN_COLOUR};color:#fff">{down} down</span>')
    when = time.strftime("%H:%M:%S UTC", time.gmtime(data["ts"])) if data.get("ts") else "never"
    lines = [
        f'<p class="muted">{data.get("visible_devices", len(up))}/{data.get("expected_devices", "?")} GPUs up · '
        f'backend {esc(health.get("backend", "?"))} · snapshot {when} (cycle {esc(health.get("cycles_total", 0))})</p>',
        f'<div class="summary" id="summary">{"".join(chips)}{waste_chips(waste)}'
        f'<span class="chip" style="background:#eee">mean MFU {pct(sum(mfus) / len(mfus)) if mfus else "—"}</span></div>',
        measures_note(waste),
    ]
    if stale:
        lines.insert(0, f'<div class="banner" id="stale">{esc(stale)}</div>')
    if health.get("waiting_for"):
        lines.insert(0, f'<div class="banner" id="waiting">Waiting for {esc(health["waiting_for"])}</div>')
    if not verdicts and up:
        lines.append('<p class="muted">No verdicts yet: the classifier needs one full window of samples.</p>')
    return "".join(lines)


def _chart(devices: list[dict[str, Any]], verdicts: dict[str, dict[str, Any]], servers: list[ServingGroup]) -> str:
    roofs: list[Roof] = []
    points: list[ChartPoint] = []
    missing: list[str] = []
    by_report: list[str] = []
    for device in devices:
        info, verdict = device["info"], verdicts.get(device["info"]["gpu"])
        if not device.get("up") or verdict is None:
            continue
        spec = info.get("spec") or {}
        roof = roof_for(spec.get("name") or info.get("model", "?"), verdict.get("dtype") or "bf16",
                        spec.get("peak_flops"), spec.get("mem_bandwidth_bytes_per_s"))
        if roof:
            roofs.append(roof)
        rl = verdict.get("roofline") or {}
        intensity, flops, reported = position(rl.get("achieved_flops"), rl.get("achieved_bytes_per_s"),
                                              verdict.get("mfu_workload"), roof.peak_flops if roof else None)
        point = ChartPoint(intensity, flops, verdict["class"], info["gpu"], _point_title(info["gpu"], verdict, reported), reported)
        points.append(point)
        if not point.plottable:
            missing.append(f"GPU {info['gpu']} ({_why_not_plotted(device, verdict)})")
        elif reported:
            by_report.append(info["gpu"])
    note = f'<p class="muted small" id="unplotted">Not on the chart: {esc("; ".join(missing))}.</p>' if missing else ""
    if by_report:
        note += (f'<p class="muted small" id="reported">Hollow: placed from the FLOPs the job reported (no FLOP counter): '
                 f'GPU {esc(", ".join(by_report))}.</p>')
    decodes, decode_note = decode_points(servers)
    return roofline_svg(roofs, points, decodes=decodes) + note + decode_note


def _point_title(gpu: str, verdict: dict[str, Any], reported: bool = False) -> str:
    rl = verdict.get("roofline") or {}
    where = "from the job's reported FLOPs" if reported else f"{rl.get('intensity')} FLOP/B, {si(rl.get('achieved_flops') or 0, 'FLOP/s')}"
    return f"GPU {gpu}: {class_label(verdict['class'])}, {where}, {judged_figures(verdict['class'], verdict)}"


def _why_not_plotted(device: dict[str, Any], verdict: dict[str, Any]) -> str:
    rl = verdict.get("roofline") or {}
    if verdict["class"] == "idle":
        return "idle"
    if rl.get("achieved_flops") is None:
        return "no FLOP counter, no workload report"
    return "no DRAM traffic measured"


def _card(device: dict[str, Any], verdict: dict[str, Any] | None) -> str:
    info = device["info"]
    gpu = info["gpu"]
    head = (f'<div class="head"><b>GPU {esc(gpu)}</b> <span class="muted small">{esc(info.get("model", ""))}</span></div>')
    if not device.get("up"):
        return (f'<div class="card down" data-gpu="{esc(gpu)}" data-class="down">{head}'
                f'<span class="badge dark" style="background:{DOWN_COLOUR}">DOWN</span>'
                f'<p class="small">{esc(device.get("error") or "no answer")}</p></div>')
    sample = device.get("sample") or {}
    cls = verdict["class"] if verdict else None
    verdict_html = '<span class="muted small">no verdict yet</span>'
    if verdict:
        flag = '<span class="pill">throttled</span>' if verdict.get("throttled") else ""
        verdict_html = (f'{class_badge(cls)} <span class="muted small">{pct(verdict.get("confidence"))} confident'
                        f'{" · " + esc(verdict["detail"]) if verdict.get("detail") else ""}</span>{flag}'
                        + figures_html(cls, {f: (verdict.get(f), verdict.get(f"{f}_source")) for f in ("mfu", "mbu")})
                        + _waste_line(verdict))
    reasons = "".join(f"<li>{esc(r)}</li>" for r in (verdict or {}).get("reasons") or [])
    key = str((verdict or {}).get("basis"))
    basis = EVIDENCE_BASES.get(key) if verdict else None
    if basis:
        basis = with_sources(key, basis, (verdict or {}).get("basis_sources") or ())
        reasons += f'<li class="basis muted" data-source="{esc((verdict or {}).get("basis_source") or "")}">verdict rests '
        reasons += f"on: {esc(basis)}</li>"
    evidence = snapshot_evidence(verdict) if verdict else []
    if evidence:
        reasons += f'<li class="evidence muted">evidence: {esc(" · ".join(evidence))}</li>'
    memory_bar = (bar("DRAM", sample.get("dram_active"), "#5794f2") if sample.get("dram_active") is not None
                  or sample.get("mem_busy") is None else bar("mem busy", sample.get("mem_busy"), "#5794f2"))
    return (
        f'<div class="card" data-gpu="{esc(gpu)}" data-class="{esc(cls or "none")}" style="border-top-color:'
        f'{class_colour(cls)}">{head}<div class="verdict">{verdict_html}</div>'
        + (f'<ul class="reasons small">{reasons}</ul>' if reasons else "")
        + bar("engine", sample.get("gr_active")) + bar("SM", sample.get("sm_active"))
        + bar("tensor", sample.get("tensor_active"), "#73bf69") + memory_bar
        + f'<div class="facts small">{_facts(sample)}</div>{_owner(sample)}</div>'
    )


def _waste_line(verdict: dict[str, Any]) -> str:
    """Under the verdict: what a wasted GPU lost (the model's words), or that an idle GPU nobody holds is spare."""
    label = (verdict.get("waste") or {}).get("label")
    figure = next((a["figure"] for a in verdict.get("attention") or [] if a.get("kind") == "waste"), None)
    if figure:
        return f'<div class="waste small" data-waste="{esc(label)}">wasted: {esc(figure)}</div>'
    if label == SPARE:
        return (f'<div class="waste small muted" data-waste="{SPARE}">spare: idle and nobody holds it (capacity, '
                "not waste)</div>")
    return ""


def _facts(sample: dict[str, Any]) -> str:
    used, total = sample.get("mem_used_bytes"), sample.get("mem_total_bytes")
    memory = "—" if used is None else f"{used / 2**30:.0f}" + (f" / {total / 2**30:.0f} GiB" if total else " GiB")
    clock = fmt(sample.get("sm_clock_mhz"), "MHz")
    if sample.get("sm_clock_max_mhz") and sample.get("sm_clock_mhz") is not None:
        clock = f"{sample['sm_clock_mhz']:.0f} / {sample['sm_clock_max_mhz']:.0f} MHz"
    return (f"<span>power {fmt(sample.get('power_w'), 'W')}</span> <span>clock {clock}</span> "
            f"<span>memory {memory}</span> <span>{fmt(sample.get('temperature_c'), '°C')}</span>")


def _owner(sample: dict[str, Any]) -> str:
    who = sample.get("attribution") or {}
    job = who.get("job_id") or (sample.get("workload") or {}).get("job")
    parts = []
    if job:
        parts.append(f"job <b>{esc(job)}</b>")
    if who.get("pod"):
        parts.append(f"pod <b>{esc((who.get('namespace') or '') + '/' + who['pod'])}</b>")
    if who.get("user"):
        parts.append(f"user {esc(who['user'])}")
    holders = who.get("holders") or []
    if len(holders) > 1:  # a shared GPU (issue 47): each holder's share is in roofwatch_gpu_holder_*
        names = [_holder_name(h) for h in holders[:3]]
        more = f" +{len(holders) - 3}" if len(holders) > 3 else ""
        parts.append(f"shared by <b>{len(holders)}</b>: {esc(', '.join(names))}{more}")
    return f'<div class="owner small">{" · ".join(parts)}</div>' if parts else ""



def _holder_name(holder: dict) -> str:
    """A holder as the owner line names it: ``namespace/pod``, ``job 5101 (alice, physics)`` (a Slurm job with its
    user and account, who its share is billed to), or ``pid 4242`` (a plain process, with its owner)."""
    owner = ", ".join(holder[k] for k in ("user", "account") if holder.get(k))
    if holder.get("pod"):
        return "/".join(holder.get(k) or "" for k in ("namespace", "pod"))
    name = f"job {holder['job_id']}" if holder.get("job_id") else "pid " + ",".join(map(str, holder.get("pids") or []))
    return f"{name} ({owner})" if owner else name

PAGE_CSS = """
.overview{display:flex;flex-wrap:wrap;gap:0 24px;align-items:flex-start}
.chart-box{flex:1 1 560px;max-width:820px}
.attention{flex:1 1 280px;max-width:560px}
.attention ul{list-style:none;padding:0;margin:0}
.attention li{background:#fff;border:1px solid #ddd;border-radius:6px;padding:6px 10px;margin-bottom:6px}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(300px,1fr));gap:12px}
.card{background:#fff;border:1px solid #ddd;border-top:5px solid #4a4a4a;border-radius:6px;padding:10px 12px}
.card.down{border-top-color:#f2495c}
.card .head{margin-bottom:6px}
.card .verdict{margin-bottom:4px}
.card .figures.lead .figure{font-size:22px;font-weight:700}
.card .figures.other .figure{font-weight:600}
.card .judged{margin:1px 0 3px}
.card .reasons{margin:4px 0 6px;padding-left:18px;color:#333}
.card .facts span{margin-right:8px;white-space:nowrap}
.card .owner{margin-top:4px;color:#333}
.card .waste{margin-top:2px;color:#8a1c12}
.card .waste.muted{color:#666}
.attention .advice{color:#333}
"""
