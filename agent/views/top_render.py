"""What ``roofwatch top`` draws: rows + class history + sort order -> a rich renderable.

Pure functions, unit-tested without a terminal; the terminal itself (fetch thread, keys, full
screen) is :mod:`agent.views.top`. The data comes from :mod:`agent.views.top_source`; absent
series are ``None`` and show as "—".
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from rich import box
from rich.cells import cell_len
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from agent.model import WORKLOAD_CLASSES
from agent.model.counter_source import source_names, sources_of_label
from agent.model.indexes import gpu_order
from agent.model.waste import WASTE_KINDS
from agent.views import palette
from agent.model.text import printable
from agent.views.top_attention import render_attention, summary_text
from agent.views.top_holders import render_holders
from agent.views.top_jitter import render_jitter
from agent.views.top_serving import ServingRow, render_serving
from agent.views.top_source import GpuKey, GpuRow, NodeView

SORT_ORDERS = ("gpu", "mfu", "class", "power")
HISTORY_LEN = 120
"""Polls kept per GPU: four minutes at the default 2 s, enough to see flapping, bounded in memory."""
EMPTY = "—"
DOWN = "down"
"""History marker of a poll in which the GPU did not answer (not a workload class)."""
BAR_WIDTH = 8
EIGHTHS = " ▏▎▍▌▋▊▉"
SPARK_CELL = "█"
MIN_SPARK, MAX_SPARK = 8, HISTORY_LEN


# -- sort orders ----------------------------------------------------------------------------


def next_sort(order: str) -> str:
    """The order ``s`` switches to: gpu -> mfu -> class -> power -> gpu."""
    return SORT_ORDERS[(SORT_ORDERS.index(order) + 1) % len(SORT_ORDERS)]


gpu_id_key = gpu_order
"""Numeric order of GPU ids ("2" < "10", "3" < "3/1" < "4"): string order would put 10 before 2."""


def _live_mfu(row: GpuRow, figure: str = "mfu") -> float | None:
    """MFU (or MBU) that describes the GPU now: a down GPU's last figure is history, not a measurement."""
    return getattr(row, figure) if row.up is not False else None


def _class_rank(row: GpuRow) -> int:
    """Wasted GPUs first (by their ``waste`` label, in the order of agent.model.waste.WASTE_KINDS), then the others
    by class (a spare idle GPU among them); down or unknown last."""
    if row.up is False or row.cls is None:
        return len(WORKLOAD_CLASSES) + len(WASTE_KINDS) + 1
    if row.waste in WASTE_KINDS:
        return WASTE_KINDS.index(row.waste)  # type: ignore[arg-type]
    return len(WASTE_KINDS) + (WORKLOAD_CLASSES.index(row.cls) if row.cls in WORKLOAD_CLASSES else len(WORKLOAD_CLASSES))


def sort_rows(rows: Iterable[GpuRow], order: str) -> list[GpuRow]:
    """Rows in ``order``; mfu puts the least efficient first and unknown MFU last, power the hungriest first."""
    def by_gpu(row: GpuRow) -> tuple:
        return (row.node, gpu_id_key(row.gpu), row.uuid)

    def by_mfu(row: GpuRow) -> tuple:
        mfu = _live_mfu(row)
        return (mfu is None, mfu or 0.0)

    keys = {
        "gpu": by_gpu,
        "mfu": lambda r: (*by_mfu(r), *by_gpu(r)),
        "class": lambda r: (_class_rank(r), *by_mfu(r), *by_gpu(r)),
        "power": lambda r: (r.power_w is None, -(r.power_w or 0.0), *by_gpu(r)),
    }
    return sorted(rows, key=keys[order])


# -- class history --------------------------------------------------------------------------


class ClassHistory:
    """The class each GPU had at each successful poll, the last ``maxlen`` per GPU.

    Kept by the view, not the agent, so it works against any agent without a query API;
    GPUs that leave the exposition are dropped so memory stays bounded as well.
    """

    def __init__(self, maxlen: int = HISTORY_LEN) -> None:
        self.maxlen = maxlen
        self._states: dict[GpuKey, collections.deque[str | None]] = {}

    def record(self, rows: Iterable[GpuRow]) -> None:
        """Append one poll: the class of each GPU, ``DOWN`` for a GPU that did not answer."""
        seen = set()
        for row in rows:
            seen.add(row.key)
            states = self._states.setdefault(row.key, collections.deque(maxlen=self.maxlen))
            states.append(DOWN if row.up is False else row.cls)
        for key in set(self._states) - seen:
            del self._states[key]

    def states(self, key: GpuKey) -> tuple[str | None, ...]:
        return tuple(self._states.get(key, ()))


# -- cells ----------------------------------------------------------------------------------


def pct(value: float | None, digits: int = 0) -> str:
    return EMPTY if value is None else f"{value * 100:.{digits}f}%"


def bar(value: float | None, width: int = BAR_WIDTH) -> Text:
    """An eighth-block bar and its percentage: shape at a glance, number when it matters."""
    if value is None:
        return Text(EMPTY)
    eighths = round(min(max(value, 0.0), 1.0) * width * 8)
    full, part = divmod(eighths, 8)
    blocks = ("█" * full + (EIGHTHS[part] if part else "")).ljust(width)
    return Text.assemble((blocks, "bold"), f" {value * 100:3.0f}%")


def plain(text: str | None) -> Text:
    """A name as text, never as markup (a job called ``[/]`` crashed the view) and without control
    characters (escape sequences in a job name reached the terminal): see agent.model.text."""
    return Text(printable(text) if text else EMPTY)


def short_model(model: str | None) -> Text:
    """The model without the vendor's marketing prefix: every GPU on a node says NVIDIA."""
    if not model:
        return Text(EMPTY)
    for prefix in ("NVIDIA ", "AMD ", "Instinct "):
        model = model.removeprefix(prefix)
    return plain(model)


def class_cell(row: GpuRow) -> Text:
    """The class in its palette colour, DOWN in red, and a throttle marker that explains low MFU."""
    if row.up is False:
        return Text("DOWN", style=f"bold {palette.DOWN_COLOUR}")
    if row.cls is None:
        return Text(EMPTY)
    text = Text(printable(palette.class_label(row.cls), 40), style=palette.class_colour(row.cls))
    if row.throttled:
        text.append(" ⚠ throttled", style="bold")
    return text


def mfu_cell(row: GpuRow, figure: str = "mfu") -> Text:
    """MFU (``figure="mbu"``: MBU) in its band colour where it judges the GPU's class, grey where it does not
    (agent.model.judging: a memory-bound decode's low MFU is not red); a counter estimate is marked, since only a
    workload report is exact."""
    value = _live_mfu(row, figure)
    if value is None:
        return Text(EMPTY)
    text = Text(pct(value, 1), style=palette.figure_colour(row.cls, figure, value))  # type: ignore[arg-type]
    if getattr(row, f"{figure}_source") == "counters":
        text.append(" est.", style="dim")
    return text


def of_cell(value: float | None, limit: float | None, unit: str = "", scale: float = 1.0) -> str:
    """"used/limit unit": a value next to its ceiling says whether it is capped."""
    if value is None:
        return EMPTY
    suffix = f" {unit}" if unit else ""
    if limit is None:
        return f"{value / scale:.0f}{suffix}"
    return f"{value / scale:.0f}/{limit / scale:.0f}{suffix}"


def owner_cell(row: GpuRow) -> Text:
    """Who holds the GPU: the job, else the pod (the person to ask about a wasted GPU)."""
    return plain(row.job or row.pod)


def sparkline(states: Sequence[str | None], width: int) -> Text:
    """One coloured cell per poll, newest on the right, padded on the left so columns line up."""
    text = Text(" " * max(0, width - len(states)))
    for state in list(states)[-width:] if width > 0 else []:
        if state == DOWN:
            text.append("✕", style=f"bold {palette.DOWN_COLOUR}")
        elif state is None:
            text.append("·", style=palette.class_colour(None))
        else:
            text.append(SPARK_CELL, style=palette.class_colour(state))
    return text


# -- frame ----------------------------------------------------------------------------------


@dataclass
class TopState:
    """What the screen shows: the last good view, the last error, the history and the sort order."""

    url: str
    sort: str = "gpu"
    view: NodeView | None = None
    error: str | None = None
    history: ClassHistory = field(default_factory=ClassHistory)

    def apply(self, result: NodeView | Exception) -> None:
        """Take one poll's result; a failed poll keeps the last data and only sets the error."""
        if isinstance(result, NodeView):
            self.view, self.error = result, None
            self.history.record(result.rows)
        else:
            self.error = str(result)


def _clock(ts: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts))


def render_header(state: TopState) -> Text:
    """Node, GPUs up of expected, where from, sort order and age: what the rows below mean.
    A failed read adds a red line under it (the data below is then the last good read)."""
    text = Text("roofwatch top", style="bold")
    view = state.view
    if view is not None:
        rows = view.rows
        up = sum(1 for r in rows if r.up is not False)
        expected = view.gpus_expected if view.gpus_expected is not None else len(rows)
        nodes = printable(", ".join(view.nodes)) or EMPTY
        up_style = f"bold {palette.DOWN_COLOUR}" if up < expected else ""
        text.append(f"  node {nodes}  ")
        text.append(f"{up}/{expected} GPUs up", style=up_style)
        text.append(counters_from(rows))
        if view.version:
            text.append(f"  agent {printable(view.version, 40)}", style="dim")
    text.append(f"  {printable(state.url)}  sorted by {state.sort}")
    if view is not None:
        text.append(f"  updated {_clock(view.fetched_at)}")
    if state.error:
        stale = " (showing the last data)" if view is not None else ""
        text.append(f"\n⚠ {printable(state.error)}{stale}", style=f"bold {palette.DOWN_COLOUR}")  # own line
    return text


def counters_from(rows: Sequence[GpuRow]) -> str:
    """Where the verdicts' counters were read (the ``basis_source`` label), per source with its GPU count when
    they differ: "  counters from GPM", "  counters from GPM 6, DCGM 2"; empty when no GPU names one."""
    counts = collections.Counter(name for r in rows if r.up is not False
                                 for name in source_names(sources_of_label(r.basis_source), short=True))
    if not counts:
        return ""
    if len(counts) == 1:
        return f"  counters from {next(iter(counts))}"
    return "  counters from " + ", ".join(f"{name} {n}" for name, n in counts.most_common())


def render_summary(rows: Sequence[GpuRow], servers: Sequence[ServingRow] = ()) -> Text:
    """GPUs per class, how many are wasted (whole windows), the time they lost, the spare ones, how many need
    attention (agent.views.top_attention), and the mean MFU."""
    live = [r for r in rows if r.up is not False]
    counts = collections.Counter(r.cls for r in live if r.cls is not None)
    text = Text()
    for cls in WORKLOAD_CLASSES:
        if counts[cls]:
            text.append(f"{palette.class_label(cls)} {counts[cls]}", style=palette.class_colour(cls))
            text.append("  ")
    down = len(rows) - len(live)
    if down:
        text.append(f"DOWN {down}  ", style=f"bold {palette.DOWN_COLOUR}")
    text.append_text(summary_text(rows, servers))
    mfus = [m for m in (_live_mfu(r) for r in rows) if m is not None]
    if mfus:
        mean = sum(mfus) / len(mfus)
        text.append(f"  mean MFU {pct(mean, 1)} over {len(mfus)} GPUs")  # not coloured: MFU judges compute-bound GPUs only
    else:
        text.append(f"  mean MFU {EMPTY}")
    return text


HISTORY_COLUMN = "CLASS HISTORY"
COLUMNS: tuple[tuple[str, Callable[[GpuRow], RenderableType]], ...] = (
    ("GPU", lambda r: plain(r.gpu)),
    ("MODEL", lambda r: short_model(r.model)),
    ("CLASS", class_cell),
    ("CONF", lambda r: pct(r.confidence)),
    ("MFU", mfu_cell),
    ("MBU", lambda r: mfu_cell(r, "mbu")),
    ("SM", lambda r: bar(r.sm)),
    ("TENSOR", lambda r: bar(r.tensor)),
    ("DRAM", lambda r: bar(r.dram)),
    ("POWER", lambda r: of_cell(r.power_w, r.power_limit_w, "W")),
    ("SM MHz", lambda r: of_cell(r.sm_clock_mhz, r.sm_clock_max_mhz)),
    ("MEM", lambda r: of_cell(r.mem_used_bytes, r.mem_total_bytes, "GiB", 2**30)),
    ("JOB", owner_cell),
)
DROP_ORDER = ("MODEL", "MEM", "SM MHz", "CONF", "POWER", "JOB", "DRAM", "TENSOR", "SM", "MBU")
"""On a narrow terminal these go first, least telling first: a column cut to "…" helps nobody,
while GPU, class and MFU (what the view is for) must always be readable, and whose job a
wasted GPU is matters more than its power. MBU goes last: it judges a memory-bound GPU."""
COLUMN_GAP = 3
"""Padding, divider, padding between two columns of the SIMPLE_HEAD box without edges."""
MAX_CELL = 20
"""Widest a job or model name may make its column; longer ones end in an ellipsis."""
CAPPED = ("NODE", "MODEL", "JOB")
"""Free-text columns, cut at MAX_CELL; the others have a bounded width of their own."""


def _width(name: str, cells: Sequence[RenderableType]) -> int:
    """Cells a column takes: its widest cell or its header, capped for free text."""
    widest = max([cell_len(name)] + [c.cell_len if isinstance(c, Text) else cell_len(str(c)) for c in cells])
    return min(MAX_CELL, widest) if name in CAPPED else widest


def fit_columns(columns: dict[str, list[RenderableType]], width: int) -> tuple[list[str], int]:
    """(columns that fit in ``width``, cells left for the history strip), dropping by DROP_ORDER."""
    widths = {name: _width(name, cells) for name, cells in columns.items()}
    shown = list(columns)

    def free() -> int:
        return width - sum(widths[n] + COLUMN_GAP for n in shown)

    needed = max(MIN_SPARK, cell_len(HISTORY_COLUMN))  # the strip's header is wider than its minimum
    for name in DROP_ORDER:
        if free() >= needed:
            break
        shown.remove(name)
    return shown, max(MIN_SPARK, min(MAX_SPARK, free()))


def render_table(rows: Sequence[GpuRow], history: ClassHistory, width: int = 200) -> Table:
    """One line per GPU, as many columns as ``width`` holds; NODE only when there are several nodes."""
    columns: dict[str, list[RenderableType]] = {"NODE": [plain(r.node) for r in rows]} if len({r.node for r in rows}) > 1 else {}
    columns.update({name: [cell(r) for r in rows] for name, cell in COLUMNS})
    shown, spark = fit_columns(columns, width)
    columns[HISTORY_COLUMN] = [sparkline(history.states(r.key), spark) for r in rows]
    shown.append(HISTORY_COLUMN)
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, expand=False)
    for name in shown:
        table.add_column(name, no_wrap=True, overflow="ellipsis", max_width=MAX_CELL if name in CAPPED else None,
                         min_width=_width(name, columns[name]) if name == "GPU" else None,
                         justify="right" if name in ("GPU", "CONF") else "left")
    for i in range(len(rows)):
        table.add_row(*(columns[name][i] for name in shown))
    return table


def render_footer(sort: str) -> Text:
    return Text(f"q quit · s sort: {next_sort(sort)}", style="dim")


def render_frame(state: TopState, width: int = 200, interactive: bool = True) -> RenderableType:
    """The whole screen, from data only (no I/O): header, summary, table, and the keys when live."""
    parts: list[RenderableType] = [render_header(state)]
    if state.view is None:
        parts.append(Text(f"waiting for {printable(state.url)} …" if not state.error else "no data yet", style="dim"))
    else:
        rows = sort_rows(state.view.rows, state.sort)
        parts += [render_summary(rows, state.view.serving), render_table(rows, state.history, width)]
        needs = render_attention(rows, state.view.serving)
        if needs is not None:
            parts.append(needs)
        jitter = render_jitter(rows, width)
        if jitter is not None:
            parts.append(jitter)
        shared = render_holders(state.view.holders, width)
        if shared is not None:
            parts.append(shared)
        if state.view.serving:
            parts.append(render_serving(state.view.serving, width))
    if interactive:
        parts.append(render_footer(state.sort))
    return Group(*parts)


def handle_keys(keys: str, sort: str) -> tuple[bool, str]:
    """(quit?, sort order) after the keys typed since the last frame; other keys are ignored."""
    for key in keys:
        if key in "qQ":
            return True, sort
        if key in "sS":
            sort = next_sort(sort)
    return False, sort
