"""Activity over the agent's own window from cumulative cycle counters: Δactive / Δelapsed.

DCGM 4.6 exports raw monotonic counters beside its sampled ratios (``DCGM_FI_PROF_SM_CYCLES_ELAPSED_TOTAL``,
``..._MMA_CYCLES_ACTIVE_TOTAL`` and so on: :data:`agent.backends.dcgm.fields.CUMULATIVE`). A sampled ratio such as
``PIPE_TENSOR_ACTIVE`` is DCGM's average over its own update period, which the agent's reads alias against;
the difference of two readings of a counter covers exactly the span between them, however the work was
distributed inside it. So where a source gives both, the counters win (:func:`prefer`).

Why a window can give no value, and never a wrong one:

* the first reading of a GPU is a baseline only;
* a reading whose counters did not move at all is the same update of the source read again (the exporter
  is read more often than DCGM refreshes): the previous window's activity is given again;
* elapsed cycles that went back mean the counters started again: a driver reload, a GPU reset, an exporter
  now reading another GPU, or a counter that wrapped. DCGM types them int64 and an H100 adds about 2.6e11
  SM cycles a second, so an honest 63-bit counter wraps after more than a year; whatever the cause, the
  window across it is dropped and the new reading is the baseline (:attr:`CounterWindows.restarts`);
* an active counter that went back, or moved further than the elapsed cycles (more than all of the time
  active), is that one counter restarted: its field has no value this window, the others keep theirs.

So an activity is always within 0..1 and never negative.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Hashable, Mapping

OVER_TOLERANCE = 1e-6
"""Relative slack before an active count past the elapsed one is called a restart (float rounding of counters
near 2^53, where a double no longer holds every integer)."""


@dataclass(frozen=True, slots=True)
class Totals:
    """One reading of a GPU's cumulative counters: SM cycles elapsed, and active cycles per sample field."""

    elapsed: float
    active: Mapping[str, float]


@dataclass(slots=True)
class _Last:
    totals: Totals
    ratios: dict[str, float] = field(default_factory=dict)
    window_cycles: float | None = None


@dataclass(frozen=True, slots=True)
class WindowState:
    """How the counters of one GPU went at its latest reading, for ``doctor``."""

    used: tuple[str, ...]
    """Sample fields the counters gave over the latest window."""
    window_cycles: float | None
    """SM cycles the latest window spanned (None before the second reading)."""
    restarts: int
    """Readings whose counters went back since start (each dropped its window)."""


class CounterWindows:
    """The latest reading of each GPU's counters, and the activity since the one before."""

    def __init__(self) -> None:
        self._last: dict[Hashable, _Last] = {}
        self._restarts: dict[Hashable, int] = {}
        self._lock = threading.Lock()

    def activity(self, key: Hashable, totals: Totals | None) -> dict[str, float]:
        """Sample field -> Δactive / Δelapsed since ``key``'s previous reading (the module's rules); {} when the
        window gives nothing (first reading, restart, no counters)."""
        if totals is None:
            return {}
        with self._lock:
            last = self._last.get(key)
            if last is None:
                self._last[key] = _Last(totals)
                return {}
            moved = totals.elapsed - last.totals.elapsed
            if moved == 0 and all(totals.active.get(f) == v for f, v in last.totals.active.items()):
                return dict(last.ratios)  # the same update of the source, read again
            if moved <= 0:
                self._restart(key, totals)
                return {}
            ratios: dict[str, float] = {}
            for name, value in totals.active.items():
                before = last.totals.active.get(name)
                if before is None:
                    continue
                delta = value - before
                if delta < 0 or delta > moved * (1 + OVER_TOLERANCE):
                    self._restarts[key] = self._restarts.get(key, 0) + 1
                    continue
                ratios[name] = min(1.0, delta / moved)
            self._last[key] = _Last(totals, ratios, moved)
            return dict(ratios)

    def forget(self, key: Hashable) -> None:
        """Drop ``key``'s latest reading (its restarts stay counted): the next one is a baseline. For a reader whose
        next reading does not continue the last one's span (GPM's sample pair started again)."""
        with self._lock:
            self._last.pop(key, None)

    def _restart(self, key: Hashable, totals: Totals) -> None:
        self._restarts[key] = self._restarts.get(key, 0) + 1
        self._last[key] = _Last(totals)

    def state(self, key: Hashable) -> WindowState | None:
        """The latest window of ``key``; None when its counters were never read."""
        with self._lock:
            last = self._last.get(key)
            if last is None:
                return None
            return WindowState(tuple(sorted(last.ratios)), last.window_cycles, self._restarts.get(key, 0))


def prefer(sampled: Mapping[str, object], exact: Mapping[str, float]) -> dict[str, object]:
    """``sampled`` with every field the counters gave replaced by the counters' activity over the window."""
    return {**sampled, **exact}
