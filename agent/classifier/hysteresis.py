"""Step 4 of an evaluation: hysteresis on what a verdict publishes, the class and then its detail.

A steady workload must not flap between classes, nor its dashboard legend and alert labels between
details, on one window's noise. A challenger replaces the published label only when it has won
``confirm_evaluations`` evaluations in a row and the label has been held ``min_dwell_s``
(docs/classification.md §3). The engine keeps one :class:`Hysteresis` for a GPU's class and one for the
detail within that class, started afresh when the class changes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from agent.classifier.thresholds import Thresholds
from agent.model.verdict import Check, Reason


@dataclass
class Hysteresis:
    """Hysteresis on a published label (the class, or the detail within it): a challenger must win
    ``confirm_evaluations`` evaluations in a row, and the label must have been held ``min_dwell_s``."""

    published: str | None = None
    since: float = -math.inf
    challenger: str | None = None
    wins: int = 0

    def update(self, raw: str, now: float, t: Thresholds, *, at_once: bool = False) -> str:
        """The label to publish now; ``at_once`` publishes ``raw`` without waiting (nothing to defend)."""
        if at_once or self.published is None:
            if raw != self.published:
                self.published, self.since = raw, now
            self.challenger, self.wins = None, 0
            return raw
        if raw == self.published:
            self.challenger, self.wins = None, 0
            return raw
        self.wins = self.wins + 1 if raw == self.challenger else 1
        self.challenger = raw
        if self.wins >= t.confirm_evaluations and now - self.since >= t.min_dwell_s:
            self.published, self.since = raw, now
            self.challenger, self.wins = None, 0
        return self.published

    def hold_phrase(self, label: str, t: Thresholds) -> str:
        """The hysteresis that keeps the published label against ``label``, in a few words."""
        if self.wins < t.confirm_evaluations:
            return f"hysteresis holds it until {label} wins {t.confirm_evaluations} evaluations in a row"
        return f"hysteresis holds it {t.min_dwell_s:g} s before {label} may replace it"

    def holding(self, label: str, what: str, now: float, t: Thresholds) -> Reason:
        """Why the published label stands against ``label``, this window's own: the challenger's wins so far,
        or the time the label has been held."""
        if self.wins < t.confirm_evaluations:
            return Reason(f"holding {what}{self.published}: {label} must win {t.confirm_evaluations} evaluations in a "
                          f"row to replace it ({self.wins} so far)",
                          (Check("challenger_wins", float(self.wins), float(t.confirm_evaluations), "below",
                                 "confirm_evaluations"),))
        held = now - self.since
        return Reason(f"holding {what}{self.published}: held {held:.0f} s of the {t.min_dwell_s:g} s it is kept before "
                      f"{label} may replace it", (Check("held_s", held, t.min_dwell_s, "below", "min_dwell_s"),))
