"""The little SVG the views draw by hand: scales, ticks and escaped elements.

Hand-written rather than a plotting library because the pages must be self-contained text
(no external assets, no JavaScript renderer) and small enough to serve from the agent.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass

from agent.model.text import printable


def esc(text: object) -> str:
    """HTML-escaped and printable: names on the pages come from jobs, traces and reports (agent.model.text)."""
    return html.escape(printable(text), quote=True)


def num(value: float) -> str:
    """Coordinates with one decimal: sub-pixel precision is invisible and bloats the file."""
    return f"{value:.1f}".rstrip("0").rstrip(".") if math.isfinite(value) else "0"


@dataclass(frozen=True)
class LogScale:
    """Maps a positive value range onto pixels logarithmically (decade ticks)."""

    lo: float
    hi: float
    start_px: float
    end_px: float

    def __call__(self, value: float) -> float:
        value = min(max(value, self.lo), self.hi)
        span = math.log10(self.hi) - math.log10(self.lo)
        return self.start_px + (math.log10(value) - math.log10(self.lo)) / span * (self.end_px - self.start_px)

    def decades(self) -> list[float]:
        """Powers of ten inside the range (the tick marks)."""
        first = math.ceil(math.log10(self.lo) - 1e-9)
        last = math.floor(math.log10(self.hi) + 1e-9)
        return [10.0 ** e for e in range(first, last + 1)]

    @staticmethod
    def around(values: list[float], start_px: float, end_px: float) -> LogScale:
        """Half decades that enclose every value: tight enough to waste no space, round enough
        that the ticks stay powers of ten (at least one decade wide)."""
        lo = 10.0 ** (math.floor(2 * math.log10(min(values))) / 2)
        hi = 10.0 ** (math.ceil(2 * math.log10(max(values))) / 2)
        if hi < lo * 10.0:
            hi = lo * 10.0
        return LogScale(lo, hi, start_px, end_px)


@dataclass(frozen=True)
class LinearScale:
    lo: float
    hi: float
    start_px: float
    end_px: float

    def __call__(self, value: float) -> float:
        span = (self.hi - self.lo) or 1.0
        return self.start_px + (value - self.lo) / span * (self.end_px - self.start_px)


def si(value: float, unit: str = "") -> str:
    """Compact engineering notation for axis labels: 1e15 -> '1P', 3.35e12 -> '3.35T'."""
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g}{prefix}{unit}"
    return f"{value:.3g}{unit}"


def text(x: float, y: float, content: str, *, cls: str = "", anchor: str = "start", extra: str = "") -> str:
    attrs = f' class="{cls}"' if cls else ""
    return f'<text x="{num(x)}" y="{num(y)}" text-anchor="{anchor}"{attrs}{extra}>{esc(content)}</text>'


def line(x1: float, y1: float, x2: float, y2: float, cls: str) -> str:
    return f'<line x1="{num(x1)}" y1="{num(y1)}" x2="{num(x2)}" y2="{num(y2)}" class="{cls}"/>'


def polyline(points: list[tuple[float, float]], cls: str, extra: str = "") -> str:
    coords = " ".join(f"{num(x)},{num(y)}" for x, y in points)
    return f'<polyline points="{coords}" class="{cls}"{extra}/>'
