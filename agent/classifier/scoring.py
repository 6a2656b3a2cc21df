"""The score shapes every rule is built from: soft steps around a threshold, and their combination.

A class score is a logistic step ``σ((x - θ)/w)`` around its entry threshold θ on the feature
that governs it, and the minimum over components for classes with several conditions
(classification.md §7.4). ``None`` means the feature is unknown and stays unknown.
"""

from __future__ import annotations

import math


def sigmoid(x: float) -> float:
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


def above(x: float | None, theta: float, width: float) -> float | None:
    return None if x is None else sigmoid((x - theta) / width)


def below(x: float | None, theta: float, width: float) -> float | None:
    return None if x is None else sigmoid((theta - x) / width)


def all_of(*parts: float | None) -> float | None:
    """Minimum of the known components; unknown if the first (governing) one is unknown."""
    if not parts or parts[0] is None:
        return None
    return min(p for p in parts if p is not None)


def any_of(*parts: float | None) -> float | None:
    """Maximum of the known components; unknown only if all are."""
    known = [p for p in parts if p is not None]
    return max(known) if known else None
