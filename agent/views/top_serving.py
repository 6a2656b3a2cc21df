"""``roofwatch top``'s serving lines: one per inference server, read from the ``roofwatch_serving_*`` series.

The exposition repeats a replica's figures on each of its GPUs (exporters/serving_families.py), so
the GPUs are grouped by (node, server) and the figures read from the first; a server without a name
stands alone as its GPU. Absent series are unknown, shown "—", as everywhere in ``top``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

from rich import box
from rich.cells import cell_len
from rich.table import Table
from rich.text import Text

from agent.views import palette
from agent.model.text import printable

EMPTY = "—"
PREFIX = "roofwatch_serving_"

_GAUGES: dict[str, str] = {
    "roofwatch_serving_time_per_output_token_seconds": "tpot_s",
    "roofwatch_serving_decode_floor_seconds": "floor_s",
    "roofwatch_serving_tpot_floor_multiple": "floor_multiple",
    "roofwatch_serving_output_tokens_per_second_per_gpu": "tokens_per_s_per_gpu",
    "roofwatch_serving_prefill_time_ratio": "prefill",
    "roofwatch_serving_possible_batch_requests": "possible",
    "roofwatch_serving_kv_cache_usage_ratio": "kv_usage",
    "roofwatch_serving_preemptions_per_second": "preemptions",
}
_REQUESTS = {"running": "running", "waiting": "waiting"}


@dataclass(frozen=True)
class ServingRow:
    """One server (model replica) as the exposition describes it; ``None`` = series absent."""

    node: str
    server: str
    """The server's name, or ``GPU <id>`` when it has none."""
    gpus: tuple[str, ...]
    model: str | None = None
    state: str | None = None
    advice: str | None = None
    tpot_s: float | None = None
    floor_s: float | None = None
    floor_multiple: float | None = None
    tokens_per_s_per_gpu: float | None = None
    prefill: float | None = None
    running: float | None = None
    waiting: float | None = None
    possible: float | None = None
    kv_usage: float | None = None
    preemptions: float | None = None


@dataclass
class ServingSeries:
    """The serving samples of one exposition, per GPU, in the order the GPUs first appear."""

    per_gpu: dict[tuple[str, str], dict[str, object]] = field(default_factory=dict)

    def add(self, name: str, labels: Mapping[str, str], value: float | None) -> None:
        """File one ``roofwatch_serving_*`` sample (others are ignored)."""
        fields = self.per_gpu.setdefault((labels.get("node", ""), labels["gpu"]), {})
        if name == "roofwatch_serving_info":
            fields.update(server=labels.get("server") or None, model=labels.get("model") or None,
                          state=labels.get("state") or None, advice=labels.get("advice") or None)
        elif name in _GAUGES:
            fields[_GAUGES[name]] = value
        elif name == "roofwatch_serving_requests" and labels.get("state") in _REQUESTS:
            fields[_REQUESTS[labels["state"]]] = value

    def rows(self) -> tuple[ServingRow, ...]:
        """One row per server that has an info series (the series that says a GPU serves)."""
        groups: dict[tuple[str, str], tuple[list[str], dict[str, object]]] = {}
        for (node, gpu), fields in self.per_gpu.items():
            if "state" not in fields:
                continue
            name = str(fields.get("server") or f"GPU {gpu}")
            groups.setdefault((node, name), ([], fields))[0].append(gpu)
        return tuple(ServingRow(node=node, server=name, gpus=tuple(gpus),
                                **{k: v for k, v in fields.items() if k != "server"})  # type: ignore[arg-type]
                     for (node, name), (gpus, fields) in groups.items())


# -- rendering ------------------------------------------------------------------------------

MAX_NAME = 28
"""Widest a server or model name may make its column; longer ones end in an ellipsis."""


def _pct(value: float | None) -> str:
    return EMPTY if value is None else f"{value * 100:.0f}%"


def _count(value: float | None) -> str:
    return EMPTY if value is None else f"{value:.3g}"


def _ms(seconds: float | None) -> str:
    return EMPTY if seconds is None else f"{seconds * 1e3:.3g} ms"


def state_cell(row: ServingRow) -> Text:
    return Text(printable(palette.serving_label(row.state), 40), style=palette.serving_colour(row.state))


def floor_cell(row: ServingRow) -> Text:
    """``1.3x of 23.9 ms``: TPOT as a multiple of the floor, and the floor itself."""
    if row.floor_multiple is None:
        return Text(EMPTY if row.floor_s is None else f"floor {_ms(row.floor_s)}")
    m = row.floor_multiple
    text = Text(f"{m:.1f}x" if m < 10 else f"{m:.0f}x", style="bold")
    if row.floor_s is not None:
        text.append(f" of {_ms(row.floor_s)}", style="dim")
    return text


def batch_cell(row: ServingRow) -> str:
    """``24/~120``: the running batch against the one the KV cache could hold."""
    if row.running is None:
        return EMPTY
    return _count(row.running) + ("" if row.possible is None else f"/~{row.possible:.0f}")


def _gpus(row: ServingRow) -> str:
    return ",".join(row.gpus)


def middle(text: str, width: int) -> str:
    """``text`` cut in its middle to ``width`` cells: ``vllm 10.0.0.7…engine-b/metrics``. A server's name starts
    with its kind and host and ends with its path, and two servers on one host and port differ only in the
    path (agent.context.workload.inference.endpoint), so an ellipsis at the end would make them one."""
    if cell_len(text) <= width:
        return text
    head = (width - 1) // 2
    tail = width - 1 - head
    while head + tail > 0:
        cut = text[:head] + "…" + (text[len(text) - tail:] if tail else "")
        if cell_len(cut) <= width:
            return cut
        head, tail = (head - 1, tail) if head >= tail else (head, tail - 1)
    return "…"


def apart(names: Sequence[str], least: int) -> int:
    """The narrowest width, from ``least`` up, at which :func:`middle` keeps names that differ apart (two servers
    at ``/gen/10/x/metrics`` and ``/gen/13/x/metrics`` of one host differ only in their middle)."""
    distinct = set(names)
    longest = max((cell_len(name) for name in distinct), default=least)
    return next((width for width in range(least, longest + 1)
                 if len({middle(name, width) for name in distinct}) == len(distinct)), max(least, longest))


COLUMNS = (
    ("SERVER", lambda r: Text(printable(r.server))),
    ("MODEL", lambda r: Text(printable(r.model, MAX_NAME * 4) if r.model else EMPTY)),
    ("STATE", state_cell),
    ("TPOT", lambda r: Text(_ms(r.tpot_s))),
    ("TPOT/FLOOR", floor_cell),
    ("BATCH", lambda r: Text(batch_cell(r))),
    ("WAITING", lambda r: Text(_count(r.waiting))),
    ("KV", lambda r: Text(_pct(r.kv_usage))),
    ("PREFILL", lambda r: Text(_pct(r.prefill))),
    ("GPUS", lambda r: Text(printable(_gpus(r), MAX_NAME))),
)
CAPPED = ("NODE", "SERVER", "MODEL", "GPUS")
"""Free-text columns, cut at MAX_NAME (the server's name only as far as it still tells servers apart)."""
DROP_ORDER = ("GPUS", "MODEL", "TPOT", "PREFILL", "WAITING")
"""Left out first on a narrow terminal: the state, the floor multiple, the batch and the KV cache
(what says which knob to turn) stay."""
COLUMN_GAP = 3
MIN_SERVER = 12
"""Narrowest the server's name is cut to before a column is dropped for it."""


def fit(columns: dict[str, list[Text]], width: int, server_cap: int = MAX_NAME) -> tuple[list[str], int]:
    """(the columns that fit in ``width``, the width left for the server's name, at most ``server_cap``): the
    name gives way down to MIN_SERVER first, then columns go by DROP_ORDER."""
    widths = {name: max([cell_len(name)] + [c.cell_len for c in cells]) for name, cells in columns.items()}
    widths.update({name: min(server_cap if name == "SERVER" else MAX_NAME, widths[name])
                   for name in CAPPED if name in widths})
    shown = list(columns)

    def over() -> int:
        return sum(widths[n] + COLUMN_GAP for n in shown) - COLUMN_GAP - width

    for name in (*DROP_ORDER, None):
        if over() <= 0 or widths["SERVER"] - over() >= MIN_SERVER or name is None:
            break
        shown.remove(name)
    widths["SERVER"] = max(min(MIN_SERVER, widths["SERVER"]), widths["SERVER"] - max(0, over()))
    return shown, widths["SERVER"]


def render_serving(rows: Sequence[ServingRow], width: int = 200) -> Table:
    """One line per server under the GPU table: the state and the numbers that decided it."""
    node = (("NODE", lambda r: Text(printable(r.node, MAX_NAME))),) if len({r.node for r in rows}) > 1 else ()
    columns = {name: [cell(r) for r in rows] for name, cell in node + COLUMNS}
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, expand=False, title="SERVING",
                  title_justify="left", title_style="bold")
    shown, server_width = fit(columns, width, apart([cell.plain for cell in columns["SERVER"]], MAX_NAME))
    columns["SERVER"] = [Text(middle(cell.plain, server_width)) for cell in columns["SERVER"]]
    for name in shown:
        cap = server_width if name == "SERVER" else MAX_NAME if name in CAPPED else None
        table.add_column(name, no_wrap=True, overflow="ellipsis", max_width=cap,
                         min_width=server_width if name == "SERVER" else None,
                         justify="right" if name in ("TPOT", "WAITING", "KV", "PREFILL") else "left")
    for i in range(len(rows)):
        table.add_row(*(columns[name][i] for name in shown))
    return table
