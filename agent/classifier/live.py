"""The classifier inside the daemon: fed from each collection cycle, evaluated on its own grid.

The collector calls :meth:`LiveClassifier.__call__` with every new snapshot; it forwards the
samples it has not seen yet, evaluates when the next grid time has passed, and otherwise hands
back the previous verdicts. Costs stay flat: one evaluation every ``evaluate_every_s`` per node,
and at most ``long_window_s`` of samples per GPU.
"""

from __future__ import annotations

import math
import threading

from agent.classifier.engine import Classifier, Verdict
from agent.classifier.thresholds import DEFAULT_THRESHOLDS, Thresholds
from typing import Mapping, Sequence

from agent.model import GpuSample, GpuSpec, NodeSnapshot


class LiveClassifier:
    """Snapshot in, verdicts out (one per device, ordered like the snapshot's devices)."""

    def __init__(self, thresholds: Thresholds = DEFAULT_THRESHOLDS, *, dtype: str | None = None) -> None:
        self.thresholds = thresholds
        self._classifier = Classifier(thresholds, dtype=dtype)
        self._seen: dict[str, float] = {}
        self._next_eval: float | None = None
        self._verdicts: tuple[Verdict, ...] = ()
        self._lock = threading.Lock()

    def prime(self, samples: Sequence[GpuSample], specs: Mapping[str, GpuSpec | None]) -> None:
        """Replay samples from before the agent started (the virtual demo's head start).

        Evaluates on the same grid as live operation, so hysteresis state is what it would
        have been had the agent been running; the last verdicts are served until the first
        live evaluation.
        """
        with self._lock:
            step = self.thresholds.evaluate_every_s
            for sample in sorted(samples, key=lambda s: s.ts):
                if self._next_eval is None:
                    self._next_eval = (math.floor(sample.ts / step) + 1) * step
                while sample.ts > self._next_eval:
                    self._verdicts = tuple(self._classifier.evaluate(self._next_eval))
                    self._next_eval += step
                if sample.ts > self._seen.get(sample.gpu, -math.inf):
                    self._seen[sample.gpu] = sample.ts
                    self._classifier.observe(sample, specs.get(sample.gpu))

    def __call__(self, snapshot: NodeSnapshot) -> tuple[Verdict, ...]:
        with self._lock:  # one collector thread in practice; the lock keeps tests honest
            for device in snapshot.devices:
                sample = device.sample
                if not device.up or sample is None or sample.ts <= self._seen.get(device.info.gpu, -math.inf):
                    continue
                self._seen[device.info.gpu] = sample.ts
                self._classifier.observe(sample, device.info.spec)
            step = self.thresholds.evaluate_every_s
            if self._next_eval is None:
                self._next_eval = (math.floor(snapshot.ts / step) + 1) * step
            if snapshot.ts >= self._next_eval:
                order = {d.info.gpu: i for i, d in enumerate(snapshot.devices)}
                verdicts = [v for v in self._classifier.evaluate(snapshot.ts) if v.gpu in order]
                self._verdicts = tuple(sorted(verdicts, key=lambda v: order[v.gpu]))
                self._next_eval += step * max(1, math.ceil((snapshot.ts - self._next_eval) / step + 1e-9))
            return self._verdicts
