"""Δactive / Δelapsed of cumulative counters: exact over the window, and never negative across a reset
(agent/backends/cumulative.py; issue 46 item 1). The dcgm-exporter side: tests/test_dcgm_exporter_counters.py."""

from __future__ import annotations

import pytest

from agent.backends.cumulative import CounterWindows, Totals


def _totals(elapsed: float, tensor: float, sm: float | None = None) -> Totals:
    active = {"tensor_active": tensor, **({"sm_active": sm} if sm is not None else {})}
    return Totals(elapsed, active)


def test_activity_is_the_difference_over_the_window_not_the_mean_since_start():
    windows = CounterWindows()
    assert windows.activity("0", _totals(1_000_000, 100_000)) == {}, "the first reading is a baseline"
    got = windows.activity("0", _totals(1_000_000 + 4_000, 100_000 + 3_000))
    assert got == {"tensor_active": pytest.approx(0.75)}  # 3,000 of 4,000 cycles; since start it is 0.1
    state = windows.state("0")
    assert state is not None and state.used == ("tensor_active",) and state.window_cycles == 4_000


def test_the_same_reading_again_gives_the_same_window():
    windows = CounterWindows()
    windows.activity("0", _totals(0, 0))
    first = windows.activity("0", _totals(1_000, 250))
    assert windows.activity("0", _totals(1_000, 250)) == first == {"tensor_active": pytest.approx(0.25)}


@pytest.mark.parametrize("after", [
    _totals(500, 100),  # elapsed went back: a driver reload, a GPU reset, a counter that wrapped
    _totals(2_000 - 2**32, 1_000 - 2**32),  # a wrap of a narrower counter reads as going back too
    _totals(2_000, 1_200),  # elapsed did not move but the active count did: not one source's update
])
def test_counters_that_go_back_are_a_restart_never_a_negative_activity(after):
    windows = CounterWindows()
    windows.activity("0", _totals(1_000, 600))
    windows.activity("0", _totals(2_000, 1_000))
    assert windows.activity("0", after) == {}, "the window across the restart is dropped"
    assert windows.state("0").restarts == 1
    moved = Totals(after.elapsed + 1_000, {"tensor_active": after.active["tensor_active"] + 400})
    assert windows.activity("0", moved) == {"tensor_active": pytest.approx(0.4)}, "the new reading is the baseline"


def test_one_counter_reset_costs_that_field_only():
    windows = CounterWindows()
    windows.activity("0", _totals(1_000, 600, 900))
    got = windows.activity("0", _totals(2_000, 10, 1_800))  # tensor went back; SM active moved 900 of 1,000
    assert got == {"sm_active": pytest.approx(0.9)}
    over = windows.activity("0", _totals(3_000, 2_000, 2_700))  # tensor moved 1,990 in 1,000 cycles: impossible
    assert over == {"sm_active": pytest.approx(0.9)} and windows.state("0").restarts == 2
