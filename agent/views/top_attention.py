"""``roofwatch top``'s waste figures and "needs attention" lines, from one ``/metrics`` exposition.

The exposition carries what the agent's model decided: each GPU's ``waste`` label (agent.model.waste) on
``roofwatch_gpu_workload_reason_info``, the share it lost (``roofwatch_gpu_waste_lost_ratio``) and each
server's state and figures (``roofwatch_serving_*``). The reasons for attention are then decided by
agent.model.attention from those figures, the same function the status page's list comes from, so
``top`` and the page name the same GPUs and servers for the same reasons.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from rich.console import Group, RenderableType
from rich.text import Text

from agent.model.attention import ATTENTION_KINDS, Attention, attention, serving_attention
from agent.model.indexes import gpu_order
from agent.model.text import printable
from agent.model.waste import SPARE, WASTE_KINDS
from agent.views import palette
from agent.views.top_serving import ServingRow
from agent.views.top_source import GpuRow

EMPTY = "—"


def _pct(value: float) -> str:
    return f"{value * 100:.0f}%"


def serving_reasons(servers: Sequence[ServingRow]) -> dict[tuple[str, str], Attention]:
    """(node, gpu) -> the serving reason of the server that GPU serves, for servers whose state needs one."""
    out: dict[tuple[str, str], Attention] = {}
    for s in servers:
        reason = serving_attention(s.state, server=s.server, floor_ratio=s.floor_multiple, waiting=s.waiting,
                                   kv_usage=s.kv_usage, batch=s.running, possible_batch=s.possible,
                                   prefill_share=s.prefill, preemptions_per_s=s.preemptions)
        if reason is not None:
            out.update({(s.node, gpu): reason for gpu in s.gpus})
    return out


def row_attention(row: GpuRow, serving: dict[tuple[str, str], Attention]) -> tuple[Attention, ...]:
    """Every reason one GPU row needs attention (none while it is down: that is said apart)."""
    if row.up is False or row.cls is None:
        return ()
    return attention(waste=row.waste or "none", lost=row.lost, cls=row.cls, mfu=row.mfu, throttled=row.throttled,
                     throttle=row.throttle, serving=serving.get((row.node, row.gpu)))


@dataclass(frozen=True)
class WasteFigures:
    """What the summary line says: GPUs with a verdict, wasted, spare, time lost and needing attention."""

    gpus: int
    wasted: int
    spare: int
    lost: float
    unmeasured: int
    attention: int


def waste_figures(rows: Sequence[GpuRow], servers: Sequence[ServingRow]) -> WasteFigures:
    live = [r for r in rows if r.up is not False and r.cls is not None]
    serving = serving_reasons(servers)
    wasted = [r for r in live if r.waste in WASTE_KINDS]
    return WasteFigures(
        gpus=len(live), wasted=len(wasted), spare=sum(1 for r in live if r.waste == SPARE),
        lost=sum(r.lost or 0.0 for r in live), unmeasured=sum(1 for r in wasted if r.lost is None),
        attention=sum(1 for r in live if row_attention(r, serving)))


def summary_text(rows: Sequence[GpuRow], servers: Sequence[ServingRow]) -> Text:
    """``wasted 4/8 (whole windows)  time lost 24%  spare 1  attention 5``: each figure with its measure."""
    f = waste_figures(rows, servers)
    text = Text()
    text.append(f"wasted {f.wasted}/{len(rows)}", style="bold" if f.wasted else "")
    text.append(" (whole windows)", style="dim")
    lost = _pct(f.lost / f.gpus) if f.gpus else EMPTY
    text.append(f"  time lost {'≥ ' if f.unmeasured else ''}{lost}")
    if f.spare:
        text.append(f"  spare {f.spare}", style="dim")
    text.append(f"  attention {f.attention}", style="bold" if f.attention else "")
    return text


def _label(reason: Attention, row: GpuRow | None) -> Text:
    if reason.kind == "serving":
        return Text(palette.serving_label(reason.code), style=palette.serving_colour(reason.code))
    if reason.kind == "throttled":
        return Text(f"throttled ({reason.code})", style="bold")
    cls = row.cls if row is not None else None
    return Text(palette.class_label(cls) + (" (held)" if reason.code == "idle_held" else ""),
                style=palette.class_colour(cls))


def render_attention(rows: Sequence[GpuRow], servers: Sequence[ServingRow]) -> RenderableType | None:
    """One line per down GPU, per GPU reason and per server reason, most costly first; None when nothing needs
    attention and nothing is down. Spare GPUs get a dim line of their own: capacity, not waste."""
    serving = serving_reasons(servers)
    lines: list[tuple[int, tuple, Text]] = []
    seen_servers: dict[str, list[str]] = {}
    server_reason: dict[str, Attention] = {}
    for row in rows:
        who = f"GPU {printable(row.gpu, 40)}" + (f" on {printable(row.node, 40)}" if len({r.node for r in rows}) > 1 else "")
        if row.up is False:
            line = Text(f"{who}  ")
            line.append("DOWN", style=f"bold {palette.DOWN_COLOUR}")
            lines.append((0, gpu_order(row.gpu), line))
            continue
        for reason in row_attention(row, serving):
            if reason.kind == "serving":
                name = printable(reason.server or who, 60)
                seen_servers.setdefault(name, []).append(row.gpu)
                server_reason[name] = reason
                continue
            line = Text(f"{who}  ")
            line.append_text(_label(reason, row))
            line.append(f"  {reason.figure}")
            if reason.kind == "waste" and row.detail:
                line.append(f" ({printable(row.detail, 40)})", style="dim")
            lines.append((ATTENTION_KINDS.index(reason.kind) + 1, gpu_order(row.gpu), line))
    for name, gpus in seen_servers.items():
        reason = server_reason[name]
        line = Text(f"{name} (GPU{'s' if len(gpus) > 1 else ''} {printable(','.join(gpus), 40)})  ")
        line.append_text(_label(reason, None))
        line.append(f"  {reason.figure}")
        line.append(f": {reason.advice}", style="dim")
        lines.append((ATTENTION_KINDS.index("serving") + 1, gpu_order(gpus[0]), line))
    spare = [printable(r.gpu, 40) for r in rows if r.up is not False and r.waste == SPARE]
    if not lines and not spare:
        return None
    parts: list[RenderableType] = [Text("NEEDS ATTENTION", style="bold")]
    parts += [line for _, _, line in sorted(lines, key=lambda item: (item[0], item[1]))] or [
        Text("nothing: no GPU is wasted, and no server has a knob to turn", style="dim")]
    if spare:
        parts.append(Text(f"spare (idle, nobody holds it: capacity, not waste): GPU {', '.join(spare)}", style="dim"))
    return Group(*parts)
