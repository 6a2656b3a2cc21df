"""The report's numbers as plain data: GPU-hours per class and per kind of waste per group, their cost,
and the definitions that turn classes into "wasted" and "useful" (docs/fleet-report.md).

* **wasted** GPU-hours: agent/model/waste.py's waste, the one definition every view counts by: hours a
  GPU was idle while someone held it (a process's memory or the scheduler's allocation: ``idle_held``,
  the idle-allocated hours), input-starved or communication-jittered. An idle GPU nobody held is
  ``spare`` capacity. Measured in whole verdict windows (``MEASURES["windows"]``): an upper bound of the
  time lost; the idle-allocated part alone is a lower bound.
* **useful** GPU-hours: ``compute_bound``, ``memory_bound`` and ``latency_bound`` (kernels ran and a
  roof or the launch rate bounded them). ``unknown`` is neither.
* **cost**: GPU-hours x the $/GPU-hour of the GPU's model (``--cost-per-gpu-hour``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from agent.model import WORKLOAD_CLASSES
from agent.model.waste import NOT_WASTED, SPARE, WASTE_KINDS, WASTE_LABELS

USEFUL_CLASSES = ("compute_bound", "memory_bound", "latency_bound")
DEFAULT_COST_PER_GPU_HOUR = 2.0
"""USD per GPU-hour for models without a configured price: a round on-demand-cloud order of
magnitude, flagged on the page as assumed. Set real prices with --cost-per-gpu-hour."""


@dataclass
class Prices:
    """$/GPU-hour by GPU model: a key matches the ``spec`` (``h100-sxm``) or the driver's model name,
    case-insensitively; ``default`` covers the rest."""

    rates: dict[str, float] = field(default_factory=dict)
    default: float = DEFAULT_COST_PER_GPU_HOUR
    default_configured: bool = False

    @staticmethod
    def parse(items: Iterable[str]) -> Prices:
        """From ``MODEL=USD`` strings (``default=2.5`` sets the fallback); ValueError names the bad one."""
        prices = Prices()
        for item in items:
            name, sep, value = item.partition("=")
            try:
                rate = float(value)
            except ValueError:
                rate = -1.0
            if not sep or not name.strip() or not rate >= 0 or rate == float("inf"):
                raise ValueError(f"{item!r} is not MODEL=USD with a non-negative price (e.g. h100-sxm=2.49)")
            if name.strip().lower() == "default":
                prices.default, prices.default_configured = rate, True
            else:
                prices.rates[name.strip().lower()] = rate
        return prices

    def rate(self, model: str, spec: str) -> tuple[float, bool]:
        """(USD per GPU-hour, whether it was configured rather than assumed)."""
        for key in (spec.lower(), model.lower()):
            if key and key in self.rates:
                return self.rates[key], True
        return self.default, self.default_configured


@dataclass
class Group:
    """GPU-hours per class of one row of a table (a cluster, a user, a job) and their cost."""

    key: dict[str, str]
    hours: dict[str, float] = field(default_factory=lambda: dict.fromkeys(WORKLOAD_CLASSES, 0.0))
    cost_per_class: dict[str, float] = field(default_factory=lambda: dict.fromkeys(WORKLOAD_CLASSES, 0.0))
    waste_hours: dict[str, float] = field(default_factory=lambda: dict.fromkeys(WASTE_LABELS, 0.0))
    """GPU-hours per ``waste`` label (agent.model.waste.WASTE_LABELS): the kinds of waste, spare, none."""
    waste_cost: dict[str, float] = field(default_factory=lambda: dict.fromkeys(WASTE_LABELS, 0.0))
    models: set[str] = field(default_factory=set)
    assumed_price: bool = False
    mfu: float | None = None
    kwh: float | None = None
    """Energy in the period (the namespace table: whole GPUs' counters, shared GPUs' holder estimates)."""
    reasons: list[dict[str, object]] = field(default_factory=list)

    def add(self, cls: str, hours: float, model: str, spec: str, prices: Prices, waste: str = NOT_WASTED) -> None:
        rate, configured = prices.rate(model, spec)
        self.hours[cls] = self.hours.get(cls, 0.0) + hours
        self.cost_per_class[cls] = self.cost_per_class.get(cls, 0.0) + hours * rate
        self.waste_hours[waste] = self.waste_hours.get(waste, 0.0) + hours
        self.waste_cost[waste] = self.waste_cost.get(waste, 0.0) + hours * rate
        if model:
            self.models.add(model)
        self.assumed_price |= not configured and hours > 0

    @property
    def total(self) -> float:
        return sum(self.hours.values())

    @property
    def wasted(self) -> float:
        return sum(self.waste_hours.get(k, 0.0) for k in WASTE_KINDS)

    @property
    def idle_allocated(self) -> float:
        """Idle while held (``idle_held``): the lower bound of the time wasted."""
        return self.waste_hours.get("idle_held", 0.0)

    @property
    def spare(self) -> float:
        """Idle and held by nobody: capacity, not waste."""
        return self.waste_hours.get(SPARE, 0.0)

    @property
    def useful(self) -> float:
        return sum(self.hours.get(c, 0.0) for c in USEFUL_CLASSES)

    @property
    def wasted_cost(self) -> float:
        return sum(self.waste_cost.get(k, 0.0) for k in WASTE_KINDS)

    @property
    def cost(self) -> float:
        return sum(self.cost_per_class.values())

    def to_json(self) -> dict[str, object]:
        return {**self.key, "hours": {k: round(v, 6) for k, v in self.hours.items()}, "total_hours": round(self.total, 6),
                "wasted_hours": round(self.wasted, 6), "idle_allocated_hours": round(self.idle_allocated, 6),
                "spare_hours": round(self.spare, 6), "waste_hours": {k: round(v, 6) for k, v in self.waste_hours.items()},
                "useful_hours": round(self.useful, 6), "cost_usd": round(self.cost, 4),
                "wasted_cost_usd": round(self.wasted_cost, 4), "models": sorted(self.models),
                "assumed_price": self.assumed_price, "mfu": None if self.mfu is None else round(self.mfu, 6),
                "kwh": None if self.kwh is None else round(self.kwh, 6),
                "reasons": self.reasons}


def group_rows(rows: Iterable[tuple[dict[str, str], float]], keys: tuple[str, ...], prices: Prices) -> list[Group]:
    """Rows of ``(labels, hours)`` (labels carry ``class``, ``waste``, ``model``, ``spec``) summed into one
    Group per value of ``keys``, most wasted cost first."""
    groups: dict[tuple[str, ...], Group] = {}
    for labels, hours in rows:
        ident = tuple(labels.get(k, "") for k in keys)
        group = groups.setdefault(ident, Group(key=dict(zip(keys, ident))))
        group.add(labels.get("class", "unknown"), hours, labels.get("model", ""), labels.get("spec", ""), prices,
                  labels.get("waste", NOT_WASTED))
    return sorted(groups.values(), key=lambda g: (-g.wasted_cost, -g.wasted, tuple(g.key.values())))


@dataclass
class Problem:
    """Something the report could not compute: which section, the query, and the server's answer."""

    section: str
    error: str
    query: str = ""

    def to_json(self) -> dict[str, str]:
        return {"section": self.section, "error": self.error, "query": self.query}


def skipped_text(count: int) -> str:
    """A query's problem when its answer carried NaN or +-Inf samples (the API's "NaN", "+Inf", "-Inf")."""
    return (f"{count:,} non-finite sample{'s' if count != 1 else ''} (NaN, +Inf or -Inf) in the answer, "
            "left out of the report")


def percentile(histogram: dict[int, float], q: float) -> float | None:
    """The ``q`` quantile (0..1) of a whole-percent histogram, interpolated inside its bucket."""
    total = sum(histogram.values())
    if total <= 0:
        return None
    target, seen = q * total, 0.0
    for bucket in sorted(histogram):
        weight = histogram[bucket]
        if weight > 0 and seen + weight >= target:
            return (bucket + (target - seen) / weight) / 100.0
        seen += weight
    return max(histogram) / 100.0


def share_below(histogram: dict[int, float], ratio: float) -> float | None:
    """Share of the histogram's weight in buckets wholly below ``ratio`` (a whole percent)."""
    total = sum(histogram.values())
    if total <= 0:
        return None
    edge = round(ratio * 100)
    return sum(w for b, w in histogram.items() if b < edge) / total
