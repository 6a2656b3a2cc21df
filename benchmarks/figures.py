"""One measured figure, its baseline from the same run, and its budget."""

from __future__ import annotations

from dataclasses import asdict, dataclass

WIDE_MARGIN = 2.0
"""A budget missed by more than this factor fails the run; a smaller miss is reported, not failed
(timings on a shared 2-core machine wobble by tens of percent)."""


@dataclass(frozen=True)
class Figure:
    """``value`` in ``unit``; ``budget`` is an upper bound in the same unit (None: reported only).

    ``baseline`` is what the same quantity costs the reference measured in the same run (the
    peer exporter, prometheus_client's own encoder, the start of the run), so the ratio is
    meaningful across machines even when the absolute value is not.
    """

    group: str
    name: str
    value: float
    unit: str
    budget: float | None = None
    baseline: float | None = None
    baseline_name: str = ""
    note: str = ""

    @property
    def ratio(self) -> float | None:
        return None if not self.baseline else self.value / self.baseline

    @property
    def verdict(self) -> str:
        if self.budget is None:
            return "—"
        if self.value <= self.budget:
            return "met"
        return "MISSED" if self.value > self.budget * WIDE_MARGIN else "over"

    def to_json(self) -> dict[str, object]:
        return {**asdict(self), "ratio": self.ratio, "verdict": self.verdict}


def table(figures: list[Figure]) -> str:
    """Markdown, so the output pastes into docs/performance.md as it is."""
    lines = ["| group | figure | value | budget | verdict | baseline | ratio | note |", "|---|---|---|---|---|---|---|---|"]
    for f in figures:
        base = f"{_fmt(f.baseline)} {f.unit} ({f.baseline_name})" if f.baseline is not None else "—"
        ratio = f"{f.ratio:.2f}x" if f.ratio is not None else "—"
        budget = f"<= {_fmt(f.budget)} {f.unit}" if f.budget is not None else "—"
        lines.append(f"| {f.group} | {f.name} | {_fmt(f.value)} {f.unit} | {budget} | {f.verdict} | {base} | {ratio} | {f.note} |")
    return "\n".join(lines)


def _fmt(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
