"""The benchmark code keeps working, and what it can check without timing holds.

The benchmarks themselves are not run here (timings are machine-dependent and take minutes);
these tests run their checks that do not depend on time: the soak leaks no threads or file
descriptors, the /metrics baseline holds exactly our series, and budgets are judged as documented.
"""

from __future__ import annotations

import pytest

from benchmarks import memory_soak, scrape
from benchmarks.figures import WIDE_MARGIN, Figure, table


@pytest.mark.slow
def test_a_short_soak_leaks_no_threads_or_file_descriptors():
    figures = {f.name: f for f in memory_soak.run(intervals=400, churn_every_s=5.0)}
    assert figures["thread growth"].value == 0
    assert figures["file descriptor growth"].value == 0
    assert figures["peak RSS"].value > 0


def test_scrape_baseline_holds_the_same_series_and_our_bytes_match_the_library():
    snapshot = scrape.node_snapshot()
    text = scrape.checked_render(snapshot, scrape.TEXT_ACCEPT)  # raises if the bytes differ
    scrape.checked_render(snapshot, scrape.OPENMETRICS_ACCEPT)
    registry = scrape.checked_baseline(text.decode())  # raises unless the series are the same
    assert registry is not None and len(scrape.series(text.decode())) > 1000


def test_budgets_are_judged_with_the_documented_margin():
    assert Figure("g", "met", 4.0, "ms", 5.0).verdict == "met"
    assert Figure("g", "over", 5.0 * WIDE_MARGIN, "ms", 5.0).verdict == "over"
    assert Figure("g", "missed", 5.0 * WIDE_MARGIN + 0.01, "ms", 5.0).verdict == "MISSED"
    assert Figure("g", "reported", 1.0, "ms").verdict == "—"
    assert Figure("g", "r", 3.0, "ms", baseline=6.0).ratio == 0.5
    assert "| g | met | 4 ms | <= 5 ms | met |" in table([Figure("g", "met", 4.0, "ms", 5.0)])
