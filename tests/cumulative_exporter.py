"""A stand-in dcgm-exporter whose cumulative counters advance between reads, as DCGM 4.6's do on a busy GPU.

The fixture pair ``a100-8x-pods.cumulative.prom`` and ``...cumulative.next.prom`` holds one node's counters at
two instants one second of GPU time apart. Read ``k`` of :class:`AdvancingExporter` serves the first with every
``TYPE counter`` series moved on by ``k`` times that second's step, so each read is one more second of the same
work, whatever the wall clock does; the test computes the expected activity from the two files alone
(:func:`window_activity`), never through the agent's code.
"""

from __future__ import annotations

import re

from tests.dcgm_exporter_server import FakeExporter, fixture

FIRST, SECOND = "a100-8x-pods.cumulative.prom", "a100-8x-pods.cumulative.next.prom"
_SAMPLE = re.compile(r'^(\w+)\{gpu="(\d+)",[^}\n]*\} (\S+)$')


def counters(body: str) -> set[str]:
    """The families the body types ``counter``."""
    return set(re.findall(r"^# TYPE (\w+) counter$", body, re.MULTILINE))


def readings(body: str) -> dict[tuple[str, str], float]:
    """(family, gpu) -> value of every counter series of ``body``."""
    typed = counters(body)
    return {(m.group(1), m.group(2)): float(m.group(3)) for line in body.splitlines()
            if (m := _SAMPLE.match(line)) and m.group(1) in typed}


def window_activity(active: str, first: str | None = None, second: str | None = None) -> dict[str, float]:
    """GPU -> Δ``active`` / Δ SM cycles elapsed between the two fixtures: the activity over one window."""
    a, b = readings(first or fixture(FIRST)), readings(second or fixture(SECOND))
    elapsed = "DCGM_FI_PROF_SM_CYCLES_ELAPSED_TOTAL"
    return {gpu: (b[(active, gpu)] - a[(active, gpu)]) / (b[(elapsed, gpu)] - a[(elapsed, gpu)])
            for (name, gpu) in a if name == active}


def advanced(first: str, second: str, steps: int) -> str:
    """``first`` with every counter moved on by ``steps`` times its step from ``first`` to ``second``."""
    before = readings(first)
    step = {key: value - before[key] for key, value in readings(second).items()}
    typed = counters(first)

    def move(line: str) -> str:
        m = _SAMPLE.match(line)
        if m is None or m.group(1) not in typed:
            return line
        value = int(float(m.group(3)) + steps * step[(m.group(1), m.group(2))])
        return f"{line[:m.start(3)]}{value}"
    return "\n".join(move(line) for line in first.splitlines()) + "\n"


class AdvancingExporter(FakeExporter):
    """:class:`FakeExporter` whose counters move on by one step at every read; :meth:`restart` puts them back
    to the first reading (a GPU reset or driver reload: counters that go back)."""

    def __init__(self, first: str | None = None, second: str | None = None, port: int = 0) -> None:
        self.first, self.second = first or fixture(FIRST), second or fixture(SECOND)
        self._base = 0
        super().__init__(self.first, port)

    @property
    def body(self) -> str:  # read by the handler under the lock, after ``requests`` counted this read
        return advanced(self.first, self.second, self.requests - self._base)

    @body.setter
    def body(self, value: str) -> None:
        self.first = value

    def restart(self) -> None:
        with self._lock:
            self._base = self.requests
