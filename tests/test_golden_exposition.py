"""The whole exposition of a fixed virtual node, compared with a committed golden file.

As in node_exporter's end-to-end test, any change to a name, label, HELP text, value format or
to the simulation shows up as a reviewable diff. Regenerate deliberately with
``ROOFWATCH_UPDATE_GOLDEN=1 ./dev.sh test tests/test_golden_exposition.py``.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

from prometheus_client.exposition import generate_latest

from agent import __version__
from agent.backends.virtual import VirtualBackend
from agent.classifier.live import LiveClassifier
from agent.collector import Collector
from exporters.prometheus import ExpositionCache

GOLDEN = Path(__file__).parent / "fixtures" / "demo-exposition.prom"
START = 1_800_000_000.0


def render_fixed_demo() -> str:
    clock = {"t": START}
    backend = VirtualBackend("demo", start_time=START - 60.0, interval_s=1.0)
    collector = Collector(
        backend, node="golden-node", interval_s=1.0, clock=lambda: clock["t"], monotonic=lambda: clock["t"],
        analyzer=LiveClassifier(),
    )
    for _ in range(25):  # enough for a full classification window: the verdicts are in the golden file too
        collector.collect_once()
        clock["t"] += 1.0
    text = ExpositionCache(lambda: collector.snapshot).render(generate_latest, "text/plain").decode()
    collector.stop()
    # The only run-dependent values: the agent and Python versions.
    return text.replace(f'python_version="{platform.python_version()}"', 'python_version="X"').replace(
        f'version="{__version__}"', 'version="X"'
    )


def test_exposition_matches_golden_file():
    text = render_fixed_demo()
    if os.environ.get("ROOFWATCH_UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert GOLDEN.is_file(), f"missing {GOLDEN}; create it with ROOFWATCH_UPDATE_GOLDEN=1"
    expected = GOLDEN.read_text()
    assert text == expected, "exposition changed; if intended, regenerate with ROOFWATCH_UPDATE_GOLDEN=1"


def test_rendering_is_deterministic():
    assert render_fixed_demo() == render_fixed_demo()
