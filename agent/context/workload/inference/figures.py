"""An inference server's figures checked against the serving bounds, one replica at a time.

Why per replica: a server sums its data-parallel engines (vLLM ``engine``, SGLang ``dp_rank``), and one
engine that reports a latency sum of 1e308 used to make the whole server's time per token 1e+306 s (a
floor multiple of 1e308), while two such engines overflowed the sum ("OverflowError: intermediate
overflow in fsum") and marked the endpoint down. Here each replica's value is judged on its own against
agent.model.bounds.SERVING_BOUNDS, before anything is summed: a value outside is rejected (that
replica's share of that figure only; the other replicas' sums are kept), counted, and the first one named,
as an unreadable line is. What is summed is then bounded too, so no sum can overflow.

Cumulative figures are judged by what they imply: a histogram's sum over its count is a mean latency,
which no server can hold above hours over its whole life, and a counter's step between two scrapes is a
rate. Ranks of one replica (tensor, pipeline, expert) report the same figures and collapse by max first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

from agent.model.bounds import SERVING_BOUNDS
from agent.model.text import printable

SeriesKey = frozenset[tuple[str, str]]
Series = dict[SeriesKey, float]
Hist = dict[SeriesKey, tuple[float, float]]
"""(sum, count) of a histogram per replica."""

RANK_LABELS = frozenset({"tp_rank", "pp_rank", "moe_ep_rank", "attn_tp_rank", "attn_cp_rank"})
"""Labels that tell apart ranks of *one* model replica: they report the same batches, so they collapse by
max, not by sum (a replica is what the remaining labels, engines and dp ranks among them, tell apart)."""
NAME_CHARS = 120
"""A rejected series as a note names it (printable, cut): its labels come from the server."""


@dataclass(frozen=True, slots=True)
class Rejected:
    """Values refused by the serving bounds in one computation: how many, and the first, named."""

    count: int = 0
    first: str | None = None

    def __add__(self, other: Rejected) -> Rejected:
        return Rejected(self.count + other.count, self.first if self.first is not None else other.first)

    def note(self) -> str | None:
        """``2 values outside the serving bounds rejected; first ...``, or None when none was."""
        if not self.count:
            return None
        values = "value" if self.count == 1 else "values"
        return f"{self.count} {values} outside the serving bounds rejected; first {self.first}"


class Rejections:
    """Collects what one computation rejects; :meth:`result` freezes it."""

    __slots__ = ("count", "first")

    def __init__(self) -> None:
        self.count, self.first = 0, None

    def admits(self, value: float, bound: str, what: str, name: str, key: SeriesKey | None = None) -> bool:
        """Whether ``value`` (the figure ``what`` of series ``name`` ``key``) lies within ``SERVING_BOUNDS[bound]``;
        else it is counted, and named when it is the first."""
        limits = SERVING_BOUNDS[bound]
        if limits.admits(value):
            return True
        self.count += 1
        if self.first is None:
            shown = f"{value:.3g}{' ' + limits.unit if limits.unit else ''}"
            self.first = f"{series_name(name, key)}: {what} {shown}, outside {limits.low:g}..{limits.high:g}"
        return False

    def result(self) -> Rejected:
        return Rejected(self.count, self.first)


def series_name(name: str, key: SeriesKey | None) -> str:
    """``name{engine="1",model_name="llama"}``, printable and cut: the labels are the server's text."""
    labels = ",".join(f'{k}="{v}"' for k, v in sorted(key)) if key else ""
    return printable(f"{name}{{{labels}}}" if labels else name, NAME_CHARS)


def replicas(series: Series) -> Series:
    """Collapse the ranks of each replica by max (the leading rank); keep replicas apart."""
    out: Series = {}
    for key, value in series.items():
        replica = frozenset((k, v) for k, v in key if k not in RANK_LABELS)
        out[replica] = max(out.get(replica, value), value)
    return out


def fsum(values: Iterable[float]) -> float:
    """``math.fsum`` that gives infinity, not OverflowError, when the sum passes the float range."""
    try:
        return math.fsum(values)
    except OverflowError:
        return math.inf


def bounded_sum(series: Series | None, bound: str, what: str, name: str, rejections: Rejections, *,
                mean: bool = False) -> float | None:
    """The sum (or mean) over replicas of a gauge, each replica within ``bound`` and the result too; None when
    the server does not export it or every replica was rejected."""
    if series is None:
        return None
    kept = [value for key, value in replicas(series).items() if rejections.admits(value, bound, what, name, key)]
    if not kept:
        return None
    total = fsum(kept) / (len(kept) if mean else 1)
    return total if rejections.admits(total, bound, what + " (all replicas)", name) else None


def histogram(sums: Series | None, counts: Series | None, what: str, name: str,
              rejections: Rejections) -> Hist | None:
    """(sum, count) per replica of a latency histogram, each a count of observations and a mean (sum over
    count, over the server's whole life) within the bounds; None when either half is missing or every
    replica was rejected."""
    if sums is None or counts is None:
        return None
    totals, numbers = replicas(sums), replicas(counts)
    out: Hist = {}
    for key, total in totals.items():
        count = numbers.get(key)
        if count is None:
            continue
        lifetime = total / count if count else total  # no observation yet: the sum itself, 0 on a real server
        if rejections.admits(count, "total", what + " observations", name + "_count", key) and \
                rejections.admits(lifetime, "latency_s", what + " (mean since start)", name + "_sum", key):
            out[key] = (total, count)
    return out or None


def mean_between(prev: Hist | None, cur: Hist | None, what: str, name: str, rejections: Rejections) -> float | None:
    """The mean observation between two scrapes, pooled over the replicas whose own mean lies within the
    latency bound (none observed, or a replica going backwards: that replica adds nothing)."""
    if prev is None or cur is None:
        return None
    total = count = 0.0
    for key, (s1, c1) in cur.items():
        s0, c0 = prev.get(key, (0.0, 0.0))  # a replica new since the last scrape started at zero
        ds, dc = s1 - s0, c1 - c0
        if dc <= 0 or ds < 0:
            continue
        if rejections.admits(ds / dc, "latency_s", what, name, key):
            total, count = total + ds, count + dc
    return total / count if count else None


def counter_rate(prev: Series | None, cur: Series | None, dt_s: float, what: str, name: str,
                 rejections: Rejections, bound: str = "per_second") -> float | None:
    """Increase per second over replicas, each replica's rate within ``bound``; None when the counter is
    missing, ``dt_s`` is not positive or a replica went backwards (a reset: no rate for this interval)."""
    if prev is None or cur is None or dt_s <= 0:
        return None
    before, after = replicas(prev), replicas(cur)
    kept: list[float] = []
    for key, value in after.items():
        step = value - before.get(key, 0.0)  # a replica new since the last scrape started at zero
        if step < 0:
            return None
        if rejections.admits(step / dt_s, bound, what, name, key):
            kept.append(step / dt_s)
    total = fsum(kept)
    return total if rejections.admits(total, bound, what + " (all replicas)", name) else None


def finite_total(series: Series | None, what: str, name: str, rejections: Rejections) -> float | None:
    """The sum over replicas of a cumulative figure that has no bound of its own (seconds spent in prefill,
    FLOPs estimated): each replica non-negative, the sum finite."""
    if series is None:
        return None
    kept = [v for key, v in replicas(series).items() if rejections.admits(v, "total", what, name, key)]
    total = fsum(kept) if kept else None
    return total if total is None or rejections.admits(total, "total", what + " (all replicas)", name) else None


def bounded_bytes(value: float | None) -> float | None:
    """``value`` (bytes), or None outside the bytes bound: for a product of a setting and a server's figure
    (the KV-cache pool: tokens x bytes per token, or bytes per GPU x GPUs), judged where it is made. Its
    server figure was judged, and counted, when it was read."""
    return value if value is None or SERVING_BOUNDS["bytes"].admits(value) else None
