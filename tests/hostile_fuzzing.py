"""Hypothesis strategies for input other people control, and a bound on what one input may cost.

Shared by tests/test_fuzz_hostile_*.py: numbers at and past every edge (non-finite, subnormal,
1e308, integers of hundreds of digits), text from every Unicode category (controls, format and
bidi characters, lone surrogates, private use, unassigned code points), and inputs that are huge
or deeply nested. ``bounded`` runs one input under a wall-clock and a traced-memory limit, so a
regression to a hang or a runaway allocation fails the example instead of the machine.
"""

from __future__ import annotations

import contextlib
import tracemalloc
from typing import Iterator

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

FUZZ = settings(max_examples=30, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])

BYTES_PER_INPUT = 256 * 2**20
"""Traced Python allocations per input: a 4 MiB line cap and a 16 MiB body cap fit many times over."""

EDGE_FLOATS = [0.0, -0.0, 5e-324, -5e-324, 1e-300, 1e-9, 0.5, 1.0, 2.0, 1e6, 1e18, 1e300, 1.7976931348623157e308,
               -1.0, -1e308, float("inf"), float("-inf"), float("nan")]
numbers = (st.sampled_from(EDGE_FLOATS) | st.floats() | st.integers(-(2**70), 2**70)
           | st.sampled_from([10**18, 2**63, 2**64, 10**400, -(10**400)]))
"""Every kind of JSON number and then some (non-finite ones are written as the NaN/Infinity tokens)."""

any_char = st.characters(codec=None, categories=None, exclude_categories=())
"""Every Unicode category: Cc (ESC, NUL, C1 CSI), Cf (bidi overrides, tags), Cs (lone surrogates),
Co (private use), Cn (unassigned), Zl/Zp separators, combining marks, and ordinary letters."""
CONTROL_RUNS = ["\x1b[2J", "\u2028", "\x1b]52;c;Zm9v\x07", "\x9b31m", "\u202e", "\u2066", "\x00", "\udcff", "\U000e0041", "[/]", "<b>"]
any_text = (st.text(any_char, max_size=40)
            | st.lists(st.sampled_from(CONTROL_RUNS) | st.text(any_char, max_size=4), max_size=6).map("".join))


def deep(depth: int) -> str:
    return "[" * depth + "]" * depth


@contextlib.contextmanager
def bounded(what: str) -> Iterator[None]:
    """Fail when the block allocates more than ``BYTES_PER_INPUT`` (its time is not asserted: speed
    belongs in benchmarks/)."""
    tracing = tracemalloc.is_tracing()
    if not tracing:
        tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    try:
        yield
    finally:
        peak = tracemalloc.get_traced_memory()[1] - base
        if not tracing:
            tracemalloc.stop()
    assert peak < BYTES_PER_INPUT, f"{what}: {peak / 2**20:.0f} MiB for one input"
