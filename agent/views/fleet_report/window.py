"""The period a report covers and the step its queries sample at.

The step bounds every query's cost: a subquery over the period evaluates its inner expression
once per step, so ``period / step`` is held under a cap (2016 points: a week at 5 minutes), never
finer than a minute (scrape intervals are 15-60 s). The end is rounded down to a whole step so
Prometheus and VictoriaMetrics, which both align subquery steps to multiples of the step, sample
the same instants. The previous period is the same length, ending where this one starts.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
from datetime import datetime, timezone

MIN_STEP_S = 60
MAX_POINTS = 2016
MAX_RANGE_S = 400 * 86400
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"(\d+)([smhdw])")


def parse_duration(text: str) -> int:
    """``7d``, ``36h``, ``1w2d``, ``90m`` -> seconds (Prometheus duration syntax, whole units)."""
    text = text.strip()
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"{text!r} is not a duration such as 7d, 36h or 1w2d")
    seconds = sum(int(n) * _UNITS[u] for n, u in parts)
    if seconds % 60:
        raise ValueError(f"{text!r} must be whole minutes")
    if seconds < 600 or seconds > MAX_RANGE_S:
        raise ValueError(f"{text!r} must be between 10m and {MAX_RANGE_S // 86400}d")
    return seconds


def span_text(seconds: float) -> str:
    """A duration as people say it: ``10 min``, ``6 h``, ``2 d 3 h``, ``1 h 30 min`` (whole minutes: a report's
    period and step are; seconds are shown only for what is shorter than a minute or not whole minutes)."""
    total = max(0, round(seconds))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{n} {unit}" for n, unit in ((days, "d"), (hours, "h"), (minutes, "min"), (secs, "s")) if n]
    return " ".join(parts) or "0 s"


def parse_time(text: str | None) -> float:
    """``now`` (or None), unix seconds, or an RFC 3339 time (``2026-11-24T00:00:00Z``)."""
    if text is None or text == "now":
        return time.time()
    try:
        value = float(text)
    except ValueError:
        try:
            parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(f"{text!r} is neither unix seconds nor an RFC 3339 time") from None
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=timezone.utc)
        value = parsed.timestamp()
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{text!r} is not a time after 1970")
    return value


@dataclass(frozen=True)
class Window:
    """``[end - range_s, end]`` sampled every ``step_s``; ``previous`` is the period before it."""

    end: float
    range_s: int
    step_s: int

    @staticmethod
    def pick(end: float, range_s: int, *, max_points: int = MAX_POINTS, min_step_s: int = MIN_STEP_S) -> Window:
        """The coarsest of one minute and ``range / max_points``, whole minutes, dividing the range."""
        step = max(min_step_s, math.ceil(range_s / max_points))
        step = math.ceil(step / 60) * 60
        while range_s % step:
            step += 60
        return Window(end=math.floor(end / step) * step, range_s=range_s, step_s=step)

    @property
    def start(self) -> float:
        return self.end - self.range_s

    @property
    def previous(self) -> Window:
        return Window(end=self.start, range_s=self.range_s, step_s=self.step_s)

    @property
    def points(self) -> int:
        return self.range_s // self.step_s

    def subquery(self) -> str:
        """``[range-1s:step]``: exactly ``points`` steps after the start, whether the server's
        range is closed (Prometheus 2) or open (Prometheus 3, VictoriaMetrics) on the left."""
        return f"[{self.range_s - 1}s:{self.step_s}s]"

    def hours_per_point(self) -> float:
        return self.step_s / 3600.0
