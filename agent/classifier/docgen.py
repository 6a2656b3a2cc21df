"""Keeps the generated parts of ``docs/classification.md`` in step with the code.

The thresholds table comes from :class:`Thresholds` and :data:`SOURCES`; the precedence table from
:data:`agent.classifier.decision.PRECEDENCE`; the evaluation block from classifying the shipped
labelled traces. A test fails when either is stale; regenerate with
``python -m agent.classifier.docgen --write``.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Callable

from agent.classifier.decision import PRECEDENCE
from agent.classifier.engine import classify_samples
from agent.classifier.evaluate import Evaluation, evaluate
from agent.classifier.thresholds import DEFAULT_THRESHOLDS, SOURCES, Thresholds
from agent.trace import read_trace

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "classification.md"
LABELLED = ROOT / "traces" / "labelled"
PUBLISHED = ROOT / "traces" / "published"


def thresholds_table(t: Thresholds = DEFAULT_THRESHOLDS) -> str:
    lines = ["| setting | default | meaning | kind | source |", "|---|---:|---|---|---|"]
    for name, field in Thresholds.model_fields.items():
        kind, source = SOURCES[name]
        lines.append(f"| `{name}` | {getattr(t, name):g} | {field.description} | {kind} | {source} |")
    return "\n".join(lines)


def precedence_table() -> str:
    """The order a window's class is decided in, as :data:`PRECEDENCE` holds it."""
    lines = ["| step | gives | when | `precedence` says |", "|---:|---|---|---|"]
    for i, step in enumerate(PRECEDENCE, 1):
        gives = ", ".join(f"`{c}`" for c in step.gives.replace(" or ", ", ").split(", "))
        lines.append(f"| {i} | {gives} | {step.when} | {step.why} |")
    return "\n".join(lines)


def labelled_evaluation(directory: Path = LABELLED) -> Evaluation:
    samples = [s for path in sorted(directory.glob("*.jsonl.gz")) for s in read_trace(path)]
    return evaluate(classify_samples(samples))


def render(text: str, blocks: dict[str, str]) -> str:
    for name, body in blocks.items():
        pattern = re.compile(rf"(<!-- BEGIN GENERATED: {name} -->\n).*?(<!-- END GENERATED: {name} -->)", re.DOTALL)
        if not pattern.search(text):
            raise ValueError(f"{DOC}: markers for the generated block {name!r} are missing")
        text = pattern.sub(lambda m: m.group(1) + body.rstrip("\n") + "\n" + m.group(2), text)
    return text


def generated_blocks(evaluation: Callable[[Path], Evaluation] = labelled_evaluation) -> dict[str, str]:
    """The generated blocks; ``evaluation`` classifies a directory of traces (a test that has already
    classified them passes its own, so the same traces are not classified twice)."""
    return {"thresholds": thresholds_table(), "precedence": precedence_table(), "evaluation": evaluation(LABELLED).table(),
            "evaluation-published": evaluation(PUBLISHED).table()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite docs/classification.md in place")
    args = parser.parse_args(argv)
    text = DOC.read_text(encoding="utf-8")
    updated = render(text, generated_blocks())
    if args.write:
        DOC.write_text(updated, encoding="utf-8")
    elif updated != text:
        print(f"{DOC} is stale; run python -m agent.classifier.docgen --write", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
