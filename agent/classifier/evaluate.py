"""Precision, recall and the confusion matrix of verdicts against labelled samples.

A verdict is scored against the label of the last sample in its window (the class the GPU was
really in at that moment). Verdicts within ``settle_s`` after a GPU's label changed, or after
it first appeared, are not scored but counted as ``settling``: the classifier promises to
report a phase change within 30 s, and judging it inside that grace period would measure the
promise, not the rules. Stability and detection latency have their own tests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from agent.model import WORKLOAD_CLASSES, Verdict

SETTLE_S = 30.0


@dataclass
class Evaluation:
    """Counts of (true class, verdict class) over the scored verdicts."""

    matrix: dict[str, dict[str, int]] = field(default_factory=lambda: {t: {p: 0 for p in WORKLOAD_CLASSES} for t in WORKLOAD_CLASSES})
    scored: int = 0
    settling: int = 0
    unlabelled: int = 0

    def add(self, truth: str, predicted: str) -> None:
        self.matrix[truth][predicted] += 1
        self.scored += 1

    def support(self, cls: str) -> int:
        return sum(self.matrix[cls].values())

    def predicted(self, cls: str) -> int:
        return sum(row[cls] for row in self.matrix.values())

    def recall(self, cls: str) -> float | None:
        n = self.support(cls)
        return self.matrix[cls][cls] / n if n else None

    def precision(self, cls: str) -> float | None:
        n = self.predicted(cls)
        return self.matrix[cls][cls] / n if n else None

    @property
    def accuracy(self) -> float | None:
        return sum(self.matrix[c][c] for c in WORKLOAD_CLASSES) / self.scored if self.scored else None

    @property
    def present(self) -> list[str]:
        """Classes that occur as truth or as verdict (the rows and columns worth printing)."""
        return [c for c in WORKLOAD_CLASSES if self.support(c) or self.predicted(c)]

    def to_json(self) -> dict[str, object]:
        return {
            "scored": self.scored, "settling": self.settling, "unlabelled": self.unlabelled,
            "accuracy": _r(self.accuracy),
            "classes": {c: {"precision": _r(self.precision(c)), "recall": _r(self.recall(c)), "support": self.support(c)}
                        for c in self.present},
            "confusion": {t: {p: self.matrix[t][p] for p in self.present} for t in self.present},
        }

    def table(self) -> str:
        """Per-class precision/recall and the confusion matrix as aligned text (Markdown-friendly)."""
        classes = self.present
        lines = ["| class | precision | recall | support |", "|---|---:|---:|---:|"]
        for c in classes:
            lines.append(f"| {c} | {_fmt(self.precision(c))} | {_fmt(self.recall(c))} | {self.support(c)} |")
        lines += ["", "Confusion matrix (rows: true class, columns: verdict):", "",
                  "| true \\ verdict | " + " | ".join(classes) + " |", "|---|" + "---:|" * len(classes)]
        for t in classes:
            lines.append(f"| {t} | " + " | ".join(str(self.matrix[t][p]) for p in classes) + " |")
        lines += ["", f"{self.scored} verdicts scored, accuracy {_fmt(self.accuracy)}; {self.settling} within "
                      f"{SETTLE_S:.0f} s of a phase change not scored; {self.unlabelled} unlabelled."]
        return "\n".join(lines)


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def _fmt(x: float | None) -> str:
    return "—" if x is None else f"{x:.3f}"


def evaluate(verdicts: Iterable[Verdict], settle_s: float = SETTLE_S) -> Evaluation:
    """Score verdicts (in time order per GPU, as :func:`classify_samples` yields them)."""
    result = Evaluation()
    changed: dict[tuple[str, str], tuple[str | None, float]] = {}
    for v in verdicts:
        key = (v.node, v.gpu)
        previous = changed.get(key)
        if previous is None or previous[0] != v.truth:
            changed[key] = (v.truth, v.window_end)
        if v.truth is None:
            result.unlabelled += 1
        elif v.window_end - changed[key][1] < settle_s:
            result.settling += 1
        else:
            result.add(v.truth, v.cls)
    return result
