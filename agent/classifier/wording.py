"""How the classifier words a figure in a reason: one format per kind of number, so a reason's text and the
figure its check carries read the same."""

from __future__ import annotations

from typing import Callable

from agent.model.verdict import Check

Reading = tuple[str, "float | None", float, str, Callable[[float], str]]
"""One reading a detail rule holds against its threshold: quantity, value, threshold, setting, and how the
value is worded."""


def pct(x: float | None) -> str:
    """A share as a whole percentage (``n/a`` when unknown)."""
    return "n/a" if x is None else f"{100.0 * x:.0f}%"


def score(x: float) -> str:
    """A class score as the snapshot's ``scores`` show it."""
    return f"{x:.3f}"


def at_or_above(*readings: Reading) -> tuple[list[str], tuple[Check, ...]]:
    """The readings at or above their thresholds (either is enough for the rule), each worded, with the
    comparisons that make them evidence; a reading below its threshold is not said."""
    said, found = [], []
    for quantity, value, threshold, setting, words in readings:
        if value is not None and value >= threshold:
            said.append(words(value))
            found.append(Check(quantity, value, threshold, "above", setting))
    return said, tuple(found)
