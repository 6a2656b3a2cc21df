"""The golden exposition for the ``roofwatch top`` tests, and the tests' own small reader of it.

Expected values are read from tests/fixtures/demo-exposition.prom with a line parser independent of
agent.views.top_source, so the assertions follow the fixture instead of numbers copied by hand.
Shared by tests/test_top.py and tests/test_top_fetch.py, with the ``text`` fixture.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

FIXTURE = Path(__file__).parent / "fixtures" / "demo-exposition.prom"
LINE = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})? (?P<value>\S+)$')
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def series(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """(labels, value) of every sample named ``name``: the test's own reading of the exposition."""
    out = []
    for line in text.splitlines():
        match = LINE.match(line)
        if match and match["name"] == name:
            out.append((dict(LABEL.findall(match["labels"] or "")), float(match["value"])))
    return out


def per_gpu(text: str, name: str) -> dict[str, float]:
    return {labels["gpu"]: value for labels, value in series(text, name)}


@pytest.fixture(scope="module")
def text() -> str:
    return FIXTURE.read_text()
