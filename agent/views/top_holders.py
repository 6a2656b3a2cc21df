"""``roofwatch top``'s holders of shared GPUs: under the GPU table, one line per holder of each shared GPU.

A time-sliced, MPS or DRA-shared GPU reads as one row in the table, with the verdict of the whole device:
a trainer keeping it busy hides a pod that holds 20 GiB and computes nothing. This section lists who holds
each shared GPU from the ``roofwatch_gpu_holder_*`` series (agent.collector.holders): how it was found,
its estimated SM share, memory and power, and its own class where one can be had (``idle_held``, or one
from its own workload report). The series exist only on shared GPUs, so a node without one shows nothing
here. Absent figures are a dash, never 0; names are made printable and cut, and a line never wraps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

from rich.text import Text

from agent.model.indexes import gpu_order
from agent.model.text import printable
from agent.views import palette

PREFIX = "roofwatch_gpu_holder_"
TITLE = "SHARED GPUS"
EMPTY = "—"
MAX_NAME = 40
"""Widest a holder's name may be on a line (a kubelet's pod names run to 253 characters)."""
GIB = 2**30

_GAUGES: dict[str, str] = {
    "roofwatch_gpu_holder_sm_share_ratio": "sm",
    "roofwatch_gpu_holder_memory_used_bytes": "memory",
    "roofwatch_gpu_holder_power_watts": "power_w",
}
_LAST = {"other": 1, "unattributed": 2}
"""The collector's ``other`` (holders past the largest N, summed) and ``unattributed`` remainder go last."""


@dataclass(frozen=True)
class HolderRow:
    """One holder of one shared GPU as the exposition describes it; ``None``: the series was absent."""

    node: str
    gpu: str
    holder: str
    via: str | None = None
    user: str | None = None
    """Its Slurm job's user, or its process's owner (pods have none)."""
    account: str | None = None
    """Its Slurm job's account."""
    sm: float | None = None
    memory: float | None = None
    power_w: float | None = None
    cls: str | None = None


@dataclass
class HolderSeries:
    """The holder samples of one exposition, keyed by (node, GPU, holder)."""

    per_holder: dict[tuple[str, str, str], dict[str, object]] = field(default_factory=dict)

    def add(self, name: str, labels: Mapping[str, str], value: float | None) -> None:
        """File one ``roofwatch_gpu_holder_*`` sample (the energy counter and unknown names are ignored)."""
        holder = labels.get("holder")
        if not holder:
            return
        fields = self.per_holder.setdefault((labels.get("node", ""), labels["gpu"], holder), {})
        if name == "roofwatch_gpu_holder_info":
            fields["via"] = labels.get("via") or None
            fields["user"] = labels.get("user") or None
            fields["account"] = labels.get("account") or None
        elif name in _GAUGES:
            fields[_GAUGES[name]] = value
        elif name == "roofwatch_gpu_holder_class" and value == 1:
            fields["cls"] = labels.get("class") or None

    def rows(self) -> tuple[HolderRow, ...]:
        """Every holder, GPU by GPU in index order, the largest SM share (then memory) first on each."""
        def order(item: tuple[tuple[str, str, str], dict[str, object]]) -> tuple:
            (node, gpu, holder), fields = item
            return (node, gpu_order(gpu), _LAST.get(holder, 0), -float(fields.get("sm") or 0.0),  # type: ignore[arg-type]
                    -float(fields.get("memory") or 0.0), holder)  # type: ignore[arg-type]

        return tuple(HolderRow(node=node, gpu=gpu, holder=holder, **fields)  # type: ignore[arg-type]
                     for (node, gpu, holder), fields in sorted(self.per_holder.items(), key=order))


def _pct(value: float | None) -> str:
    return EMPTY if value is None else f"{value * 100:.0f}%"


def _gib(value: float | None) -> str:
    return EMPTY if value is None else f"{value / GIB:.1f} GiB"


def _watts(value: float | None) -> str:
    return EMPTY if value is None else f"{value:.0f} W"


def holder_line(row: HolderRow, width: int, with_node: bool = False) -> Text:
    """``GPU 0  research/notebook/main  time-slicing  SM 0% · 20.0 GiB · 87 W  idle held``, at most ``width`` cells; a
    Slurm job's holder adds ``user alice · acct physics`` after how it was found."""
    who = f"GPU {printable(row.gpu, 20)}"
    if with_node:
        who = f"{printable(row.node, 20)} {who}"
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(who, style="bold")
    text.append(f"  {printable(row.holder, MAX_NAME)}")
    if row.via:
        text.append(f"  {printable(row.via, 20)}", style="dim")
    owner = " · ".join(f"{what} {printable(value, 32)}" for what, value in (("user", row.user), ("acct", row.account))
                       if value)
    if owner:  # who the bill goes to: a Slurm job's user and account, a process's owner
        text.append(f"  {owner}", style="dim")
    if row.holder == "unattributed":
        text.append(f"  {_watts(row.power_w)} no holder explains")
    else:
        text.append(f"  SM {_pct(row.sm)} · {_gib(row.memory)} · {_watts(row.power_w)}")
    if row.cls:
        text.append(f"  {printable(palette.class_label(row.cls), 30)}", style=palette.class_colour(row.cls))
    if text.cell_len > width:
        text.truncate(width, overflow="ellipsis")
    return text


def render_holders(rows: Sequence[HolderRow], width: int = 200) -> Text | None:
    """The section, or None when no GPU is shared."""
    if not rows:
        return None
    with_node = len({r.node for r in rows}) > 1
    gpus = len({(r.node, r.gpu) for r in rows})
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(f"{TITLE} ({gpus})"[:width], style="bold")
    for row in rows:
        text.append("\n")
        text.append_text(holder_line(row, width, with_node))
    return text
