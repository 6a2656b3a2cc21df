"""The score shapes every rule is built from: soft comparisons with a threshold, and their combination.

A class score is a logistic step ``σ((x - θ)/w)`` around its entry threshold θ on the feature
that governs it, and the minimum over components for classes with several conditions
(classification.md §7.4). ``None`` means the feature is unknown and stays unknown.

The atoms are :class:`Term` records rather than bare floats, and their combinations :class:`Rule`
records, so that after scoring the rule that decided still says which figure it compared with which
threshold, in which direction: the explanation is built from those (agent.classifier.explain), and a
reason can never quote a threshold the rule did not use.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator, Literal, Union

from agent.model.verdict import Check, Direction


def sigmoid(x: float) -> float:
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


@dataclass(frozen=True, slots=True)
class Term:
    """One soft comparison: ``quantity`` (its ``value``) against ``threshold``, scoring towards 1 on the
    ``direction`` side; ``score`` is None while the value is unknown."""

    quantity: str
    value: float | None
    threshold: float
    direction: Direction
    score: float | None
    setting: str | None = None

    def check(self) -> Check | None:
        """The comparison as a reason carries it (None while the value is unknown)."""
        if self.value is None:
            return None
        return Check(self.quantity, self.value, self.threshold, self.direction, self.setting)

    def terms(self) -> Iterator[Term]:
        yield self


@dataclass(frozen=True, slots=True)
class Rule:
    """A combination of terms: ``all`` (the minimum of the known parts, unknown when the first, governing
    part is), ``any`` (the maximum of the known parts) or ``not`` (one minus its one part)."""

    name: str
    op: Literal["all", "any", "not"]
    parts: tuple[Node, ...]
    score: float | None

    def chosen(self) -> Node | None:
        """The part an ``any`` rule took its score from (the first with the highest score)."""
        known = [p for p in self.parts if p.score is not None]
        return max(known, key=lambda p: p.score) if known else None  # type: ignore[arg-type, return-value]

    def terms(self) -> Iterator[Term]:
        """The terms on the path that made this score: every part of ``all``, the chosen part of ``any``;
        nothing under ``not`` (its terms argue the other way)."""
        if self.op == "all":
            for part in self.parts:
                yield from part.terms()
        elif self.op == "any":
            part = self.chosen()
            if part is not None:
                yield from part.terms()

    def find(self, name: str) -> Rule | None:
        """The rule called ``name`` anywhere below (or at) this one."""
        if self.name == name:
            return self
        for part in self.parts:
            if isinstance(part, Rule) and (found := part.find(name)) is not None:
                return found
        return None


Node = Union[Term, Rule]


def above(quantity: str, x: float | None, theta: float, width: float, setting: str | None = None) -> Term:
    return Term(quantity, x, theta, "above", None if x is None else sigmoid((x - theta) / width), setting)


def below(quantity: str, x: float | None, theta: float, width: float, setting: str | None = None) -> Term:
    return Term(quantity, x, theta, "below", None if x is None else sigmoid((theta - x) / width), setting)


def fact(quantity: str, value: bool | None) -> Term:
    """A yes/no condition as a term: 1 when it holds, 0 when not, unknown as None."""
    number = None if value is None else (1.0 if value else 0.0)
    return Term(quantity, number, 1.0, "above", number)


def constant(name: str, score: float) -> Rule:
    """A rule with a fixed score and no terms (a class that cannot apply: jitter on a lone GPU)."""
    return Rule(name, "all", (), score)


def negated(term: Term) -> Term:
    """The opposite comparison, scoring one minus the term's score."""
    return Term(term.quantity, term.value, term.threshold, "below" if term.direction == "above" else "above",
                None if term.score is None else 1.0 - term.score, term.setting)


def not_rule(name: str, rule: Rule) -> Rule:
    """One minus a rule's score (its terms argue the other way, so none is listed under it)."""
    return Rule(name, "not", (rule,), None if rule.score is None else 1.0 - rule.score)


def all_of(name: str, *parts: Node | None) -> Rule:
    """Minimum of the known components; unknown if the first (governing) one is unknown. A part given as
    None is left out (a condition that does not apply here)."""
    present = tuple(p for p in parts if p is not None)
    if not parts or parts[0] is None or parts[0].score is None:
        return Rule(name, "all", present, None)
    return Rule(name, "all", present, min(p.score for p in present if p.score is not None))


def any_of(name: str, *parts: Node | None) -> Rule:
    """Maximum of the known components; unknown only if all are."""
    present = tuple(p for p in parts if p is not None)
    known = [p.score for p in present if p.score is not None]
    return Rule(name, "any", present, max(known) if known else None)
