"""The classifier inside the daemon: fed from each collection cycle, evaluated on its own grid.

The collector calls :meth:`LiveClassifier.__call__` with every new snapshot; it forwards the
samples it has not seen yet, evaluates when the next grid time has passed, and otherwise hands
back the previous verdicts. Costs stay flat: one evaluation every ``evaluate_every_s`` per node,
and at most ``long_window_s`` of samples per GPU.
"""

from __future__ import annotations

import logging
import threading
from typing import Mapping, Sequence

from agent.classifier.engine import Classifier, Grid
from agent.classifier.thresholds import DEFAULT_THRESHOLDS, Thresholds
from agent.model import GpuSample, GpuSpec, NodeSnapshot, Verdict

log = logging.getLogger("roofwatch.classifier")

CLOCK_BACK_TOLERANCE_S = 2.0
"""A snapshot this much older than the previous one means the wall clock was set back."""


class LiveClassifier:
    """Snapshot in, verdicts out (one per device, ordered like the snapshot's devices)."""

    def __init__(self, thresholds: Thresholds = DEFAULT_THRESHOLDS, *, dtype: str | None = None) -> None:
        self.thresholds = thresholds
        self._dtype = dtype
        self._grid = Grid(Classifier(thresholds, dtype=dtype))
        self._verdicts: tuple[Verdict, ...] = ()
        self._last_ts: float | None = None
        self._lock = threading.Lock()

    def prime(self, samples: Sequence[GpuSample], specs: Mapping[str, GpuSpec | None]) -> None:
        """Replay samples from before the agent started (the virtual demo's head start).

        Evaluates on the same grid as live operation, so hysteresis state is what it would
        have been had the agent been running; the last verdicts are served until the first
        live evaluation.
        """
        with self._lock:
            for sample in sorted(samples, key=lambda s: s.ts):
                due = self._grid.feed(sample, specs.get(sample.gpu))
                if due:
                    self._verdicts = tuple(due[-1])

    def __call__(self, snapshot: NodeSnapshot) -> tuple[Verdict, ...]:
        with self._lock:  # one collector thread in practice; the lock keeps tests honest
            if self._last_ts is not None and snapshot.ts < self._last_ts - CLOCK_BACK_TOLERANCE_S:
                # The wall clock went back (NTP step, VM restore): the windows hold times of the old
                # clock, and every new sample would look older than them and be dropped, freezing the
                # verdicts until the clock caught up. Start the windows again on the new clock.
                log.warning("wall clock went back; classifier windows restarted",
                            extra={"by_s": round(self._last_ts - snapshot.ts, 1)})
                self._grid = Grid(Classifier(self.thresholds, dtype=self._dtype))
            self._last_ts = snapshot.ts
            classifier = self._grid.classifier
            for device in snapshot.devices:
                if device.up and device.sample is not None:
                    classifier.observe(device.sample, device.info.spec)  # repeats are ignored there
            grid = self._grid
            if grid.next_eval is None:
                grid.next_eval = grid.first_after(snapshot.ts)
            if snapshot.ts >= grid.next_eval:
                order = {d.info.gpu: i for i, d in enumerate(snapshot.devices)}
                verdicts = [v for v in classifier.evaluate(snapshot.ts) if v.gpu in order]
                self._verdicts = tuple(sorted(verdicts, key=lambda v: order[v.gpu]))
                # The next grid time after now: a slow cycle skips evaluations rather than bunching them.
                grid.next_eval = grid.first_after(snapshot.ts)
            return self._verdicts
