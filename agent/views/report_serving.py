"""The serving section of ``roofwatch report``: per inference server, how far it ran from its floor and why.

Only traces whose samples carry ``workload.serving`` (an inference server scraped or reporting through
the client while the trace was recorded) get this section. A replica's figures repeat on each of
its GPUs, so the rows are per server, from the verdicts of its first GPU.
"""

from __future__ import annotations

import statistics
from collections import Counter
from typing import Sequence

from agent.model import ServingView, Verdict
from agent.views.html_parts import pct
from agent.views.palette import serving_label
from agent.views.svg import esc



def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _ms(seconds: float | None) -> str:
    return "—" if seconds is None else f"{seconds * 1e3:.3g} ms"


def _number(value: float | None, digits: int = 1) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def serving_section(verdicts: Sequence[Verdict]) -> str:
    """The HTML section, or "" when no verdict has a serving view."""
    servers: dict[str, list[ServingView]] = {}
    first_gpu: dict[str, str] = {}
    for verdict in verdicts:
        view = verdict.serving
        if view is None:
            continue
        name = view.server or f"GPU {verdict.node}/{verdict.gpu}"
        key = f"{verdict.node}/{verdict.gpu}"
        if first_gpu.setdefault(name, key) == key:
            servers.setdefault(name, []).append(view)
    if not servers:
        return ""
    rows = []
    for name, views in sorted(servers.items()):
        states = Counter(v.state for v in views)
        state, _ = states.most_common(1)[0]
        latest = next(v for v in reversed(views) if v.state == state)
        shares = ", ".join(f"{serving_label(s)} {pct(n / len(views))}" for s, n in states.most_common())
        multiple = _median([v.floor_ratio for v in views if v.floor_ratio is not None])
        rows.append(
            f'<tr data-server="{esc(name)}"><td>{esc(name)}</td><td>{esc(latest.model or "—")}</td><td>{esc(shares)}</td>'
            f'<td class="num">{_ms(_median([v.floor_s for v in views if v.floor_s is not None]))}</td>'
            f'<td class="num">{_ms(_median([v.tpot_s for v in views if v.tpot_s is not None]))}</td>'
            f'<td class="num">{"—" if multiple is None else f"{multiple:.2g}x"}</td>'
            f'<td class="num">{_number(_median([v.batch for v in views if v.batch is not None]))} / '
            f'{_number(_median([v.possible_batch for v in views if v.possible_batch is not None]), 0)}</td>'
            f'<td class="num">{pct(_median([v.prefill_share for v in views if v.prefill_share is not None]))}</td>'
            f"<td>{esc(latest.advice)}</td></tr>")
    return ('<h2>Serving</h2><p class="muted">Per inference server: the decode latency floor (weights and KV cache read '
            "from HBM, or the batch's FLOPs at peak), achieved time per output token against it, and the knob the "
            'dominant state points at (docs/serving.md). Medians over the trace.</p><table id="serving"><tr><th>server</th>'
            "<th>model</th><th>time per state</th><th>floor</th><th>TPOT</th><th>TPOT / floor</th><th>batch / possible</th>"
            "<th>prefill</th><th>what to change</th></tr>" + "".join(rows) + "</table>")
